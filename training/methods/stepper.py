"""The step machine: the loss of a step's task groups and one optimiser update, with the components
that change the update (PCGrad, SMART, weight EMA). Each component owns its state (`state_dict()` /
`load_state_dict()`); the Stepper's state is theirs plus the optimiser's and scheduler's.

    stepper = Stepper.build(model, cfg, total_steps, device)   # AdamW, warm-up/decay, the tricks
    parts = stepper.take(update, load, step)                   # a sampler's update: per-task loss parts,
                                                               # or None if skipped (non-finite)
    parts = stepper.step([batch], step)                        # the same from device batches
"""
from __future__ import annotations

import contextlib
import logging
import math
import warnings
from dataclasses import fields

import torch

from data.batching import Batch
from heads import KIND, MultitaskBert, task_loss
from training.common.device import autocast
from training.common.errors import ConfigError, NonFiniteLossError
from training.config.train_config import TrainConfig
from training.methods.compiling import mark_step
from training.methods.ema import WeightEMA
from training.methods.pcgrad import PCGrad
from training.methods.smart import EMATeacher, SmartConfig, adversarial_loss, bregman_loss, dropout_disabled

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the optimiser

def layer_depth(name: str, num_layers: int) -> int:
    """Depth of a parameter for layer-wise learning rates: embeddings 0, encoder layer i at i + 1,
    pooler and task heads num_layers + 1."""
    if name.startswith("encoder.embeddings."):
        return 0
    if name.startswith("encoder.layers."):
        return int(name.split(".")[2]) + 1
    return num_layers + 1


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device,
                    by_layer: bool = False) -> torch.optim.AdamW:
    """AdamW over the trainable parameters only; no weight decay on biases and LayerNorm weights.
    With --layer-lr-decay g a parameter at depth k (layer_depth) gets lr * g^(L + 1 - k) (lr: cfg.peak_lr()): the heads
    the full rate, each layer below g times the one above it. by_layer: one group per depth even
    without the decay (a freezing schedule warms each unfrozen layer up on its own).
    fused=True: one kernel for the whole update (on CPU too, where it measured ~7x faster)."""
    top = model.encoder.num_layers + 1
    groups: dict[tuple[int, bool], list] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            depth = top if cfg.layer_lr_decay == 1.0 and not by_layer else layer_depth(name, model.encoder.num_layers)
            groups.setdefault((depth, p.ndim < 2), []).append(p)
    groups = [{"params": groups[k], "lr": cfg.peak_lr() * cfg.layer_lr_decay ** (top - k[0]),
               "weight_decay": 0.0 if k[1] else cfg.weight_decay}
              for k in sorted(groups, key=lambda k: (-k[0], k[1]))]  # group 0: the heads' peak rate
    try:
        return torch.optim.AdamW(groups, lr=cfg.peak_lr(), fused=True)
    except (RuntimeError, TypeError):  # a device/dtype without a fused kernel
        return torch.optim.AdamW(groups, lr=cfg.peak_lr())


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """The warm-up's updates: the share of the updates, rounded down, where a product within floating point's
    rounding of a whole number is that number (50 * 0.58 is 28.999999999999996: 29 updates, not 28)."""
    share = total_steps * warmup_ratio
    return round(share) if abs(share - round(share)) < 1e-9 else math.floor(share)


def linear_warmup_decay(optimizer, total_steps: int, warmup_ratio: float, group_factors: list | None = None):
    """Linear warm-up over warmup_ratio of the steps, then linear decay to 0. group_factors: one more
    factor per parameter group, f(step) (a freezing schedule's warm-up of the layers it unfreezes)."""
    warmup = warmup_steps(total_steps, warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    if group_factors is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda step, f=f: factor(step) * f(step)
                                                         for f in group_factors])


