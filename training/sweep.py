"""Freezing depth x training-set size x seed: how much do the frozen layers cost or save?

    python -m training.sweep --tasks sst --depths none 0 3 5 6 --sizes 100 1000 --seeds 1 2 3 \\
        --epochs 3 --data-dir ../shared/data/cs224n --out docs/sweep-sst
    python -m training.report docs/sweep-sst --plot

For every (depth, size, seed) one ordinary training run (training.trainer.train) is made in its own
run directory under --runs-dir, on a stratified subset of each task's training file, and one JSON
line is appended to OUT/results.jsonl as soon as it finishes: the key (tasks, depth, size, seed),
the best dev metrics, wall time, peak memory and trainable parameters.

Subsets: for each task and seed, the subsets of all sizes are nested (the 1000 examples contain the
100) and stratified: each label class gets its share of the full training set, rounded by largest
remainder (STS-B's continuous scores are stratified on int(score) clipped to 0..4). The subset is
written as a course-format file in the run directory and handed to the trainer as its training file.
Dev sets are always the full course dev files.

Resuming: rerunning the same command skips every run whose key is already in results.jsonl; a run
that was cut off starts again from scratch in a cleaned run directory (so its time is a clean
measurement). A partial last line (the sweep killed while writing) is dropped with a warning. A run
whose record the results file could not take (a full disk) keeps its directory and the record beside
it (sweep-result.json), which the next start records without training. Ctrl-C or SIGTERM stops the
sweep after the current run (its training after the step: the run starts again next time), exit
status 130 or 143. Results written with different settings (epochs, lr, model, ...) are refused: use
another --out.
Workers: the same command started again (another shell, `--threads 1` each on a small machine) shares
the grid: a run is claimed by a lock file in --runs-dir, left to its worker while that lives, taken
over when it died. Arms (training.study): a key may name a set of option overrides, recorded with it.

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
import csv
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, Sequence

from data.loaders import COURSE_FILES, LABEL_COLUMN, TASKS, TEXT_COLUMNS, Example, load_task_file

from .cli import add_option, config_from_args, depth_or_share
from . import signals
from .config import TrainConfig, depth_error, dir_problem, freeze_depth, options, seed_error, validate
from .errors import TrainingInterrupted
from .peft import share, trainable_counts
from .progress import setup_logging
from .signals import exit_on_sigterm, exit_with_parent, stop_after

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
TUNE = "tune"  # training_subsets' key of a task's tuning split: (task, TUNE)
PREDICTIONS = "dev-predictions"  # beside results.jsonl: each run's per-example dev predictions, for the bootstrap
MARKER = "sweep-run.json"  # written into each run directory: the sweep may clean it on a rerun
KEPT = "sweep-result.json"  # a trained run's record that results.jsonl could not take (a full disk), kept beside it
# TrainConfig fields that differ between the runs of one sweep or do not change results.
# The training options a sweep passes on to every run (the rest are per run, or TrainConfig's defaults).
SWEEP_OPTIONS = ("epochs", "lr", "batch_size", "eval_batch_size", "max_length", "pair_encoding", "pooling",
                 "head_dropout", "ema_decay", "predict_both_orders", "warmup_ratio", "weight_decay", "task_sampling",
                 "frozen_cache", "device", "precision", "peft")
PER_RUN = ("out_dir", "predictions_dir", "test_predictions", "files", "freeze_upto", "seed", "max_train_examples",
           "tasks", "cache_dir", "resume", "log_every", "save_every", "keep_last", "export_hf")


# --------------------------------------------------------------------------- stratified nested subsets

def largest_remainder(class_sizes: dict[Hashable, int], n: int) -> dict[Hashable, int]:
    """Split n among the classes in proportion to their sizes: each class gets the floor of its exact
    share n * size / total, and the seats left over go to the largest fractional parts (ties: the
    larger class, then the class first in sorted order)."""
    total = sum(class_sizes.values())
    if not 0 <= n <= total:
        raise ValueError(f"cannot take {n} of {total} examples")
    order = sorted(class_sizes, key=_sort_key)
    counts = {k: n * class_sizes[k] // total for k in order}
    rest = n - sum(counts.values())
    # exact integer arithmetic: remainder of class k is (n * size_k) mod total
    by_remainder = sorted(order, key=lambda k: (-(n * class_sizes[k] % total), -class_sizes[k]))
    for k in by_remainder[:rest]:
        counts[k] += 1
    return counts


def _sort_key(x):
    return (str(type(x)), x)


def nested_counts(class_sizes: dict[Hashable, int], sizes: Sequence[int]) -> dict[int, dict[Hashable, int]]:
    """Per-class counts for each size, by largest remainder, made monotone in the size so that the
    subsets can nest (largest remainder alone can give a class fewer seats at a larger size: the
    Alabama paradox). Where it would, the class keeps its smaller-size count and the surplus is
    taken back from the classes furthest above their exact share (ties: the reverse of
    largest_remainder's order)."""
    total = sum(class_sizes.values())
    rank = {k: i for i, k in enumerate(sorted(class_sizes, key=_sort_key))}
    out: dict[int, dict[Hashable, int]] = {}
    prev = {k: 0 for k in class_sizes}
    for n in sorted(set(sizes)):
        counts = {k: max(c, prev[k]) for k, c in largest_remainder(class_sizes, n).items()}
        while sum(counts.values()) > n:
            over = [k for k in counts if counts[k] > prev[k]]
            k = max(over, key=lambda k: (counts[k] * total - n * class_sizes[k], -class_sizes[k], rank[k]))
            counts[k] -= 1
        out[n] = counts
        prev = counts
    return out


def stratified_nested_subsets(labels: Sequence[Hashable], sizes: Sequence[int], seed: int) -> dict[int, list[int]]:
    """{size: sorted indices into labels} with label proportions as close to the full set's as
    integer counts allow (largest remainder, see nested_counts), each subset containing every smaller
    one, and the same for the same seed. One seeded permutation is drawn per label class (classes in
    sorted order) and each size takes a prefix of it. Labels must be discrete: bin continuous ones
    first (strata())."""
    import numpy as np

    labels = list(labels)
    for n in sizes:
        if not 0 <= n <= len(labels):
            raise ValueError(f"subset size {n} is not between 0 and the {len(labels)} examples available")
    members: dict[Hashable, list[int]] = {}
    for i, y in enumerate(labels):
        members.setdefault(y, []).append(i)
    rng = np.random.default_rng(seed)
    order = {k: [members[k][j] for j in rng.permutation(len(members[k]))] for k in sorted(members, key=_sort_key)}
    counts = nested_counts({k: len(v) for k, v in members.items()}, sizes)
    return {n: sorted(i for k, c in counts[n].items() for i in order[k][:c]) for n in sizes}


def tuning_split(labels: Sequence[Hashable], share: float, seed: int) -> tuple[list[int], list[int]]:
    """(tuning indices, the rest), both sorted: a stratified share of the examples, fixed by its own seed
    (not a run's), held out of training to choose each run's epoch and each arm's learning rate, so that
    the dev sets only report. The share is rounded to whole examples, at least one."""
    n = min(max(round(share * len(labels)), 1), len(labels) - 1)
    tune = stratified_nested_subsets(labels, [n], seed)[n]
    held = set(tune)
    return tune, [i for i in range(len(labels)) if i not in held]


def strata(task: str, labels: Sequence) -> list[int]:
    """Discrete strata for a task's labels: the class for sst/para, int(score) clipped to 0..4 for sts."""
    if task == "sts":
        return [min(max(int(y), 0), 4) for y in labels]
    return [int(y) for y in labels]


def write_course_file(path: str | os.PathLike, task: str, examples: Sequence[Example]) -> None:
    """Examples as a course-format file: tab-separated, csv-quoted, a leading index column."""
    columns = ["", "id", *TEXT_COLUMNS[task], LABEL_COLUMN[task]]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(columns)
        for i, e in enumerate(examples):
            texts = [e.text_a] if task == "sst" else [e.text_a, e.text_b]
            w.writerow([i, e.id, *texts, repr(float(e.label)) if task == "sts" else int(e.label)])
    os.replace(tmp, path)


# --------------------------------------------------------------------------- the plan and its record

@dataclass(frozen=True)
class RunKey:
    tasks: str           # "sst", "sst+para", ...
    depth: int | None    # --freeze-upto; None: full fine-tuning
    size: int | str      # training examples per task, or "all"
    seed: int
    arm: str = ""        # a named set of option overrides (training.study's arms); "": the sweep's settings

    @property
    def name(self) -> str:
        d = "none" if self.depth is None else self.depth
        return f"{self.tasks}-freeze{d}-n{self.size}-seed{self.seed}" + (f"-{self.arm}" if self.arm else "")

    def to_dict(self) -> dict:
        return {"tasks": self.tasks, "depth": self.depth, "size": self.size, "seed": self.seed,
                **({"arm": self.arm} if self.arm else {})}

    @classmethod
    def of(cls, record: dict) -> "RunKey":
        return cls(record["tasks"], record["depth"], record["size"], record["seed"], record.get("arm", ""))


def plan(tasks: Sequence[str], depths, sizes, seeds, arms: Sequence[str] = ("",)) -> list[RunKey]:
    """Seeds outermost, so that a sweep stopped early already holds whole seeds."""
    name = "+".join(tasks)
    return [RunKey(name, d, n, s, a) for s in seeds for n in sizes for d in depths for a in arms]


def schedule_arm(schedule: str) -> str:
    """The arm of a --schedules entry, a name fit for a folder: "" for fixed, else gradual-1epoch-floor1."""
    if schedule.strip() == "fixed":
        return ""
    return re.sub(r"[^A-Za-z0-9.%-]+", "-", schedule.strip().replace("=", "")).strip("-")


def schedule_arms(schedules: Sequence[str]) -> dict[str, dict]:
    """{arm: its overrides} of --schedules."""
    return {schedule_arm(s): ({"unfreeze_schedule": s} if schedule_arm(s) else {}) for s in schedules}


def read_results(path: str | os.PathLike, repair: bool = False) -> list[dict]:
    """The records of a results.jsonl. A line that is not a JSON object is skipped with a warning;
    repair=True also cuts a partial last line (no newline: the writer was killed) off the file, so
    that the next record starts on a line of its own."""
    path = Path(path)
    if not path.is_file():
        return []
    data = cut_torn_last_line(path, path.read_bytes(), repair, "the sweep was stopped while writing it")
    records = []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if not isinstance(r, dict):
                raise ValueError("not a JSON object")
            RunKey.of(r)
        except (ValueError, KeyError) as e:
            log.warning("%s:%d: skipping an unreadable record (%s)", path, n, e)
            continue
        records.append(r)
    return records


def cut_torn_last_line(path: Path, data: bytes, repair: bool, why: str) -> bytes:
    """data (path's bytes) without a partial last line (no newline: its writer was killed), with a warning;
    repair=True also cuts it off the file, so that the next line appended starts on a line of its own."""
    if not data or data.endswith(b"\n"):
        return data
    cut = data.rfind(b"\n") + 1
    try:
        if repair:
            with open(path, "r+b") as f:
                f.truncate(cut)
        done = "; removed it" if repair else ""
    except OSError as e:
        done = f"; could not remove it ({e.strerror or e})"
    log.warning("%s: ignoring a partial last line (%d bytes, %s)%s", path, len(data) - cut, why, done)
    return data[:cut]


def append_result(path: Path, record: dict) -> None:
    """One line appended and synced. A write that fails part-way (a full disk) is cut off again, so that
    the file never holds a torn line in the middle (only if nobody appended after it meanwhile)."""
    line = (json.dumps(record) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            _cut_back(path, fd, start, line)
            raise
    finally:
        os.close(fd)


def _cut_back(path: Path, fd: int, start: int, line: bytes) -> None:
    try:
        end = os.fstat(fd).st_size
        if start < end <= start + len(line) and path.read_bytes()[start:] == line[:end - start]:
            os.ftruncate(fd, start)
    except OSError:
        pass  # the partial line stays; the next start cuts it (read_results(repair=True))


def settings_of(cfg: TrainConfig) -> dict:
    """The settings a results file records of its runs, the precision as it resolves on this machine
    (--precision auto: bf16, fp16 or fp32 by the device), so that a result says what it ran in."""
    settings = {k: v for k, v in cfg.to_dict().items() if k not in PER_RUN}
    return {**settings, "precision": _resolved_precision(cfg.precision, cfg.device)}


def _resolved_precision(precision: str, device: str) -> str:
    from .device import pick_device, resolve_precision  # torch, once a sweep is under way
    return resolve_precision(precision, pick_device(device))[0]


def _legacy_auto(settings: dict) -> dict:
    """Results written before the precision was recorded resolved say "auto", which then meant bf16 on
    GPUs with native bf16 and on CPUs with AMX, else fp32: what it meant on this machine."""
    if settings.get("precision") != "auto":
        return settings
    import torch

    from .device import native_bf16, pick_device
    device = pick_device(settings.get("device", "auto"))
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    bf16 = native_bf16(device) is not None if device.type == "cuda" else device.type == "cpu" and amx()
    return {**settings, "precision": "bf16" if bf16 else "fp32"}


# --------------------------------------------------------------------------- one run, measured

def measure(cfg: TrainConfig, threads: int | None = None, report_dev: dict[str, str] | None = None) -> dict:
    """Train in this process and return the best dev metrics with time and memory figures. With
    report_dev ({task: dev file}; cfg's dev files are then a tuning split), the kept model (best.pt) is
    also scored on those files once training is over: "report" holds their metrics and predictions."""
    import resource

    import torch

    from .build import build_model
    from .trainer import train

    if threads:
        torch.set_num_threads(threads)
    cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    t0 = time.perf_counter()
    metrics = train(cfg)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cuda_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    report = score_kept_model(cfg, report_dev) if report_dev else None
    model, _, _ = build_model(cfg)  # after the measurement: only to count what freezing (and --peft) left trainable
    trainable, total = trainable_counts(model)
    return {"metrics": metrics, "wall_seconds": wall, "peak_rss_mib": peak, "base_rss_mib": base,
            "cuda_peak_mib": cuda_peak, "trainable_params": trainable, "total_params": total,
            "threads": torch.get_num_threads(), **({"report": report} if report else {})}


def score_kept_model(cfg: TrainConfig, dev_files: dict[str, str]) -> dict:
    """The run's kept model (OUT_DIR/best.pt) scored on each task's file: {"metrics": {sst_acc, ...,
    overall}, "predictions": {task: [per-example prediction, in the file's order]}}."""
    from heads import predict

    from .api import load
    from .evaluate import METRIC, overall, score

    model = load(cfg.out_dir, device=cfg.device, batch_size=cfg.eval_batch_size)
    metrics, predictions = {}, {}
    for task, path in dev_files.items():
        examples = load_task_file(path, task, labelled=True).examples
        preds = predict(task, model.outputs(task, examples)).double().numpy()
        metrics[METRIC[task]] = score(task, preds, [e.label for e in examples])
        predictions[task] = [round(float(x), 6) for x in preds] if task == "sts" else [int(x) for x in preds]
    return {"metrics": {**metrics, "overall": overall(metrics)}, "predictions": predictions}


def _child(cfg_dict: dict, threads: int | None, log_level: int, conn, report_dev: dict | None = None) -> None:
    """The training process: its reply ends with the stop signal it received, if any (its sweep stops too)."""
    setup_logging(log_level)
    exit_with_parent()
    with stop_after("run"):
        try:
            reply = ("ok", measure(TrainConfig.from_dict(cfg_dict), threads, report_dev))
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
            import traceback
            reply = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
        try:
            conn.send((*reply, signals.received()))
        except OSError:  # the sweep is gone (killed): nobody to tell
            pass
        finally:
            conn.close()


class RunFailed(RuntimeError):
    pass


def measure_isolated(cfg: TrainConfig, threads: int | None = None, report_dev: dict | None = None) -> dict:
    """measure(cfg) in a fresh spawned process (its own ru_maxrss and CUDA allocator)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(cfg.to_dict(), threads, logging.getLogger().getEffectiveLevel(), child,
                                         report_dev),
                    name=f"sweep:{Path(cfg.out_dir).name}")
    p.start()
    child.close()
    forward = lambda signum: p.terminate()  # noqa: E731 - a stop signal to the sweep stops the run after its step
    signals._on_stop.append(forward)
    try:
        if signals.received():  # came between the sweep's check and the start
            p.terminate()
        try:
            reply = parent.recv()
        except EOFError:
            p.join()
            if -(p.exitcode or 0) in (signal.SIGINT, signal.SIGTERM):  # stopped by a signal before its handler
                signals.record(-p.exitcode)
            raise RunFailed(f"the training process died without a result (exit code {p.exitcode})") from None
        p.join()
    finally:
        signals._on_stop.remove(forward)
        if p.is_alive():  # interrupted while waiting: SIGTERM makes the trainer stop cleanly
            p.terminate()
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    if reply[-1]:
        signals.record(reply[-1])  # the run ends, and then the sweep
    if reply[0] == "error":
        log.debug("%s", reply[2])
        raise RunFailed(f"{reply[1]}\n{reply[2]}")
    return reply[1]


# --------------------------------------------------------------------------- the sweep

def base_config(args: argparse.Namespace) -> TrainConfig:
    """The training options every run of the sweep gets: the flags over TrainConfig's defaults, with
    checkpoints at epoch ends only."""
    return config_from_args(args, TrainConfig(save_every=0, keep_last=1))


def _clean_run_dir(run_dir: Path, out: Path) -> None:
    """Remove what an interrupted run of this sweep left, and nothing else."""
    if run_dir.exists():
        marker = run_dir / MARKER
        if not marker.is_file() and any(run_dir.iterdir()):
            raise SystemExit(f"{run_dir} exists and is not a sweep run directory; refusing to delete it "
                             f"(move it, or pass another --runs-dir)")
        owner = json.loads(marker.read_text()).get("out") if marker.is_file() else None
        if owner is not None and owner != str(out.resolve()):
            raise SystemExit(f"{run_dir} belongs to the sweep in {owner}; refusing to delete it "
                             f"(pass another --runs-dir)")
        log.info("%s: left over from an interrupted run; starting it again", run_dir)
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)


def run_sweep(args: argparse.Namespace) -> int:
    out, runs_dir = Path(args.out), Path(args.runs_dir or default_runs_dir(args.out))
    base = base_config(args)
    problem = None if args.dry_run else writable_problem({"--out": out, "--runs-dir": runs_dir})
    records = read_results(out / RESULTS, repair=not args.dry_run)
    problem = problem or settings_clash(records, settings_of(base), out / RESULTS) or None
    subsets = None if problem else training_subsets(args, base)
    if problem or isinstance(subsets, str):
        print(f"training.sweep: error: {problem or subsets}", file=sys.stderr)
        return 2
    arms = schedule_arms(args.schedules)
    keys = plan(args.tasks, args.depths, args.sizes, args.seeds, list(arms))
    if args.dry_run:
        done = {RunKey.of(r) for r in records}
        for k in keys:
            print(f"{'done' if k in done else 'todo'}  {k.name}")
        return 0
    return work(args, base, lambda records: keys, arms, subsets, out, runs_dir)


def work(args, base: TrainConfig, plan_of, arms: dict[str, dict], subsets: dict, out: Path, runs_dir: Path,
         after_each=None, annotate=None) -> int:
    """Run every planned key not yet in results.jsonl, one at a time, appending each result as it finishes.

    plan_of(records) gives the keys to have, in order, from the results so far (the study's later
    stages depend on earlier results), so it is asked again after every run, and after_each() is called
    once each result is recorded (the study rewrites its report); annotate(key) adds fields to a record
    (the study's seed role). arms: anything with .get(arm, default) giving an arm's overrides. Several workers (this
    command started again, in another shell) share the work: each run is claimed with a lock file in
    runs_dir, and a run claimed by a live process is left to it. SIGINT/SIGTERM stop the worker after
    the current run (whose training stops after its step: the run starts again on the next start)."""
    results_path, settings = out / RESULTS, settings_of(base)
    runs_dir.mkdir(parents=True, exist_ok=True)
    failures, spent, busy = [], [], set()
    with stop_after("run"):
        while not signals.received():
            records = read_results(results_path)
            done, planned = {RunKey.of(r) for r in records}, plan_of(records)
            clean_leftovers(runs_dir, done, out, args.keep_checkpoints)
            todo = [k for k in planned if k not in done and k not in failures]
            key = claim_next(runs_dir, [k for k in todo if k not in busy], busy, results_path)
            if key is None:
                break
            eta = f", about {len(todo) * sum(spent) / len(spent) / 60:.0f} min left" if spent else ""
            log.info("run %d/%d: %s%s", len(planned) - len(todo) + 1, len(planned), key.name, eta)
            try:
                record = one_run(args, base, key, subsets, out, runs_dir, settings, arms.get(key.arm, {}),
                                 annotate)
            except (RunFailed, TrainingInterrupted, KeyboardInterrupt) as e:
                if signals.received():  # stopped by a signal (a second Ctrl-C in training: at once), not failed:
                    break               # the run starts again on the next start
                if isinstance(e, KeyboardInterrupt):
                    raise
                log.error("run %s failed: %s", key.name, e)
                failures.append(key)
                if not args.keep_going:
                    print(f"training.sweep: error: run {key.name} failed (its log: {runs_dir / key.name / 'train.log'}"
                          f"); the finished runs are kept, rerun the same command to go on", file=sys.stderr)
                    return 1
                continue
            if isinstance(record, str):
                print(f"training.sweep: error: {record}", file=sys.stderr)
                return 1
            spent.append(record["wall_seconds"])
            log.info("%s done in %.0f s: dev %s", key.name, record["wall_seconds"],
                     " ".join(f"{k} {v:.4f}" for k, v in record["dev"].items()))
            if after_each is not None:
                after_each()
        if signals.received():
            print(f"training.sweep: stopped by {signal.Signals(signals.received()).name} ({len(spent)} run(s) "
                  f"finished and recorded); rerun the same command to go on", file=sys.stderr)
            return signals.exit_status()
    if failures:
        print(f"training.sweep: {len(failures)} run(s) failed: {', '.join(k.name for k in failures)}; rerun the "
              f"same command to retry them", file=sys.stderr)
        return 1
    busy = [k for k in busy if k not in {RunKey.of(r) for r in read_results(results_path)}]
    if busy:
        log.info("%d run(s) are being trained by another worker: %s", len(busy), ", ".join(k.name for k in busy))
    else:
        log.info("sweep complete: %s; summarise with `python -m training.report %s`", results_path, out)
    return 0


def one_run(args, base: TrainConfig, key: RunKey, subsets: dict, out: Path, runs_dir: Path, settings: dict,
            overrides: dict, annotate=None) -> dict | str:
    """Train key's claimed run (or take the record a full disk kept beside it), record it, clean it up,
    release its claim; the record, or the one line saying why it could not be recorded. The order
    matters to a worker killed in between: a claim left on a recorded run means its clean-up is due
    (clean_leftovers)."""
    run_dir, results_path, cleaned = runs_dir / key.name, out / RESULTS, False
    try:
        kept = kept_record(run_dir, key, settings)
        if kept is None:
            m = sweep_run(args, base, key, subsets, run_dir, out, overrides)
            record = {**result_record(args, base, key, subsets, run_dir, m, settings, overrides),
                      **(annotate(key) if annotate else {})}
            kept = record, m["report"]["predictions"] if "report" in m else None
        problem = record_or_keep(out, key, *kept, run_dir)
        if problem:
            return problem
        clean_recorded_run(run_dir, args.keep_checkpoints)
        cleaned = True
        return kept[0]
    finally:  # stopped at once (a second signal) between the record and its clean-up: clean up before letting go
        if not cleaned and key in {RunKey.of(r) for r in read_results(results_path)}:
            clean_recorded_run(run_dir, args.keep_checkpoints)
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
    if holder.get("host") != socket.gethostname():
        return True  # another machine's worker: we cannot tell, so it is left alone
    try:
        os.kill(int(holder["pid"]), 0)
    except (KeyError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def settings_clash(records: list[dict], settings: dict, results_path: Path) -> str:
    """Results made with other training settings cannot share a results file. An option a record lacks
    (added to TrainConfig since) counts at its default, which that record's run had."""
    defaults = settings_of(TrainConfig())
    clash = [r for r in records if {**defaults, **_legacy_auto(r.get("settings", settings))} != settings]
    if not clash:
        return ""
    old = {**defaults, **_legacy_auto(clash[0]["settings"])}
    diff = [f"{k}: {old.get(k)!r} there, {v!r} now" for k, v in settings.items() if old.get(k) != v]
    diff += [f"{k}: {v!r} there, absent now" for k, v in old.items() if k not in settings]
    return (f"{results_path} holds {len(clash)} result(s) made with other settings ({'; '.join(diff)}); "
            f"use another --out")


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


def training_subsets(args: argparse.Namespace, base: TrainConfig, flag: str = "--sizes") -> dict | str:
    """Every training subset, (task, seed) -> size -> examples, made before any training (a bad size fails
    now, not an hour in); or the error, naming `flag`. With args.tuning_split ({"share", "seed"}; training.study's), a
    stratified tuning split is first taken out of each training file, kept as (task, TUNE) -> examples,
    and the subsets are drawn from the rest ("all": the whole rest)."""
    subsets: dict[tuple[str, int | str], dict[int | str, list[Example]] | list[Example]] = {}
    split = getattr(args, "tuning_split", None)
    for task in args.tasks:
        full = load_task_file(base.file(task, "train"), task, labelled=True).examples
        if split:
            tune, rest = tuning_split(strata(task, [e.label for e in full]), split["share"], split["seed"])
            subsets[task, TUNE] = [full[i] for i in tune]
            full = [full[i] for i in rest]
        wanted = [len(full) if n == "all" else n for n in args.sizes]
        too_big = [n for n in wanted if n > len(full)]
        if too_big:
            return (f"{flag} {too_big[0]}: {task} has only {len(full)} training examples in "
                    f"{base.file(task, 'train')}")
        labels = strata(task, [e.label for e in full])
        for seed in args.seeds:
            idx = stratified_nested_subsets(labels, wanted, seed)
            subsets[task, seed] = {n: [full[i] for i in idx[w]] for n, w in zip(args.sizes, wanted)}
    return subsets


def sweep_run(args, base: TrainConfig, key: RunKey, subsets: dict, run_dir: Path, out: Path,
              overrides: dict | None = None) -> dict:
    """One run of the grid in its own directory, on its training subsets, with its arm's overrides."""
    _clean_run_dir(run_dir, out)
    (run_dir / MARKER).write_text(json.dumps({**key.to_dict(), "out": str(out.resolve())}) + "\n")
    files, report_dev = {}, {}
    for task in args.tasks:
        path = run_dir / f"{task}-train-subset.csv"
        write_course_file(path, task, subsets[task, key.seed][key.size])
        files[f"{task}_train"] = str(path)
        if (task, TUNE) in subsets:  # the tuning split stands in for dev during training; dev only reports
            files[f"{task}_dev"] = str(run_dir / f"{task}-tune-split.csv")
            write_course_file(files[f"{task}_dev"], task, subsets[task, TUNE])
            report_dev[task] = base.file(task, "dev")
    cfg = TrainConfig.from_dict({**base.to_dict(), **(overrides or {}), "files": files, "freeze_upto": key.depth,
                                 "seed": key.seed,
                                 "out_dir": str(run_dir), "predictions_dir": str(run_dir / "predictions"),
                                 "cache_dir": str(run_dir.parent / ".frozen-cache")})
    runner = measure if args.in_process else measure_isolated
    return runner(cfg, args.threads, report_dev) if report_dev else runner(cfg, args.threads)


def result_record(args, base: TrainConfig, key: RunKey, subsets: dict, run_dir: Path, m: dict,
                  settings: dict, overrides: dict | None = None) -> dict:
    """The line results.jsonl keeps of a finished run."""
    from .rundir import read_metrics
    rows = read_metrics(run_dir / "metrics.jsonl")
    epochs = [r for r in rows if "train_seconds" in r]
    evals = [r for r in rows if r.get("dev_overall") is not None]
    best_epoch = max(evals, key=lambda r: r["dev_overall"])["epoch"] if evals else None
    split = getattr(args, "tuning_split", None)
    # With a tuning split the trainer's "dev" was that split: it chose the kept evaluation (best_epoch);
    # the dev sets scored the kept model once, afterwards.
    selection = {"dev": m["report"]["metrics"], "tune": m["metrics"],
                 "split": {**split, "n_tune": {t: len(subsets[t, TUNE]) for t in args.tasks}},
                 "tune_curve": [[r["step"], r["epoch"], round(r["dev_overall"], 6)] for r in evals],
                 "lr": (overrides or {}).get("lr", base.lr)} if split else {"dev": m["metrics"]}
    return {**key.to_dict(), **selection,
            "best_epoch": best_epoch, "epochs": base.epochs, "epochs_run": len(epochs),
            "n_train": {t: len(subsets[t, key.seed][key.size]) for t in args.tasks},
            "wall_seconds": round(m["wall_seconds"], 2),
            "train_seconds": round(sum(r["train_seconds"] for r in epochs), 2),
            "epoch_seconds": [r["train_seconds"] for r in epochs],
            "frozen_cache_seconds": sum(r.get("frozen_cache_seconds", 0) for r in epochs) or None,
            "peak_rss_mib": None if args.in_process else round(m["peak_rss_mib"], 1),
            "base_rss_mib": None if args.in_process else round(m["base_rss_mib"], 1),
            "cuda_peak_mib": None if m["cuda_peak_mib"] is None else round(m["cuda_peak_mib"], 1),
            "trainable_params": m["trainable_params"], "total_params": m["total_params"],
            "trainable_share": share(m["trainable_params"], m["total_params"]),
            "threads": m["threads"], "run_dir": str(run_dir), **provenance(),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "settings": settings,
            **({"overrides": overrides} if overrides else {})}


def provenance() -> dict:
    """Where a record was made: the code's commit (and whether its tree had uncommitted changes) and the
    CPU, since a study's runs span days, code changes and machines."""
    import subprocess

    from .device import cpu_model

    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=30).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                    capture_output=True, text=True, timeout=30).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit, "dirty": dirty, "cpu": cpu_model()}


