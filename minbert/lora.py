"""LoRA (Hu et al. 2021), written by hand: a frozen nn.Linear plus a trainable low-rank update.

    y = W x + b + (alpha / r) * B A dropout(x)        A: (r, in), B: (out, r)

A starts random (kaiming-uniform, nn.Linear's own initialisation, as the `peft` library does) and B at
zero, so that before the first update the layer computes exactly W x + b: step 0 is the pretrained
model. Our Q, K and V share one fused `qkv` Linear (minbert/model.py); each of them that is adapted
gets its own A and B over its block of output rows, which is what LoRA on Hugging Face's separate
query/key/value Linears computes. merged_state_dict() folds the updates into the weights (for export).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import Bert, Dropout

# The encoder's linear maps LoRA may adapt, by name: a block of one layer's Linear (attribute, rows).
TARGETS = ("q", "k", "v", "attn_out", "ffn_in", "ffn_out")


class LoRALinear(nn.Linear):
    """`base`'s weight and bias (the same Parameters: its state-dict keys stay weight and bias), plus
    one LoRA pair per block of output rows in `blocks` [(lo, hi), ...], in increasing order."""

    def __init__(self, base: nn.Linear, blocks: list[tuple[int, int]], r: int, alpha: float, dropout: float,
                 generator: torch.Generator | None = None):
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a weight of its own
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.blocks, self.r, self.alpha, self.scale = list(blocks), r, alpha, alpha / r
        kw = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.ParameterList(nn.Parameter(torch.empty(r, self.in_features, **kw)) for _ in blocks)
        self.lora_B = nn.ParameterList(nn.Parameter(torch.zeros(hi - lo, r, **kw)) for lo, hi in blocks)
        for a in self.lora_A:
            nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        self.lora_drop = Dropout(dropout)

    def forward(self, x):  # (..., in) -> (..., out)
        return self.rows(x, 0, self.out_features)

    def rows(self, x, lo: int, hi: int):  # (..., in) -> (..., hi - lo): output features lo..hi-1 alone
        y = F.linear(x, self.weight[lo:hi], None if self.bias is None else self.bias[lo:hi])
        # Every block's A x in one product, scaled while it has r columns per block rather than out, then
        # added to y inside one GEMM: an update per block, a scale over (..., out), an add and a cat of the
        # pieces made a LoRA step dispatch 1202 operations against full fine-tuning's 625 (bf16; 949 this
        # way: bench/step_ops.py), which is what a GPU step, bound by launching them, costs. Out of place:
        # an in-place add into y failed autograd under torchrun above a cached prefix.
        u = F.linear(self.lora_drop(x), self.stacked_A()) * self.scale  # (..., blocks * r)
        B = self.stacked_B()[lo:hi]  # (hi - lo, blocks * r)
        return torch.addmm(y.reshape(-1, hi - lo), u.reshape(-1, u.shape[-1]), B.t()).view(y.shape)

    def stacked_A(self) -> torch.Tensor:  # (blocks * r, in): the blocks' A one under another
        return self.lora_A[0] if len(self.lora_A) == 1 else torch.cat(tuple(self.lora_A))

    def stacked_B(self) -> torch.Tensor:
        """(out, blocks * r): block i's B at its rows and at columns i r..(i + 1) r - 1, zero elsewhere, so
        that stacked_B @ stacked_A is the update of every block at once."""
        k, r = len(self.blocks), self.r
        if k == 1 and self.blocks[0] == (0, self.out_features):
            return self.lora_B[0]
        pieces, at = [], 0
        for i, ((lo, hi), B) in enumerate(zip(self.blocks, self.lora_B)):
            if at < lo:  # rows no block adapts
                pieces.append(B.new_zeros(lo - at, k * r))
            pieces.append(F.pad(B, (i * r, (k - 1 - i) * r)))
            at = hi
        if at < self.out_features:
            pieces.append(self.lora_B[-1].new_zeros(self.out_features - at, k * r))
        return torch.cat(pieces)

    def delta(self) -> torch.Tensor:
        """The update (alpha / r) B A as a dense (out, in) matrix, zero outside the adapted blocks."""
        d = torch.zeros_like(self.weight)
        for (lo, hi), A, B in zip(self.blocks, self.lora_A, self.lora_B):
            d[lo:hi] = self.scale * (B @ A)
        return d

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, r={self.r}, alpha={self.alpha:g}, blocks={self.blocks}"


def add_lora(bert: Bert, targets, r: int, alpha: float, dropout: float = 0.0, first_layer: int = 0,
             seed: int = 0) -> int:
    """Adapt `targets` (names of TARGETS) in layers first_layer.. of `bert`, in place; returns the number
    of LoRA parameters added. The A matrices come from their own generator seeded with `seed`, so they
    leave the global random stream (head initialisation, dropout) as it was."""
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or r < 1:
        raise ValueError(f"LoRA: targets must be among {', '.join(TARGETS)} and r >= 1, not {targets}, r={r}")
    H = bert.config.hidden_size
    qkv = [(lo, lo + H) for name, lo in (("q", 0), ("k", H), ("v", 2 * H)) if name in targets]
    gen = torch.Generator().manual_seed(seed)
    added = 0
    for layer in bert.layers[first_layer:]:
        wanted = {"qkv": qkv, **{a: [(0, getattr(layer, a).out_features)] for a in TARGETS[3:] if a in targets}}
        for attr, blocks in wanted.items():
            if blocks:
                lora = LoRALinear(getattr(layer, attr), blocks, r, alpha, dropout, gen)
                setattr(layer, attr, lora)
                added += sum(p.numel() for p in (*lora.lora_A, *lora.lora_B))
    return added


def lora_modules(module: nn.Module) -> list[LoRALinear]:
    return [m for m in module.modules() if isinstance(m, LoRALinear)]


def merged_state_dict(bert: Bert) -> dict[str, torch.Tensor]:
    """bert's state dict with every LoRA update folded into its weight and the factors left out: the
    weights of a plain Bert computing the same function."""
    sd = {k: v for k, v in bert.state_dict().items() if ".lora_" not in k}
    with torch.no_grad():
        for name, m in bert.named_modules():
            if isinstance(m, LoRALinear):
                sd[f"{name}.weight"] = m.weight + m.delta()
    return sd
