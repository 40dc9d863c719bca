"""The checkpoint files: written so that a crash mid-write never destroys the previous one, read back
with one-line errors. This module stores the dicts its callers hand it and knows no component's
insides; the run (training/run/trainer.py) asks each component for its `state_dict()`.

    best.pt                      {"model", "bert_config", "config", "epoch", "step", "metrics"}
    checkpoints/step-NNNNNNN.pt  the same model keys plus every component's state (Run.state_dict)
"""
from __future__ import annotations

import logging
import os
import pickle
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path

import torch

from heads import MultitaskBert
from minbert import Bert, BertConfig
from training.common.errors import write_error
from training.common.places import current_umask
from training.config.freeze_spec import freeze_depth
from training.config.train_config import TrainConfig
from training.methods.peft import apply_peft

log = logging.getLogger(__name__)


def atomic_save(obj, path: str | os.PathLike) -> None:
    """torch.save to a temp file in the same directory, fsync, then rename over `path`. The temp name
    holds the writer's pid (TEMP_NAME), so a later run can tell a killed write's leftover from a live one's.
    A write that fails (a full disk) leaves `path` as it was and raises a one-line WriteError."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp's 0600 would keep a shared run's files private
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # the rename itself survives a power loss
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        error = write_error(e, path) if isinstance(e, Exception) else None
        if error is not None:
            raise error from e
        raise


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not possible everywhere (Windows); the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(path, model: MultitaskBert, cfg: TrainConfig, **extra) -> None:
    atomic_save({"model": model.state_dict(), "bert_config": asdict(model.encoder.config),
                 "config": cfg.to_dict(), **extra}, path)


def read_checkpoint(path) -> dict:
    """A checkpoint's dict; RuntimeError of one line saying why it cannot be read (torch's own messages
    run to many lines of advice that does not apply)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    why = _unreadable(path)
    if why is None:
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            why = "holds Python objects beyond tensors and plain containers: not a checkpoint of minBERT-MT"
        except Exception as e:  # truncated or damaged archives raise many types
            why = f"damaged ({type(e).__name__}: {_first_line(e)})"
        else:
            if isinstance(ckpt, dict):
                return ckpt
            why = f"holds a {type(ckpt).__name__}, not a checkpoint's dict"
    raise RuntimeError(f"{path}: cannot read the checkpoint: {why}")


def _unreadable(path: Path) -> str | None:
    """Why `path` is not a torch.save archive, found without unpickling anything; None if it may be one."""
    size = path.stat().st_size
    if size == 0:
        return "the file is empty (a write cut short?)"
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut one has no central directory
        return f"not a torch.save archive, or one cut short ({size} bytes)"
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0][:200] if text else "no message")


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
    apply_run_peft(model, cfg)
    if raw_weights and "ema" not in ckpt:
        raise ValueError(f"{path}: holds one set of weights, no weight average beside them: --raw-weights is for "
                         f"the training checkpoints (checkpoints/step-N.pt) of an --ema-decay run")
    model.load_state_dict(ckpt["model"])
    if "ema" in ckpt and not raw_weights:
        from training.methods.ema import load_average
        load_average(model, ckpt["ema"])
        log.info("%s: the weight average at step %s (not the raw weights)", path, ckpt["run_state"]["global_step"])
    return model, cfg, ckpt


def apply_run_peft(model: MultitaskBert, cfg: TrainConfig) -> None:
    """Set `model` up as run `cfg` did (--peft above --freeze-upto): LoRA's factors where the run put them,
    so that its state dict's names are the run's."""
    depth = freeze_depth(cfg.freeze_upto, model.encoder.num_layers)
    apply_peft(model, cfg.peft, max(depth or 0, 0), cfg.seed)


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
