"""Gradient surgery for multi-task learning over the shared encoder.

Two variants, both acting only on the shared (encoder) parameters; each task head keeps its
own task's gradient untouched, because a head only ever appears in its own task's graph.

- ``pcgrad``: Yu et al. 2020, "Gradient Surgery for Multi-Task Learning", Algorithm 1.
  For each task i, walk the *other* tasks j in a random order; whenever the running
  projected g_i^PC conflicts with the ORIGINAL g_j (dot < 0), remove its component along g_j:
  g_i^PC -= (g_i^PC . g_j / ||g_j||^2) g_j. The update is the SUM of the projected gradients,
  as in the paper (several public ports average instead, which only rescales the step by 1/T
  but silently changes the effective learning rate relative to the non-surgery baseline).
- ``dominant``: "Freeze Your Layers" sec. 3.2. The task gradient of largest norm g_d is kept
  as is; every other g_i with g_i . g_d < 0 becomes g_i - (g_i . g_d / ||g_d||^2) g_d.
  The update is g_d plus the (projected or untouched) others. Ties: squared norms within a
  relative DOMINANT_RTOL of the largest count as equal, and the first such task in row order
  wins (PCGrad.backward's rows follow its losses dict, i.e. the order of the step's batches), so
  two norms that differ only by rounding never pick the task by float error.

An all-zero task gradient (e.g. a task whose loss does not reach the encoder) is never
projected against, which also means no 0/0, and it contributes zero to the update.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

VARIANTS = ("pcgrad", "dominant")
# Squared norms this close (relatively) to the largest tie for "dominant". A squared norm from
# gram_matrix rounds by up to ~5e-7 relative (float32 products over 16384-column chunks; measured on
# a vector and a permutation of it), and a 1e-5 difference in norms means nothing for the update.
DOMINANT_RTOL = 1e-5


@dataclass
class ConflictStats:
    pairs: int                   # unordered pairs of tasks present in the step: T(T-1)/2
    conflicting: int             # pairs whose ORIGINAL gradients have a negative dot product
    mean_conflict_cosine: float  # mean cosine over the conflicting pairs; nan if there are none

    @property
    def conflict_fraction(self) -> float:
        # nan (not 0) with fewer than two tasks: there was nothing that could conflict.
        return self.conflicting / self.pairs if self.pairs else math.nan


def gram_matrix(grads: torch.Tensor, chunk: int = 1 << 14) -> torch.Tensor:
    """G G^T of the (T, P) gradients: float32 products over column chunks, summed in float64.
    One read of the data, no full-size temporary; relative error ~1e-8 at P = 22M (one fp32
    matmul over all of P: ~1e-3), at about the speed of that single matmul."""
    T = grads.shape[0]
    gram = torch.zeros(T, T, dtype=torch.float64, device=grads.device)
    for c in grads.split(chunk, dim=1):
        c = c.float() if c.dtype in (torch.float16, torch.bfloat16) else c
        gram += (c @ c.T).double()
    return gram


def surgery_coefficients(gram: torch.Tensor, variant: str = "pcgrad", generator: torch.Generator | None = None,
                         order: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """The per-task projected gradients in the span of the task gradients: row i holds c_i with
    g_i^PC = sum_k c_ik g_k (their sum is the surgery update). Every dot product g_i^PC . g_j =
    c_i . gram[:, j], so the (T, P) data are never touched. ``order[i]`` fixes the sequence of other
    tasks that task i is projected against (pcgrad only; tests use it to pin Algorithm 1's random
    order); otherwise it is drawn from ``generator``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown surgery variant {variant!r}; expected one of {VARIANTS}")
    T = gram.shape[0]
    C = torch.eye(T, dtype=torch.float64)
    gram = gram.cpu()
    sq = gram.diagonal()
    if variant == "dominant":
        d = dominant_task(sq)
        if sq[d] > 0:
            for i in range(T):
                if i != d and gram[i, d] < 0:
                    C[i, d] -= gram[i, d] / sq[d]
        return C
    for i in range(T):
        if order is not None:
            others = [j for j in order[i] if j != i]
        else:
            others = [j for j in torch.randperm(T, generator=generator).tolist() if j != i]
        for j in others:
            if sq[j] == 0:
                continue
            dot = C[i] @ gram[:, j]
            if dot < 0:
                C[i, j] -= dot / sq[j]
    return C


def dominant_task(sq_norms: torch.Tensor, rtol: float = DOMINANT_RTOL) -> int:
    """The row of the largest squared norm; rows within a relative `rtol` of it tie, and the first
    of them wins. (argmax alone would let the last bits of rounding choose between equal norms.)"""
    values = sq_norms.tolist()
    top = max(values)
    # a nan never compares >=: fall back to argmax (surgery() skips non-finite steps before this)
    return next((i for i, v in enumerate(values) if v >= top * (1 - rtol)), int(torch.argmax(sq_norms)))


def _stats_from_gram(gram: torch.Tensor) -> ConflictStats:
    T = gram.shape[0]
    norms = gram.diagonal().clamp_min(0).sqrt()
    iu = torch.triu_indices(T, T, offset=1, device=gram.device)
    pair_dots, n_i, n_j = gram[iu[0], iu[1]], norms[iu[0]], norms[iu[1]]
    conflict = pair_dots < 0
    cosines = pair_dots[conflict] / (n_i[conflict] * n_j[conflict])
    n_conflict = int(conflict.sum())
    return ConflictStats(pairs=T * (T - 1) // 2, conflicting=n_conflict,
                         mean_conflict_cosine=float(cosines.mean()) if n_conflict else math.nan)


