"""Freezing schedules (--unfreeze-schedule): which encoder layers train at each step.

    fixed                                  --freeze-upto N for the whole run (the default)
    lp-ft:K[,probe-lr=R]                   linear probing, then fine-tuning (Kumar et al. 2022): the heads
                                           alone (or --freeze-upto N) for K, at rate R if given (a probe
                                           wants more than fine-tuning does), then everything at --lr
    gradual:K[,layers=S][,floor=F]         gradual unfreezing (Howard & Ruder 2018, ULMFiT): frozen as lp-ft
                                           starts, then S more layers (default 1) from the top every K, down
                                           to depth F (default all: nothing frozen, the embeddings neither)
    adaptive:K[,threshold=T|percentile=P][,ceiling=C]
                                           adaptive freezing (Liu et al. 2021, AutoFreeze): everything (or
                                           what --freeze-upto N leaves) trains; every K the lowest trainable
                                           layers whose gradient norm has stopped changing are frozen, up to
                                           depth C (default: every layer), never unfrozen again

K is `Nsteps` (optimiser updates) or `Nepochs`. A depth is --freeze-upto's: d >= 1 freezes the embeddings and
layers 0..d-1; 0 the embeddings alone; None nothing. Unfreezing goes from depth 1 straight to the floor, so
the embeddings unfreeze with layer 0 unless `floor=0` keeps them frozen; adaptive freezing freezes them with
layer 0.

The learning rate: every parameter the schedule will ever train is in the optimiser from the start (a frozen
one gets no gradient, so AdamW leaves it, its moments and its weight decay alone: it stays bit-identical to
its pretrained value until its phase). The run's warm-up and linear decay apply to all; a layer unfrozen at
step t is also warmed up on its own, its rate scaled by min(1, (step - t + 1) / W) with W = `warmup=W`
(default: the run's own warm-up length, --warmup-ratio of its steps), so that it does not meet the full rate
with zero Adam moments. --layer-lr-decay scales each layer's rate as without a schedule.

The convergence test of `adaptive` (our reading of AutoFreeze's, with an absolute threshold in place of the
paper's percentile by default, so that it is the same test on a 6-layer and a 24-layer model): over each
interval of K updates, the mean gradient norm of each trainable encoder layer (the L2 norm over its
parameters, before clipping) n_l; with the previous interval's m_l, the relative change r_l = |n_l - m_l| /
m_l. From the lowest trainable layer up, each layer with r_l < T (default 0.1) is frozen, stopping at the
first that is still changing, so the frozen layers stay a prefix the frozen-prefix cache can serve.
`percentile=P` is the paper's own cut instead: T is then, at each test, the P-th percentile (linear
interpolation) of the trainable layers' changes (its authors found the median, P = 50, to agree best with
their offline measure of convergence), a relative test that freezes whenever the lowest layer is among
the calmer ones.
"""
from __future__ import annotations

import logging
import math

from training.config.freeze_spec import FLAG, ScheduleSpec, freeze_depth, parse_schedule

log = logging.getLogger(__name__)

def schedule_error(text: str, freeze_upto: int | None, num_layers: int) -> str | None:
    """The one line for a schedule that cannot run on a model of num_layers layers from depth freeze_upto
    (--freeze-upto already resolved on the model: run_settings.py), else None."""
    try:
        spec = parse_schedule(text)
    except ValueError as e:
        return str(e)
    if spec.kind == "fixed":
        return None
    start = start_depth(spec, freeze_upto, num_layers)
    floor, ceiling = freeze_depth(spec.floor, num_layers), freeze_depth(spec.ceiling, num_layers)
    for key, depth in (("floor", floor), ("ceiling", ceiling)):
        if depth is not None and depth > num_layers:
            return (f"{FLAG} {text}: {key}={getattr(spec, key)} is past the model's {num_layers} layers "
                    f"(at most {num_layers})")
    if spec.kind == "gradual" and spec.layers > num_layers:
        return f"{FLAG} {text}: layers={spec.layers} is more than the model's {num_layers} layers"
    if spec.kind in ("lp-ft", "gradual") and _shallower(floor, start) is False:
        return (f"{FLAG} {text}: it starts at --freeze-upto {start} and would unfreeze down to "
                f"{'nothing frozen' if floor is None else floor}: nothing to unfreeze")
    if spec.kind == "adaptive" and start is not None and start >= (num_layers if ceiling is None else ceiling):
        return f"{FLAG} {text}: --freeze-upto {start} is already at the deepest depth it may freeze to"
    return None


