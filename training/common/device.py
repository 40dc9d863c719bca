"""Seeding, device and precision: with training/common/errors.py, the bottom of the training package's
import graph (standard library, numpy and torch only), so any module or script may use it without an
import circle."""
from __future__ import annotations

import contextlib
import platform
import random
import warnings
from pathlib import Path

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


# --precision's names -> the autocast dtype (None: no autocast, plain fp32; fp32 may use TF32 on CUDA)
DTYPES = {"fp32": None, "fp32-strict": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# the CPU's bf16 instructions, best first: torch's probes (private; absent in some builds), what they mean
CPU_BF16 = (("_is_amx_tile_supported", "AMX tiles"), ("_is_avx512_bf16_supported", "AVX512-BF16"))


def native_bf16(device: torch.device) -> str | None:
    """Why this device computes bf16 natively, or None where it does not. CUDA: Ampere and later. CPU:
    AMX tiles (Xeon Sapphire Rapids and later) or AVX512-BF16 (AMD Zen 4, Xeon Cooper Lake), where a bf16
    training step measured 2x to 3x faster than fp32's (bench/cpu_step.py; issue 41, docs/results.md)."""
    if device.type == "cuda":
        try:
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.4: no emulation flag, and no emulation either
            native = torch.cuda.is_bf16_supported()
        return f"{torch.cuda.get_device_name(device)} computes bf16 natively" if native else None
    what = cpu_bf16() if device.type == "cpu" else None
    return f"the CPU computes bf16 natively ({what})" if what else None


def cpu_bf16() -> str | None:
    """The CPU's bf16 instructions, the best it has (AMX tiles or AVX512-BF16), or None: emulated there."""
    for probe, what in CPU_BF16:
        found = getattr(torch.cpu, probe, None)
        if found is not None and found():
            return what
    return None


def resolve_precision(precision: str, device: torch.device) -> tuple[str, str]:
    """--precision on `device` -> (fp32 | bf16 | fp16, why). auto: bf16 where the device computes it
    natively; fp16 with loss scaling on a CUDA device that does not (T4, V100: fp16 tensor cores); fp32
    elsewhere (a CPU without bf16 instructions, where emulated half precision is slower than fp32)."""
    if precision != "auto":
        return precision, f"--precision {precision}"
    why = native_bf16(device)
    if why is not None:
        return "bf16", f"--precision auto: {why}"
    if device.type == "cuda":
        return "fp16", (f"--precision auto: {torch.cuda.get_device_name(device)} has no native bf16, so fp16 with "
                        f"dynamic loss scaling")
    what = "the CPU has neither AMX nor AVX512-BF16" if device.type == "cpu" else f"a {device.type} device"
    return "fp32", f"--precision auto: {what}"


def tf32_capable(device: torch.device) -> bool:
    """Whether `device` has TF32 tensor cores: a CUDA GPU of compute capability 8.0 (Ampere) or later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def fp32_math(precision: str, device: torch.device) -> str | None:
    """How a resolved --precision computes fp32 matmuls on `device`, in words, or None where it changes
    nothing: fp32 on a GPU with TF32 tensor cores uses them, fp32-strict keeps full fp32 there. The
    CPU, older GPUs and bf16/fp16 runs (autocast picks their matmuls' type) are left as torch has them."""
    if device.type != "cuda" or precision not in ("fp32", "fp32-strict") or not tf32_capable(device):
        return None
    return "TF32 matmuls" if precision == "fp32" else "full fp32 matmuls (TF32 off)"


def tf32_flags() -> tuple[bool, bool, str]:
    """torch's process-wide TF32 switches: (cuda matmul, cuDNN, float32 matmul precision)."""
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision())


def set_tf32_flags(flags: tuple[bool, bool, str]) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags[:2]
    torch.set_float32_matmul_precision(flags[2])


def apply_fp32_math(precision: str, device: torch.device) -> tuple[bool, bool, str] | None:
    """Set torch's TF32 switches for a run's resolved --precision (fp32_math): TF32 matmuls and cuDNN
    convolutions on for fp32 on Ampere and later, both off for fp32-strict; elsewhere nothing is touched
    (None). The switches are process-wide: returns the ones found, for set_tf32_flags to put back."""
    if fp32_math(precision, device) is None:
        return None
    saved = tf32_flags()
    tf32 = precision == "fp32"
    set_tf32_flags((tf32, tf32, "high" if tf32 else "highest"))
    return saved


def emulated_precision(precision: str, device: torch.device) -> str | None:
    """A warning where a named half precision runs emulated on a CPU, slower than fp32 (auto never picks
    one there), else None. bf16 without AMX or AVX512-BF16 computes its matmuls by converting: a training
    step measured 16x slower than fp32's on MiniLM, 27x on MPNet, on AMD EPYCs with AVX2 only
    (bench/cpu_step.py; docs/benchmarks.md, docs/mpnet/step-avx2-epyc-2026-11-29.txt)."""
    if device.type != "cpu":
        return None
    if precision == "bf16" and cpu_bf16() is None:
        return ("--precision bf16 on a CPU without AMX or AVX512-BF16: torch emulates bf16 there, many times "
                "slower than fp32 (a training step 16x on MiniLM, 27x on MPNet, on an AVX2-only EPYC); "
                "--precision auto picks fp32 here")
    amx_fp16 = getattr(torch.cpu, "_is_amx_fp16_supported", lambda: False)  # private; absent in some builds
    if precision == "fp16" and not amx_fp16():
        return ("--precision fp16 on a CPU without AMX-FP16: torch emulates float16 there, slower than fp32; "
                "fp16 is meant for CUDA devices without bf16 (use bf16 or fp32 on a CPU)")
    return None


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """--precision's autocast dtype on `device` (None for plain fp32); auto as resolve_precision says."""
    return DTYPES[resolve_precision(precision, device)[0]]


def fp16_autocast_problem(device: torch.device) -> str | None:
    """Why --precision fp16 cannot run on `device` with this torch, or None. torch builds before CPU
    float16 autocast warn and run in fp32; that must not pass for an fp16 run."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(device.type, dtype=torch.float16):
            out = torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
    if out.dtype != torch.float16:
        why = f": {caught[0].message}" if caught else ""
        return (f"--precision fp16: torch {torch.__version__} has no float16 autocast on {device.type}{why}; "
                f"use --precision bf16 or fp32 there")
    return None


def autocast(device: torch.device, dtype: torch.dtype | None, cache: bool = True):
    """The autocast context of a precision choice (a no-op for fp32). cache=False: no cache of the
    weights' casts, which a CUDA graph's capture must not keep (torch's CUDA graph notes)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)


def gpu_name() -> str | None:
    """The CUDA GPU a run trained on (the current device's name), or None where there is none."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def machine_name() -> str:
    """What a measurement ran on, as cost measurements record it and a study's dry run compares: the CUDA GPU
    where one is visible (the trainer's --device auto trains there), else the CPU."""
    return gpu_name() or cpu_model()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name with its family and model numbers (what a benchmark's or a study's figures
    were measured on). The numbers tell apart CPUs a virtual machine names alike: "AMD EPYC" is Zen 4
    (family 25) on one machine and Zen 5 (family 26) on another, at twice the speed."""
    try:
        fields = {}
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first processor's
            if not line.strip() and fields:
                break
        name = fields.get("model name")
        if name:
            numbers = [f"{word} {fields[key]}" for key, word in (("cpu family", "family"), ("model", "model"))
                       if fields.get(key)]
            return f"{name} ({', '.join(numbers)})" if numbers else name
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"