def write_dev_predictions(out: Path, key: RunKey, predictions: dict) -> str:
    """A run's per-example dev predictions, gzipped JSON beside results.jsonl (the run directory is not
    kept): the bootstrap over dev examples reads them. Returns the path relative to out."""
    import gzip

    folder = out / PREDICTIONS
    folder.mkdir(parents=True, exist_ok=True)
    path, tmp = folder / f"{key.name}.json.gz", folder / f".{key.name}.json.gz.tmp"
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump(predictions, f)
    os.replace(tmp, path)
    return str(path.relative_to(out))


def default_runs_dir(out: str | os.PathLike) -> Path:
    """runs/<name of OUT>-<hash of its full path>-runs: two sweeps whose OUT folders share a name
    (expA/sweep, expB/sweep) must not share run directories."""
    out = Path(out).resolve()
    return Path("runs") / f"{out.name}-{hashlib.sha1(str(out).encode()).hexdigest()[:8]}-runs"


# --------------------------------------------------------------------------- command line

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    g.add_argument("--out", default="runs/sweep", help="folder for results.jsonl (and the report) (default: %(default)s)")
    g.add_argument("--runs-dir", default=None, help="folder for the run directories (checkpoints, logs, the subset "
                   "files) (default: runs/<name of OUT>-<hash of its path>-runs)")
    for name in ("data_dir", "model"):
        add_option(g, TrainConfig.__dataclass_fields__[name], help_suffix=" (default: %(default)s)")

    g = p.add_argument_group("training (passed to every run; see run_multitask.py --help)")
    for f in options():
        if f.name in SWEEP_OPTIONS:
            add_option(g, f, help_suffix="" if f.metadata["default_text"] else " (default: %(default)s)")
    g.add_argument("--log-every", type=int, default=2, help="log running losses every N steps, for "
                   "`python -m training.report --curves` (default: %(default)s)")

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


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
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
    return run_sweep(args)


def schedules_problem(args) -> str | None:
    """Each of --schedules on its own, and against the model at every depth it starts from."""
    from .freezing import parse_schedule, schedule_error
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
            return f"--depths {next(d for d in args.depths if isinstance(d, str))}: cannot read the depth of {args.model}"
        return None
    for d in args.depths:
        problem = depth_error(d, layers, args.model)
        if problem:
            return problem.replace("--freeze-upto", "--depths")
    args.depths = _unique([freeze_depth(d, layers) for d in args.depths])
    return None


def model_layers(model: str) -> int | None:
    """The model's depth from its config.json, or None when it cannot be read cheaply."""
    try:
        from minbert import resolve_checkpoint
        return int(json.loads((resolve_checkpoint(model) / "config.json").read_text())["num_hidden_layers"])
    except Exception:  # noqa: BLE001 - the run itself will say what is wrong
        return None


if __name__ == "__main__":
    sys.exit(main())
