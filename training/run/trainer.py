"""The training recipe: a Run whose phases are named methods, with the loop's state on `self`.

    run = Run(cfg)        # validates cfg unless validated already (one line per problem, ConfigError)
    run.setup()           # device, model, data, step machine, resume, frozen cache, the run directory
    run.fit()             # epochs of steps; dev evaluation keeps best.pt; checkpoints; signals
    run.finish()          # predictions of the best model (the train command then exports it, --export-hf)

`train(cfg)` does all four. One loop for CPU and CUDA, in one process or data-parallel under torchrun
(training/methods/distributed.py). Each step trains on one task's batch (MT-DNN and the other per-task
samplers) or on a mixed batch grouped by task (--task-sampling mixed, PCGrad's sampler); the loss of
each task's group is computed separately so PCGrad can take one backward per task. The components
(stepper.py, build.py, checkpointing.py, rundir.py) know nothing of the loop.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data.batching import Batch, make_batch
from data.sampler import TaskBatch, padding_efficiency
from minbert.checkpoint import copy_tokenizer_files
from training.common.device import (
    DTYPES,
    GlobalRng,
    apply_fp32_math,
    emulated_precision,
    fp16_autocast_problem,
    fp32_math,
    pick_device,
    resolve_precision,
    seed_everything,
    set_tf32_flags,
)
from training.common.errors import ConfigError, TrainingInterrupted
from training.common.progress import progress
from training.config.run_settings import RunSettings
from training.config.train_config import TrainConfig, validate_once
from training.inference.metrics import metrics_of
from training.inference.outputs import predict_sets
from training.inference.predictions import check_predictions_dir, write_run_predictions
from training.methods.cache_keeper import CacheKeeper
from training.methods.freezing import FreezeSchedule
from training.methods.peft import share, trainable_counts
from training.methods.stepper import Stepper, warmup_steps
from training.run.build import build_model, load_data, updates_for_epoch
from training.run.checkpointing import RollingCheckpoints, load_model_state, save_checkpoint
from training.run.preflight import check_disk, check_model, settle
from training.run.rundir import (
    MetricsLog,
    check_test_predictions_kept,
    drop_earlier_log,
    earlier_run_to_replace,
    find_resume_checkpoint,
    finished_run,
    remove_earlier_run,
    remove_stale_temp_files,
    run_log,
)
from training.run.signals import stop_on_signals

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """Where a run is: enough, with the components' states, to continue it exactly."""
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    best: float = float("-inf")
    best_metrics: dict = field(default_factory=dict)
    losses: dict = field(default_factory=dict)  # this epoch's training losses per task so far
    epoch_seconds: float = 0.0  # training time of this epoch before the last checkpoint
    evals_since_best: int = 0  # dev evaluations since the last new best (--early-stop-patience)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.__init__(**state)


