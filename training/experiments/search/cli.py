"""minbert search SPACE: trials of a search space on an Optuna study, then its summary.

Each trial is an ordinary run directory in OUT/trials (config.json, metrics.jsonl, train.log, dev
predictions; best.pt and checkpoints only for the best trial, or the front's, unless --keep-checkpoints),
so `python run_multitask.py --config OUT/trials/trial-N/config.json` reruns it. With the default
storage, a journal file in OUT, a killed search loses only the trial in progress: run the same
command again. Start it N times (here or, with --storage on a database, on other machines) for N
workers; they share the budget and never run one grid point twice.
"""
from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

from training.args import Parser, add_option
from training.common.errors import ConfigError, TrainingInterrupted
from training.common.progress import setup_logging
from training.config.train_config import TrainConfig, validate
from training.experiments.search.space import load_space
from training.run import signals
from training.run.signals import exit_on_sigterm, stop_after

log = logging.getLogger(__name__)
PROG = "python -m training.experiments.search"
NO_OPTUNA = "the search runs on Optuna, which is not installed: pip install -e \".[search]\" (or pip install optuna)"


def build_parser(prog: str = PROG) -> Parser:
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("space", help="the search space, a JSON file (docs/search.md)")
    p.add_argument("--out", default="runs/search", help="folder of the trials, the journal and the summary "
                   "(default: %(default)s)")
    p.add_argument("--storage", default=None, help="an Optuna storage URL shared by the workers, e.g. "
                   "postgresql://user:pass@host/db or sqlite:///search.db (default: a journal file in OUT)")
    p.add_argument("--study-name", default=None, help="the study's name in the storage (default: the space "
                   "file's name)")
    p.add_argument("--trials", type=int, default=None, help="the budget, over every worker (default: the space's)")
    for name in ("data_dir", "model"):
        add_option(p, TrainConfig.__dataclass_fields__[name], help_suffix=" (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--sampler-seed", dest="seed", type=int, default=None,
                   help="the sampler's seed (default: the space's, else 0; "
                   "each worker adds its process id and 100003 times the trials so far, so that workers, and a "
                   "restarted one, do not propose the same settings)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep every trial's best.pt")
    p.add_argument("--report-only", action="store_true", help="run no trial: write the summary")
    p.add_argument("--repair-journal", action="store_true", help="a journal file damaged in the middle (the "
                   "error names its line): keep the entries before that line and go on from them (the whole "
                   "file is copied aside first)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def base_config(args, space) -> TrainConfig:
    """What every trial gets before the space's fixed and searched options: no test predictions,
    checkpoints at epoch ends only."""
    return TrainConfig(data_dir=args.data_dir, model=args.model, test_predictions=False, save_every=0, keep_last=1)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    exit_on_sigterm()
    from training.experiments.search.engine import require_optuna
    optuna = require_optuna()
    if optuna is None:
        print(f"{prog}: error: {NO_OPTUNA}", file=sys.stderr)
        return 2
    try:
        space = load_space(args.space)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if args.trials is not None:
        if args.trials < 1:
            print(f"{prog}: error: --trials must be >= 1, not {args.trials}", file=sys.stderr)
            return 2
        space.trials = args.trials
    base = base_config(args, space)
    errors = validate(TrainConfig(**{**base.to_dict(), **space.fixed}))
    if errors:
        print(f"{prog}: error: {space.path}: fixed: {errors[0]}", file=sys.stderr)
        return 2
    problem = storage_problem(args)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
    return search(optuna, space, base, args, prog)


def storage_problem(args) -> str | None:
    """--out writable (a probe file written there) and, the default storage, its journal one to go on from."""
    from training.experiments.search.engine import JOURNAL, journal_problem
    from training.experiments.sweep.engine import writable_problem
    out = Path(args.out)
    return writable_problem({"--out": out}) or (None if args.storage else journal_problem(out / JOURNAL,
                                                                                         args.repair_journal))


def run_trials(optuna, study, space, base: TrainConfig, args, seed: int) -> str | None:
    """Trials until the budget is spent, or a stop signal's name: a signal during a trial's training
    stops it after its step (the trial is failed, and run again by the next start); one after its
    training, or between trials, stops the worker once that trial is told."""
    from training.experiments.search import summary
    from training.experiments.search.engine import run_trial
    while not (args.report_only or signals.received()):
        try:
            state = run_trial(optuna, study, space, base, Path(args.out), seed)
        except TrainingInterrupted as e:
            return e.signal_name
        except KeyboardInterrupt:  # a second Ctrl-C during training stops it at once (the trial is failed)
            if signals.received():
                return signal.Signals(signals.received()).name
            raise
        if state is None:
            return None
        summary.write(study, space, Path(args.out))
    return signal.Signals(signals.received()).name if signals.received() else None


def search(optuna, space, base: TrainConfig, args, prog: str = PROG) -> int:
    import os

    import torch

    from training.experiments.search import summary
    from training.experiments.search.engine import keep_best_checkpoints, open_study, reap_dead, storage_for

    out = Path(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    storage = storage_for(optuna, args.storage, out)
    name = args.study_name or space.path.stem
    try:  # each worker, and each restart of one, its own proposals: the process id and the trials so far
        earlier = len(open_study(optuna, space, storage, name, 0).get_trials(deepcopy=False))
    except Exception as e:  # noqa: BLE001 - no driver, a bad URL, another study's directions, no database
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        driver = " (PostgreSQL needs a driver: pip install 'psycopg[binary]')" if isinstance(e, ImportError) else ""
        print(f"{prog}: error: --storage {args.storage or out / 'study.journal'}: {first}{driver}", file=sys.stderr)
        return 2
    seed = (args.seed if args.seed is not None else space.seed) + os.getpid() + 100_003 * earlier
    study = open_study(optuna, space, storage, name, seed)
    reaped = reap_dead(optuna, study)
    if reaped:
        log.warning("trial(s) %s were cut off when their worker died: marked failed, their places run again",
                    ", ".join(map(str, reaped)))
    with stop_after("trial"):
        stopped = run_trials(optuna, study, space, base, args, seed)
        if stopped:
            print(f"{prog}: stopped by {stopped}; the trials so far are kept, rerun the same command to go on",
                  file=sys.stderr)
            summary.write(study, space, out)
            return signals.exit_status()
    if not args.keep_checkpoints:
        keep_best_checkpoints(study, space, out)
    path = summary.write(study, space, out)
    log.info("summary: %s", path)
    return 0
