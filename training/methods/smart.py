"""SMART regularisation (Jiang et al. 2020), as the CS224N "Freeze Your Layers" paper uses it.

    loss = L(theta) + lambda_s * R_s(theta) + mu * D_Breg(theta, theta_tilde)

R_s (smoothness-inducing adversarial regulariser): how much the model's output moves when its
hidden inputs are pushed by an adversarial delta. D_Breg (Bregman proximal point term): how far
the model's output is from a momentum (EMA) copy of itself.

Two ways to find the delta (SmartConfig.perturbation): "paper", Algorithm 1 as written (a
normalised ascent step, then projection onto an eps ball: |delta| <= eps = 1e-5), and "reference",
what the authors' MT-DNN code runs (noise plus step normalised per token, no projection: |delta|
about 1 per token; R_s grows with |delta|^2, so it is many orders of magnitude larger).
docs/smart.md has the details ("Perturbation modes").

Typical use for one batch of one task:

    clean = fn((h,))                                   # h: embedding output / first trainable input
    task = F.cross_entropy(clean, y)
    with dropout_disabled(model):                      # fn is opaque to us, so the caller does this
        r_s = adversarial_loss(fn, (h,), clean, "categorical", cfg, masks=(mask,))
    d = bregman_loss(clean, teacher(batch), "categorical")   # teacher = EMATeacher(model, cfg, total)
    (task + cfg.lambda_s * r_s + cfg.mu * d).backward(); opt.step(); teacher.update(model)

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

from training.methods.ema import ema_update_

KINDS = ("categorical", "bernoulli", "regression")
PERTURBATIONS = ("paper", "reference")


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
    # "paper": Algorithm 1 as written (per-example normalised step, projection onto the eps ball,
    # padding untouched, symmetric KL against a detached target). "reference": the adversarial step
    # of the MT-DNN code (mt_dnn/perturbation.py): noise plus step normalised per token, no
    # projection, so the perturbation's per-token norm is about 1. docs/smart.md lists
    # every difference. This dataclass keeps the paper's algorithm as its default; the trainer's
    # default is "reference" (TrainConfig.smart_perturbation says why).
    perturbation: str = "paper"
    # reference mode only: the guard in (noise + step_size * g) / (||.||_token + norm_eps), MT-DNN's
    # adv_epsilon (default 1e-6 in its train.py). It, not eps, sets how close to 1 the norm gets.
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.norm not in ("inf", "l2"):
            raise ValueError(f"norm must be 'inf' or 'l2', got {self.norm!r}")
        if self.perturbation not in PERTURBATIONS:
            raise ValueError(f"perturbation must be one of {PERTURBATIONS}, got {self.perturbation!r}")
        if not self.norm_eps > 0:  # 0 would divide 0 by 0 where noise and gradient vanish
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")
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

    cfg.perturbation == "paper": delta_0 ~ N(0, noise_std^2) (one torch.randn draw per input, in
    order, from `generator`); then K times: delta += step_size * g / ||g||, g = d l_s(fn(x + delta),
    clean) / d delta, followed by projection onto the eps ball. Each input (each side of a siamese
    pair) and each example gets its own ball. Padding positions (mask == 0) are never perturbed.
    We normalise *and* project, as the paper does; the reference implementations skip the projection.

    cfg.perturbation == "reference": see `reference_perturb` (masks are not used there).

    The ascent uses detached x and torch.autograd.grad w.r.t. delta only, so no parameter .grad
    is touched.
    """
    if masks is not None and len(masks) != len(inputs):
        raise ValueError("need one mask per input")
    if cfg.perturbation == "reference":
        return reference_perturb(fn, inputs, clean, kind, cfg, generator)
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
    """R_s: the divergence between fn(x + delta) and f(x) = `clean`, delta from `perturb`.

    "paper" mode: l_s(fn(x + delta), clean.detach()). Detaching the clean output is our choice: the
    paper's formula differentiates both sides, and so do both reference implementations (MT-DNN's
    SymKlCriterion and smart-pytorch's sym_kl_loss), each side as a cross-entropy towards the other
    held fixed. "reference" mode computes that: `reference_divergence(fn(x + delta), clean)`, so a
    `clean` that carries a graph gets a gradient too (one computed under no_grad does not).

    x is *not* detached in this final forward, so gradients reach the parameters of fn and, through
    x, any lower layers that produced it. Dropout is the caller's business: wrap this call in
    `dropout_disabled(model)` (the reference runs these passes with dropout on).
    """
    deltas = perturb(fn, inputs, clean, kind, cfg, masks, generator)
    adv = fn(tuple(x + d for x, d in zip(inputs, deltas)))
    if cfg.perturbation == "reference":
        return reference_divergence(adv, clean, kind)
    return smoothness_loss(adv, clean.detach(), kind)