def surgery(
    grads: torch.Tensor, variant: str = "pcgrad", generator: torch.Generator | None = None
) -> tuple[torch.Tensor, ConflictStats]:
    """Combine (T, P) per-task gradients into one (P,) update. Pure: ``grads`` is untouched.

    Two passes over the data: the float64 Gram matrix, then one weighted sum of the rows."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown surgery variant {variant!r}; expected one of {VARIANTS}")
    gram = gram_matrix(grads)
    stats = _stats_from_gram(gram)
    # A non-finite entry makes its row's squared norm inf or nan (float32 squares cannot overflow
    # float64), so the diagonal is the finiteness check.
    if not bool(torch.isfinite(gram.diagonal()).all()):
        logger.debug("non-finite task gradients: surgery skipped")
        return grads.sum(dim=0), stats
    w = surgery_coefficients(gram, variant, generator).sum(dim=0)
    g = grads.float() if grads.dtype in (torch.float16, torch.bfloat16) else grads
    return (w.to(g.dtype).to(g.device) @ g).to(grads.dtype), stats


class PCGrad:
    """Per-task backward passes + surgery on the shared parameters' .grad.

    Usage per step::

        optimizer.zero_grad(set_to_none=True)
        stats = pcgrad.backward({"sst": l1, "para": l2, "sts": l3}, scaler=scaler)
        scaler.step(optimizer)  # or optimizer.step()

    Data-parallel (training/methods/distributed.py): ``reduce`` sums the (T, P) buffer, and the head
    gradients, across the ranks, so surgery sees the global per-task gradients.
    """

    def __init__(self, shared_params: Iterable[torch.nn.Parameter], variant: str = "pcgrad", seed: int = 0):
        if variant not in VARIANTS:
            raise ValueError(f"unknown surgery variant {variant!r}; expected one of {VARIANTS}")
        # Frozen params get no gradient and must not be given one (the optimizer would then
        # apply weight decay/momentum to them), so they are left out entirely.
        self.params = [p for p in shared_params if p.requires_grad]
        if not self.params:
            raise ValueError("PCGrad needs at least one trainable shared parameter")
        self.numels = [p.numel() for p in self.params]
        self.variant = variant
        self.generator = torch.Generator().manual_seed(seed)
        self._buf: torch.Tensor | None = None  # (rows, P), allocated on first use and reused

    def _buffer(self, rows: int) -> torch.Tensor:
        if self._buf is None or self._buf.shape[0] < rows:
            p0 = self.params[0]
            self._buf = torch.empty(max(3, rows), sum(self.numels), dtype=p0.dtype, device=p0.device)
        return self._buf

    def backward(
        self,
        task_losses: dict[str, torch.Tensor],
        scaler: torch.amp.GradScaler | None = None,
        reduce: Callable[[torch.Tensor], None] | None = None,
    ) -> ConflictStats:
        if any(p.grad is not None for p in self.params):
            raise RuntimeError("shared params already have .grad: call optimizer.zero_grad(set_to_none=True) "
                               "before PCGrad.backward, each task's gradient must be seen alone")
        # those a freezing schedule holds frozen for now have no gradient to operate on
        params = [p for p in self.params if p.requires_grad]
        numels = [p.numel() for p in params]
        names = list(task_losses)
        if not params and reduce is None:  # the heads alone train: nothing shared, nothing conflicts
            for loss in task_losses.values():
                (scaler.scale(loss) if scaler is not None else loss).backward()
            return ConflictStats(len(names) * (len(names) - 1) // 2, 0, math.nan)
        buf = self._buffer(len(names))[: len(names), : sum(numels)]
        touched = [False] * len(params)  # did any task reach this param?

        for t, name in enumerate(names):
            loss = task_losses[name]
            # Each task has its own forward over its own sub-batch, so graphs are disjoint and
            # no retain_graph is needed. Head params accumulate their own task's grad untouched.
            (scaler.scale(loss) if scaler is not None else loss).backward()
            for k, (p, row) in enumerate(zip(params, buf[t].split(numels))):
                if p.grad is None:  # this task does not reach p: a zero component
                    row.zero_()
                else:
                    row.copy_(p.grad.reshape(-1))
                    touched[k] = True
                    p.grad = None  # so the next task's backward starts from nothing

        if reduce is not None:
            reduce(buf)

        # AMP: the losses were scaled by s, a power of two, so every row is s * (true gradient). Surgery
        # runs on the true gradients (rows / s: exact), so that its Gram matrix and conflict statistics
        # see what an fp32 run would; its result goes back times s (exact again), where
        # scaler.unscale_/step divide it like the heads' gradients and run their inf/nan check.
        scale = scaler.get_scale() if scaler is not None else 1.0
        if scale != 1.0:
            buf.mul_(1.0 / scale)
        combined, stats = surgery(buf, self.variant, self.generator)
        if scale != 1.0:
            combined = combined * scale

        for p, chunk, hit in zip(params, combined.split(numels), touched):
            # A param no task reached keeps grad None, as after a plain backward, so the
            # optimizer skips it rather than stepping on a zero gradient.
            p.grad = chunk.view_as(p).to(p.dtype) if hit else None

        logger.debug("surgery %s over %s: %d/%d pairs conflicting, mean cosine %.3f",
                     self.variant, names, stats.conflicting, stats.pairs, stats.mean_conflict_cosine)
        return stats

    def state_dict(self) -> dict:
        """The random stream that orders the projections (the buffer is scratch space)."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
