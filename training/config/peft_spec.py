"""The value of --peft, parsed and checked on its own (no model, no torch): what the config validates and
methods/peft.py applies."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

FLAG = "--peft"
# minbert.lora.TARGETS, written here too so that parsing the flag imports no torch (--help stays light)
TARGETS = ("q", "k", "v", "attn_out", "ffn_in", "ffn_out")
KINDS = ("none", "bitfit", "lora")
LORA_KEYS = ("r", "alpha", "dropout", "targets")


@dataclass(frozen=True)
class PeftSpec:
    kind: str = "none"
    r: int = 0
    alpha: float = 8.0
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS


def parse_peft(text: str) -> PeftSpec:
    """The spec of a --peft value; ValueError with the one line naming the flag."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{FLAG} must be one of none, bitfit, lora:r=R[,...] (see --help), not {text!r}")
    kind, colon, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"{FLAG} {text}: must be none, bitfit or lora:r=R[,alpha=A][,dropout=D][,targets=T], "
                         f"not {kind!r}")
    if kind != "lora":
        if colon:
            raise ValueError(f"{FLAG} {text}: {kind} takes no settings")
        return PeftSpec(kind)
    spec = PeftSpec("lora")
    for part in (p.strip() for p in rest.split(",") if rest.strip()):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in LORA_KEYS:
            raise ValueError(f"{FLAG} {text}: {part!r} is not a setting of lora (it takes {', '.join(LORA_KEYS)})")
        spec = replace(spec, **{key.strip(): _setting(text, key.strip(), value.strip())})
    if spec.r == 0:
        raise ValueError(f"{FLAG} {text}: lora needs its rank, e.g. lora:r=8")
    return spec


def _setting(text: str, key: str, value: str):
    where = f"{FLAG} {text}: {key}"
    if key == "targets":
        names = TARGETS if value == "all" else tuple(n.strip() for n in value.split("+"))
        bad = [n for n in names if n not in TARGETS]
        if bad or not names:
            raise ValueError(f"{where} must be all or some of {', '.join(TARGETS)} joined with '+' (e.g. q+v), "
                             f"not {value!r}")
        return tuple(n for n in TARGETS if n in names)  # in one order, each once
    if key == "r":
        try:
            r = int(value)
        except ValueError:
            r = 0
        if r < 1:
            raise ValueError(f"{where} must be a whole number >= 1, not {value!r}")
        return r
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if key == "alpha" and not 0 < number < math.inf:
        raise ValueError(f"{where} must be a number > 0 (the update is scaled by alpha / r), not {value!r}")
    if key == "dropout" and not 0 <= number < 1:
        raise ValueError(f"{where} must be a probability in [0, 1), not {value!r}")
    return number