def optimised_depth(spec: ScheduleSpec, freeze_upto: int | None, num_layers: int) -> int | None:
    """The shallowest depth a run of this schedule reaches (the optimiser holds what trains there), from
    --freeze-upto already resolved on the model."""
    return widest_depth(spec, start_depth(spec, freeze_upto, num_layers), freeze_depth(spec.floor, num_layers))


def widest_depth(spec: ScheduleSpec, start: int | None, floor: int | None) -> int | None:
    """lp-ft ends with nothing frozen, gradual at its floor (below its start: schedule_error sees to it);
    fixed and adaptive never train more than at their start."""
    if spec.kind == "lp-ft":
        return None
    return floor if spec.kind == "gradual" else start


def start_depth(spec: ScheduleSpec, freeze_upto: int | None, num_layers: int) -> int | None:
    """lp-ft and gradual start with the heads alone unless --freeze-upto N says another depth; adaptive
    and fixed start where --freeze-upto puts them."""
    if spec.kind in ("lp-ft", "gradual") and freeze_upto is None:
        return num_layers
    return freeze_upto


def _shallower(a: int | None, b: int | None) -> bool:
    """Whether depth a trains more of the encoder than depth b (None: nothing frozen, the shallowest)."""
    return depth_rank(a) < depth_rank(b)


def depth_rank(depth: int | None) -> int:
    """A depth's place in the order shallow to deep, where -1 and 0 (both: the embeddings alone) are one."""
    return -2 if depth is None else max(depth, 0)


def trainable_at(param_depth: int, depth: int | None) -> bool:
    """Whether a parameter at layer_depth param_depth (0 embeddings, i + 1 layer i, L + 1 heads) trains
    when the frozen depth is `depth`."""
    return depth is None or param_depth > max(depth, 0)


class FreezeSchedule:
    """A spec resolved on a model and a run: the frozen depth at each step, the depth whose trainable
    parameters the optimiser holds (the shallowest the run reaches), the warm-up of unfrozen layers, and for
    `adaptive` the convergence test's state."""

    def __init__(self, spec: ScheduleSpec, freeze_upto: int | None, num_layers: int, steps_per_epoch: int,
                 total_steps: int, run_warmup: int, lr: float = 1.0):
        self.spec, self.num_layers, self.total_steps, self.lr = spec, num_layers, total_steps, lr
        self.start = start_depth(spec, freeze_upto, num_layers)
        self.every = spec.every * (steps_per_epoch if spec.unit == "epochs" else 1)
        self.floor = freeze_depth(spec.floor, num_layers)
        self.warmup = run_warmup if spec.warmup is None else spec.warmup
        self.changes = self._changes()  # [(step, depth)]: fixed, lp-ft and gradual know theirs in advance
        self.freezer = None
        if spec.kind == "adaptive":
            ceiling = freeze_depth(spec.ceiling, num_layers)
            self.freezer = AdaptiveFreezer(num_layers, self.every, spec.threshold,
                                           num_layers if ceiling is None else ceiling, self.start, spec.percentile)

    @property
    def scheduled(self) -> bool:
        return self.spec.kind != "fixed"

    def _changes(self) -> list[tuple[int, int | None]]:
        if self.spec.kind == "lp-ft":
            return [(self.every, None)]
        if self.spec.kind != "gradual":
            return []
        out, depth, step = [], self.start, self.every
        while _shallower(self.floor, depth):
            nxt = depth - self.spec.layers
            if nxt < 1 or not _shallower(self.floor, nxt):  # past layer 0, or at the floor: the floor
                nxt = self.floor
            out.append((step, nxt))
            depth, step = nxt, step + self.every
        return out

    def check_length(self) -> str | None:
        """Why the schedule never acts in a run of total_steps updates, else None."""
        if self.spec.kind in ("lp-ft", "gradual", "adaptive") and self.every >= self.total_steps:
            return (f"{FLAG} {self.spec_text()}: its first {'test' if self.freezer else 'unfreezing'} would come "
                    f"at step {self.every}, past the run's {self.total_steps} steps: shorten the interval")
        return None

    def spec_text(self) -> str:
        return f"{self.spec.kind}:{self.spec.every}{self.spec.unit}"

    def depth_at(self, step: int) -> int | None:
        """The frozen depth of update `step` (0-based)."""
        if self.freezer is not None:
            return self.freezer.depth
        depth = self.start
        for at, d in self.changes:
            if step >= at:
                depth = d
        return depth

    @property
    def widest(self) -> int | None:
        """The shallowest depth of the run: its trainable parameters are the optimiser's."""
        return widest_depth(self.spec, self.start, self.floor)

    def unfrozen_at(self, param_depth: int) -> int:
        """The first update at which a parameter at layer_depth param_depth trains."""
        if trainable_at(param_depth, self.start) or self.freezer is not None:
            return 0
        return next(at for at, d in self.changes if trainable_at(param_depth, d))

    def lr_factor(self, param_depth: int, step: int) -> float:
        """What the schedule multiplies the run's rate by for a parameter at layer_depth param_depth: the
        newly unfrozen layers' own warm-up; lp-ft's probe rate over --lr in its first phase."""
        t = self.unfrozen_at(param_depth)
        if t == 0:
            probing = self.spec.probe_lr is not None and step < self.every
            return self.spec.probe_lr / self.lr if probing else 1.0
        if self.warmup <= 0:
            return 1.0
        return min(1.0, max(0.0, (step - t + 1) / self.warmup))

    def phase_end(self, step: int) -> int:
        """The step where the phase holding `step` ends (the run's end for the last, and for adaptive)."""
        return next((at for at, _ in self.changes if at > step), self.total_steps)

    def state_dict(self) -> dict:
        return {"freezer": self.freezer.state_dict()} if self.freezer is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.freezer is not None:
            self.freezer.load_state_dict(state["freezer"])


