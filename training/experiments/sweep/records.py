"""A sweep's record: the plan's keys, results.jsonl (appended one line per finished run, a torn last line
cut), the settings every record must share, and each record's fields and provenance.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from training.config.train_config import TrainConfig
from training.experiments.sweep.subsets import TUNE, Grid
from training.methods.peft import share
from training.run.metrics_file import epoch_records, evaluations, kept_evaluation, read_metrics, training_seconds

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
PREDICTIONS = "dev-predictions"  # beside results.jsonl: each run's per-example dev predictions, for the bootstrap

# The training options a sweep passes on to every run (the rest are per run, or TrainConfig's defaults).
SWEEP_OPTIONS = ("epochs", "lr", "batch_size", "eval_batch_size", "max_length", "pair_encoding", "pooling",
                 "head_dropout", "ema_decay", "predict_both_orders", "warmup_ratio", "weight_decay", "task_sampling",
                 "frozen_cache", "device", "precision", "peft")
# TrainConfig fields that differ between the runs of one sweep or do not change results: left out of the
# settings every record of a results file must share.
PER_RUN = ("out_dir", "predictions_dir", "test_predictions", "files", "freeze_upto", "seed", "max_train_examples",
           "tasks", "cache_dir", "resume", "log_every", "save_every", "keep_last", "export_hf")


@dataclass(frozen=True)
class RunKey:
    tasks: str           # "sst", "sst+para", ...
    depth: int | None    # --freeze-upto; None: full fine-tuning
    size: int | str      # training examples per task, or "all"
    seed: int
    arm: str = ""        # a named set of option overrides (training.experiments.study's arms); "": the sweep's settings

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
    from training.common.device import pick_device, resolve_precision  # torch, once a sweep is under way
    return resolve_precision(precision, pick_device(device))[0]


def completed_settings(settings: dict, defaults: dict | None = None) -> dict:
    """A record's settings as today's TrainConfig states them: an option the record lacks (added since)
    at its default, which that record's run had. defaults: settings_of(TrainConfig()), for a caller
    completing many records (building it costs a third of a millisecond)."""
    return {**(settings_of(TrainConfig()) if defaults is None else defaults), **settings}


def settings_clash(records: list[dict], settings: dict, results_path: Path, then: str = "; use another --out") -> str:
    """Results made with other training settings cannot share a results file. An option a record lacks
    (added to TrainConfig since) counts at its default (completed_settings). `then` ends the message
    (what to do about it)."""
    defaults = settings_of(TrainConfig())
    clash = [r for r in records if completed_settings(r.get("settings", settings), defaults) != settings]
    if not clash:
        return ""
    old = completed_settings(clash[0]["settings"], defaults)
    diff = [f"{k}: {old.get(k)!r} there, {v!r} now" for k, v in settings.items() if old.get(k) != v]
    diff += [f"{k}: {v!r} there, absent now" for k, v in old.items() if k not in settings]
    return f"{results_path} holds {len(clash)} result(s) made with other settings ({'; '.join(diff)}){then}"


def result_record(grid: Grid, base: TrainConfig, key: RunKey, subsets: dict, run_dir: Path, m: dict,
                  settings: dict, overrides: dict | None = None, in_process: bool = False) -> dict:
    """The line results.jsonl keeps of a finished run."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    epochs, evals, kept = epoch_records(rows), evaluations(rows), kept_evaluation(rows)
    best_epoch = kept["epoch"] if kept else None
    changes = [[r["step"], r["frozen_depth"]] for r in rows if "frozen_depth" in r]  # a freezing schedule's moves
    split = grid.tuning_split
    # With a tuning split the trainer's "dev" was that split: it chose the kept evaluation (best_epoch);
    # the dev sets scored the kept model once, afterwards.
    selection = {"dev": m["report"]["metrics"], "tune": m["metrics"],
                 "split": {**split, "n_tune": {t: len(subsets[t, TUNE]) for t in grid.tasks}},
                 "tune_curve": [[r["step"], r["epoch"], round(r["dev_overall"], 6)] for r in evals],
                 "lr": (overrides or {}).get("lr", base.lr)} if split else {"dev": m["metrics"]}
    return {**key.to_dict(), **selection,
            "best_epoch": best_epoch, "epochs": (overrides or {}).get("epochs", base.epochs), "epochs_run": len(epochs),
            "n_train": {t: len(subsets[t, key.seed][key.size]) for t in grid.tasks},
            "wall_seconds": round(m["wall_seconds"], 2),
            "train_seconds": training_seconds(rows),
            "epoch_seconds": [r["train_seconds"] for r in epochs],
            "frozen_cache_seconds": sum(r.get("frozen_cache_seconds", 0) for r in epochs) or None,
            "peak_rss_mib": None if in_process else round(m["peak_rss_mib"], 1),
            "base_rss_mib": None if in_process else round(m["base_rss_mib"], 1),
            "cuda_peak_mib": None if m["cuda_peak_mib"] is None else round(m["cuda_peak_mib"], 1),
            "trainable_params": m["trainable_params"], "total_params": m["total_params"],
            "trainable_share": share(m["trainable_params"], m["total_params"]),
            "threads": m["threads"], "run_dir": str(run_dir), **provenance(),
            "gpu": m.get("gpu"),  # the GPU it trained on (None: the CPU)
            **({"resumed": True} if m.get("resumed") else {}),  # its wall_seconds count the last part only
            **({"depth_changes": changes} if changes else {}),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "settings": settings,
            **({"overrides": overrides} if overrides else {})}


def provenance() -> dict:
    """Where a record was made: the code's commit (and whether its tree had uncommitted changes) and the
    CPU with its bf16 instructions (None: bf16 emulated), since a study's runs span days, code changes and
    machines, and one CPU model name covers machines with and without them."""
    import subprocess

    from training.common.device import cpu_bf16, cpu_model

    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=30).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                    capture_output=True, text=True, timeout=30).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit, "dirty": dirty, "cpu": cpu_model(), "cpu_bf16": cpu_bf16()}


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
