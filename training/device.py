"""Seeding, device and precision: with training/errors.py, the bottom of the training package's
import graph (standard library, numpy and torch only), so any module or script may use it without an
import circle."""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class GlobalRng:
    """The process's global random streams (Python, numpy, torch CPU and CUDA): dropout, sampling noise.
    A component like any other, so a checkpoint holds them and a resume continues them exactly."""

    @staticmethod
    def state_dict() -> dict:
        state = {"python": random.getstate(), "numpy": np.random.get_state()[1].tolist(),
                 "numpy_pos": int(np.random.get_state()[2]), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    @staticmethod
    def load_state_dict(state: dict) -> None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        np.random.set_state(("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"], 0, 0.0))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def fast_bf16(device: torch.device) -> bool:
    """Does this device do bf16 matmuls in hardware? CUDA: Ampere and later. CPU: AMX tiles (Intel
    Sapphire Rapids and later), where bf16 autocast measured 2x faster per training step and the quick
    start 1.6x faster at the same dev scores (docs/results.md); without AMX it is not measured: fp32 stays."""
    if device.type == "cuda":
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.4: no emulation flag, and no emulation either
            return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        is_amx = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private; absent in some builds
        return bool(is_amx and is_amx())
    return False


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """--precision: bf16 autocast, or None for plain fp32. auto: bf16 where the hardware is fast at it."""
    if precision == "bf16" or (precision == "auto" and fast_bf16(device)):
        return torch.bfloat16
    return None


def autocast(device: torch.device, dtype: torch.dtype | None):
    """The autocast context of a precision choice (a no-op for fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
