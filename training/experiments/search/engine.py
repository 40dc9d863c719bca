"""Trials on an Optuna study: ask, train one ordinary run, report its dev evaluations (pruning), tell.

A study lives in a storage every worker shares: by default a journal file in the output folder (a
killed worker loses only its trial in progress), or any database URL Optuna accepts (PostgreSQL for
workers on several machines). Workers are this command started again, anywhere the storage reaches.

Rules that keep several workers honest, all decided through the storage alone:
- a trial left RUNNING by a worker that is gone (same machine, dead process) is marked FAIL when a
  worker starts, and its place in the budget (and, for the grid, its point) is free again;
- a trial whose settings equal those of a lower-numbered live trial is a duplicate (two workers
  picked the same grid point at once, or a sampler proposed settings already tried): it is marked FAIL
  unrun, and the lower number keeps the point;
- the budget counts trials finished or running, and the duplicates of a tpe or random sampler (a grid's
  are races, whose point another trial holds), so workers stop together and a sampler that keeps
  proposing tried settings cannot go on for ever; a space of fewer settings than the budget (choices
  and integer ranges only) ends once each has been tried.
"""
from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import shutil
import socket
import time
import warnings
from pathlib import Path

from training.common.processes import process_alive
from training.config.train_config import TrainConfig
from training.experiments.search.space import Space
from training.experiments.search.summary import is_duplicate
from training.run.trainer import train

log = logging.getLogger(__name__)

TRIALS = "trials"
JOURNAL = "study.journal"


def require_optuna():
    try:
        import optuna
    except ImportError:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # ours says what a trial did
    return optuna


def storage_for(optuna, url: str | None, out: Path):
    if url:
        return url
    from optuna.storages.journal import JournalStorage
    out.mkdir(parents=True, exist_ok=True)
    return JournalStorage(mending_journal(out / JOURNAL))


def mending_journal(path: Path):
    """Optuna's journal file, except that an append first cuts a torn last line (a worker killed mid-write,
    a full disk): appended onto, that line would sit in the middle of the file, where Optuna cannot read
    past it, and every worker would stop there."""
    from optuna.storages.journal import JournalFileBackend

    class Mending(JournalFileBackend):
        def append_logs(self, logs):
            if _ends_torn(path):
                cut_torn_journal_tail(path)
            super().append_logs(logs)
    return Mending(str(path))


def _ends_torn(path: Path) -> bool:
    """Whether the file's last byte is not a newline (one byte read: this runs before every append)."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def cut_torn_journal_tail(path: Path) -> bytes:
    """The journal's bytes, a torn last line cut off the file with a warning; under the journal's lock,
    so that no worker is half-way through an append."""
    from optuna.storages.journal import JournalFileSymlinkLock

    from training.experiments.sweep.records import cut_torn_last_line
    lock = JournalFileSymlinkLock(str(path))  # the lock JournalFileBackend takes by default
    lock.acquire()
    try:
        return cut_torn_last_line(path, path.read_bytes(), True, "its writer was stopped while writing it")
    finally:
        lock.release()


def journal_problem(path: Path, repair: bool) -> str | None:
    """Whether the search can go on from its journal file: a torn last line is cut with a warning (as
    the next append would); a line elsewhere that is not a journal entry is the one-line answer, naming
    file and line, unless repair, which keeps the entries before it (the whole file copied aside first).
    A journal that cannot be read or appended to is the answer too."""
    if not path.exists():
        return None
    try:
        with open(path, "ab"):
            pass
        data = cut_torn_journal_tail(path)
    except OSError as e:
        return f"{path}: cannot be read and appended to ({e.strerror or e})"
    offset = 0
    for n, line in enumerate(data.splitlines(keepends=True), 1):
        if not _journal_entry(line):
            return _damaged(path, n, offset, repair)
        offset += len(line)
    return None


def _journal_entry(line: bytes) -> bool:
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    return isinstance(entry, dict) and "op_code" in entry


def _damaged(path: Path, n: int, offset: int, repair: bool) -> str | None:
    if not repair:
        return (f"{path}:{n}: not an Optuna journal entry (the file is damaged there); rerun with "
                f"--repair-journal to go on from the {n - 1} entries before it (the file is copied aside "
                f"first), or use another --out to start afresh")
    copy = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    shutil.copyfile(path, copy)
    with open(path, "r+b") as f:
        f.truncate(offset)
    log.warning("%s:%d: damaged; kept the %d entries before it and dropped the rest (the whole file is in %s)",
                path, n, n - 1, copy)
    return None


def pruner_for(optuna, space: Space):
    if space.multi or space.pruner == "none":  # Optuna prunes single-objective studies only
        return optuna.pruners.NopPruner()
    if isinstance(space.pruner, dict):
        return optuna.pruners.ThresholdPruner(lower=float(space.pruner["threshold"]))
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)


def sampler_for(optuna, space: Space, seed: int):
    if space.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True) if not space.multi else \
            optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def open_study(optuna, space: Space, storage, name: str, seed: int, attempts: int = 3):
    """The shared study, created by whichever worker comes first. Workers starting together on an empty
    database race to create its tables, and the loser's first try fails: it tries again."""
    for attempt in range(1, attempts + 1):
        try:
            return optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                       directions=space.directions, sampler=sampler_for(optuna, space, seed),
                                       pruner=pruner_for(optuna, space))
        except (ImportError, ValueError):  # no database driver, a bad URL, a study of other directions
            raise
        except Exception:  # noqa: BLE001 - the database's own errors (sqlalchemy's), raced or not
            if attempt == attempts:
                raise
            log.info("the study's storage was busy (another worker creating it?); trying again")
            time.sleep(1.0 * attempt)


