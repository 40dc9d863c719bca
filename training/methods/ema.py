"""An exponential moving average of the trainable weights (--ema-decay), evaluated and kept in
place of the raw weights: averaging over the last few hundred updates smooths out the noise of
single small batches, the cheap cousin of checkpoint averaging (Polyak & Juditsky 1992).

Shadow copies are kept in fp32 whatever the training precision; frozen parameters never change,
so they have none.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn


@torch.no_grad()
def ema_update_(averages: list[torch.Tensor], values: list[torch.Tensor], decay: float) -> None:
    """averages <- decay * averages + (1 - decay) * values, in place, as one foreach kernel each."""
    if averages:
        torch._foreach_mul_(averages, decay)
        torch._foreach_add_(averages, values, alpha=1.0 - decay)


@torch.no_grad()
def load_average(model: nn.Module, state: dict) -> None:
    """Put the averages of a WeightEMA.state_dict() into the model's parameters, for good (a saved
    run evaluated with the weights it kept; `WeightEMA.applied` swaps them in for a block only)."""
    params = dict(model.named_parameters())
    missing = [n for n in state["names"] if n not in params]
    if missing:
        raise ValueError(f"the weight average covers parameters this model lacks: {', '.join(missing[:3])}")
    torch._foreach_copy_([params[n] for n in state["names"]], list(state["shadow"]))


class WeightEMA:
    """avg_t = d_t * avg_{t-1} + (1 - d_t) * theta_t with d_t = min(decay, (1 + t) / (10 + t)):
    the warm-up of d_t (as in TensorFlow's ExponentialMovingAverage) keeps the first updates from
    being dominated by the pretrained starting point."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), not {decay}")
        self.decay = decay
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in trainable]
        self.shadow = [p.detach().float().clone() for _, p in trainable]
        self.num_updates = 0

    def _params(self, model: nn.Module) -> list[torch.Tensor]:
        params = dict(model.named_parameters())
        return [params[n] for n in self.names]

    def update(self, model: nn.Module) -> None:
        """Call after each optimiser step."""
        t = self.num_updates
        d = min(self.decay, (1.0 + t) / (10.0 + t))
        # a parameter a freezing schedule holds frozen for now keeps its average (its pretrained value
        # until it first trains), bit for bit
        pairs = [(s, p.detach().float()) for s, p in zip(self.shadow, self._params(model)) if p.requires_grad]
        ema_update_([s for s, _ in pairs], [v for _, v in pairs], d)
        self.num_updates += 1

    @contextlib.contextmanager
    def applied(self, model: nn.Module):
        """The model holds the averaged weights inside the block, its own (bit for bit) after it."""
        params = self._params(model)
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
            torch._foreach_copy_(params, self.shadow)
        try:
            yield model
        finally:
            with torch.no_grad():
                torch._foreach_copy_(params, saved)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "names": self.names, "shadow": self.shadow, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict) -> None:
        if state["names"] != self.names:
            raise ValueError("the checkpoint's EMA covers other parameters than this model's trainable ones")
        for s, v in zip(self.shadow, state["shadow"]):
            s.copy_(v)
        self.num_updates = state["num_updates"]