def train(cfg: TrainConfig, on_evaluation=None, on_update=None) -> dict:
    """Train, keep the best dev checkpoint, write predictions. Returns the best dev metrics.
    Launched by torchrun with WORLD_SIZE > 1, each process is one data-parallel rank (docs/distributed.md).
    on_evaluation(record): called with each dev evaluation's metrics.jsonl record once it is written (a
    hyperparameter search reports it, and may stop the run by raising). on_update(stepper): called before
    each optimiser update, the gradients in place (training.methods.stepper.Stepper.on_update)."""
    from training.methods.distributed import init_distributed

    check_config(cfg)
    finished = finished_run(cfg, Path(cfg.out_dir))  # before anything, train.log included, is touched
    if finished is not None:
        stopped = "" if finished["epoch"] >= cfg.epochs else f", stopped early after {finished['epoch']}"
        log.info("--resume auto: %s holds a finished run (%d epoch(s)%s; best dev %s), with its predictions in "
                 "%s: nothing to do, nothing written", cfg.out_dir, cfg.epochs, stopped,
                 _fmt(finished["best_metrics"]), cfg.predictions_folder())
        return finished["best_metrics"]
    with init_distributed(cfg.device) as dist:
        run = Run(cfg, dist, on_evaluation, on_update)
        with run.logging_to_out_dir(), contextlib.closing(run):
            run.setup()
            t0 = time.time()
            try:  # what ends a run goes into train.log too: the file a `nohup` run is read from
                run.fit()
                metrics = run.finish()
            except TrainingInterrupted as e:
                log.warning("%s", e)
                raise
            except BaseException as e:
                log.log(logging.INFO if getattr(e, "expected", False) else logging.ERROR, "the run stopped: %s: %s",
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                raise
            log.info("finished in %.0f s: best dev %s (%s); predictions in %s", time.time() - t0, _fmt(metrics),
                     run.out_dir / "best.pt", cfg.predictions_folder())
            return metrics


def check_config(cfg: TrainConfig) -> None:
    """ConfigError with every problem of cfg; a config the command line (or train()) validated is not
    validated again (validate_once)."""
    errors = validate_once(cfg)
    if errors:
        raise ConfigError("; ".join(errors))


class Run:
    """One training run. Rank 0 of a data-parallel run (or the only process) writes the run directory,
    evaluates and predicts; every rank trains."""

    def __init__(self, cfg: TrainConfig, dist=None, on_evaluation=None, on_update=None):
        check_config(cfg)  # Python callers get the command line's checks too
        self.cfg, self.dist = cfg, dist
        self.on_evaluation, self.on_update = on_evaluation, on_update  # see train()
        self.out_dir = Path(cfg.out_dir)
        self.state = RunState()
        self.started = time.time()  # temp files older than this, of dead writers, are a killed run's leftovers
        self.log_start = 0  # where this run's lines begin in train.log
        self.file_log = None
        self.metrics_log: MetricsLog | None = None  # opened when the run claims OUT_DIR
        self.earlier: list[Path] = []  # an earlier run's files, replaced at this run's first step
        self.best_dev_preds: dict | None = None  # the kept evaluation's dev predictions, task -> array
        self.stopped_early = False
        self.stop = None  # the signal handler's flag while fit() runs
        # choose_device(): where and in which precision the run computes
        self.device: torch.device | None = None
        self.precision, self.precision_reason, self.amp_dtype = None, None, None
        self.fp32_math = None  # on a TF32 GPU in fp32: what its matmuls use (device.fp32_math)
        self.tf32_found = None  # torch's TF32 switches before choose_device set them (restore_fp32_math)
        self.settings: RunSettings | None = None  # settle(): the flags worked out on the model, once
        # build(): the parts, made from the config
        self.model, self.tokenizer, self.ckpt_dir = None, None, None
        self.data, self.steps_per_epoch, self.schedule = None, None, None
        self.stepper: Stepper | None = None
        self.caches: CacheKeeper | None = None
        self.checkpoints: RollingCheckpoints | None = None  # setup(): the rolling training checkpoints

    @property
    def main(self) -> bool:
        """Rank 0 (or the only process): writes checkpoints, metrics, predictions; evaluates."""
        return self.dist is None or self.dist.is_main

    @contextlib.contextmanager
    def logging_to_out_dir(self):
        """Rank 0 logs to OUT_DIR/train.log too; the other ranks log warnings only."""
        if not self.main:
            logging.getLogger().setLevel(logging.WARNING)
            yield
            return
        with run_log(self.out_dir) as file_log:  # until the run claims OUT_DIR, a failure leaves it as it was
            self.file_log, self.log_start = file_log, file_log.start
            yield

    # ------------------------------------------------------------------ setup

    def setup(self) -> "Run":
        """Everything before the first step, in an order that keeps a run's random streams fixed: the
        checks that need no heavy work first (the model folder, memory and disk against the machine's), then
        the model and data. An earlier run's files go only at the first step that trains (claim_out_dir)."""
        cfg, dist = self.cfg, self.dist
        if dist is not None and cfg.grad_accum_steps > 1:
            raise ConfigError("--grad-accum-steps is for one process; under torchrun the ranks already split "
                              "each --batch-size batch between them: raise --batch-size instead")
        if self.main:
            check_predictions_dir(cfg.predictions_folder(), self.out_dir, cfg.overwrite)
        seed_everything(cfg.seed)
        self.choose_device()
        self.settings = settle(cfg)
        footprint = check_model(cfg, self.device, self.settings)
        resume = find_resume_checkpoint(cfg, self.out_dir)
        if resume is not None and self.main:
            check_test_predictions_kept(cfg)
        self.earlier = (earlier_run_to_replace(self.out_dir, cfg.overwrite, cfg.resume == "auto")
                        if resume is None and self.main else [])
        if self.main:
            remove_stale_temp_files(self._written_dirs(), self.started)
            check_disk(self.out_dir, footprint, cfg.keep_last, sum(p.stat().st_size for p in self.earlier))
        self.build()
        if resume is not None:
            self.load_state_dict(resume)
            log.info("resumed at epoch %d, step %d of the epoch (%d in all)", self.state.epoch,
                     self.state.step_in_epoch, self.state.global_step)
        if dist is not None and len(set(dist.all_gather_object(self.state.global_step))) > 1:
            raise ConfigError("the ranks resumed from different checkpoints (or some found none): put --out-dir on "
                              "a filesystem every node sees, or pass --resume PATH readable on every node")
        if dist is not None and self.schedule.scheduled:
            raise ConfigError("--unfreeze-schedule is for one process (its caches and convergence test are "
                              "not shared between ranks): leave it out under torchrun, or use --freeze-upto N")
        step = self.state.global_step
        if resume is not None:  # the depth and caches of the run that wrote the checkpoint (else build()'s)
            self.model.freeze(self.depth_in_force())
            self.caches.restore(resume.get("caches"), self.phase_steps(step))
        else:
            self.caches.serve(self.phase_steps(step))
        if resume is not None:  # its own directory: the records after the checkpoint's step go now
            self.claim_out_dir(resume_step=self.state.global_step)
        self.checkpoints = RollingCheckpoints(self.out_dir, cfg.keep_last)
        return self

    def build(self) -> "Run":
        """Model, data and step machine, without touching the run directory: what tests and benchmarks
        need to take steps (`Run(cfg).build().stepper`). Expects setup()'s seeding and device."""
        cfg, dist = self.cfg, self.dist
        if self.device is None:  # called alone
            seed_everything(cfg.seed)
            self.choose_device()
        if self.settings is None:
            self.settings = settle(cfg)
        self.model, self.tokenizer, self.ckpt_dir = build_model(cfg, self.settings)
        self.model.to(self.device)
        if dist is not None:  # the same initial model everywhere, but each rank its own dropout masks
            from training.methods.distributed import rank_seed
            torch.manual_seed(rank_seed(cfg.seed, dist.rank))
            log.info("data-parallel over %d ranks: each step's batch of %d is split between them",
                     dist.world_size, cfg.batch_size)
        self.data = load_data(cfg, self.tokenizer)
        self.steps_per_epoch = len(updates_for_epoch(cfg, self.data.train, 0))
        eval_points(self.steps_per_epoch, cfg.evals_per_epoch)  # refused now, not after an epoch's work
        total = self.steps_per_epoch * cfg.epochs
        self.schedule = FreezeSchedule(self.settings.schedule, self.settings.freeze_depth,
                                       self.settings.num_layers, self.steps_per_epoch, total,
                                       warmup_steps(total, cfg.warmup_ratio), cfg.peak_lr())
        if problem := self.schedule.check_length():
            raise ConfigError(problem)
        self.stepper = Stepper.build(self.model, cfg, total, self.device, self.amp_dtype, dist, self.schedule)
        self.stepper.on_update = self.on_update
        self._log_model()
        if cfg.compile:  # after the Stepper: SMART's teacher is a deep copy and must stay eager
            from training.methods.compiling import compile_layers
            compile_layers(self.model.encoder, mode=cfg.compile_mode)
            log.info("--compile: encoder layers compiled lazily; the first steps of each shape family are slow")
        if cfg.step_graphs:
            from training.methods.step_graphs import StepGraphs
            self.stepper.graphs = StepGraphs.for_run(self.stepper, self.device, dist)
        self.caches = CacheKeeper(cfg, self.model, self.data, self.tokenizer, self.device, self.amp_dtype, dist)
        return self

    def choose_device(self) -> None:
        """The device, and the precision --precision means on it (logged with the model: _log_model)."""
        self.device = pick_device(self.cfg.device) if self.dist is None else self.dist.device
        self.precision, self.precision_reason = resolve_precision(self.cfg.precision, self.device)
        if self.precision == "fp16" and (problem := fp16_autocast_problem(self.device)):
            raise ConfigError(problem)
        self.amp_dtype = DTYPES[self.precision]
        if (found := apply_fp32_math(self.precision, self.device)) is not None and self.tf32_found is None:
            self.tf32_found = found
        self.fp32_math = fp32_math(self.precision, self.device)
        self.precision_reason += f"; {self.fp32_math}" if self.fp32_math else ""

    def close(self) -> None:
        self.restore_fp32_math()

    def restore_fp32_math(self) -> None:
        """Put torch's process-wide TF32 switches back as choose_device found them (train() does at the
        end of a run, so that a library user's settings outlive it)."""
        if self.tf32_found is not None:
            set_tf32_flags(self.tf32_found)
            self.tf32_found = None

    def _log_model(self) -> None:
        model, cfg = self.model, self.cfg
        n_train, n_all = trainable_counts(model)
        upto = cfg.freeze_upto if model.frozen_upto == cfg.freeze_upto else f"{cfg.freeze_upto} = {model.frozen_upto}"
        schedule = f", then {cfg.unfreeze_schedule}" if self.schedule.scheduled else ""
        peft = f", peft {cfg.peft}" if cfg.peft != "none" else ""
        log.info("model %s: %d layers, %.1fM parameters, %d trainable = %.4f%% (freeze-upto %s%s%s); device %s, %s",
                 cfg.model, model.encoder.num_layers, n_all / 1e6, n_train, 100 * n_train / n_all, upto, schedule,
                 peft, self.device, f"{self.precision} autocast" if self.amp_dtype else self.precision)
        if cfg.scale_lr_with_batch is not None:
            log.info("learning rate %.4g: --lr %g at batch %d, times sqrt(%d x %d / %d) (--scale-lr-with-batch)",
                     cfg.peak_lr(), cfg.lr, cfg.scale_lr_with_batch, cfg.batch_size, cfg.grad_accum_steps,
                     cfg.scale_lr_with_batch)
        # once, with why: a run under auto must say what it used (each epoch's record names it too)
        log.info("precision %s (%s)", self.precision, self.precision_reason)
        slow = emulated_precision(self.precision, self.device)
        if slow:
            log.warning(slow)

    def _written_dirs(self) -> list[Path]:
        """Where this run writes files through temp names (see rundir.remove_stale_temp_files)."""
        predictions = Path(self.cfg.predictions_folder())  # its new set is written beside it, then swapped in
        dirs = [self.out_dir, self.out_dir / "checkpoints", predictions, predictions.parent]
        cache = Path(self.cfg.cache_dir)  # the frozen-prefix cache writes in one folder per entry
        dirs += sorted(p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []
        return dirs + ([Path(self.cfg.export_hf)] if self.cfg.export_hf else [])

    def claim_out_dir(self, resume_step: int | None = None) -> None:
        """The run directory becomes this run's (rank 0, once): the replaced run's files and log lines go,
        config.json and the tokenizer are written, and metrics.jsonl opens (a resumed run's goes on from its
        checkpoint). A new run claims it at its first step that trained, or its first write if earlier, so
        that whatever is found wrong before -- a flag, the model, the data, that step -- costs nothing."""
        if not self.main or self.metrics_log is not None:
            return
        remove_earlier_run(self.earlier)
        if self.earlier:
            drop_earlier_log(self.out_dir / "train.log", self.log_start)
        if self.file_log is not None:
            self.file_log.keep()
        (self.out_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2) + "\n")
        copy_tokenizer_files(self.ckpt_dir, self.out_dir / "tokenizer")  # evaluate without the original
        self.metrics_log = MetricsLog(self.out_dir / "metrics.jsonl", resume_step,
                                      tensorboard=self.cfg.report_to == "tensorboard")

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Everything to continue the run, one entry per component. Distributed: every rank's own random
        streams are gathered into `rng_ranks`, so every rank must call this."""
        model = self.model
        out = {"model": model.state_dict(), "bert_config": asdict(model.encoder.config),
               "config": self.cfg.to_dict(), "run_state": self.state.state_dict(), "rng": GlobalRng.state_dict(),
               "schedule": self.schedule.state_dict(), "caches": self.caches.state_dict(),
               "train_sizes": {t: len(d) for t, d in self.data.train.items()},
               "train_digests": {t: d.digest() for t, d in self.data.train.items()},
               **self.stepper.state_dict()}
        if self.dist is not None:
            out["rng_ranks"] = self.dist.all_gather_object(self._own_streams())
        return out

    def load_state_dict(self, ckpt: dict) -> None:
        self._check_same_training_data(ckpt)
        self.model.load_state_dict(ckpt["model"])
        self.model.to(self.device)
        self.stepper.load_state_dict(ckpt)
        if self.schedule.scheduled:
            self.schedule.load_state_dict(ckpt["schedule"])
        GlobalRng.load_state_dict(ckpt["rng"])
        self.state.load_state_dict(ckpt["run_state"])
        if self.dist is not None:
            self._load_own_streams(ckpt.get("rng_ranks"))

    def _own_streams(self) -> dict:
        """A rank's own random streams: dropout (the global RNGs) and SMART's noise."""
        generator = self.stepper.generator
        return {"rng": GlobalRng.state_dict(), "smart_generator": generator.get_state() if generator else None}

    def _load_own_streams(self, ranks: list | None) -> None:
        dist, generator = self.dist, self.stepper.generator
        if ranks is not None and len(ranks) == dist.world_size:  # same number of ranks: each its own streams
            GlobalRng.load_state_dict(ranks[dist.rank]["rng"])
            if generator is not None:
                generator.set_state(ranks[dist.rank]["smart_generator"])
            return
        from training.methods.distributed import rank_seed  # another number of ranks (or a single-process checkpoint)
        seed = rank_seed(self.cfg.seed, dist.rank, self.state.global_step)
        torch.manual_seed(seed)
        if generator is not None:
            generator.manual_seed(seed)

    def _check_same_training_data(self, ckpt: dict) -> None:
        """The sampler's indices point into the training sets: they must be the checkpoint's."""
        sizes = {t: len(d) for t, d in self.data.train.items()}
        digests = {t: d.digest() for t, d in self.data.train.items()}
        if ckpt.get("train_sizes", sizes) != sizes:
            raise ConfigError(f"--resume: the training sets changed since the checkpoint (examples per task were "
                              f"{ckpt['train_sizes']}, now {sizes}): resume with the same files")
        if ckpt.get("train_digests", digests) != digests:
            changed = [t for t in digests if ckpt["train_digests"].get(t) != digests[t]]
            raise ConfigError(f"--resume: the {', '.join(changed)} training examples changed since the checkpoint "
                              f"(same number, other sentences or labels): resume with the same files")

    def save_checkpoint(self, epoch_start: float) -> None:
        """A training checkpoint of where the run is (every rank calls it: see state_dict)."""
        if self.state.step_in_epoch:  # mid-epoch: a resumed epoch's train_seconds counts the time before it too
            self.state.epoch_seconds = time.time() - epoch_start
        obj = self.state_dict()
        if self.main:
            self.claim_out_dir()  # a first checkpoint before any step trained (all were non-finite)
            self.checkpoints.save(obj, self.state.global_step)

    # ------------------------------------------------------------------ fit

    def fit(self) -> None:
        with stop_on_signals() as stop:
            self.stop = stop
            for epoch in range(self.state.epoch, self.cfg.epochs):
                if self.stopped_early or self.patience_spent():
                    break
                self.train_epoch(epoch)

    def patience_spent(self) -> bool:
        """--early-stop-patience P: P dev evaluations in a row without a new best (rank 0's count, which
        every rank follows)."""
        patience, since = self.cfg.early_stop_patience, self.state.evals_since_best
        spent = patience is not None and since >= patience
        if self.dist is not None:
            spent = self.dist.broadcast_object(spent)
        if spent:
            log.info("early stop: %d dev evaluations without a new best (--early-stop-patience %d); best dev "
                     "score %.4f", since, patience, self.state.best)
        return spent

    def stop_requested(self) -> bool:
        """Distributed: all ranks stop at the same step, whichever got the signal."""
        return self.stop.requested if self.dist is None else self.dist.any(self.stop.requested)

    def train_epoch(self, epoch: int) -> None:
        cfg, state, data = self.cfg, self.state, self.data
        schedule = updates_for_epoch(cfg, data.train, epoch)  # global: the same on every rank
        flat = [tb for update in schedule for s in update for tb in s]
        eff = padding_efficiency(flat, {t: d.side_lengths for t, d in data.train.items()}, cfg.pad_multiple,
                                 cfg.max_length)
        log.info("epoch %d: %d steps, padding efficiency %.2f (real tokens / tokens computed)",
                 epoch, len(schedule), eff)
        t0, built = time.time() - state.epoch_seconds, self.caches.seconds or 0.0
        evaluating = 0.0  # seconds of this epoch's mid-epoch evaluations

        def epoch_start() -> float:  # the clock of the epoch's training: a cache a schedule builds mid-epoch
            # (freezing deeper) is not training, here or resumed, nor is a mid-epoch evaluation
            return t0 + (self.caches.seconds or 0.0) - built + evaluating

        todo = schedule[state.step_in_epoch:]
        mid_evals = eval_points(len(schedule), cfg.evals_per_epoch)[:-1]  # the last is the epoch end's
        bar = progress(todo, desc=f"epoch {epoch}", total=len(todo)) if self.main else tqdm(todo, disable=True)
        for update in bar:
            self.train_step(update, bar)
            if state.step_in_epoch in mid_evals:  # before the step's checkpoint, which then holds its best
                began = time.time()
                self.evaluate_mid_epoch(epoch, len(schedule))
                evaluating += time.time() - began
                if self.patience_spent():
                    self.stopped_early = True  # the rest of the epoch, its evaluation included, is not run
                    return
            # not at the epoch's last step: the epoch-end checkpoint follows its record and best.pt,
            # and a crash in between must resume before that step, so it is replayed and recorded once
            if cfg.save_every and state.global_step % cfg.save_every == 0 and state.step_in_epoch < len(schedule):
                self.save_checkpoint(epoch_start())
            if self.stop_requested():
                break
        if self.stop_requested():
            self.save_checkpoint(epoch_start())
            if self.dist is not None:
                self.dist.barrier()  # nobody exits before rank 0 has written the checkpoint
            raise TrainingInterrupted(self.stop.signal_name, epoch, state.global_step, state.step_in_epoch,
                                      self.checkpoints.latest())
        start = epoch_start()  # before end_epoch, which counts the epoch's building and clears it
        self.end_epoch(epoch, time.time() - start, eff)
        self.save_checkpoint(start)

    def train_step(self, update: list[list[TaskBatch]], bar) -> None:
        """One optimiser update from the steps of `update` (one, or --grad-accum-steps of them)."""
        state = self.state
        self.follow_schedule(self.schedule.depth_at(state.global_step), in_update=state.global_step + 1)
        parts = self.stepper.take(update, self.load_batch, state.global_step)
        state.step_in_epoch += 1
        state.global_step += 1
        if self.schedule.freezer is not None:  # adaptive freezing: its test at the end of each interval
            tests = len(self.schedule.freezer.history)
            depth = self.schedule.freezer.after_update(state.global_step)
            if len(self.schedule.freezer.history) > tests and self.main and self.metrics_log is not None:
                self.metrics_log.write({"step": state.global_step, "epoch": state.epoch,
                                        "freeze_test": self.schedule.freezer.history[-1]})
            self.follow_schedule(depth)
        if parts is None:  # skipped: non-finite
            return
        self.claim_out_dir()  # the first step that trained: only now may an earlier run's files go
        for task, p in parts.items():
            state.losses.setdefault(task, []).append(p["loss"])
        bar.set_postfix({t: f"{np.mean(v[-50:]):.3f}" for t, v in state.losses.items() if v})
        if self.main and state.global_step % self.cfg.log_every == 0:
            self.metrics_log.write({**step_record(state, self.stepper.lr, parts, self.cfg.log_every),
                                    **self.stepper.scale_record()})

    def load_batch(self, tb: TaskBatch) -> Batch:
        data, cache = self.data.train[tb.task], self.caches.train
        shape = self.cfg.pad_multiple, self.cfg.max_length
        batch = cache.batch(data, tb.indices, *shape) if cache else make_batch(data, tb.indices, self.tokenizer, *shape)
        return batch.to(self.device)

    # ------------------------------------------------------------------ freezing schedule

    def depth_in_force(self) -> int | None:
        """The frozen depth the run was at when its checkpoint was written (at step 0: the first)."""
        schedule, step = self.schedule, self.state.global_step
        return schedule.depth_at(max(step - 1, 0))

    def phase_steps(self, step: int) -> int | None:
        """The updates left in the phase holding `step` (None for a fixed depth: the whole run)."""
        return self.schedule.phase_end(step) - step if self.schedule.scheduled else None

    def follow_schedule(self, depth: int | None, in_update: int | None = None) -> None:
        """The model at `depth` from the next update on, with the caches that serve it, and the change
        logged and recorded. in_update: the update this is called in, when that is after the previous
        update's checkpoint (its record says so: a resume from that checkpoint drops it and writes it again)."""
        model, state = self.model, self.state
        if depth == model.frozen_upto:
            return
        before = model.first_trainable_layer
        model.freeze(depth)
        after = model.first_trainable_layer
        lo, hi = min(before, after), max(before, after)
        layers = "" if lo == hi else f"layer {lo}" if hi == lo + 1 else f"layers {lo}..{hi - 1}"
        what = (f"unfroze {' and '.join(p for p in ('the embeddings' if depth is None else '', layers) if p)}"
                if after < before or depth is None else f"froze {layers}")
        log.info("step %d: %s (--freeze-upto %s from here)", state.global_step, what, depth)
        self.caches.serve(self.phase_steps(state.global_step))
        if self.main and self.metrics_log is not None:
            self.metrics_log.write({"step": state.global_step, "epoch": state.epoch, "frozen_depth": depth,
                                    **({"written_in_step": in_update} if in_update is not None else {})})

    def end_epoch(self, epoch: int, train_time: float, padding_eff: float) -> None:
        """The epoch's record and dev evaluation (rank 0), then the loop state of the next epoch."""
        state = self.state
        if self.stepper.graphs is not None:
            log.info("epoch %d: %s", epoch, self.stepper.graphs.summary())
        if self.main:  # only rank 0 tracks the best score: the checkpoints are its
            trainable, total = trainable_counts(self.model)  # as trained in this epoch's last step
            record = {"epoch": epoch, "step": state.global_step, "train_seconds": round(train_time, 1),
                      "padding_efficiency": padding_eff, "trainable_params": trainable,
                      "trainable_share": share(trainable, total), "precision": self.precision,
                      **({"tf32": self.precision == "fp32"} if self.fp32_math else {}),
                      **self.stepper.scale_record(),
                      **({"frozen_cache_seconds": round(self.caches.seconds, 2)}
                         if self.caches.seconds is not None else {}),
                      **{f"train_loss_{t}": float(np.mean(v)) for t, v in state.losses.items() if v}}
            self.evaluate_and_keep(epoch, record, f"epoch {epoch}", f" ({train_time:.0f} s training)")
            self.caches.seconds = None  # counted once
        if self.dist is not None:
            self.dist.barrier()  # the other ranks wait while rank 0 evaluates
        state.epoch, state.step_in_epoch, state.losses, state.epoch_seconds = epoch + 1, 0, {}, 0.0

    # ------------------------------------------------------------------ evaluate and keep

    def evaluate_mid_epoch(self, epoch: int, steps: int) -> None:
        state = self.state
        if self.main:
            self.evaluate_and_keep(epoch, {"epoch": epoch, "step": state.global_step,
                                           "epoch_progress": round(state.step_in_epoch / steps, 4)},
                                   f"epoch {epoch}, step {state.step_in_epoch}/{steps}",
                                   raw=False)  # the weight average only: half the cost
        if self.dist is not None:
            self.dist.barrier()

    def predict(self, sets: dict) -> dict:
        """Predictions of the model's weights as they are now, batched as --eval-batch-size/--eval-tokens say."""
        return predict_sets(self.model, sets, self.tokenizer, self.cfg.eval_batching(), self.device,
                            self.stepper.autocast, self.caches.dev)

    def evaluate(self) -> dict[str, float]:
        """Dev metrics of the model's weights as they are now."""
        return metrics_of(self.data.dev, self.predict(self.data.dev))

    def evaluate_and_keep(self, epoch: int, record: dict, when: str, note: str = "", raw: bool = True) -> None:
        """Rank 0: the dev metrics into `record` and the log; best.pt when they beat the best so far.
        With a weight EMA, the raw weights are scored too (for the record) where `raw`."""
        ema, state = self.stepper.ema, self.state
        self.claim_out_dir()  # an epoch of skipped steps still ends in an evaluation and its record
        with contextlib.ExitStack() as weights:  # inside: the weights evaluated and kept
            if ema is not None and raw:
                raw_metrics = self.evaluate()
                record.update({f"dev_raw_{k}": v for k, v in raw_metrics.items()})
                log.info("%s: dev, raw weights %s", when, _fmt(raw_metrics))
            if ema is not None:
                weights.enter_context(ema.applied(self.model))
            preds = self.predict(self.data.dev)
            metrics = metrics_of(self.data.dev, preds)
            record.update({f"dev_{k}": v for k, v in metrics.items()})
            self.metrics_log.write(record)
            log.info("%s: dev%s %s%s", when, ", weight EMA" if ema is not None else "", _fmt(metrics), note)
            state.evals_since_best += 1
            if metrics["overall"] > state.best:
                state.best, state.best_metrics, state.evals_since_best = metrics["overall"], metrics, 0
                self.best_dev_preds = preds  # the dev prediction files need not predict dev again
                save_checkpoint(self.out_dir / "best.pt", self.model, self.cfg, epoch=epoch, step=state.global_step,
                                metrics=metrics)
                log.info("new best dev score %.3f: saved %s", state.best, self.out_dir / "best.pt")
        if self.on_evaluation is not None:
            self.on_evaluation(record)

    # ------------------------------------------------------------------ finish

    def finish(self) -> dict:
        """Rank 0 predicts with the best checkpoint; every rank returns the best dev metrics."""
        dist = self.dist
        if not self.main:  # the others return rank 0's best metrics when it is done
            return dist.broadcast_object(None)
        self.metrics_log.close()
        # best.pt's frozen layers are not always those the caches were computed from (adaptive freezing
        # freezes layers after the best evaluation): its predictions run uncached
        self.caches.drop()
        best = load_model_state(self.model, self.out_dir / "best.pt", self.device)
        self.write_predictions(best)
        return self.state.best_metrics if dist is None else dist.broadcast_object(self.state.best_metrics)


    def write_predictions(self, best: dict) -> None:
        """The best model's dev and test prediction files with their manifest. The dev predictions are
        those of the evaluation that kept best.pt (predicted again only when that was before a resume)."""
        if self.best_dev_preds is not None:
            log.info("dev prediction files: the predictions of the evaluation that kept best.pt")
            dev = self.best_dev_preds
        else:
            log.info("dev prediction files: predicting dev again with best.pt (kept before this process started)")
            dev = self.predict(self.data.dev)
        metrics = metrics_of(self.data.dev, dev)
        print("dev metrics of the best checkpoint: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        test = self.predict(self.data.test)
        write_run_predictions(self.cfg.predictions_folder(), self.data, dev, test, self.out_dir,
                              self.out_dir / "best.pt", self.cfg.to_dict(), metrics, best.get("epoch"),
                              best.get("step"))


def eval_points(steps: int, k: int) -> list[int]:
    """The steps of an epoch (1-based, within it) after which dev is evaluated: k, evenly spaced, the
    last at the epoch's end."""
    if k > steps:
        raise ConfigError(f"--evals-per-epoch {k} is more than the {steps} steps of an epoch")
    return [round(steps * i / k) for i in range(1, k + 1)]


def step_record(state: RunState, lr: float, parts: dict, window: int) -> dict:
    """Running mean losses per task, the step's learning rate, and the step's extra terms: per task
    (`r_s_sst`, `d_breg_para`, ...), or for the whole step (`pcgrad_*`)."""
    record = {"step": state.global_step, "epoch": state.epoch, "lr": lr,
              **{f"loss_{t}": float(np.mean(v[-window:])) for t, v in state.losses.items() if v}}
    for task, p in parts.items():
        record.update({k if k.startswith("pcgrad_") else f"{k}_{task}": v for k, v in p.items() if k != "loss"})
    return record


def _fmt(metrics: dict) -> str:
    return " ".join(f"{k} {v:.3f}" for k, v in metrics.items())
