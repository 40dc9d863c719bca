"""The sweep's workers: each planned run not yet recorded is claimed (a lock file in the runs folder, taken
over when its worker died), trained in its own run directory, recorded, and cleaned up; several workers
share one plan. training.experiments.study and training.experiments.search run their plans through it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from training.common.errors import TrainingInterrupted
from training.common.processes import TRAINER_LOCK, process_alive, wait_for_run_folder
from training.config.train_config import TrainConfig, dir_problem
from training.experiments.sweep.measure import RunFailed, measure, measure_isolated
from training.experiments.sweep.records import (
    RESULTS,
    RunKey,
    append_result,
    read_results,
    result_record,
    settings_of,
    write_dev_predictions,
)
from training.experiments.sweep.subsets import TUNE, Grid, write_course_file
from training.run import signals
from training.run.signals import stop_after

log = logging.getLogger(__name__)
SAYS = "training.experiments.sweep"  # what the one-line errors and stops start with

MARKER = "sweep-run.json"  # written into each run directory: the sweep may clean it on a rerun

KEPT = "sweep-result.json"  # a trained run's record that results.jsonl could not take (a full disk), kept beside it
WAIT_SECONDS = 15.0  # how long a worker with nothing to claim waits, while others train, before looking again


class RunDirRefused(ValueError):
    """A run directory this sweep must not delete (not a sweep's, or another sweep's): one line."""


def _check_run_dir(run_dir: Path, out: Path) -> None:
    """Refuse a run directory this sweep did not make (one line, before anything is touched)."""
    if run_dir.exists():
        marker = run_dir / MARKER
        if not marker.is_file() and any(run_dir.iterdir()):
            raise RunDirRefused(f"{run_dir} exists and is not a sweep run directory; refusing to delete it "
                             f"(move it, or pass another --runs-dir)")
        owner = json.loads(marker.read_text()).get("out") if marker.is_file() else None
        if owner is not None and owner != str(out.resolve()):
            raise RunDirRefused(f"{run_dir} belongs to the sweep in {owner}; refusing to delete it "
                             f"(pass another --runs-dir)")


def _clean_run_dir(run_dir: Path) -> None:
    """Remove what an interrupted run of this sweep left (_check_run_dir found it this sweep's)."""
    if run_dir.exists():
        log.info("%s: left over from an interrupted run; starting it again", run_dir)
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)


