"""Checkpoints written so that a crash mid-write never destroys the previous one."""
from __future__ import annotations

import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from heads import MultitaskBert
from minbert import Bert, BertConfig

from .config import TrainConfig


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


def model_from_checkpoint(path) -> tuple[MultitaskBert, TrainConfig, dict]:
    """Rebuild the trained model from a checkpoint alone (no pretrained weights needed)."""
    ckpt = read_checkpoint(path)
    cfg = TrainConfig.from_dict(ckpt["config"])
    model = MultitaskBert(Bert(BertConfig(**ckpt["bert_config"]), attn_impl=cfg.attn_impl), cfg.pair_encoding,
                          cfg.head_dropout)
    model.load_state_dict(ckpt["model"])
    return model, cfg, ckpt