# ----------------------------------------------------------------------------- reference mode

# stable_kl's guard in MT-DNN's mt_dnn/loss.py (its default epsilon)
STABLE_KL_EPS = 1e-6


def _log_probs(logits: Tensor, kind: str) -> Tensor:
    """(N, C) log-probabilities: a softmax over the last dim, or one Bernoulli logit z per example as
    the two-class distribution (sigmoid(z), sigmoid(-z)), what a two-logit softmax head gives."""
    if kind == "categorical":
        return F.log_softmax(logits, dim=-1).reshape(-1, logits.shape[-1])
    if kind == "bernoulli":
        z = logits.reshape(-1)
        return torch.stack([F.logsigmoid(z), F.logsigmoid(-z)], dim=-1)
    raise ValueError(f"kind must be 'categorical' or 'bernoulli' here, got {kind!r}")


def reference_ascent_loss(adv: Tensor, target: Tensor, kind: str) -> Tensor:
    """The loss the reference's inner step ascends (mt_dnn/perturbation.py, SmartPerturbation.forward).

    Regression: sum of (adv - target)^2. Otherwise stable_kl(adv, target, reduce=False):
    2 * sum_{n,c} p_nc * (r(p_nc) - r(y_nc)), p the perturbed and y the clean distribution,
    r(q) = -log(1 / (q + 1e-6) - 1 + 1e-6) ~ log(q / (1 - q)) held constant (detached), so only the
    factor p carries a gradient. Summed over the batch, not averaged: the gradient's scale matters,
    because step_size * g is added to the noise before the normalisation.
    """
    if kind == "regression":
        return ((adv - target) ** 2).sum()
    p, y = _log_probs(adv, kind).exp(), _log_probs(target, kind).exp()
    with torch.no_grad():
        r_p = -(1.0 / (p + STABLE_KL_EPS) - 1.0 + STABLE_KL_EPS).log()
        r_y = -(1.0 / (y + STABLE_KL_EPS) - 1.0 + STABLE_KL_EPS).log()
    return 2.0 * (p * (r_p - r_y)).sum()


def _per_token_normalise(v: Tensor, norm: str, guard: float) -> Tensor:
    """v / (||v|| + guard), the norm over the last (hidden) dim: one norm per token."""
    if norm == "inf":
        size = v.abs().amax(dim=-1, keepdim=True)
    else:
        size = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return v / (size + guard)


def reference_perturb(
    fn: Callable[[tuple[Tensor, ...]], Tensor],
    inputs: tuple[Tensor, ...],
    clean: Tensor,
    kind: str,
    cfg: SmartConfig,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, ...]:
    """The MT-DNN code's adversarial step. Returned detached.

    delta_0 = noise_std * N(0, 1) at every position, padding included (the same torch.randn draws
    as paper mode, unmasked); then K times: v = delta + step_size * g with g = d
    reference_ascent_loss(fn(x + delta), clean) / d delta, and delta = v / (||v||_token + norm_eps).
    No projection: after one step every token's delta has norm ||v|| / (||v|| + norm_eps), close to 1
    whenever ||v|| >> norm_eps, whatever eps says.
    """
    xs = tuple(x.detach() for x in inputs)
    target = clean.detach()
    deltas = [torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device) * cfg.noise_std for x in xs]
    for _ in range(cfg.steps):
        deltas = [d.requires_grad_(True) for d in deltas]
        loss = reference_ascent_loss(fn(tuple(x + d for x, d in zip(xs, deltas))), target, kind)
        grads = torch.autograd.grad(loss, deltas, allow_unused=True)
        deltas = [
            _per_token_normalise(d.detach() + (0.0 if g is None else cfg.step_size * g), cfg.norm, cfg.norm_eps)
            for d, g in zip(deltas, grads)
        ]
    return tuple(d.detach() for d in deltas)