def _resumable(run_dir: Path, key: RunKey, cfg: TrainConfig) -> bool:
    """Whether an interrupted run of this sweep left a training checkpoint that fits cfg: training then
    goes on from it (exact resume: the same numbers as an uninterrupted run) instead of starting again.
    One the trainer would refuse (another config, a damaged file) is not used: the run starts again."""
    from training.common.errors import ConfigError
    from training.run.rundir import find_resume_checkpoint

    marker = run_dir / MARKER
    if not _left_a_checkpoint(run_dir):
        return False
    try:
        if RunKey.of(json.loads(marker.read_text())) != key:
            return False
        if find_resume_checkpoint(replace(cfg, resume="auto"), run_dir, quiet=True) is None:
            raise ValueError("none can be read")
        return True
    except (ConfigError, OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s: its checkpoint is not used (%s); starting the run again", run_dir, e)
        return False


def _left_a_checkpoint(run_dir: Path) -> bool:
    """Whether a run of a sweep began in run_dir and left a training checkpoint (readable or not)."""
    return (run_dir / MARKER).is_file() and any((run_dir / "checkpoints").glob("*.pt"))


def interrupted_first(runs_dir: Path, keys: list[RunKey]) -> list[RunKey]:
    """keys with the runs an earlier worker began and left a checkpoint for first, each part in plan order:
    a restarted sweep finishes what it began before it begins more, so no half-trained run waits on disk
    (with its checkpoints) while another worker starts a fresh one."""
    begun = [k for k in keys if _left_a_checkpoint(runs_dir / k.name)]
    return begun + [k for k in keys if k not in begun]


@dataclass(frozen=True)
class Workers:
    """How a worker trains its runs: torch threads per run (None: torch's choice), in this process or in a
    child process per run (whose peak memory is then its own), on after a failed run or not, and whether a
    recorded run keeps its best.pt and training checkpoints."""
    threads: int | None = None
    in_process: bool = False
    keep_going: bool = False
    keep_checkpoints: bool = False


def work(grid: Grid, workers: Workers, base: TrainConfig, plan_of, arms: dict[str, dict], subsets: dict, out: Path,
         runs_dir: Path, after_each=None, annotate=None) -> int:
    """Run every planned key not yet in results.jsonl, one at a time, appending each result as it finishes.

    plan_of(records) gives the keys to have, in order, from the results so far (the study's later
    stages depend on earlier results), so it is asked again after every run, and after_each() is called
    once each result is recorded (the study rewrites its report); annotate(key) adds fields to a record
    (the study's seed role). arms: anything with .get(arm, default) giving an arm's overrides. Several workers (this
    command started again, in another shell) share the work: each run is claimed with a lock file in
    runs_dir, and a run claimed by a live process is left to it until that process is gone, when the next
    worker to look takes it over. SIGINT/SIGTERM stop the worker after the current run (whose training
    stops after its step, with a checkpoint: the run goes on from it on the next start, before any run
    nobody began)."""
    results_path, settings = out / RESULTS, settings_of(base)
    runs_dir.mkdir(parents=True, exist_ok=True)
    failures, spent, waited_for = [], [], frozenset()
    with stop_after("run"):
        while not signals.received():
            records = read_results(results_path)
            done, planned = {RunKey.of(r) for r in records}, plan_of(records)
            clean_leftovers(runs_dir, done, out, workers.keep_checkpoints)
            todo = [k for k in planned if k not in done and k not in failures]
            busy = set()  # asked afresh each time: a run whose worker has died since is taken over, not left
            key = claim_next(runs_dir, interrupted_first(runs_dir, todo), busy, results_path)
            if key is None and not busy:
                break
            if key is None:
                waited_for = wait_for_others(busy, waited_for)
                continue
            eta = f", about {len(todo) * sum(spent) / len(spent) / 60:.0f} min left" if spent else ""
            log.info("run %d/%d: %s%s", len(planned) - len(todo) + 1, len(planned), key.name, eta)
            try:
                record = one_run(grid, workers, base, key, subsets, out, runs_dir, settings, arms.get(key.arm, {}),
                                 annotate)
            except RunDirRefused as e:  # before any training: nothing of another's is touched
                print(f"{SAYS}: error: {e}", file=sys.stderr)
                return 2
            except (RunFailed, TrainingInterrupted, KeyboardInterrupt) as e:
                if signals.received():  # stopped by a signal (a second Ctrl-C in training: at once), not failed:
                    break               # the run goes on from its checkpoint on the next start
                if isinstance(e, KeyboardInterrupt):
                    raise
                log.error("run %s failed: %s", key.name, e)
                failures.append(key)
                if not workers.keep_going:
                    print(f"{SAYS}: error: run {key.name} failed (its log: {runs_dir / key.name / 'train.log'}"
                          f"); the finished runs are kept, rerun the same command to go on", file=sys.stderr)
                    return 1
                continue
            if isinstance(record, str):
                print(f"{SAYS}: error: {record}", file=sys.stderr)
                return 1
            spent.append(record["wall_seconds"])
            log.info("%s done in %.0f s: dev %s", key.name, record["wall_seconds"],
                     " ".join(f"{k} {v:.4f}" for k, v in record["dev"].items()))
            if after_each is not None:
                after_each()
        if signals.received():
            print(f"{SAYS}: stopped by {signal.Signals(signals.received()).name} ({len(spent)} run(s) "
                  f"finished and recorded); rerun the same command to go on", file=sys.stderr)
            return signals.exit_status()
    return _final_status(failures, results_path, out)


def wait_for_others(busy: set[RunKey], waited_for: frozenset) -> frozenset:
    """Nothing left to claim while other workers train `busy`: wait WAIT_SECONDS before looking again, for
    their results may plan more runs (a study's reporting runs wait for their point's tuning) and a run
    whose worker dies is this one's to take over. Says so once for each set of runs; returns the set."""
    busy = frozenset(busy)
    if busy != waited_for:
        log.info("nothing to claim now: waiting for the %d run(s) other workers train (%s), whose results may "
                 "plan more", len(busy), ", ".join(sorted(k.name for k in busy)))
    end = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < end and not signals.received():
        time.sleep(0.2)
    return busy


def _final_status(failures: list[RunKey], results_path: Path, out: Path) -> int:
    """A worker with nothing left to claim or wait for: 1 if a run of its failed, else 0."""
    if failures:
        print(f"{SAYS}: {len(failures)} run(s) failed: {', '.join(k.name for k in failures)}; rerun the "
              f"same command to retry them", file=sys.stderr)
        return 1
    log.info("sweep complete: %s; summarise with `minbert report %s`", results_path, out)
    return 0


def one_run(grid: Grid, workers: Workers, base: TrainConfig, key: RunKey, subsets: dict, out: Path, runs_dir: Path,
            settings: dict, overrides: dict, annotate=None) -> dict | str:
    """Train key's claimed run (or take the record a full disk kept beside it), record it, clean it up,
    release its claim; the record, or the one line saying why it could not be recorded. The order
    matters to a worker killed in between: a claim left on a recorded run means its clean-up is due
    (clean_leftovers)."""
    run_dir, results_path, cleaned = runs_dir / key.name, out / RESULTS, False
    try:
        kept = kept_record(run_dir, key, settings)
        if kept is None:
            m = sweep_run(grid, workers, base, key, subsets, run_dir, out, overrides)
            record = {**result_record(grid, base, key, subsets, run_dir, m, settings, overrides, workers.in_process),
                      **(annotate(key) if annotate else {})}
            kept = record, m["report"]["predictions"] if "report" in m else None
        problem = record_or_keep(out, key, *kept, run_dir)
        if problem:
            return problem
        clean_recorded_run(run_dir, workers.keep_checkpoints)
        cleaned = True
        return kept[0]
    finally:  # stopped at once (a second signal) between the record and its clean-up: clean up before letting go
        if not cleaned and key in {RunKey.of(r) for r in read_results(results_path)}:
            clean_recorded_run(run_dir, workers.keep_checkpoints)
        (runs_dir / f".{key.name}.lock").unlink(missing_ok=True)


def kept_record(run_dir: Path, key: RunKey, settings: dict) -> tuple[dict, dict | None] | None:
    """The record (and dev predictions) of key's run kept in its directory when they could not be written
    beside results.jsonl, if it is this run's, made with these settings: recording it is all that is left."""
    path = run_dir / KEPT
    try:
        kept = json.loads(path.read_text())
        record, predictions = kept["record"], kept["predictions"]
        if RunKey.of(record) != key or record.get("settings") != settings:
            raise ValueError("another run's, or other settings'")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s: not used (%s); training the run again", path, e)
        return None
    log.info("%s: recording the run trained before, without training it again", path)
    return record, predictions


def record_or_keep(out: Path, key: RunKey, record: dict, predictions: dict | None, run_dir: Path) -> str | None:
    """Write the run's dev predictions (if any) and append its record to results.jsonl. If that fails (a
    full disk), the trained run is kept, with both written beside it, which the next start records
    without training; the message says so."""
    try:
        if predictions is not None:
            record = {**record, "dev_predictions": write_dev_predictions(out, key, predictions)}
        append_result(out / RESULTS, record)
        return None
    except OSError as e:
        why = f"{e.filename or out / RESULTS}: {e.strerror or e}"
    kept = run_dir / KEPT
    try:
        tmp = kept.with_name(kept.name + ".tmp")
        tmp.write_text(json.dumps({"record": record, "predictions": predictions}) + "\n")
        os.replace(tmp, kept)
        how = f"rerun the same command once it can be written: it records the run from {kept} without training it"
    except OSError:
        how = f"append this line to {out / RESULTS} yourself: {json.dumps(record)}"
    return f"{why}: run {key.name} trained but is not recorded; its directory {run_dir} is kept; {how}"


def clean_recorded_run(run_dir: Path, keep_checkpoints: bool) -> None:
    """A recorded run keeps its logs, metrics and dev predictions; best.pt and the training checkpoints go
    unless --keep-checkpoints."""
    if not keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        (run_dir / "best.pt").unlink(missing_ok=True)
    (run_dir / KEPT).unlink(missing_ok=True)
    (run_dir / TRAINER_LOCK).unlink(missing_ok=True)  # its trainer has exited: the run is recorded


def clean_leftovers(runs_dir: Path, done: set[RunKey], out: Path, keep_checkpoints: bool) -> None:
    """A worker killed after recording its run but before cleaning it up left the run's claim, best.pt
    and checkpoints behind, which no worker would visit again (recorded runs are skipped): whoever sees
    a recorded run's claim whose worker is gone takes it over and does that clean-up."""
    names = {k.name for k in done}
    for lock in sorted(runs_dir.glob(".*.lock")):
        name, run_dir = lock.name[1:-len(".lock")], runs_dir / lock.name[1:-len(".lock")]
        if name not in names or not _claim(lock):
            continue
        try:
            marker = json.loads((run_dir / MARKER).read_text()) if (run_dir / MARKER).is_file() else {}
            if marker.get("out") == str(out.resolve()):  # this sweep's run (a runs dir may be shared)
                clean_recorded_run(run_dir, keep_checkpoints)
                log.info("%s: cleaned up after its worker, which died once the run was recorded", run_dir)
        finally:
            lock.unlink(missing_ok=True)


def claim_next(runs_dir: Path, candidates: list[RunKey], busy: set, results_path: Path) -> RunKey | None:
    """The first of candidates this worker could claim and nobody has recorded (another worker may have
    finished it between our reading the results and our claim); the others, claimed, go into busy."""
    for k in candidates:
        lock = claim(runs_dir, k)
        if lock is None:
            busy.add(k)  # another worker trains it
        elif k in {RunKey.of(r) for r in read_results(results_path)}:
            lock.unlink(missing_ok=True)  # finished by another worker just now
        else:
            return k
    return None


def claim(runs_dir: Path, key: RunKey) -> Path | None:
    """The lock file of key's run, made by this process; None while another live process holds it. A
    lock left by a dead process (killed, or on a machine that restarted) is taken over."""
    lock = runs_dir / f".{key.name}.lock"
    return lock if _claim(lock) else None


def _claim(lock: Path) -> bool:
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _holder_alive(lock):
                return False
            log.info("%s: its worker is gone; taking the run over", lock)
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        return True
    return False


def _holder_alive(lock: Path) -> bool:
    try:
        holder = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return False  # half written by a process killed at once: nobody holds it
    # no host yet: a worker between creating its lock and writing it (alive); another machine's: left alone
    return process_alive(holder.get("pid"), holder.get("host", ""))


def writable_problem(folders: dict[str, Path]) -> str | None:
    """The first of folders ({what names it, the flag: folder}) this process cannot write in, found before
    any training by making it and writing a probe file there; a results.jsonl in it must take appends."""
    for name, folder in folders.items():
        problem = dir_problem(folder, True)
        if problem is None:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                probe = folder / f".write-probe-{os.getpid()}"
                probe.write_bytes(b"probe")
                probe.unlink()
                if (folder / RESULTS).exists():
                    open(folder / RESULTS, "ab").close()
            except OSError as e:
                problem = f"not writable ({e.filename}: {e.strerror or e})"
        if problem:
            return f"{name} {folder}: {problem}"
    return None


def sweep_run(grid: Grid, workers: Workers, base: TrainConfig, key: RunKey, subsets: dict, run_dir: Path, out: Path,
              overrides: dict | None = None) -> dict:
    """One run of the grid in its own directory, on its training subsets, with its arm's overrides; a run
    interrupted earlier (a stopped worker, a machine that went away) goes on from its last checkpoint."""
    files, report_dev = {}, {}
    for task in grid.tasks:
        files[f"{task}_train"] = str(run_dir / f"{task}-train-subset.csv")
        if (task, TUNE) in subsets:  # the tuning split stands in for dev during training; dev only reports
            files[f"{task}_dev"] = str(run_dir / f"{task}-tune-split.csv")
            report_dev[task] = base.file(task, "dev")
    cfg = TrainConfig.from_dict({**base.to_dict(), **(overrides or {}), "files": files, "freeze_upto": key.depth,
                                 "seed": key.seed,
                                 "out_dir": str(run_dir), "predictions_dir": str(run_dir / "predictions"),
                                 "cache_dir": str(run_dir.parent / ".frozen-cache")})
    _check_run_dir(run_dir, out)
    wait_for_run_folder(run_dir, log)  # a killed worker's training process may still write its checkpoint
    if _resumable(run_dir, key, cfg):
        log.info("%s: interrupted earlier; going on from its last checkpoint", run_dir)
        cfg = replace(cfg, resume="auto")
    else:
        _clean_run_dir(run_dir)
    (run_dir / MARKER).write_text(json.dumps({**key.to_dict(), "out": str(out.resolve())}) + "\n")
    for task in grid.tasks:  # the same rows every time: a resumed run reads what it started on
        write_course_file(Path(files[f"{task}_train"]), task, subsets[task, key.seed][key.size])
        if task in report_dev:
            write_course_file(Path(files[f"{task}_dev"]), task, subsets[task, TUNE])
    runner = measure if workers.in_process else measure_isolated
    m = runner(cfg, workers.threads, report_dev) if report_dev else runner(cfg, workers.threads)
    return {**m, "resumed": True} if cfg.resume else m


def default_runs_dir(out: str | os.PathLike) -> Path:
    """runs/<name of OUT>-<hash of its full path>-runs: two sweeps whose OUT folders share a name
    (expA/sweep, expB/sweep) must not share run directories."""
    out = Path(out).resolve()
    return Path("runs") / f"{out.name}-{hashlib.sha1(str(out).encode()).hexdigest()[:8]}-runs"


def model_layers(model: str) -> int | None:
    """The model's depth from its config.json, or None when it cannot be read cheaply."""
    try:
        from minbert import resolve_checkpoint
        return int(json.loads((resolve_checkpoint(model) / "config.json").read_text())["num_hidden_layers"])
    except Exception:  # noqa: BLE001 - the run itself will say what is wrong
        return None
