"""The training recipe: wires model, data, sampler, optimiser and the multi-task tricks together.

One loop for CPU and CUDA, in one process or data-parallel under torchrun (training/distributed.py).
Each step trains on one task's batch (MT-DNN and the other per-task samplers) or on a mixed batch
grouped by task (--task-sampling mixed, PCGrad's sampler); the loss of each task's group is
computed separately so PCGrad can take one backward per task.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data.batching import Batch, TaskData, encode_task, make_batch, with_swapped_pairs
from data.loaders import load_task_file
from data.sampler import TaskBatch, epoch_schedule, mixed_schedule, padding_efficiency
from heads import KIND, MultitaskBert, task_loss
from minbert import Tokenizer, load_bert, resolve_checkpoint
from minbert.checkpoint import copy_tokenizer_files

from .checkpointing import (RollingCheckpoints, RunState, TrainingInterrupted, drop_earlier_log,
                            earlier_run_to_replace, find_resume_checkpoint, remove_earlier_run,
                            restore_training_state, save_checkpoint, stop_on_signals, training_state,
                            truncate_metrics)
from .config import TrainConfig
from .evaluate import evaluate, write_all_predictions
from .progress import LOG_FORMAT, progress

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration that cannot work with the model or data it names (one line for the user)."""


class NonFiniteLossError(RuntimeError):
    pass


# --------------------------------------------------------------------------- setup helpers

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def fast_bf16(device: torch.device) -> bool:
    """Does this device do bf16 matmuls in hardware? CUDA: Ampere and later. CPU: AMX tiles (Intel
    Sapphire Rapids and later), where bf16 autocast measured 2x faster per training step and the quick
    start 1.6x faster at the same dev scores (README); without AMX it is not measured: fp32 stays."""
    if device.type == "cuda":
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch < 2.4: no emulation flag, and no emulation either
            return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        is_amx = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private; absent in some builds
        return bool(is_amx and is_amx())
    return False


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """--precision: bf16 autocast, or None for plain fp32. auto: bf16 where the hardware is fast at it."""
    if precision == "bf16" or (precision == "auto" and fast_bf16(device)):
        return torch.bfloat16
    return None


def layer_depth(name: str, num_layers: int) -> int:
    """Depth of a parameter for layer-wise learning rates: embeddings 0, encoder layer i at i + 1,
    pooler and task heads num_layers + 1."""
    if name.startswith("encoder.embeddings."):
        return 0
    if name.startswith("encoder.layers."):
        return int(name.split(".")[2]) + 1
    return num_layers + 1


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the trainable parameters only; no weight decay on biases and LayerNorm weights.
    With --layer-lr-decay g a parameter at depth k (layer_depth) gets lr * g^(L + 1 - k): the heads
    the full rate, each layer below g times the one above it.
    fused=True: one kernel for the whole update (on CPU too, where it measured ~7x faster)."""
    top = model.encoder.num_layers + 1
    groups: dict[tuple[int, bool], list] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            depth = top if cfg.layer_lr_decay == 1.0 else layer_depth(name, model.encoder.num_layers)
            groups.setdefault((depth, p.ndim < 2), []).append(p)
    groups = [{"params": groups[k], "lr": cfg.lr * cfg.layer_lr_decay ** (top - k[0]),
               "weight_decay": 0.0 if k[1] else cfg.weight_decay}
              for k in sorted(groups, key=lambda k: (-k[0], k[1]))]  # group 0: the heads' peak rate
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)
    except (RuntimeError, TypeError):  # a device/dtype without a fused kernel
        return torch.optim.AdamW(groups, lr=cfg.lr)


def linear_warmup_decay(optimizer, total_steps: int, warmup_ratio: float):
    warmup = int(total_steps * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --------------------------------------------------------------------------- data

@dataclass
class Splits:
    train: dict[str, TaskData]
    dev: dict[str, TaskData]
    test: dict[str, TaskData]


def load_data(cfg: TrainConfig, tokenizer: Tokenizer) -> Splits:
    out = Splits({}, {}, {})
    for task in cfg.tasks:
        for split, target in (("train", out.train), ("dev", out.dev), ("test", out.test)):
            path = cfg.file(task, split)
            if split == "test" and not os.path.isfile(path):
                log.warning("%s: not found; no %s test predictions will be written", path, task)
                continue
            examples = load_task_file(path, task, labelled=split != "test", strict=cfg.strict).examples
            if split == "train" and cfg.max_train_examples and len(examples) > cfg.max_train_examples:
                keep = np.random.default_rng([cfg.seed, 7]).permutation(len(examples))[: cfg.max_train_examples]
                examples = [examples[i] for i in sorted(keep)]
            if split == "train" and cfg.pair_swap and task != "sst" and cfg.pair_encoding == "cross":
                examples = with_swapped_pairs(examples)
            target[task] = encode_task(task, examples, tokenizer, cfg.pair_encoding, cfg.max_length,
                                       both_orders=cfg.predict_both_orders and split != "train")
    return out


def schedule_for_epoch(cfg: TrainConfig, train: dict[str, TaskData], epoch: int) -> list[list[TaskBatch]]:
    """The epoch's steps; each step is a list of TaskBatch (one, or one per task in a mixed batch)."""
    sizes = {t: len(d) for t, d in train.items()}
    if cfg.task_sampling == "mixed":
        return mixed_schedule(sizes, cfg.batch_size, epoch=epoch, seed=cfg.seed)
    lengths = {t: d.lengths for t, d in train.items()} if cfg.bucket else None
    steps = epoch_schedule(sizes, cfg.batch_size, epoch=epoch, seed=cfg.seed, sampling=cfg.task_sampling,
                           num_epochs=cfg.epochs, max_batches_per_task=cfg.max_batches_per_task, lengths=lengths)
    return [[s] for s in steps]