def reference_divergence(adv: Tensor, clean: Tensor, kind: str) -> Tensor:
    """R_s as MT-DNN's final SymKlCriterion(clean, adv) computes it (mt_dnn/loss.py).

    KL(P_adv || P_clean) with P_adv held constant plus KL(P_clean || P_adv) with P_clean held
    constant, summed over classes and divided by the batch size ("batchmean"). Its value is
    symmetric_kl's; its gradient is not: each side is pulled towards the other as by a cross-entropy
    with the other's probabilities as soft labels, and the clean side is differentiated too.
    Regression: mean (adv - clean)^2 with both sides differentiated (MseCriterion, without the
    reference's (B,) against (B, 1) broadcast; docs/smart.md).
    """
    if kind == "regression":
        return F.mse_loss(adv, clean)
    la, lc = _log_probs(adv, kind), _log_probs(clean, kind)
    n = la.shape[0]
    la_fixed, lc_fixed = la.detach(), lc.detach()
    kl_adv_clean = (la_fixed.exp() * (la_fixed - lc)).sum() / n
    kl_clean_adv = (lc_fixed.exp() * (lc_fixed - la)).sum() / n
    return kl_adv_clean + kl_clean_adv


# ----------------------------------------------------------------------------- Bregman term


class EMATeacher:
    """theta_tilde: a momentum copy of the model for the Bregman proximal point term.

    Deliberately not an nn.Module, so it can never end up inside a model's parameters() and
    hence in an optimiser; it lives on the device the model had when it was copied.

    The parameters frozen when it is made never train in the run (Stepper.build makes it at a freezing
    schedule's widest depth), so their average is themselves: the teacher holds the model's own tensors
    there, not copies (under --freeze-upto 9 most of the model's memory), and update() refuses to go on
    if one of them trains after all.
    """

    def __init__(self, model: nn.Module, cfg: SmartConfig, total_steps: int | None = None):
        self.cfg, self.total_steps = cfg, total_steps
        frozen = {id(p): p for p in model.parameters() if not p.requires_grad}
        self.module = copy.deepcopy(model, memo=dict(frozen)).eval()  # the memo: those are not copied
        self.module.requires_grad_(False)
        self.shared = [name for name, p in self.module.named_parameters() if id(p) in frozen]
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
        trains = [name for name in self.shared if src[name].requires_grad]
        if trains:
            raise RuntimeError(f"SMART's teacher shares {trains[0]} with the model, which was frozen when the teacher "
                               f"was made and trains now: its average would be the parameter itself")
        # Frozen parameters do not change, so their copies keep their last average (the model's own
        # tensor where frozen throughout): skip them.
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

    def state_dict(self, student: nn.Module | None = None) -> dict[str, Any]:
        """The teacher's weights and update count. Given the `student` whose state is saved beside it, the
        tensors bit-identical to the student's are named instead of stored: under freezing that is every
        frozen layer (9 of MPNet's 12: a checkpoint 330 MiB smaller). A layer frozen after it trained (an
        adaptive schedule) differs from the student's and is stored."""
        weights = self.module.state_dict()
        theirs = student.state_dict() if student is not None else {}
        same = [name for name, t in weights.items() if name in theirs and bit_identical(t, theirs[name])]
        for name in same:
            del weights[name]
        return {"module": weights, "same_as_student": same, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any], student: nn.Module | None = None) -> None:
        """`student` must hold the state saved beside this one (a checkpoint's model: load it first)."""
        weights, same = dict(state["module"]), state.get("same_as_student", [])
        if same:
            if student is None:
                raise ValueError("the teacher's state names tensors of its student: load it with the student")
            theirs = student.state_dict()
            weights.update({name: theirs[name] for name in same})
        self.module.load_state_dict(weights)
        self.num_updates = int(state["num_updates"])


def bit_identical(a: Tensor, b: Tensor) -> bool:
    """The same dtype, shape and bits (torch.equal calls -0.0 and 0.0 equal; a resume must not)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def bregman_loss(student_out: Tensor, teacher_out: Tensor, kind: str) -> Tensor:
    """D_Breg = l_s(student, teacher), the teacher being a constant."""
    return smoothness_loss(student_out, teacher_out.detach(), kind)