def group_depths(model: MultitaskBert, optimizer) -> list[int]:
    """The layer_depth of each parameter group of an optimizer built by_layer."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [layer_depth(names[id(g["params"][0])], model.encoder.num_layers) for g in optimizer.param_groups]


# --------------------------------------------------------------------------- SMART's state

# TrainConfig's smart_* fields are SmartConfig's fields of the same name, but for these two
SMART_RENAMED = {"smart_lambda": "lambda_s", "smart_noise_var": "noise_std"}


def smart_config(cfg: TrainConfig) -> SmartConfig:
    """SmartConfig from TrainConfig's smart_* options: a new SMART setting is a field in both, no more."""
    names = {f.name for f in fields(SmartConfig)}
    values = {}
    for f in fields(TrainConfig):
        name = SMART_RENAMED.get(f.name, f.name.removeprefix("smart_"))
        if f.name.startswith("smart_") and name in names:
            values[name] = getattr(cfg, f.name)
    return SmartConfig(**values)


class SmartTerms:
    """SMART's stateful parts: the Bregman teacher (a momentum copy of the model) and the noise stream
    of the adversarial perturbation."""

    def __init__(self, model: MultitaskBert, cfg: TrainConfig, total_steps: int, device, seed: int):
        self.cfg, self.student = smart_config(cfg), model
        self.teacher = EMATeacher(model, self.cfg, total_steps=total_steps)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    # The teacher's state names the tensors it shares with the student, whose state the checkpoint holds
    # and the run loads first (Run.load_state_dict).
    def state_dict(self) -> dict:
        return {"teacher": self.teacher.state_dict(self.student), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.teacher.load_state_dict(state["teacher"], self.student)
        self.generator.set_state(state["generator"])


# --------------------------------------------------------------------------- fp16's loss scale

class LossScaler:
    """--precision fp16's dynamic loss scale (torch's GradScaler: the loss is multiplied by the scale
    before backward so that small fp16 gradients do not flush to 0; a step whose scaled gradients
    overflow is skipped and the scale halved; 2000 steps without one double it), and the count of the
    steps it skipped. Scales are powers of two, so scaling and unscaling are exact."""

    def __init__(self, device: torch.device):
        self.scaler = torch.amp.GradScaler(device.type)
        self.skipped = 0  # overflow steps over the whole run (--max-bad-steps counts non-finite losses apart)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def get_scale(self) -> float:
        return self.scaler.get_scale()

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])
        self.skipped = state["skipped"]


# --------------------------------------------------------------------------- the step

