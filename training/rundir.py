"""The run directory (--out-dir): which checkpoint a resume continues from and whether it fits, what an
earlier run left and when it may go, train.log and metrics.jsonl. Nothing here knows the checkpoint
format beyond the few fields a resume checks."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from .checkpointing import RollingCheckpoints, read_checkpoint
from .config import TrainConfig, resume_may_differ
from .errors import ConfigError
from .progress import LOG_FORMAT

log = logging.getLogger(__name__)


def find_resume_checkpoint(cfg: TrainConfig, out_dir: Path) -> dict | None:
    """--resume auto|PATH -> the checkpoint to continue from, after checking it fits this config."""
    if not cfg.resume:
        return None
    if cfg.resume == "auto":
        path = RollingCheckpoints(out_dir, 1).latest()
        if path is None:
            log.info("--resume auto: no checkpoint in %s, starting a new run", out_dir / "checkpoints")
            return None
    else:
        path = Path(cfg.resume)
        if not path.is_file():
            raise ConfigError(f"--resume {path}: no such checkpoint")
    try:
        ckpt = read_checkpoint(path)
    except RuntimeError as e:
        raise ConfigError(str(e)) from None
    if "optimizer" not in ckpt:
        raise ConfigError(f"--resume {path}: not a training checkpoint (best.pt holds only the model; "
                          f"resume from {out_dir / 'checkpoints'})")
    old, may_differ = ckpt["config"], resume_may_differ()
    diff = [f"--{k.replace('_', '-')} was {old.get(k)!r}, now {v!r}" for k, v in cfg.to_dict().items()
            if k not in may_differ and old.get(k) != v]
    if (old.get("frozen_cache") == "off") != (cfg.frozen_cache == "off"):  # the cache keeps the prefix in fp16
        diff.append(f"--frozen-cache was {old.get('frozen_cache')!r}, now {cfg.frozen_cache!r} (on and off give "
                    f"different numbers)")
    if diff:
        raise ConfigError(f"--resume {path}: the checkpoint comes from an incompatible config: {'; '.join(diff)}")
    _check_best_for_resume(ckpt, path, out_dir)
    log.info("resuming from %s", path)
    return ckpt


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


def earlier_run_files(out_dir: Path) -> list[Path]:
    """What a new run in out_dir would replace: an earlier run's best.pt, training checkpoints and
    metrics.jsonl."""
    out_dir = Path(out_dir)
    found = [p for p in (out_dir / "best.pt", out_dir / "metrics.jsonl") if p.is_file() and p.stat().st_size]
    return found + RollingCheckpoints(out_dir, 1).all()


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


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the records after `step` from metrics.jsonl: a resumed run writes those steps again."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    keep = [x for x in lines if x.strip() and json.loads(x).get("step", 0) <= step]
    if len(keep) != len(lines):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, path)
        log.info("%s: dropped %d record(s) after step %d, written again by the resumed run", path,
                 len(lines) - len(keep), step)


class MetricsLog:
    """OUT_DIR/metrics.jsonl: one JSON record per line, flushed as written. A resumed run first drops
    the records after its checkpoint's step (it writes those steps again)."""

    def __init__(self, path: Path, resume_step: int | None = None):
        if resume_step is not None:
            truncate_metrics(path, resume_step)
        self.file = open(path, "a" if resume_step is not None else "w")

    def write(self, record: dict) -> None:
        """A non-finite number (e.g. PCGrad's mean cosine when nothing conflicts) becomes null, since bare
        NaN is not JSON."""
        clean = {k: None if isinstance(v, float) and not np.isfinite(v) else v for k, v in record.items()}
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class FileLog:
    """OUT_DIR/train.log: every log line of the run, appended (a resumed run's log goes on). `start` is
    where this run's lines begin, so replacing an earlier run can drop that run's lines."""

    def __init__(self, out_dir: Path):
        path = Path(out_dir) / "train.log"
        self.start = path.stat().st_size if path.is_file() else 0
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter(LOG_FORMAT))

    def __enter__(self) -> "FileLog":
        root = logging.getLogger()
        root.addHandler(self.handler)
        # train() called from Python, where nothing set up logging: the file still gets the INFO lines
        self.root_level = root.level
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self.root_level)
        self.handler.close()
