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

from training.config.peft_spec import PeftSpec, parse_peft


def apply_peft(model, spec: PeftSpec | str, first_layer: int, seed: int) -> int:
    """Set up `model` (a heads.MultitaskBert) for --peft `spec` (a run passes its settings' parsed spec; a
    text is parsed here): LoRA factors in layers first_layer.. (the ones above a frozen prefix), and the
    mode, with the factors, that model.freeze() follows, applied at the model's depth as it is. Returns the
    number of parameters added (LoRA's factors)."""
    from minbert.lora import add_lora, lora_modules

    spec = parse_peft(spec) if isinstance(spec, str) else spec
    added, factors = 0, []
    if spec.kind == "lora":
        added = add_lora(model.encoder, spec.targets, spec.r, spec.alpha, spec.dropout, max(first_layer, 0), seed)
        factors = [p for m in lora_modules(model.encoder) for p in (*m.lora_A, *m.lora_B)]
    model.use_peft(spec.kind, factors)
    model.freeze(model.frozen_upto)
    return added


def trainable_counts(model) -> tuple[int, int]:
    """(trainable, all) parameters of the model as it is now, LoRA's factors counted in both."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def share(trainable: int, total: int) -> float:
    """The trainable share of the model, rounded for the records (6 significant digits)."""
    return float(f"{trainable / total:.6g}") if total else 0.0
