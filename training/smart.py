"""SMART regularisation (Jiang et al. 2020), as the CS224N "Freeze Your Layers" paper uses it.

    loss = L(theta) + lambda_s * R_s(theta) + mu * D_Breg(theta, theta_tilde)

R_s (smoothness-inducing adversarial regulariser): how much the model's output moves when its
hidden inputs are pushed by a small adversarial delta inside an eps ball. D_Breg (Bregman
proximal point term): how far the model's output is from a momentum (EMA) copy of itself.

Typical use for one batch of one task:

    clean = fn((h,))                                   # h: embedding output / first trainable input
    task = F.cross_entropy(clean, y)
    with dropout_disabled(model):                      # fn is opaque to us, so the caller does this
        r_s = adversarial_loss(fn, (h,), clean, "categorical", cfg, masks=(mask,))
    d = bregman_loss(clean, teacher(batch), "categorical")   # teacher = EMATeacher(model, cfg, total)
    smart_loss(task, r_s, d, cfg).backward(); opt.step(); teacher.update(model)

Modules that use F.scaled_dot_product_attention should take their attention dropout probability
from `self.dropout.training` (an nn.Dropout submodule) rather than from the module's own
`self.training`, so that `dropout_disabled` switches attention dropout off too.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .ema import ema_update_

KINDS = ("categorical", "bernoulli", "regression")


@dataclass
class SmartConfig:
    lambda_s: float = 1.0  # paper tries 1, 3, 5
    mu: float = 1.0
    eps: float = 1e-5  # radius of the projection ball around the clean hidden states
    step_size: float = 1e-3  # eta, ascent step
    # sigma of the initial Gaussian noise. The paper calls 1e-5 a *variance*; we use it as a
    # standard deviation, as the reference implementation does.
    noise_std: float = 1e-5
    steps: int = 1  # K ascent steps (the paper uses 1)
    norm: str = "inf"  # "inf" | "l2": norm of the normalised ascent step and of the ball
    beta: float = 0.99  # EMA momentum of the Bregman teacher
    beta_late: float = 0.999  # the paper raises beta after the first 10% of updates
    beta_switch_frac: float = 0.1
    adv_dropout: bool = False  # adversarial passes run without dropout by default

    def __post_init__(self) -> None:
        if self.norm not in ("inf", "l2"):
            raise ValueError(f"norm must be 'inf' or 'l2', got {self.norm!r}")
        if self.steps < 1:  # K = 0 would return raw noise that may lie outside the ball
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.eps < 0 or self.step_size < 0 or self.noise_std < 0:
            raise ValueError("eps, step_size and noise_std must be >= 0")


# ----------------------------------------------------------------------------- divergences


def symmetric_kl(p_logits: Tensor, q_logits: Tensor, kind: str) -> Tensor:
    """KL(P||Q) + KL(Q||P), mean over all leading (batch) dims.

    "categorical": softmax over the last dim. "bernoulli": sigmoid of one logit per example,
    shape (B,) or (B, 1). Written as sum (p - q)(log p - log q) with p = exp(log p): every term is
    a product of two same-signed factors, so the result is >= 0 and exactly symmetric in floats.
    """
    if kind == "categorical":
        lp, lq = F.log_softmax(p_logits, dim=-1), F.log_softmax(q_logits, dim=-1)
        return ((lp.exp() - lq.exp()) * (lp - lq)).sum(-1).mean()
    if kind == "bernoulli":
        # log(1 - sigmoid(z)) = logsigmoid(-z): stable for large |z|, unlike log1p(-sigmoid(z)).
        lp, lq = F.logsigmoid(p_logits), F.logsigmoid(q_logits)
        lp0, lq0 = F.logsigmoid(-p_logits), F.logsigmoid(-q_logits)
        terms = (lp.exp() - lq.exp()) * (lp - lq) + (lp0.exp() - lq0.exp()) * (lp0 - lq0)
        return terms.mean()
    raise ValueError(f"symmetric_kl: kind must be 'categorical' or 'bernoulli', got {kind!r}")


def smoothness_loss(a: Tensor, b: Tensor, kind: str) -> Tensor:
    """l_s of the paper: symmetric KL for classification, squared error for regression."""
    if kind == "regression":
        return F.mse_loss(a, b)
    return symmetric_kl(a, b, kind)


# ----------------------------------------------------------------------------- dropout


@contextmanager
def dropout_disabled(module: nn.Module) -> Iterator[nn.Module]:
    """Put only the dropout submodules of `module` in eval mode; restore their modes on exit.

    The adversarial forwards must see the same network as the clean forward bar the delta,
    otherwise R_s measures dropout noise. `adversarial_loss` cannot do this itself because `fn`
    is opaque, so the caller wraps the call (skip the wrapper when cfg.adv_dropout is True).
    """
    # _DropoutNd is the base of Dropout, Dropout1d/2d/3d, AlphaDropout and FeatureAlphaDropout.
    drops = [m for m in module.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    modes = [m.training for m in drops]
    try:
        for m in drops:
            m.train(False)
        yield module
    finally:
        for m, mode in zip(drops, modes):
            m.train(mode)


# ----------------------------------------------------------------------------- adversarial term


def _per_example_max_abs(t: Tensor) -> Tensor:
    return t.flatten(1).abs().amax(dim=1).view(-1, *([1] * (t.dim() - 1)))


def _per_example_l2(t: Tensor) -> Tensor:
    return torch.linalg.vector_norm(t.flatten(1), dim=1).view(-1, *([1] * (t.dim() - 1)))


def _normalise(g: Tensor, norm: str) -> Tensor:
    """g / ||g|| per example. No sign(): the step keeps the gradient's shape, as in SMART."""
    tiny = torch.finfo(g.dtype).tiny  # only guards 0/0; a huge additive eps would damp tiny g
    u = g / _per_example_max_abs(g).clamp_min(tiny)
    if norm == "l2":
        # Dividing by max|g| first keeps the squares inside the l2 norm from underflowing.
        u = u / _per_example_l2(u).clamp_min(tiny)
    return u