# --------------------------------------------------------------------------- the workers' rules

LIVE = ("RUNNING", "COMPLETE", "PRUNED")


def _live(trials) -> list:
    return [t for t in trials if t.state.name in LIVE]


def reap_dead(optuna, study, orphan_after: float = 60.0) -> list[int]:
    """Mark FAIL the RUNNING trials of workers on this machine that are gone, and those that never got a
    worker (it sets itself just after asking: one still without a worker `orphan_after` seconds later was
    asked by a worker killed in between, and would hold its place for good); their numbers."""
    reaped = []
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        orphan = worker is None and (now - t.datetime_start).total_seconds() >= orphan_after
        if orphan or (worker or {}).get("host") == socket.gethostname() and not process_alive(worker.get("pid")):
            study._storage.set_trial_user_attr(t._trial_id, "state_note", "its worker died mid-trial")
            study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            reaped.append(t.number)
    return reaped


def next_grid_point(space: Space, trials) -> dict | None:
    """The first combination of the grid's choices that no live trial holds, or None."""
    taken = [t.params for t in _live(trials)]
    names = list(space.params)
    for values in itertools.product(*(space.params[n].choices for n in names)):
        point = dict(zip(names, values))
        if point not in taken:
            return point
    return None


def budget_left(space: Space, trials) -> bool:
    spent = len(_live(trials)) + (0 if space.sampler == "grid" else sum(map(is_duplicate, trials)))
    return spent < space.trials


def space_exhausted(space: Space, trials) -> bool:
    """Whether live trials hold every setting of a space that has finitely many."""
    settings = {json.dumps(t.params, sort_keys=True) for t in _live(trials) if len(t.params) == len(space.params)}
    return len(settings) >= space.size


def duplicate_of(trial, trials) -> int | None:
    """The lower-numbered live trial holding the same settings, if any."""
    params = trial.params
    return next((t.number for t in _live(trials) if t.number < trial.number and t.params == params), None)


def settled_trials(study, number: int, wait: float = 5.0) -> list:
    """The study's trials once every lower-numbered running trial has its settings: a worker sets them
    just after asking, and a duplicate check made in between would miss its twin. A trial still without
    settings after `wait` seconds (its worker died in between) is taken as it is."""
    deadline = time.monotonic() + wait
    while True:
        trials = study.get_trials(deepcopy=False)
        pending = [t for t in trials if t.number < number and t.state.name == "RUNNING" and not t.params]
        if not pending or time.monotonic() > deadline:
            return trials
        time.sleep(0.05)


# --------------------------------------------------------------------------- one trial


class Stop(Exception):
    """Raised inside training when the pruner says so: the run stops at once, its records kept."""
    expected = True  # the trainer logs it as news, not as an error


