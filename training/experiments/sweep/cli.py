"""Freezing depth x training-set size x seed: how much do the frozen layers cost or save?

    minbert sweep --tasks sst --depths none 0 3 5 6 --sizes 100 1000 --seeds 1 2 3 \\
        --epochs 3 --data-dir ../shared/data/cs224n --out docs/sweep-sst
    minbert report docs/sweep-sst --plot

For every (depth, size, seed) one ordinary training run (training.run.trainer.train) is made in its own
run directory under --runs-dir, on a stratified subset of each task's training file, and one JSON
line is appended to OUT/results.jsonl as soon as it finishes: the key (tasks, depth, size, seed),
the best dev metrics, wall time, peak memory and trainable parameters.

Subsets: for each task and seed, the subsets of all sizes are nested (the 1000 examples contain the
100) and stratified: each label class gets its share of the full training set, rounded by largest
remainder (STS-B's continuous scores are stratified on int(score) clipped to 0..4). The subset is
written as a course-format file in the run directory and handed to the trainer as its training file.
Dev sets are always the full course dev files.

Resuming: rerunning the same command skips every run whose key is already in results.jsonl; a run
that was cut off goes on from its last training checkpoint (exact resume: the numbers of an uninterrupted
run; its record says "resumed", and its wall seconds count the last part only), or starts again in a
cleaned run directory when it left none that the trainer can use; runs cut off are taken before
runs nobody began. A partial last line (the sweep killed while writing) is dropped with a warning. A
run whose record the results file could not take (a full disk) keeps its directory and the record
beside it (sweep-result.json), which the next start records without training. Ctrl-C or SIGTERM stops
the sweep after the current run (its training after the step, with a checkpoint: the run goes on from
it next time), exit status 130 or 143. Results written with different settings (epochs, lr, model,
...) are refused: use another --out.
Workers: the same command started again (another shell, `--threads 1` each on a small machine) shares
the grid: a run is claimed by a lock file in --runs-dir, left to its worker while that lives, taken
over when it died. Arms (training.experiments.study): a key may name a set of option overrides, recorded with it.

Measurement: each run trains in a fresh child process (multiprocessing, spawn), so its peak
resident memory is its own: getrusage(RUSAGE_SELF).ru_maxrss of the child at the end of the run,
which includes the Python + torch baseline (base_rss_mib, the peak before training starts, is
recorded too; the difference is what the run itself added). On CUDA, torch.cuda.max_memory_allocated
is recorded as well. wall_seconds is the train() call in the child (model loading, frozen cache,
training, dev evaluation each epoch, final predictions), without the child's start-up; train_seconds
is the sum of the per-epoch training times the trainer logged. --in-process runs in this process
instead (no memory figure: ru_maxrss is a high-water mark of the whole process).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from data.loaders import COURSE_FILES, TASKS
from training.args import Parser, add_option, config_from_args, depth_or_share
from training.common.progress import setup_logging
from training.config.freeze_spec import depth_error, freeze_depth
from training.config.train_config import TrainConfig, options, seed_error, validate
from training.experiments.sweep.engine import Workers, default_runs_dir, model_layers, work, writable_problem
from training.experiments.sweep.records import (
    RESULTS,
    SWEEP_OPTIONS,
    RunKey,
    plan,
    read_results,
    schedule_arms,
    settings_clash,
    settings_of,
)
from training.experiments.sweep.subsets import Grid, training_subsets
from training.run.signals import exit_on_sigterm

log = logging.getLogger(__name__)

PROG = "python -m training.experiments.sweep"


def base_config(args: argparse.Namespace) -> TrainConfig:
    """The training options every run of the sweep gets: the flags over TrainConfig's defaults, with
    checkpoints at epoch ends only."""
    return config_from_args(args, TrainConfig(save_every=0, keep_last=1))


def run_sweep(args: argparse.Namespace, prog: str = PROG) -> int:
    out, runs_dir = Path(args.out), Path(args.runs_dir or default_runs_dir(args.out))
    base = base_config(args)
    problem = None if args.dry_run else writable_problem({"--out": out, "--runs-dir": runs_dir})
    records = read_results(out / RESULTS, repair=not args.dry_run)
    problem = problem or settings_clash(records, settings_of(base), out / RESULTS) or None
    grid = Grid(args.tasks, args.sizes, args.seeds)
    subsets = None if problem else training_subsets(grid, base)
    if problem or isinstance(subsets, str):
        print(f"{prog}: error: {problem or subsets}", file=sys.stderr)
        return 2
    arms = schedule_arms(args.schedules)
    keys = plan(args.tasks, args.depths, args.sizes, args.seeds, list(arms))
    if args.dry_run:
        done = {RunKey.of(r) for r in records}
        for k in keys:
            print(f"{'done' if k in done else 'todo'}  {k.name}")
        return 0
    workers = Workers(args.threads, args.in_process, args.keep_going, args.keep_checkpoints)
    return work(grid, workers, base, lambda records: keys, arms, subsets, out, runs_dir)


def _depth(s: str) -> int | str | None:
    if s.lower() in ("none", "full"):
        return None
    try:
        return depth_or_share(s)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a depth: an integer >= -1, a share of the layers (P%), "
                                         f"or none") from None


def _size(s: str) -> int | str:
    if s.lower() == "all":
        return "all"
    try:
        n = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a size: a positive integer, or all") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"size {n}: must be >= 1")
    return n


def _unique(items: list) -> list:
    return list(dict.fromkeys(items))


def build_parser(prog: str = PROG) -> Parser:
    p = Parser(prog=prog, description=__doc__)
    g = p.add_argument_group("the grid")
    g.add_argument("--tasks", nargs="+", choices=TASKS, default=["sst"], help="tasks trained together in each run "
                   "(default: sst)")
    g.add_argument("--depths", nargs="+", type=_depth, default=[None, 0, 3, 5, 6], metavar="D",
                   help="--freeze-upto values: D freezes the embeddings and encoder layers 0..D-1 (-1 and 0 both "
                        "freeze only the embeddings), P%% a share of the layers (rounded as --freeze-upto rounds it); "
                        "none: full fine-tuning (default: none 0 3 5 6)")
    g.add_argument("--sizes", nargs="+", type=_size, default=[100, 1000], metavar="N",
                   help="training examples per task (stratified, nested across sizes), or all (default: 100 1000)")
    g.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], metavar="S",
                   help="seeds: each picks the subsets and seeds the training run (default: 1 2 3)")

    g.add_argument("--schedules", nargs="+", default=["fixed"], metavar="SCHEDULE",
                   help="freezing schedules (--unfreeze-schedule), each run at every depth: the depth is where "
                        "lp-ft and gradual start and adaptive starts from (default: fixed)")
    g = p.add_argument_group("where")
    g.add_argument("--out", default="runs/sweep",
                   help="folder for results.jsonl (and the report) (default: %(default)s)")
    g.add_argument("--runs-dir", default=None, help="folder for the run directories (checkpoints, logs, the subset "
                   "files) (default: runs/<name of OUT>-<hash of its path>-runs)")
    for name in ("data_dir", "model"):
        add_option(g, TrainConfig.__dataclass_fields__[name], help_suffix=" (default: %(default)s)")

    g = p.add_argument_group("training (passed to every run; see run_multitask.py --help)")
    for f in options():
        if f.name in SWEEP_OPTIONS:
            add_option(g, f, help_suffix="" if f.metadata["default_text"] else " (default: %(default)s)")
    g.add_argument("--log-every", type=int, default=2, help="log running losses every N steps, for "
                   "`minbert report --curves` (default: %(default)s)")

    g = p.add_argument_group("the sweep")
    g.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's choice, "
                   "which follows OMP_NUM_THREADS)")
    g.add_argument("--in-process", action="store_true", help="train in this process instead of a child per run "
                   "(no peak-memory figure)")
    g.add_argument("--keep-going", action="store_true", help="after a failed run, go on with the others "
                   "(default: stop; the finished runs are kept either way)")
    g.add_argument("--keep-checkpoints", action="store_true", help="keep each run's best.pt and training "
                   "checkpoint (default: delete them once the result is recorded; logs, metrics and dev "
                   "predictions stay)")
    g.add_argument("--test-predictions", action="store_true", help="also write test-set predictions in every run")
    g.add_argument("--dry-run", action="store_true", help="list the runs, done or to do, and stop")
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    p = build_parser(prog)
    args = p.parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    exit_on_sigterm()  # until the runs start (work(): a signal stops the sweep after the current run)
    args.tasks, args.depths = _unique(args.tasks), _unique(args.depths)
    args.sizes, args.seeds = _unique(args.sizes), _unique(args.seeds)
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    if -1 in args.depths and 0 in args.depths:
        log.warning("--depths -1 and 0 both freeze exactly the embeddings: their runs are identical")
    for task in args.tasks:
        path = Path(args.data_dir) / COURSE_FILES[task]["train"]
        if not path.is_file():
            p.error(f"{path}: no such file; pass --data-dir pointing at the course's CSV files")
    errors = validate(base_config(args))  # the training flags every run gets, checked as run_multitask.py does
    errors += [e for e in (seed_error(s, "--seeds") for s in args.seeds) if e]
    if errors:
        p.error("\n  ".join(errors))
    problem = resolve_depths(args) or schedules_problem(args)
    if problem:
        p.error(problem)
    return run_sweep(args, prog)


def schedules_problem(args) -> str | None:
    """Each of --schedules on its own, and against the model at every depth it starts from."""
    from training.config.freeze_spec import parse_schedule
    from training.methods.freezing import schedule_error
    args.schedules = _unique(args.schedules)
    layers = model_layers(args.model)
    for schedule in args.schedules:
        try:
            parse_schedule(schedule)
        except ValueError as e:
            return f"--schedules: {e}"
        for depth in args.depths if layers is not None else ():
            problem = schedule_error(schedule, depth, layers)
            if problem:
                return f"--schedules: {problem} (at --depths {'none' if depth is None else depth})"
    return None


def resolve_depths(args) -> str | None:
    """args.depths as numbers of layers of args.model (a share P% rounded as --freeze-upto rounds it;
    shares that meet on one depth run once), or the error."""
    layers = model_layers(args.model)
    if layers is None:
        if any(isinstance(d, str) for d in args.depths):
            share = next(d for d in args.depths if isinstance(d, str))
            return f"--depths {share}: cannot read the depth of {args.model}"
        return None
    for d in args.depths:
        problem = depth_error(d, layers, args.model)
        if problem:
            return problem.replace("--freeze-upto", "--depths")
    args.depths = _unique([freeze_depth(d, layers) for d in args.depths])
    return None