class AdaptiveFreezer:
    """AutoFreeze's test (module docstring): each update's per-layer gradient norms summed over an
    interval; at its end, the lowest layers whose mean has stopped changing freeze."""

    def __init__(self, num_layers: int, every: int, threshold: float, ceiling: int, depth: int | None,
                 percentile: float | None = None):
        self.num_layers, self.every, self.threshold, self.ceiling = num_layers, every, threshold, ceiling
        self.percentile = percentile
        self.depth = depth
        self.sums = [0.0] * num_layers  # this interval's summed gradient norms, layer by layer
        self.count = 0  # updates observed in this interval
        self.previous: list[float] | None = None  # the last interval's means
        self.history: list[dict] = []  # each test: step, means, changes, the depth after it

    def first_trainable(self) -> int:
        return max(self.depth or 0, 0)

    def layer_norms(self, model) -> dict[int, float]:
        """Each trainable encoder layer's gradient norm (L2 over its parameters), as the update has it now."""
        import torch  # this module is also the config's, which stays torch-free

        norms, layers = {}, model.encoder.layers
        for i in range(self.first_trainable(), self.num_layers):
            grads = [p.grad for p in layers[i].parameters() if p.grad is not None]
            if grads:
                with torch.no_grad():
                    norms[i] = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))
        return norms

    def observe(self, norms: dict[int, float]) -> None:
        """An update's layer_norms, taken before clipping (of an update that was applied)."""
        for i, n in norms.items():
            self.sums[i] += n
        self.count += 1

    def after_update(self, step: int) -> int | None:
        """At the end of an interval (`step` updates done): the test, and the depth from the next update."""
        if step % self.every or self.count == 0 or self.first_trainable() >= self.ceiling:
            return self.depth
        low = self.first_trainable()
        means = [s / self.count for s in self.sums]
        changes = None
        cut = None
        if self.previous is not None:
            changes = [abs(m - p) / p if p > 0 else math.inf for m, p in zip(means, self.previous)]
            cut = self.threshold if self.percentile is None else percentile(changes[low:], self.percentile)
            layer = low
            while layer < self.ceiling and changes[layer] < cut:
                layer += 1
            if layer > low:
                self.depth = layer
        self.history.append({"step": step, "grad_norms": means[low:], "changes": changes[low:] if changes else None,
                             "cut": cut, "first_layer": low, "depth": self.depth})
        self.previous, self.sums, self.count = means, [0.0] * self.num_layers, 0
        return self.depth

    def state_dict(self) -> dict:
        return {"depth": self.depth, "sums": list(self.sums), "count": self.count, "previous": self.previous,
                "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.depth, self.sums, self.count = state["depth"], list(state["sums"]), state["count"]
        self.previous, self.history = state["previous"], list(state["history"])


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile of values, interpolating linearly between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    below = math.floor(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)