def trial_config(space: Space, base: TrainConfig, params: dict, run_dir: Path) -> TrainConfig:
    return TrainConfig(**{**base.to_dict(), **space.fixed, **params, "out_dir": str(run_dir),
                          "predictions_dir": str(run_dir / "predictions"), "overwrite": True})


def run_trial(optuna, study, space: Space, base: TrainConfig, out: Path, seed: int):
    """Ask one trial, train it, tell its outcome. Returns the trial's state name, or None when the
    budget (or the grid) is used up."""
    trials = study.get_trials(deepcopy=False)
    if not budget_left(space, trials):
        return None
    if space_exhausted(space, trials):
        log.info("every one of the space's %d settings has been tried: no trial left to run", space.size)
        return None
    if space.sampler == "grid":
        point = next_grid_point(space, trials)
        if point is None:
            return None
        with warnings.catch_warnings():  # Optuna marks PartialFixedSampler experimental
            warnings.simplefilter("ignore")
            study.sampler = optuna.samplers.PartialFixedSampler(point, optuna.samplers.RandomSampler(seed=seed))
    trial = study.ask()
    trial.set_user_attr("worker", {"pid": os.getpid(), "host": socket.gethostname()})
    params = {name: p.suggest(trial) for name, p in space.params.items()}
    dup = duplicate_of(trial, settled_trials(study, trial.number))
    if dup is not None:
        trial.set_user_attr("state_note", f"duplicate of trial {dup}, not run")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return "DUPLICATE"
    run_dir = out / TRIALS / f"trial-{trial.number:04d}"
    trial.set_user_attr("run_dir", str(run_dir))
    log.info("trial %d: %s", trial.number, json.dumps(params))

    def report(record: dict) -> None:
        if space.multi:
            return
        step = report.count = report.count + 1
        trial.report(record[f"dev_{space.objective[0]}"], step)
        if trial.should_prune():
            raise Stop(f"pruned after evaluation {step}")
    report.count = 0
    t0 = time.perf_counter()
    try:
        metrics = train(trial_config(space, base, params, run_dir), on_evaluation=report)
    except Stop as e:
        trial.set_user_attr("state_note", str(e))
        trial.set_user_attr("train_seconds", train_seconds(run_dir) or None)  # None: stopped in its first epoch
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        log.info("trial %d %s", trial.number, e)
        return "PRUNED"
    except BaseException as e:  # interrupted, or the run failed: the trial is lost, its place free again
        trial.set_user_attr("state_note", f"stopped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    seconds = train_seconds(run_dir)
    trial.set_user_attr("dev", metrics)
    trial.set_user_attr("train_seconds", seconds)
    trial.set_user_attr("wall_seconds", round(time.perf_counter() - t0, 2))
    values = [metrics[space.objective[0]]] + ([seconds] if space.multi else [])
    study.tell(trial, values)
    log.info("trial %d: %s", trial.number, " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return "COMPLETE"


def train_seconds(run_dir: Path) -> float:
    """The run's training time: its epochs' train_seconds in metrics.jsonl (steps only, no evaluation);
    for a run stopped mid-epoch, what the epochs before it took (0 if none ended)."""
    from training.run.metrics_file import read_metrics, training_seconds
    path = run_dir / "metrics.jsonl"
    return training_seconds(read_metrics(path) if path.is_file() else [])


def keep_best_checkpoints(study, space: Space, out: Path) -> None:
    """best.pt and the training checkpoints of the best trial (or, two-objective, the Pareto front's)
    are kept, and those of trials still running (another worker's: it needs them, and cleans up when it
    ends); every other trial keeps its logs, metrics and prediction files only."""
    trials = study.get_trials(deepcopy=False)
    keep = {t.number for t in study.best_trials} if space.multi else (
        {study.best_trial.number} if any(t.state.name == "COMPLETE" for t in trials) else set())
    keep |= {t.number for t in trials if t.state.name == "RUNNING"}
    for run_dir in sorted((out / TRIALS).glob("trial-*")):
        if int(run_dir.name.split("-")[1]) not in keep:
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            (run_dir / "best.pt").unlink(missing_ok=True)