class Stepper:
    """Computes the loss of a step's task groups and applies one optimiser update."""

    def __init__(self, model: MultitaskBert, cfg: TrainConfig, optimizer, scheduler, device, amp_dtype,
                 total_steps: int, dist=None):
        self.model, self.cfg, self.optimizer, self.scheduler = model, cfg, optimizer, scheduler
        self.device, self.amp_dtype = device, amp_dtype
        self.dist = dist  # a training.methods.distributed.Dist in a data-parallel run, else None
        self.bad_steps = 0
        self.lr = 0.0  # the peak learning rate of the last step taken (heads' rate under --layer-lr-decay)
        self.ema = WeightEMA(model, cfg.ema_decay) if cfg.ema_decay is not None else None
        self.loss_scaler = LossScaler(device) if amp_dtype == torch.float16 else None
        shared = [p for p in model.encoder.parameters() if p.requires_grad]
        self.pcgrad = PCGrad(shared, variant=cfg.pcgrad_variant, seed=cfg.seed) if cfg.pcgrad else None
        self.freezer = None  # an adaptive freezing schedule's test, shown each update's gradients
        # on_update(stepper): called before each update's clipping, the step's gradients in place (unscaled
        # under fp16); for instrumentation (train(cfg, on_update=...)): it must not change them
        self.on_update = None
        self.smart_terms = None
        self.graphs = None  # a training.methods.step_graphs.StepGraphs under --step-graphs (set by the run)
        if cfg.smart:
            # Data-parallel: every rank its own noise (the teacher stays identical: it follows the
            # parameters, which are).
            seed = cfg.seed if dist is None else _rank_seed(cfg.seed, dist.rank)
            self.smart_terms = SmartTerms(model, cfg, total_steps, device, seed)

    @classmethod
    def build(cls, model: MultitaskBert, cfg: TrainConfig, total_steps: int, device=None, amp_dtype=None,
              dist=None, schedule=None) -> "Stepper":
        """A ready step machine for `model`: AdamW (build_optimizer) with linear warm-up and decay over
        `total_steps`, and the tricks cfg turns on. schedule: a freezing.FreezeSchedule; the optimiser,
        the weight EMA and PCGrad then hold every parameter it will ever train (a frozen one has no
        gradient, which each of them skips), and the model is left at the schedule's first depth."""
        device = device if device is not None else torch.device("cpu")
        if schedule is None or not schedule.scheduled:
            optimizer = build_optimizer(model, cfg, device)
            scheduler = linear_warmup_decay(optimizer, total_steps, cfg.warmup_ratio)
            return cls(model, cfg, optimizer, scheduler, device, amp_dtype, total_steps, dist)
        model.freeze(schedule.widest)
        optimizer = build_optimizer(model, cfg, device, by_layer=True)
        factors = [lambda step, k=k: schedule.lr_factor(k, step) for k in group_depths(model, optimizer)]
        scheduler = linear_warmup_decay(optimizer, total_steps, cfg.warmup_ratio, factors)
        stepper = cls(model, cfg, optimizer, scheduler, device, amp_dtype, total_steps, dist)
        stepper.freezer = schedule.freezer
        model.freeze(schedule.depth_at(0))
        return stepper

    # SMART's config and state, as the loss code reads them
    @property
    def smart(self) -> SmartConfig | None:
        return self.smart_terms.cfg if self.smart_terms else None

    @property
    def teacher(self) -> EMATeacher | None:
        return self.smart_terms.teacher if self.smart_terms else None

    @property
    def generator(self) -> torch.Generator | None:
        return self.smart_terms.generator if self.smart_terms else None

    def autocast(self, cache: bool = True):
        return autocast(self.device, self.amp_dtype, cache)

    def state_dict(self) -> dict:
        """The optimiser's, the scheduler's and each component's state, one key each."""
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "bad_steps": self.bad_steps}
        for name, part in self._components().items():
            state[name] = part.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        parts = self._components()
        if "scaler" in parts and "scaler" not in state:  # fp16 now, not then (--precision auto on another device)
            log.warning("the checkpoint was not trained in fp16: the loss scale starts afresh")
            del parts["scaler"]
        missing = [k for k in ("optimizer", "scheduler", *parts) if k not in state]
        if missing:
            raise ConfigError(f"the checkpoint has no {', '.join(missing)} state: it was written by another "
                              f"version of minBERT-MT, or without the options this run turns on")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.bad_steps = state["bad_steps"]
        for name, part in parts.items():
            part.load_state_dict(state[name])

    def _components(self) -> dict:
        parts = {"ema": self.ema, "pcgrad": self.pcgrad, "smart": self.smart_terms, "scaler": self.loss_scaler}
        return {k: v for k, v in parts.items() if v is not None}

    def scale_record(self) -> dict:
        """fp16: the loss scale and the steps its overflows skipped so far, for metrics.jsonl."""
        if self.loss_scaler is None:
            return {}
        return {"loss_scale": self.loss_scaler.get_scale(), "overflow_steps": self.loss_scaler.skipped}

    def task_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one task's group and its parts (loss_terms), the parts for the log and the
        finiteness test in one copy to the host (on CUDA each `.item()` and `if tensor` waits for the
        GPU, and a small model's step is bound by the host: docs/benchmarks.md, H200)."""
        loss, terms = self.loss_terms(batch)
        values = torch.stack([t.detach().float().reshape(()) for t in terms.values()]).tolist()
        return loss, dict(zip(terms, values))

    def loss_terms(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of one task's group: task loss, plus SMART's terms when on; and its parts, as tensors."""
        model, layer = self.model, self.model.first_trainable_layer
        masks = [s["attention_mask"] for s in batch.inputs]
        perturb_layer = 0 if self.cfg.perturbs_embeddings() else layer
        # The frozen prefix needs no graph unless SMART perturbs below it.
        frozen_prefix = model.frozen_upto is not None and perturb_layer == layer
        with torch.set_grad_enabled(not frozen_prefix and torch.is_grad_enabled()):
            hs = model.hidden_at(batch.inputs, perturb_layer)
        out = model.from_hidden(batch.task, hs, masks, perturb_layer)
        loss = task_loss(batch.task, out, batch.labels)
        terms = {"loss": loss}
        if self.smart:
            kind = KIND[batch.task]
            if self.smart.lambda_s:  # --smart-lambda 0 (Bregman term alone) skips the adversarial passes
                r_s = self._smoothness(batch.task, hs, out, masks, perturb_layer, kind)
                loss = loss + self.smart.lambda_s * r_s
                terms["r_s"] = r_s
            if self.smart.mu:
                teacher_inputs = batch.inputs
                if frozen_prefix:  # the teacher's frozen prefix is the student's: reuse its output
                    teacher_inputs = [{"hidden": h, "cache_layer": perturb_layer, "attention_mask": m}
                                      for h, m in zip(hs, masks)]
                d_breg = bregman_loss(out, self.teacher(batch.task, teacher_inputs, perturb_layer), kind)
                loss = loss + self.smart.mu * d_breg
                terms["d_breg"] = d_breg
        return loss, terms

    def _smoothness(self, task: str, hs: list, out: torch.Tensor, masks: list, perturb_layer: int, kind: str):
        """SMART's R_s at the hidden states `hs` that gave the clean output `out`."""
        model = self.model

        def f(xs):
            return model.from_hidden(task, list(xs), masks, perturb_layer)

        ctx = contextlib.nullcontext() if self.smart.adv_dropout else dropout_disabled(model)
        # fp32 whatever --precision says: the perturbation (about 1e-5 to 1e-3) is below bf16's
        # resolution, where R_s would measure rounding flips, not smoothness. Under fp16 the ascent takes
        # the gradient of its own unscaled fp32 loss (torch.autograd.grad, never the loss scaler's), so
        # it neither overflows nor depends on the scale; R_s then joins the scaled loss like any term.
        xs = tuple(h.float() for h in hs)
        with ctx, torch.autocast(self.device.type, enabled=False):
            clean = out.float()
            if not self.smart.adv_dropout:  # the target must be the same dropout-free network
                # the reference differentiates the clean side of R_s too; the paper's target is fixed
                with torch.no_grad() if self.smart.perturbation == "paper" else contextlib.nullcontext():
                    clean = f(xs)
            return adversarial_loss(f, xs, clean, kind, self.smart, masks=tuple(masks), generator=self.generator)

    def take(self, update: list[list], load, step: int) -> dict[str, dict[str, float]] | None:
        """One optimiser update from a sampler's update (data.sampler: one step's task batches, or
        --grad-accum-steps steps' of them), each TaskBatch made a device Batch by `load`. Data-parallel:
        this rank's slice of each task group, its parts come back global."""
        if self.cfg.grad_accum_steps > 1:
            return self.accumulated_step([[load(tb) for tb in tbs if tb.indices] for tbs in update], step)
        tbs, = update
        if self.dist is None:
            return self.step([load(tb) for tb in tbs if tb.indices], step)
        from training.methods.distributed import local_step
        mine, weights = local_step(tbs, self.dist.rank, self.dist.world_size)
        return self.step([load(tb) for tb in mine], step, weights)

    def step(self, batches: list[Batch], step: int, weights: list[float] | None = None
             ) -> dict[str, dict[str, float]] | None:
        """One update. Returns per-task loss parts, or None if the step was skipped (non-finite loss).

        Data-parallel (self.dist): `batches` are this rank's slices and `weights` their shares
        n_local / n_global of their task's global batch; the weighted gradients and loss parts are
        summed over the ranks (training/methods/distributed.py), so the update and the returned parts are
        those of the global batch.

        --step-graphs (self.graphs): a shape seen before replays its graph; a new one runs eagerly, then is
        recorded."""
        self.model.train()
        key = self.graphs.shape(batches) if self.graphs is not None else None
        if key is not None and (parts := self.graphs.replay(key, batches)) is not None:
            return self._after_replay(parts, batches, step)
        parts = self._eager_step(batches, step, weights)
        if key is not None and parts is not None:
            self.graphs.capture(key, batches)
        return parts

    def _after_replay(self, parts: dict, batches: list[Batch], step: int) -> dict[str, dict[str, float]] | None:
        """A step whose forward and backward its shape's CUDA graph replayed: the eager update."""
        tasks = ",".join(b.task for b in batches)
        if not all(finite(p) for p in parts.values()):
            return self._skip(tasks, step, parts)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return parts if self._update(params, tasks, step) else None

    def _eager_step(self, batches: list[Batch], step: int, weights: list[float] | None
                    ) -> dict[str, dict[str, float]] | None:
        if self.cfg.compile and self.cfg.compile_mode == "reduce-overhead":
            mark_step()  # the layers' CUDA graphs may reuse the last step's output memory
        self.optimizer.zero_grad(set_to_none=True)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        losses, parts = {}, {}
        nonfinite = 0
        for i, b in enumerate(batches):
            try:
                with self.autocast():
                    losses[b.task], parts[b.task] = self.task_loss(b)
            except torch.OutOfMemoryError as e:
                raise torch.OutOfMemoryError(_oom_message(b, self.cfg)) from e
            if not finite(parts[b.task]):
                if self.dist is None:
                    return self._skip(b.task, step, losses[b.task])
                nonfinite += 1  # every rank must still join the all-reduce; all skip after it
            if self.dist is not None:
                losses[b.task] = losses[b.task] * weights[i]
            if self.pcgrad is None:
                self._backward(losses[b.task])  # mixed batches without PCGrad: gradient of the sum of task losses
        reduce = None
        if self.dist is not None:
            from training.methods.distributed import StepReduce  # torch.distributed only for data-parallel runs
            reduce = StepReduce(self.dist, params, parts, weights, nonfinite)
        if self.pcgrad is not None:
            scaler = self.loss_scaler.scaler if self.loss_scaler is not None else None
            stats = self.pcgrad.backward(losses, scaler, reduce)  # surgery on the summed task gradients
            parts[batches[0].task]["pcgrad_conflict"] = stats.conflict_fraction
            parts[batches[0].task]["pcgrad_cosine"] = stats.mean_conflict_cosine
        elif reduce is not None:
            reduce()
        if reduce is not None and reduce.nonfinite:
            return self._skip(",".join(b.task for b in batches), step, "nan/inf on some rank")
        return parts if self._update(params, ",".join(b.task for b in batches), step) else None

    def accumulated_step(self, groups: list[list[Batch]], step: int) -> dict[str, dict[str, float]] | None:
        """One update from the gradients of several steps' batches (--grad-accum-steps): each group's
        loss is weighted 1 / len(groups), so the update is that of their mean, as one step over all of
        their examples would be when the groups are of one size. Parts: each task's mean over the groups.
        One process, no PCGrad (validation refuses the rest)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        sums: dict[str, dict[str, float]] = {}
        counts: dict[str, int] = {}
        for batches in groups:
            for b in batches:
                try:
                    with self.autocast():
                        loss, parts = self.task_loss(b)
                except torch.OutOfMemoryError as e:
                    raise torch.OutOfMemoryError(_oom_message(b, self.cfg)) from e
                if not finite(parts):
                    return self._skip(b.task, step, loss)
                self._backward(loss / len(groups))
                counts[b.task] = counts.get(b.task, 0) + 1
                for k, v in parts.items():
                    sums.setdefault(b.task, {})[k] = sums.get(b.task, {}).get(k, 0.0) + v
        means = {t: {k: v / counts[t] for k, v in p.items()} for t, p in sums.items()}
        return means if self._update(params, ",".join(means), step) else None

    def _backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), times the loss scale under fp16."""
        (self.loss_scaler.scale(loss) if self.loss_scaler is not None else loss).backward()

    def _update(self, params: list, tasks: str, step: int) -> bool:
        """Clip, then the optimiser, scheduler, teacher and weight-average updates; False where the
        gradient is not finite (the step is skipped). fp16: the gradients are unscaled first, so that
        clipping, the adaptive freezer's norms and the update see the true gradients."""
        if self.loss_scaler is not None:
            self.loss_scaler.scaler.unscale_(self.optimizer)  # records whether any gradient overflowed
        if self.on_update is not None:
            self.on_update(self)
        layer_norms = self.freezer.layer_norms(self.model) if self.freezer is not None else None  # before clipping
        if self.cfg.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        else:
            norm = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in params if p.grad is not None))
        if not torch.isfinite(norm):
            if self.loss_scaler is not None and self._overflowed(tasks, step):
                return False
            self._skip(tasks, step, norm)
            return False
        if layer_norms is not None:
            self.freezer.observe(layer_norms)
        self.lr = max(g["lr"] for g in self.optimizer.param_groups)
        if self.loss_scaler is not None:
            self.loss_scaler.scaler.step(self.optimizer)  # the gradients are finite: it steps
            self.loss_scaler.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        if self.smart_terms is not None:
            self.smart_terms.teacher.update(self.model)
        if self.ema is not None:
            self.ema.update(self.model)
        self.bad_steps = 0
        return True

    def _overflowed(self, tasks: str, step: int) -> bool:
        """fp16, a non-finite gradient: the scaler halves its scale. True where that was an overflow of
        the scaled gradients (the scale was above 1): the step is skipped (weights, optimiser state,
        teacher and weight average untouched; the schedule moves on) and counted apart from the bad
        steps. False where the gradient is not finite even unscaled: a bad step like any other."""
        scale = self.loss_scaler.get_scale()
        self.loss_scaler.scaler.update()  # no step: unscale_ found the inf, so the scale backs off
        if scale <= 1.0:
            return False
        self.loss_scaler.skipped += 1
        self.optimizer.zero_grad(set_to_none=True)
        self._schedule_on()
        log.info("step %d (%s): fp16 gradients overflowed at loss scale %g; step skipped, scale now %g (%d "
                 "overflow steps so far)", step, tasks, scale, self.loss_scaler.get_scale(), self.loss_scaler.skipped)
        return True

    def _schedule_on(self) -> None:
        """A skipped step moves the learning-rate schedule on: it follows the step count, taken or skipped."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()

    def _skip(self, task: str, step: int, value) -> None:
        self.bad_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self._schedule_on()
        step += 1  # numbered as metrics.jsonl and the checkpoints number the updates, from 1
        log.warning("step %d (%s): non-finite loss or gradient (%s); step skipped (%d in a row)",
                    step, task, value, self.bad_steps)
        if self.bad_steps >= self.cfg.max_bad_steps:
            raise NonFiniteLossError(f"{self.bad_steps} consecutive non-finite steps, the last at step {step} on "
                                     f"task {task}; lower --lr, or check the data. --out-dir keeps best.pt (the best "
                                     f"epoch so far) and the training checkpoints written up to here "
                                     f"(every --save-every steps and at epoch ends); --resume auto goes back to "
                                     f"the newest")
        return None


def finite(parts: dict[str, float]) -> bool:
    """Whether a loss is finite, from its parts: the loss is their weighted sum, finite where each is
    (a sum of finite parts that overflows float32 still fails, later, as a non-finite gradient)."""
    return all(math.isfinite(v) for v in parts.values())


def _oom_message(b: Batch, cfg: TrainConfig) -> str:
    T = max(seq["attention_mask"].shape[1] for seq in b.inputs)
    return (f"out of memory on a {b.task} batch of {b.size} sequences x {T} tokens "
            f"({len(b.inputs)} sequence(s) per example): lower --batch-size (now {cfg.batch_size}) or "
            f"--max-length (now {cfg.max_length}), or use --precision bf16 / --freeze-upto N")


def _rank_seed(seed: int, rank: int) -> int:
    from training.methods.distributed import rank_seed  # torch.distributed only for data-parallel runs
    return rank_seed(seed, rank)