def _project(delta: Tensor, eps: float, norm: str) -> Tensor:
    """Closest point of the eps ball (per example) to delta."""
    if norm == "inf":
        return delta.clamp(-eps, eps)
    n = _per_example_l2(delta)
    return delta * (eps / n.clamp_min(torch.finfo(delta.dtype).tiny)).clamp(max=1.0)


def perturb(
    fn: Callable[[tuple[Tensor, ...]], Tensor],
    inputs: tuple[Tensor, ...],
    clean: Tensor,
    kind: str,
    cfg: SmartConfig,
    masks: Sequence[Tensor] | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, ...]:
    """The adversarial deltas, one per input (Algorithm 1, inner loop). Returned detached.

    delta_0 ~ N(0, noise_std^2) (one torch.randn draw per input, in order, from `generator`);
    then K times: delta += step_size * g / ||g||, g = d l_s(fn(x + delta), clean) / d delta,
    followed by projection onto the eps ball. Each input (each side of a siamese pair) and each
    example gets its own ball. Padding positions (mask == 0) are never perturbed.

    The ascent uses detached x and torch.autograd.grad w.r.t. delta only, so no parameter .grad
    is touched. We normalise *and* project, as the paper does; common implementations skip the
    projection.
    """
    if masks is not None and len(masks) != len(inputs):
        raise ValueError("need one mask per input")
    xs = tuple(x.detach() for x in inputs)
    target = clean.detach()
    keep = [None] * len(xs) if masks is None else [m.to(x.dtype).unsqueeze(-1) for x, m in zip(xs, masks)]

    def masked(ts: Sequence[Tensor]) -> list[Tensor]:
        return [t if k is None else t * k for t, k in zip(ts, keep)]

    deltas = masked(
        [torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device) * cfg.noise_std for x in xs]
    )
    for _ in range(cfg.steps):
        deltas = [d.requires_grad_(True) for d in deltas]
        loss = smoothness_loss(fn(tuple(x + d for x, d in zip(xs, deltas))), target, kind)
        grads = torch.autograd.grad(loss, deltas, allow_unused=True)
        grads = masked([torch.zeros_like(d) if g is None else g for d, g in zip(deltas, grads)])
        deltas = [
            _project(d.detach() + cfg.step_size * _normalise(g, cfg.norm), cfg.eps, cfg.norm)
            for d, g in zip(deltas, grads)
        ]
    return tuple(d.detach() for d in deltas)


def adversarial_loss(
    fn: Callable[[tuple[Tensor, ...]], Tensor],
    inputs: tuple[Tensor, ...],
    clean: Tensor,
    kind: str,
    cfg: SmartConfig,
    masks: Sequence[Tensor] | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """R_s = l_s(fn(x + delta), f(x)) with delta from `perturb`.

    f(x) = `clean` is detached: it is a fixed target, as in the SMART reference implementation
    (the paper's formula differentiates both sides). x is *not* detached in this final forward,
    so gradients reach the parameters of fn and, through x, any lower layers that produced it.
    Dropout is the caller's business: wrap this call in `dropout_disabled(model)`.
    """
    deltas = perturb(fn, inputs, clean, kind, cfg, masks, generator)
    return smoothness_loss(fn(tuple(x + d for x, d in zip(inputs, deltas))), clean.detach(), kind)


# ----------------------------------------------------------------------------- Bregman term


class EMATeacher:
    """theta_tilde: a momentum copy of the model for the Bregman proximal point term.

    Deliberately not an nn.Module, so it can never end up inside a model's parameters() and
    hence in an optimiser; it lives on the device the model had when it was copied.
    """

    def __init__(self, model: nn.Module, cfg: SmartConfig, total_steps: int | None = None):
        self.cfg, self.total_steps = cfg, total_steps
        self.module = copy.deepcopy(model).eval()
        self.module.requires_grad_(False)
        self.num_updates = 0

    @property
    def beta(self) -> float:
        """Momentum for the next update: beta, then beta_late once the first
        beta_switch_frac * total_steps updates are done."""
        if self.total_steps is not None and self.num_updates >= self.cfg.beta_switch_frac * self.total_steps:
            return self.cfg.beta_late
        return self.cfg.beta

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Call after each optimiser step: t = beta * t + (1 - beta) * theta; buffers copied."""
        beta = self.beta
        src = dict(model.named_parameters())
        # Frozen parameters never change, so their copies already equal the student's: skip them
        # (under deep freezing that is most of the model).
        pairs = [(t, src[name].detach()) for name, t in self.module.named_parameters() if src[name].requires_grad]
        if pairs:
            ema_update_(*map(list, zip(*pairs)), beta)
        src_buf = dict(model.named_buffers())
        for name, t in self.module.named_buffers():
            t.copy_(src_buf[name])
        self.num_updates += 1

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.module.eval()  # in case someone called .train() on it
        with torch.no_grad():
            return self.module(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.num_updates = int(state["num_updates"])


def bregman_loss(student_out: Tensor, teacher_out: Tensor, kind: str) -> Tensor:
    """D_Breg = l_s(student, teacher), the teacher being a constant."""
    return smoothness_loss(student_out, teacher_out.detach(), kind)


def smart_loss(task_loss: Tensor, r_s: Tensor, d_breg: Tensor, cfg: SmartConfig) -> Tensor:
    """L + lambda_s * R_s + mu * D_Breg."""
    return task_loss + cfg.lambda_s * r_s + cfg.mu * d_breg