# --------------------------------------------------------------------------- the step

class Stepper:
    """Computes the loss of a step's task groups and applies one optimiser update."""

    def __init__(self, model: MultitaskBert, cfg: TrainConfig, optimizer, scheduler, device, amp_dtype,
                 total_steps: int, dist=None):
        self.model, self.cfg, self.optimizer, self.scheduler = model, cfg, optimizer, scheduler
        self.device, self.amp_dtype = device, amp_dtype
        self.dist = dist  # a training.distributed.Dist in a data-parallel run, else None
        self.bad_steps = 0
        self.lr = 0.0  # the peak learning rate of the last step taken (heads' rate under --layer-lr-decay)
        self.pcgrad = self.smart = self.teacher = self.ema = None
        if cfg.ema_decay is not None:
            from .ema import WeightEMA
            self.ema = WeightEMA(model, cfg.ema_decay)
        shared = [p for p in model.encoder.parameters() if p.requires_grad]
        if cfg.pcgrad:
            from .pcgrad import PCGrad
            self.pcgrad = PCGrad(shared, variant=cfg.pcgrad_variant, seed=cfg.seed)
        if cfg.smart:
            from .smart import EMATeacher, SmartConfig
            self.smart = SmartConfig(lambda_s=cfg.smart_lambda, mu=cfg.smart_mu, eps=cfg.smart_eps,
                                     step_size=cfg.smart_step_size, noise_std=cfg.smart_noise_var,
                                     steps=cfg.smart_steps, norm=cfg.smart_norm, beta=cfg.smart_beta,
                                     adv_dropout=cfg.smart_adv_dropout)
            self.teacher = EMATeacher(model, self.smart, total_steps=total_steps)
            # Data-parallel: every rank its own noise (the teacher stays identical: it follows the
            # parameters, which are).
            seed = cfg.seed
            if dist is not None:
                from .distributed import rank_seed
                seed = rank_seed(cfg.seed, dist.rank)
            self.generator = torch.Generator(device=device).manual_seed(seed)

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def task_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one task's group: task loss, plus SMART's terms when on."""
        model, layer = self.model, self.model.first_trainable_layer
        masks = [s["attention_mask"] for s in batch.inputs]
        perturb_layer = 0 if (self.smart and self.cfg.smart_perturb_at == "embeddings") else layer
        # The frozen prefix needs no graph unless SMART perturbs below it.
        frozen_prefix = model.frozen_upto is not None and perturb_layer == layer
        with torch.set_grad_enabled(not frozen_prefix and torch.is_grad_enabled()):
            hs = model.hidden_at(batch.inputs, perturb_layer)
        out = model.from_hidden(batch.task, hs, masks, perturb_layer)
        loss = task_loss(batch.task, out, batch.labels)
        parts = {"loss": loss.item()}
        if self.smart:
            kind = KIND[batch.task]
            if self.smart.lambda_s:  # --smart-lambda 0 (Bregman term alone) skips the adversarial passes
                r_s = self._smoothness(batch.task, hs, out, masks, perturb_layer, kind)
                loss = loss + self.smart.lambda_s * r_s
                parts["r_s"] = r_s.item()
            if self.smart.mu:
                from .smart import bregman_loss
                teacher_inputs = batch.inputs
                if frozen_prefix:  # the teacher's frozen prefix is the student's: reuse its output
                    teacher_inputs = [{"hidden": h, "cache_layer": perturb_layer, "attention_mask": m}
                                      for h, m in zip(hs, masks)]
                d_breg = bregman_loss(out, self.teacher(batch.task, teacher_inputs, perturb_layer), kind)
                loss = loss + self.smart.mu * d_breg
                parts["d_breg"] = d_breg.item()
        return loss, parts

    def _smoothness(self, task: str, hs: list, out: torch.Tensor, masks: list, perturb_layer: int, kind: str):
        """SMART's R_s at the hidden states `hs` that gave the clean output `out`."""
        from .smart import adversarial_loss, dropout_disabled
        model = self.model

        def f(xs):
            return model.from_hidden(task, list(xs), masks, perturb_layer)

        ctx = contextlib.nullcontext() if self.smart.adv_dropout else dropout_disabled(model)
        # fp32 whatever --precision says: the perturbation (about 1e-5 to 1e-3) is below bf16's
        # resolution, where R_s would measure rounding flips, not smoothness
        xs = tuple(h.float() for h in hs)
        with ctx, torch.autocast(self.device.type, enabled=False):
            clean = out.float()
            if not self.smart.adv_dropout:  # the target must be the same dropout-free network
                with torch.no_grad():
                    clean = f(xs)
            return adversarial_loss(f, xs, clean, kind, self.smart, masks=tuple(masks), generator=self.generator)

    def step(self, batches: list[Batch], step: int, weights: list[float] | None = None
             ) -> dict[str, dict[str, float]] | None:
        """One update. Returns per-task loss parts, or None if the step was skipped (non-finite loss).

        Data-parallel (self.dist): `batches` are this rank's slices and `weights` their shares
        n_local / n_global of their task's global batch; the weighted gradients and loss parts are
        summed over the ranks (training/distributed.py), so the update and the returned parts are
        those of the global batch."""
        self.model.train()
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
            if not torch.isfinite(losses[b.task]):
                if self.dist is None:
                    return self._skip(b.task, step, losses[b.task])
                nonfinite += 1  # every rank must still join the all-reduce; all skip after it
            if self.dist is not None:
                losses[b.task] = losses[b.task] * weights[i]
            if self.pcgrad is None:
                losses[b.task].backward()  # mixed batches without PCGrad: gradient of the sum of task losses
        reduce = None
        if self.dist is not None:
            from .distributed import StepReduce
            reduce = StepReduce(self.dist, params, parts, weights, nonfinite)
        if self.pcgrad is not None:
            stats = self.pcgrad.backward(losses, reduce=reduce)  # surgery on the summed task gradients
            parts[batches[0].task]["pcgrad_conflict"] = stats.conflict_fraction
            parts[batches[0].task]["pcgrad_cosine"] = stats.mean_conflict_cosine
        elif reduce is not None:
            reduce()
        if reduce is not None and reduce.nonfinite:
            return self._skip(",".join(b.task for b in batches), step, "nan/inf on some rank")
        if self.cfg.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        else:
            norm = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in params if p.grad is not None))
        if not torch.isfinite(norm):
            return self._skip(",".join(b.task for b in batches), step, norm)
        self.lr = max(g["lr"] for g in self.optimizer.param_groups)
        self.optimizer.step()
        self.scheduler.step()
        if self.teacher is not None:
            self.teacher.update(self.model)
        if self.ema is not None:
            self.ema.update(self.model)
        self.bad_steps = 0
        return parts

    def _skip(self, task: str, step: int, value) -> None:
        self.bad_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # the schedule follows the step count, taken or skipped
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        log.warning("step %d (%s): non-finite loss or gradient (%s); step skipped (%d in a row)",
                    step, task, value, self.bad_steps)
        if self.bad_steps >= self.cfg.max_bad_steps:
            raise NonFiniteLossError(f"{self.bad_steps} consecutive non-finite steps, the last at step {step} on "
                                     f"task {task}; lower --lr, or check the data. --out-dir keeps best.pt (the best "
                                     f"epoch so far) and the training checkpoints written up to here "
                                     f"(every --save-every steps and at epoch ends); --resume auto goes back to "
                                     f"the newest")
        return None


