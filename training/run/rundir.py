"""The run directory (--out-dir): which checkpoint a resume continues from and whether it fits, what an
earlier run left and when it may go, train.log and metrics.jsonl's writer (its reader: metrics_file.py).
Nothing here knows the checkpoint format beyond the few fields a resume checks."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np

from data.loaders import TASKS
from minbert.checkpoint import human_bytes
from training.common.errors import ConfigError, write_error
from training.common.processes import process_alive
from training.common.progress import LOG_FORMAT
from training.config.train_config import TrainConfig, resume_may_differ
from training.inference.predictions import read_manifest, test_outputs_in
from training.run.checkpointing import RollingCheckpoints, read_checkpoint
from training.run.metrics_file import truncate_metrics

log = logging.getLogger(__name__)


def find_resume_checkpoint(cfg: TrainConfig, out_dir: Path, quiet: bool = False) -> dict | None:
    """--resume auto|PATH -> the checkpoint to continue from, after checking it fits this config. auto
    takes the newest checkpoint that can be read: one damaged by a crash or a power loss is skipped,
    with a warning that names it and says why. quiet: a first look (the sweep's), which leaves the log
    lines to the resume itself."""
    if not cfg.resume:
        return None
    if cfg.resume == "auto":
        found = _newest_readable_checkpoint(out_dir, quiet)
        if found is None:
            if not quiet:
                log.info("--resume auto: no checkpoint in %s, starting a new run", out_dir / "checkpoints")
            return None
        path, ckpt = found
    else:
        path = Path(cfg.resume)
        if not path.is_file():
            raise ConfigError(f"--resume {path}: no such checkpoint")
        ckpt = read_training_checkpoint(path, out_dir)
    old, may_differ = ckpt["config"], resume_may_differ()
    diff = [f"--{k.replace('_', '-')} was {old.get(k)!r}, now {v!r}" for k, v in cfg.to_dict().items()
            if k not in may_differ and old.get(k) != v]
    # the cache keeps the prefix in fp16, and auto runs a phase too short to be worth one without it: only
    # memory and disk, the same cache in two places, may stand for each other
    caches = {old.get("frozen_cache", cfg.frozen_cache), cfg.frozen_cache}
    if len(caches) > 1 and caches != {"memory", "disk"}:
        diff.append(f"--frozen-cache was {old.get('frozen_cache')!r}, now {cfg.frozen_cache!r} (only memory and disk "
                    f"give the same numbers)")
    if diff:
        hint = f". {more_epochs_hint(cfg, out_dir)}" if old.get("epochs") != cfg.epochs else ""
        raise ConfigError(f"--resume {path}: the checkpoint comes from an incompatible config: {'; '.join(diff)}{hint}")
    _check_best_for_resume(ckpt, path, out_dir)
    if not quiet:
        log.info("resuming from %s", path)
    return ckpt


def read_training_checkpoint(path: Path, out_dir: Path) -> dict:
    """A training checkpoint with the parts a resume reads, else ConfigError of one line saying why not."""
    try:
        ckpt = read_checkpoint(path)
    except RuntimeError as e:
        raise ConfigError(f"--resume {e}") from None
    if "optimizer" not in ckpt and "model" in ckpt:
        raise ConfigError(f"--resume {path}: not a training checkpoint (best.pt holds only the model; "
                          f"resume from {out_dir / 'checkpoints'})")
    lacks = [k for k in ("model", "optimizer", "config", "run_state") if not isinstance(ckpt.get(k), dict)]
    if lacks:
        raise ConfigError(f"--resume {path}: not a training checkpoint of minBERT-MT (no {', '.join(lacks)})")
    return ckpt


def _newest_readable_checkpoint(out_dir: Path, quiet: bool = False) -> tuple[Path, dict] | None:
    """The newest of OUT_DIR/checkpoints that reads as a training checkpoint, and its contents. quiet: a
    first look (finished_run), which leaves the warnings to the resume itself."""
    skipped = []
    for path in reversed(RollingCheckpoints(out_dir, 1).all()):
        try:
            ckpt = read_training_checkpoint(path, out_dir)
        except ConfigError as e:
            skipped.append(path)
            if not quiet:
                log.warning("--resume auto: skipping the checkpoint %s", str(e).removeprefix("--resume "))
            continue
        if quiet:
            return path, ckpt
        if skipped:
            log.warning("--resume auto: resuming from %s, an older checkpoint than %s, which cannot be read; the "
                        "steps after it are trained again", path.name, ", ".join(p.name for p in skipped))
        return path, ckpt
    if skipped and not quiet:
        raise ConfigError(f"--resume auto: none of the {len(skipped)} checkpoint(s) in {out_dir / 'checkpoints'} can "
                          f"be read (see the warnings above); pass --overwrite to start afresh")
    return None


def _check_best_for_resume(ckpt: dict, path: Path, out_dir: Path) -> None:
    """The resumed run keeps its best score, so OUT_DIR/best.pt must hold that epoch's weights: the
    run only rewrites it when a later epoch does better, and predicts with it at the end."""
    state = ckpt["run_state"]
    if not state["best_metrics"]:
        return  # no epoch finished yet
    best = out_dir / "best.pt"
    if not best.is_file():
        raise ConfigError(f"--resume {path}: the run's best epoch so far (dev {state['best']:.4f}) is not in "
                          f"{best}; resume with the run's own --out-dir, or copy its best.pt there")
    saved = read_checkpoint(best)
    # best.pt may also be newer than the checkpoint (written at an epoch end just before a crash):
    # the resumed run replays that epoch exactly and writes it again.
    if saved.get("metrics") != state["best_metrics"] and saved.get("step", -1) <= state["global_step"]:
        raise ConfigError(f"--resume {path}: {best} holds another model (dev {saved.get('metrics')}) than the "
                          f"run's best epoch so far ({state['best_metrics']}); resume with the run's own "
                          f"--out-dir")


# Options that change nothing a finished run has written (its checkpoints, best.pt, records, prediction
# files): resuming one with other values of these finds nothing to redo. The others, where a resume may
# change them (--predictions-dir, --max-eval-examples, --export-hf, the data location), make it write
# its predictions again.
_NOT_IN_A_FINISHED_RUN = {"resume", "overwrite", "out_dir", "device", "compile", "log_every", "report_to",
                          "save_every", "keep_last", "max_bad_steps", "eval_batch_size", "eval_tokens",
                          "evals_per_epoch", "early_stop_patience", "frozen_cache", "cache_dir"}


def finished_run(cfg: TrainConfig, out_dir: Path) -> dict | None:
    """--resume auto on a run that trained all its epochs (or stopped early, by this --early-stop-patience)
    and wrote its prediction files with these settings: its run state, found by reading files only, so
    that the command can say so and write nothing. None when there is work left (or no --resume auto).
    A finished run asked for another --epochs is refused here: see more_epochs_hint."""
    found = _newest_readable_checkpoint(out_dir, quiet=True) if cfg.resume == "auto" else None
    if found is None:
        return None
    state, old = found[1]["run_state"], found[1]["config"]
    patience = cfg.early_stop_patience
    if state["epoch"] < old.get("epochs", 0) and (patience is None or state.get("evals_since_best", 0) < patience):
        return None
    changed = [k for k, v in cfg.to_dict().items() if k not in _NOT_IN_A_FINISHED_RUN and old.get(k) != v
               and not (k == "test_predictions" and not v)]  # fewer files than it wrote: none is to be removed
    if changed == ["epochs"]:
        raise ConfigError(f"--resume auto: {out_dir} holds a finished run of {old['epochs']} epoch(s), and "
                          f"--epochs is now {cfg.epochs}. {more_epochs_hint(cfg, out_dir)}")
    manifest = read_manifest(cfg.predictions_folder())
    written = (isinstance(manifest, dict) and manifest.get("run") == str(out_dir.resolve())
               and manifest.get("dev_metrics") == state["best_metrics"])
    if changed or not written or (cfg.export_hf and not Path(cfg.export_hf).is_dir()):
        return None  # the resume refuses another config, or writes the predictions (and export) again
    return state


def check_test_predictions_kept(cfg: TrainConfig) -> None:
    """A resumed run writes its prediction set again at its end (a finished run whose prediction options
    changed, at once), and a set replaces the folder whole: a test file there that the run will not write
    again would be lost. Refused unless --overwrite, before any work."""
    def not_written(task: str) -> str | None:  # why the run writes no test predictions for task
        if task not in cfg.tasks:
            return "not in --tasks"
        if not cfg.test_predictions:
            return "--no-test-predictions"
        path = cfg.file(task, "test")
        return None if os.path.isfile(path) else f"{path}: not found"

    folder = cfg.predictions_folder()
    lost = test_outputs_in(folder, [t for t in TASKS if not_written(t)])
    if lost and not cfg.overwrite:
        why = "; ".join(f"{name} ({not_written(name.split('-')[0])})" for name in lost)
        raise ConfigError(f"--predictions-dir {folder} holds test predictions this resumed run would not write "
                          f"again, and its new set replaces the folder whole: {why}; give the test file "
                          f"(--data-dir, --sst-test, ...), another --predictions-dir, or --overwrite to lose them")


def more_epochs_hint(cfg: TrainConfig, out_dir: Path) -> str:
    """Why a run's --epochs cannot change on resume, and what to do instead."""
    return (f"A run's learning rate warms up and then decays linearly to 0 over the epochs it was started "
            f"with, so more (or fewer) epochs is another schedule from step 0, not that run continued; to "
            f"train {cfg.epochs} epochs, start a new run with --epochs {cfg.epochs} and another --out-dir (or "
            f"--overwrite); to train on from this run's weights, export them (python -m training.export "
            f"{out_dir} DIR) and start a new run with --model DIR (its heads start afresh)")


def earlier_run_files(out_dir: Path) -> list[Path]:
    """What a new run in out_dir would replace: an earlier run's best.pt, training checkpoints and
    metrics.jsonl."""
    out_dir = Path(out_dir)
    found = [p for p in (out_dir / "best.pt", out_dir / "metrics.jsonl") if p.is_file() and p.stat().st_size]
    return found + RollingCheckpoints(out_dir, 1).all() + sorted((out_dir / TENSORBOARD).glob(TENSORBOARD_EVENTS))


def earlier_run_to_replace(out_dir: Path, overwrite: bool, resume_auto: bool) -> list[Path]:
    """An earlier run's files that a new run in out_dir replaces, refused unless told to. Called
    before any heavy work; the files go only once the new run's model and data have loaded."""
    found = earlier_run_files(out_dir)
    if not found or overwrite:
        return found
    names = ", ".join(str(p.relative_to(out_dir)) for p in found[:4]) + (" ..." if len(found) > 4 else "")
    if not resume_auto:
        raise ConfigError(f"--out-dir {out_dir} holds an earlier run ({names}): pass --resume auto to continue it, "
                          f"--overwrite to replace it, or another --out-dir")
    # --resume auto found no checkpoint (find_resume_checkpoint said so)
    if (out_dir / "best.pt").is_file():
        raise ConfigError(f"--out-dir {out_dir} holds an earlier run ({names}) but no training checkpoint to "
                          f"continue it from: pass --overwrite to replace it, or another --out-dir")
    log.warning("--resume auto: %s holds only the records of a run stopped before its first checkpoint; "
                "starting afresh replaces them", out_dir)
    return found


def remove_earlier_run(found: list[Path]) -> None:
    """Old step checkpoints would otherwise outlive the new ones in the rolling window, and old records
    mix with the new."""
    for p in found:
        p.unlink()
        log.info("removed %s of the earlier run", p)


def drop_earlier_log(path: Path, start: int) -> None:
    """Keep only what this run wrote to train.log (its bytes from `start` on): the replaced run's lines
    go with its records. The log handler appends (O_APPEND), so it writes on at the new end."""
    if start <= 0 or not path.is_file():
        return
    with open(path, "r+b") as f:
        f.seek(start)
        rest = f.read()
        f.seek(0)
        f.write(rest)
        f.truncate()
    log.info("%s: dropped the earlier run's %d bytes of log", path, start)


# Temp names of this project's writers, and only of the files they write: atomic_save's
# NAME.PID.RANDOM.tmp (NAME.RANDOM.tmp before it named the pid), write_predictions' NAME.PID.tmp,
# truncate_metrics' metrics.jsonl.PID.tmp, save_hf's model.safetensors.tmp, and the frozen-prefix
# cache's TASK.S[.offsets].PID.tmp.npy and meta.PID.tmp.json (in its entries' folders).
_TEMP_NAME = re.compile(r"(?P<name>best\.pt|step-\d+\.pt|metrics\.jsonl|(?:sst|para|sts)-(?:dev|test)-output\.csv"
                        r"|model\.safetensors)(?:\.(?P<pid>\d+))?(?:\.[a-z0-9_]{8})?\.tmp"
                        r"|(?:(?:sst|para|sts)\.\d+(?:\.offsets)?|meta)\.(?P<cache_pid>\d+)\.tmp\.(?:npy|json)")
# Folders of predictions.write_prediction_set: the new set .FOLDER.PID.RANDOM.tmp and the replaced one
# .FOLDER.old-PID, removed only when they hold nothing but a prediction set's files.
_TEMP_DIR = re.compile(r"\.[^/]+?\.(?:(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp|old-(?P<old_pid>\d+))")
_SET_FILE = re.compile(r"(?:sst|para|sts)-(?:dev|test)-output\.csv(?:\.\d+\.tmp)?|manifest\.json")


def remove_stale_temp_files(dirs: list[Path], started: float) -> list[Path]:
    """Remove the temp files (and prediction-set folders) that writes killed mid-way left in `dirs`, each
    up to a checkpoint's size: names of our own writers only, last written before this run started, and
    whose writer, where the name says which process, is no longer alive. Returns what was removed."""
    removed, total = [], 0
    for d in dict.fromkeys(Path(x) for x in dirs):
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            pid = _temp_writer(p)
            if pid is False:
                continue
            if p.stat().st_mtime >= started or (pid and process_alive(pid)):
                log.info("%s: left alone, another process may be writing it", p)
                continue
            total += _remove(p)
            removed.append(p)
    if removed:
        log.warning("removed %d temp file(s) or folder(s) of writes cut short by an earlier crash (%s): %s",
                    len(removed), human_bytes(total), ", ".join(map(str, removed)))
    return removed


def _temp_writer(p: Path) -> str | None | bool:
    """False: not one of our writers' temp files or folders; else the writer's pid where the name says it."""
    if p.is_symlink():
        return False
    if p.is_file() and (match := _TEMP_NAME.fullmatch(p.name)):
        return match["pid"] or match["cache_pid"]
    if p.is_dir() and (match := _TEMP_DIR.fullmatch(p.name)):
        inside = list(p.iterdir())
        if all(q.is_file() and not q.is_symlink() and _SET_FILE.fullmatch(q.name) for q in inside):
            return match["pid"] or match["old_pid"]
    return False


def _remove(p: Path) -> int:
    """Bytes freed by removing a temp file or a prediction-set folder of files."""
    if p.is_dir():
        size = sum(q.stat().st_size for q in p.iterdir())
        shutil.rmtree(p, ignore_errors=True)
        return size
    size = p.stat().st_size
    p.unlink(missing_ok=True)
    return size


TENSORBOARD = "tensorboard"  # OUT_DIR/tensorboard under --report-to tensorboard
TENSORBOARD_EVENTS = "events.out.tfevents.*"


class MetricsLog:
    """OUT_DIR/metrics.jsonl: one JSON record per line, flushed as written. A resumed run first drops
    the records after its checkpoint's step (it writes those steps again). With `tensorboard`, each
    record also goes to OUT_DIR/tensorboard."""

    def __init__(self, path: Path, resume_step: int | None = None, tensorboard: bool = False):
        if resume_step is not None:
            truncate_metrics(path, resume_step)
        self.file = open(path, "a" if resume_step is not None else "w")
        self.board = TensorBoardLog(Path(path).parent / TENSORBOARD, resume_step) if tensorboard else None

    def write(self, record: dict) -> None:
        """A non-finite number (e.g. PCGrad's mean cosine when nothing conflicts) becomes null, since bare
        NaN is not JSON."""
        clean = {k: None if isinstance(v, float) and not np.isfinite(v) else v for k, v in record.items()}
        try:
            self.file.write(json.dumps(clean) + "\n")
            self.file.flush()
        except OSError as e:  # a full disk: say which file, in one line
            raise write_error(e, self.file.name) from e
        if self.board is not None:
            self.board.write(clean)

    def close(self) -> None:
        self.file.close()
        if self.board is not None:
            self.board.close()


class TensorBoardLog:
    """The records as TensorBoard scalars at their step: dev metrics under dev/ (dev_raw_* under
    dev_raw/), everything else (losses, lr, SMART's and PCGrad's terms) under train/. A resumed run
    purges the events after its checkpoint's step, as metrics.jsonl drops those records."""

    def __init__(self, folder: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # the optional extra; checked by config.validate
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(str(folder), purge_step=purge)

    def write(self, record: dict) -> None:
        step = record.get("step", 0)
        for key, value in record.items():
            if key in ("step", "epoch") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            group, name = next(((g, key[len(g) + 1:]) for g in ("dev_raw", "dev") if key.startswith(g + "_")),
                               ("train", key))
            self.writer.add_scalar(f"{group}/{name}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class FileLog:
    """OUT_DIR/train.log: every log line of the run, appended (a resumed run's log goes on). `start` is
    where this run's lines begin, so replacing an earlier run can drop that run's lines. Until `keep()`
    (the run's first step), a failure leaves train.log as it was: this run's lines are dropped again."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / "train.log"
        self.existed = self.path.is_file()
        self.start = self.path.stat().st_size if self.existed else 0
        self.kept = False
        self.handler = _OneLineFileHandler(self.path)
        self.handler.setFormatter(logging.Formatter(LOG_FORMAT))

    def keep(self) -> None:
        self.kept = True

    def __enter__(self) -> "FileLog":
        root = logging.getLogger()
        root.addHandler(self.handler)
        # train() called from Python, where nothing set up logging: the file still gets the INFO lines
        self.root_level = root.level
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self.root_level)
        self.handler.close()
        if exc_type is not None and not self.kept:
            self.forget()

    def forget(self) -> None:
        """train.log as this run found it."""
        try:
            if self.existed:
                os.truncate(self.path, self.start)
            else:
                self.path.unlink(missing_ok=True)
        except OSError as e:
            log.warning("%s: could not drop this run's log lines: %s", self.path, e.strerror or e)


class _OneLineFileHandler(logging.FileHandler):
    """A log line that cannot be written (a full disk) is said once, in one line, not as a traceback per line."""

    failed = False

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # the last lines' flush, on the full disk: already said
            pass

    def handleError(self, record) -> None:
        if not self.failed:
            self.failed = True
            error = sys.exc_info()[1]
            print(f"{self.baseFilename}: cannot write the log ({getattr(error, 'strerror', None) or error}); "
                  f"logging to the console only", file=sys.stderr)


@contextlib.contextmanager
def run_log(out_dir: Path):
    """OUT_DIR, created if need be, with train.log receiving the run's log lines (a FileLog). Until the
    run keeps it, a failure leaves the directory as it found it: the folders it created are removed
    again when empty, and train.log's new lines are dropped."""
    out_dir = Path(out_dir)
    created = [p for p in (out_dir, *out_dir.parents) if not p.exists()]  # deepest first
    out_dir.mkdir(parents=True, exist_ok=True)
    file_log = None
    try:
        with FileLog(out_dir) as file_log:
            yield file_log
    except BaseException:
        if file_log is None or not file_log.kept:
            for d in created:
                try:
                    d.rmdir()
                except OSError:  # not empty
                    break
        raise
