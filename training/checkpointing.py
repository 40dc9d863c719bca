"""Checkpoints written so that a crash mid-write never destroys the previous one."""
from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from heads import MultitaskBert
from minbert import Bert, BertConfig

from .config import TrainConfig

log = logging.getLogger(__name__)


def atomic_save(obj, path: str | os.PathLike) -> None:
    """torch.save to a temp file in the same directory, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_checkpoint(path, model: MultitaskBert, cfg: TrainConfig, **extra) -> None:
    atomic_save({"model": model.state_dict(), "bert_config": asdict(model.encoder.config),
                 "config": cfg.to_dict(), **extra}, path)


def read_checkpoint(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise RuntimeError(f"{path}: cannot read the checkpoint ({type(e).__name__}: {e})") from e


def load_model_state(model: MultitaskBert, path, device=None) -> dict:
    ckpt = read_checkpoint(path)
    model.load_state_dict(ckpt["model"])
    if device is not None:
        model.to(device)
    return ckpt


def model_from_checkpoint(path, raw_weights: bool = False) -> tuple[MultitaskBert, TrainConfig, dict]:
    """Rebuild the trained model from a checkpoint alone (no pretrained weights needed). A training
    checkpoint of an --ema-decay run holds the raw weights and their average: the model gets the
    average, which is what the run evaluates and keeps in best.pt, unless `raw_weights`."""
    ckpt = read_checkpoint(path)
    cfg = TrainConfig.from_dict(ckpt["config"])
    model = MultitaskBert(Bert(BertConfig(**ckpt["bert_config"]), attn_impl=cfg.attn_impl), cfg.pair_encoding,
                          cfg.head_dropout, cfg.pooling)
    if raw_weights and "ema" not in ckpt:
        raise ValueError(f"{path}: holds one set of weights, no weight average beside them: --raw-weights is for "
                         f"the training checkpoints (checkpoints/step-N.pt) of an --ema-decay run")
    model.load_state_dict(ckpt["model"])
    if "ema" in ckpt and not raw_weights:
        from .ema import load_average
        load_average(model, ckpt["ema"])
        log.info("%s: the weight average at step %s (not the raw weights)", path, ckpt["run_state"]["global_step"])
    return model, cfg, ckpt


# --------------------------------------------------------------------------- exact resume

class TrainingInterrupted(Exception):
    """SIGINT/SIGTERM: the current step finished and a checkpoint was written."""

    def __init__(self, signal_name: str, epoch: int, state: "RunState", path: Path):
        self.signal_name, self.path = signal_name, path
        super().__init__(f"{signal_name} received: stopped after step {state.global_step} (epoch {epoch}, step "
                         f"{state.step_in_epoch} of the epoch) and wrote {path}. Resume with the same command "
                         f"plus --resume auto (or --resume {path})")


@dataclass
class RunState:
    """Where a run is: enough, with the model/optimiser/RNG states, to continue it exactly."""
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    best: float = float("-inf")
    best_metrics: dict = field(default_factory=dict)
    losses: dict = field(default_factory=dict)  # this epoch's training losses per task so far
    epoch_seconds: float = 0.0  # training time of this epoch before the last checkpoint


# Fields a resumed run may change; any other difference would change the trajectory.
RESUME_MAY_DIFFER = {"out_dir", "overwrite", "predictions_dir", "export_hf", "log_every", "save_every", "keep_last", "resume",
                     "device", "compile", "eval_batch_size", "frozen_cache", "cache_dir", "max_bad_steps",
                     "data_dir", "files", "evals_per_epoch"}


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state()[1].tolist(),
             "numpy_pos": int(np.random.get_state()[2]), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"], 0, 0.0))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def training_state(model: MultitaskBert, stepper, cfg: TrainConfig, state: RunState, train_sizes: dict[str, int],
                   train_digests: dict[str, str], dist=None) -> dict:
    """Everything to continue the run; rank-independent apart from `rng_ranks` (distributed runs:
    every rank's own random streams, gathered from all ranks, so every rank must call this).
    `train_sizes` (examples per task) and `train_digests` (TaskData.digest) let a resume notice a
    changed training file: the sampler's indices would point elsewhere, or at other examples."""
    out = {"model": model.state_dict(), "bert_config": asdict(model.encoder.config), "config": cfg.to_dict(),
           "optimizer": stepper.optimizer.state_dict(), "scheduler": stepper.scheduler.state_dict(),
           "run_state": asdict(state), "bad_steps": stepper.bad_steps, "rng": _rng_state(),
           "train_sizes": dict(train_sizes), "train_digests": dict(train_digests)}
    if stepper.teacher is not None:
        out["smart_teacher"] = stepper.teacher.state_dict()
        out["smart_generator"] = stepper.generator.get_state()
    if stepper.pcgrad is not None:
        out["pcgrad_generator"] = stepper.pcgrad.generator.get_state()
    if stepper.ema is not None:
        out["ema"] = stepper.ema.state_dict()
    if dist is not None:
        out["rng_ranks"] = dist.all_gather_object(_own_streams(stepper))
    return out


def _own_streams(stepper) -> dict:
    """A rank's own random streams: dropout (the global RNGs) and SMART's noise."""
    return {"rng": _rng_state(),
            "smart_generator": stepper.generator.get_state() if stepper.teacher is not None else None}


def restore_training_state(ckpt: dict, model: MultitaskBert, stepper, device, dist=None) -> RunState:
    model.load_state_dict(ckpt["model"])
    model.to(device)
    stepper.optimizer.load_state_dict(ckpt["optimizer"])
    stepper.scheduler.load_state_dict(ckpt["scheduler"])
    stepper.bad_steps = ckpt["bad_steps"]
    if stepper.teacher is not None:
        stepper.teacher.load_state_dict(ckpt["smart_teacher"])
        stepper.generator.set_state(ckpt["smart_generator"])
    if stepper.pcgrad is not None:
        stepper.pcgrad.generator.set_state(ckpt["pcgrad_generator"])
    if stepper.ema is not None:
        stepper.ema.load_state_dict(ckpt["ema"])
    _set_rng_state(ckpt["rng"])
    state = RunState(**ckpt["run_state"])
    if dist is not None:
        ranks = ckpt.get("rng_ranks")
        if ranks is not None and len(ranks) == dist.world_size:  # same number of ranks: each its own streams
            _set_rng_state(ranks[dist.rank]["rng"])
            if stepper.teacher is not None:
                stepper.generator.set_state(ranks[dist.rank]["smart_generator"])
        else:  # another number of ranks (or a single-process checkpoint): fresh streams per rank
            from .distributed import rank_seed
            seed = rank_seed(stepper.cfg.seed, dist.rank, state.global_step)
            torch.manual_seed(seed)
            if stepper.teacher is not None:
                stepper.generator.manual_seed(seed)
    return state


class RollingCheckpoints:
    """OUT_DIR/checkpoints/step-NNNNNNN.pt, keeping the newest `keep` of them."""

    def __init__(self, out_dir: Path, keep: int):
        self.dir, self.keep = Path(out_dir) / "checkpoints", max(1, keep)

    def all(self) -> list[Path]:
        return sorted(self.dir.glob("step-*.pt")) if self.dir.is_dir() else []

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None

    def save(self, obj: dict, step: int) -> Path:
        path = self.dir / f"step-{step:07d}.pt"
        atomic_save(obj, path)
        for old in self.all()[: -self.keep]:
            old.unlink()
        return path


def find_resume_checkpoint(cfg: TrainConfig, out_dir: Path) -> dict | None:
    """--resume auto|PATH -> the checkpoint to continue from, after checking it fits this config."""
    from .trainer import ConfigError

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
    old = ckpt["config"]
    diff = [f"--{k.replace('_', '-')} was {old.get(k)!r}, now {v!r}" for k, v in cfg.to_dict().items()
            if k not in RESUME_MAY_DIFFER and old.get(k) != v]
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
    from .trainer import ConfigError

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
    from .trainer import ConfigError

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
    import json

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


class _StopFlag:
    requested = False
    signal_name = ""


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT/SIGTERM ask the loop to stop after the current step (a second SIGINT stops at once)."""
    flag = _StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        flag.requested, flag.signal_name = True, signal.Signals(signum).name
        log.warning("%s received: finishing the current step, then writing a checkpoint (Ctrl-C again to "
                    "stop at once)", flag.signal_name)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