def _oom_message(b: Batch, cfg: TrainConfig) -> str:
    T = max(seq["attention_mask"].shape[1] for seq in b.inputs)
    return (f"out of memory on a {b.task} batch of {b.size} sequences x {T} tokens "
            f"({len(b.inputs)} sequence(s) per example): lower --batch-size (now {cfg.batch_size}) or "
            f"--max-length (now {cfg.max_length}), or use --precision bf16 / --freeze-upto N")


def maybe_frozen_cache(cfg: TrainConfig, model: MultitaskBert, train: dict[str, TaskData], tokenizer, device,
                       dist=None, amp_dtype: torch.dtype | None = None):
    """The frozen-prefix cache when it applies (frozen encoder layers, nothing needing their gradients)."""
    if cfg.frozen_cache == "off":
        return None
    if model.first_trainable_layer < 1:
        if cfg.frozen_cache != "auto":
            log.warning("--frozen-cache %s does nothing here: no encoder layer is frozen (it caches the states "
                        "entering the first trainable layer, with --freeze-upto N >= 1)", cfg.frozen_cache)
        return None
    if cfg.smart and cfg.smart_perturb_at == "embeddings":
        log.info("frozen-prefix cache off: SMART perturbs the embeddings, which needs gradients through the "
                 "frozen layers every step (--smart-perturb-at first-trainable keeps the cache)")
        return None
    if dist is not None:
        from .distributed import frozen_cache_per_rank
        return frozen_cache_per_rank(dist, model, train, tokenizer, device, cfg.frozen_cache, cfg.cache_dir,
                                     amp_dtype)
    from .frozen_cache import build_frozen_cache
    return build_frozen_cache(model, train, tokenizer, device, cfg.frozen_cache, cfg.cache_dir,
                              compute_dtype=amp_dtype)


