"""Parameter-efficient fine-tuning (--peft): which of the encoder's parameters train, beside freezing.

    none                                          everything --freeze-upto leaves trainable trains
    bitfit                                        the encoder's bias terms alone (Ben Zaken et al. 2022)
    lora:r=R[,alpha=A][,dropout=D][,targets=T]    low-rank updates of the linear maps (Hu et al. 2021)

In every mode the task heads and BERT's pooler train (the pooler is the heads' input map in the course's
`cls` pooling, and all-MiniLM-L6-v2's pooler was never trained; it trains at every --freeze-upto depth
too, so that a PEFT arm and a freezing arm differ in the encoder alone). With --freeze-upto N, LoRA
factors and trained biases are only put in the layers above the frozen prefix, which then computes
exactly the pretrained function and the frozen-prefix cache serves it.

BitFit trains every bias: the linear maps' and the LayerNorms' beta (as Ben Zaken et al. did), not the
LayerNorms' gamma (a weight, not a bias term).

LoRA's targets are our names for the encoder's linear maps: q, k, v (blocks of the fused qkv map),
attn_out, ffn_in, ffn_out, joined with '+' (targets=q+v is Hu et al.'s choice), or all (the default).
All, because Hu et al.'s own comparison at a fixed budget (their Table 5) found adapting more weight
types at a lower rank better than fewer at a higher one, and later work (QLoRA, Dettmers et al. 2023;
He et al. 2022 on the feed-forward maps) found LoRA on every linear map needed to match full
fine-tuning. alpha defaults to 8 whatever r (the `peft` library's default; Hu et al. likewise fix alpha
and vary r, so that the scale alpha / r keeps the learning rate usable across ranks); dropout on the
LoRA input defaults to 0.
"""
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


def apply_peft(model, text: str, first_layer: int, seed: int) -> int:
    """Set up `model` (a heads.MultitaskBert) for --peft `text`: LoRA factors in layers first_layer.. (the
    ones above a frozen prefix), and the rule of what trains in its encoder, which model.freeze() follows.
    Returns the number of parameters added (LoRA's factors)."""
    from minbert.lora import add_lora

    spec = parse_peft(text)
    added = 0
    if spec.kind == "lora":
        added = add_lora(model.encoder, spec.targets, spec.r, spec.alpha, spec.dropout, max(first_layer, 0), seed)
    model.peft = spec.kind
    model.freeze(model.frozen_upto)
    return added


def trainable_counts(model) -> tuple[int, int]:
    """(trainable, all) parameters of the model as it is now, LoRA's factors counted in both."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def share(trainable: int, total: int) -> float:
    """The trainable share of the model, rounded for the records (6 significant digits)."""
    return float(f"{trainable / total:.6g}") if total else 0.0