# --------------------------------------------------------------------------- the run

def build_model(cfg: TrainConfig) -> tuple[MultitaskBert, Tokenizer, Path]:
    ckpt = resolve_checkpoint(cfg.model)
    try:
        tokenizer = Tokenizer.from_checkpoint(ckpt)
    except ValueError as e:  # an unreadable tokenizer.json, a vocabulary without [CLS]: the message names it
        raise ConfigError(str(e)) from None
    encoder = load_bert(ckpt, attn_impl=cfg.attn_impl)
    if cfg.max_length > encoder.config.max_position_embeddings:
        positions = encoder.config.max_position_embeddings
        raise ConfigError(f"--max-length {cfg.max_length} is longer than the model's {positions} positions "
                          f"(max_position_embeddings in {ckpt / 'config.json'})")
    if tokenizer.vocab_size > encoder.config.vocab_size:
        raise ConfigError(f"{ckpt}: the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
                          f"has {encoder.config.vocab_size} rows; the vocabulary belongs to another model")
    torch.manual_seed(cfg.seed)  # head initialisation
    model = MultitaskBert(encoder, cfg.pair_encoding, cfg.head_dropout, cfg.pooling, cfg.siamese_init)
    try:
        model.freeze(cfg.freeze_upto)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return model, tokenizer, ckpt


def train(cfg: TrainConfig) -> dict:
    """Train, keep the best dev checkpoint, write predictions. Returns the best dev metrics.
    Launched by torchrun with WORLD_SIZE > 1, each process is one data-parallel rank (docs/distributed.md)."""
    from .distributed import init_distributed
    with init_distributed(cfg.device) as dist:
        out_dir = Path(cfg.out_dir)
        if dist is not None and not dist.is_main:  # rank 0 alone logs and writes the run directory
            logging.getLogger().setLevel(logging.WARNING)
            return _train(cfg, out_dir, dist)
        out_dir.mkdir(parents=True, exist_ok=True)
        log_path = out_dir / "train.log"
        log_start = log_path.stat().st_size if log_path.is_file() else 0  # where this run's lines begin
        file_log = logging.FileHandler(log_path)  # appends: a resumed run's log goes on
        file_log.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(file_log)
        try:
            return _train(cfg, out_dir, dist, log_start)
        finally:
            logging.getLogger().removeHandler(file_log)
            file_log.close()


def _train(cfg: TrainConfig, out_dir: Path, dist=None, log_start: int = 0) -> dict:
    main = dist is None or dist.is_main  # writes checkpoints, metrics, predictions; evaluates
    seed_everything(cfg.seed)
    device = pick_device(cfg.device) if dist is None else dist.device
    amp_dtype = autocast_dtype(cfg.precision, device)
    resume = find_resume_checkpoint(cfg, out_dir)  # checked before any heavy work
    earlier = earlier_run_to_replace(out_dir, cfg.overwrite, cfg.resume == "auto") if resume is None and main else []
    model, tokenizer, ckpt_dir = build_model(cfg)
    model.to(device)
    if dist is not None:  # the same initial model everywhere, but each rank its own dropout masks
        from .distributed import local_step, rank_seed
        torch.manual_seed(rank_seed(cfg.seed, dist.rank))
        log.info("data-parallel over %d ranks: each step's batch of %d is split between them",
                 dist.world_size, cfg.batch_size)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    log.info("model %s: %d layers, %.1fM parameters, %.1fM trainable (freeze-upto %s); device %s, %s",
             cfg.model, model.encoder.num_layers, n_all / 1e6, n_train / 1e6, cfg.freeze_upto, device,
             "bf16 autocast" if amp_dtype else "fp32")

    data = load_data(cfg, tokenizer)
    train_sizes = {t: len(d) for t, d in data.train.items()}
    train_digests = {t: d.digest() for t, d in data.train.items()}
    if resume is not None and resume.get("train_sizes", train_sizes) != train_sizes:
        raise ConfigError(f"--resume: the training sets changed since the checkpoint (examples per task were "
                          f"{resume['train_sizes']}, now {train_sizes}): resume with the same files")
    if resume is not None and resume.get("train_digests", train_digests) != train_digests:
        changed = [t for t in train_digests if resume["train_digests"].get(t) != train_digests[t]]
        raise ConfigError(f"--resume: the {', '.join(changed)} training examples changed since the checkpoint "
                          f"(same number, other sentences or labels): resume with the same files")
    steps_per_epoch = len(schedule_for_epoch(cfg, data.train, 0))
    eval_points(steps_per_epoch, cfg.evals_per_epoch)  # refused now, not after an epoch's work
    total = steps_per_epoch * cfg.epochs
    optimizer = build_optimizer(model, cfg, device)
    scheduler = linear_warmup_decay(optimizer, total, cfg.warmup_ratio)
    stepper = Stepper(model, cfg, optimizer, scheduler, device, amp_dtype, total, dist)
    if cfg.compile:  # after the Stepper: SMART's teacher is a deep copy and must stay eager
        from .compiling import compile_layers
        compile_layers(model.encoder)
        log.info("--compile: encoder layers compiled lazily; the first steps of each shape family are slow")
    state = RunState()
    if resume is not None:
        state = restore_training_state(resume, model, stepper, device, dist)
        log.info("resumed at epoch %d, step %d of the epoch (%d in all)", state.epoch, state.step_in_epoch,
                 state.global_step)
    if dist is not None and len(set(dist.all_gather_object(state.global_step))) > 1:
        raise ConfigError("the ranks resumed from different checkpoints (or some found none): put --out-dir on "
                          "a filesystem every node sees, or pass --resume PATH readable on every node")
    cache = maybe_frozen_cache(cfg, model, data.train, tokenizer, device, dist, amp_dtype)
    if main:  # only now that the model and data have loaded: a bad flag must not cost the earlier run
        remove_earlier_run(earlier)
        if earlier:
            drop_earlier_log(out_dir / "train.log", log_start)
        (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        copy_tokenizer_files(ckpt_dir, out_dir / "tokenizer")  # evaluate without the original
    checkpoints = RollingCheckpoints(out_dir, cfg.keep_last)
    metrics_log = None
    if main:
        if resume:
            truncate_metrics(out_dir / "metrics.jsonl", state.global_step)
        metrics_log = open(out_dir / "metrics.jsonl", "a" if resume else "w")

    def save_last():
        if state.step_in_epoch:  # mid-epoch: a resumed epoch's train_seconds counts the time before it too
            state.epoch_seconds = time.time() - t0
        # every rank calls it: a distributed checkpoint gathers all ranks' random states
        obj = training_state(model, stepper, cfg, state, train_sizes, train_digests, dist)
        if main:
            checkpoints.save(obj, state.global_step)

    def load(tb: TaskBatch) -> Batch:
        data_t = data.train[tb.task]
        return (cache.batch(data_t, tb.indices) if cache else make_batch(data_t, tb.indices, tokenizer)).to(device)

    def evaluate_and_keep(epoch: int, record: dict, when: str, note: str = "", raw: bool = True) -> None:
        """Rank 0: the dev metrics into `record` and the log; best.pt when they beat the best so far.
        With a weight EMA, the raw weights are scored too (for the record) where `raw`."""
        with contextlib.ExitStack() as weights:  # inside: the weights evaluated and kept
            if stepper.ema is not None and raw:
                raw_metrics = evaluate(model, data.dev, tokenizer, cfg.eval_batch_size, device, stepper.autocast)
                record.update({f"dev_raw_{k}": v for k, v in raw_metrics.items()})
                log.info("%s: dev, raw weights %s", when, _fmt(raw_metrics))
            if stepper.ema is not None:
                weights.enter_context(stepper.ema.applied(model))
            metrics = evaluate(model, data.dev, tokenizer, cfg.eval_batch_size, device, stepper.autocast)
            record.update({f"dev_{k}": v for k, v in metrics.items()})
            _write_record(metrics_log, record)
            log.info("%s: dev%s %s%s", when, ", weight EMA" if stepper.ema is not None else "", _fmt(metrics), note)
            if metrics["overall"] > state.best:
                state.best, state.best_metrics = metrics["overall"], metrics
                save_checkpoint(out_dir / "best.pt", model, cfg, epoch=epoch, step=state.global_step,
                                metrics=metrics)
                log.info("new best dev score %.3f: saved %s", state.best, out_dir / "best.pt")

    with stop_on_signals() as stop:
        def stop_requested() -> bool:  # distributed: all ranks stop at the same step, whichever got the signal
            return stop.requested if dist is None else dist.any(stop.requested)

        for epoch in range(state.epoch, cfg.epochs):
            schedule = schedule_for_epoch(cfg, data.train, epoch)  # global: the same on every rank
            flat = [tb for s in schedule for tb in s]
            eff = padding_efficiency(flat, {t: d.lengths for t, d in data.train.items()})
            log.info("epoch %d: %d steps, padding efficiency %.2f (real tokens / tokens computed)",
                     epoch, len(schedule), eff)
            t0 = time.time() - state.epoch_seconds
            todo = schedule[state.step_in_epoch:]
            mid_evals = eval_points(len(schedule), cfg.evals_per_epoch)[:-1]  # the last is the epoch end's
            bar = progress(todo, desc=f"epoch {epoch}", total=len(todo)) if main else tqdm(todo, disable=True)
            for tbs in bar:
                if dist is None:
                    parts = stepper.step([load(tb) for tb in tbs if tb.indices], state.global_step)
                else:  # this rank's slice of each task group; the step's parts come back global
                    mine, weights = local_step(tbs, dist.rank, dist.world_size)
                    parts = stepper.step([load(tb) for tb in mine], state.global_step, weights)
                state.step_in_epoch += 1
                state.global_step += 1
                if parts is not None:
                    for task, p in parts.items():
                        state.losses.setdefault(task, []).append(p["loss"])
                    bar.set_postfix({t: f"{np.mean(v[-50:]):.3f}" for t, v in state.losses.items() if v})
                    if main and state.global_step % cfg.log_every == 0:
                        _log_step(metrics_log, state, stepper.lr, parts, cfg.log_every)
                if state.step_in_epoch in mid_evals:  # before the step's checkpoint, which then holds its best
                    if main:
                        evaluate_and_keep(epoch, {"epoch": epoch, "step": state.global_step,
                                                  "epoch_progress": round(state.step_in_epoch / len(schedule), 4)},
                                          f"epoch {epoch}, step {state.step_in_epoch}/{len(schedule)}",
                                          raw=False)  # the weight average only: half the cost
                    if dist is not None:
                        dist.barrier()
                # not at the epoch's last step: the epoch-end checkpoint follows its record and best.pt,
                # and a crash in between must resume before that step, so it is replayed and recorded once
                if cfg.save_every and state.global_step % cfg.save_every == 0 and state.step_in_epoch < len(schedule):
                    save_last()
                if stop_requested():
                    break
            if stop_requested():
                save_last()
                if dist is not None:
                    dist.barrier()  # nobody exits before rank 0 has written the checkpoint
                raise TrainingInterrupted(stop.signal_name, epoch, state, checkpoints.latest())
            train_time = time.time() - t0
            if main:  # only rank 0 tracks the best score: the checkpoints are its
                record = {"epoch": epoch, "step": state.global_step, "train_seconds": round(train_time, 1),
                          "padding_efficiency": eff,
                          **{f"train_loss_{t}": float(np.mean(v)) for t, v in state.losses.items() if v}}
                evaluate_and_keep(epoch, record, f"epoch {epoch}", f" ({train_time:.0f} s training)")
            if dist is not None:
                dist.barrier()  # the other ranks wait while rank 0 evaluates
            state.epoch, state.step_in_epoch, state.losses, state.epoch_seconds = epoch + 1, 0, {}, 0.0
            save_last()
    if not main:  # rank 0 writes the predictions; the others return its best metrics when it is done
        return dist.broadcast_object(None)
    metrics_log.close()

    from .checkpointing import load_model_state
    load_model_state(model, out_dir / "best.pt", device)
    write_all_predictions(model, data, tokenizer, cfg, device, stepper.autocast)
    if cfg.export_hf:
        from minbert import save_hf
        save_hf(model.encoder, cfg.export_hf, vocab_src=ckpt_dir)
        log.info("exported the encoder in the Hugging Face layout to %s", cfg.export_hf)
    return state.best_metrics if dist is None else dist.broadcast_object(state.best_metrics)


def eval_points(steps: int, k: int) -> list[int]:
    """The steps of an epoch (1-based, within it) after which dev is evaluated: k, evenly spaced, the
    last at the epoch's end."""
    if k > steps:
        raise ConfigError(f"--evals-per-epoch {k} is more than the {steps} steps of an epoch")
    return [round(steps * i / k) for i in range(1, k + 1)]


def _fmt(metrics: dict) -> str:
    return " ".join(f"{k} {v:.3f}" for k, v in metrics.items())


def _log_step(metrics_log, state: "RunState", lr: float, parts: dict, window: int) -> None:
    """Running mean losses per task, the step's learning rate, and the step's extra terms: per task
    (`r_s_sst`, `d_breg_para`, ...), or for the whole step (`pcgrad_*`)."""
    record = {"step": state.global_step, "epoch": state.epoch, "lr": lr,
              **{f"loss_{t}": float(np.mean(v[-window:])) for t, v in state.losses.items() if v}}
    for task, p in parts.items():
        record.update({k if k.startswith("pcgrad_") else f"{k}_{task}": v for k, v in p.items() if k != "loss"})
    _write_record(metrics_log, record)


def _write_record(metrics_log, record: dict) -> None:
    """One JSON line; a non-finite number (e.g. PCGrad's mean cosine when nothing conflicts) becomes
    null, since bare NaN is not JSON."""
    clean = {k: None if isinstance(v, float) and not np.isfinite(v) else v for k, v in record.items()}
    metrics_log.write(json.dumps(clean) + "\n")
    metrics_log.flush()
