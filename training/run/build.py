"""A run's parts, built from its config: the model and tokenizer, the data splits, and each epoch's
schedule of batches (the frozen-prefix cache: training/methods/cache_keeper.py)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from data.batching import TaskData, encode_task, with_swapped_pairs
from data.loaders import load_task_file
from data.sampler import TaskBatch, epoch_schedule, mixed_schedule
from heads import MultitaskBert
from minbert import Tokenizer, load_bert, resolve_checkpoint
from training.common.errors import ConfigError
from training.config.run_settings import RunSettings, resolve_settings
from training.config.train_config import TrainConfig
from training.methods.peft import apply_peft

log = logging.getLogger(__name__)


def build_model(cfg: TrainConfig, settings: RunSettings | None = None) -> tuple[MultitaskBert, Tokenizer, Path]:
    """The model at the run's frozen depth with its --peft set up. settings: the run's (Run.setup settles them
    once); worked out here on the loaded encoder for a caller without them."""
    ckpt = resolve_checkpoint(cfg.model)
    try:
        tokenizer = Tokenizer.from_checkpoint(ckpt)
    except ValueError as e:  # an unreadable tokenizer.json, a vocabulary without [CLS]: the message names it
        raise ConfigError(str(e)) from None
    encoder = load_bert(ckpt, attn_impl=cfg.attn_impl)
    if cfg.max_length > encoder.config.max_sequence_length:  # MPNet's table also holds padding's positions
        longest = encoder.config.max_sequence_length
        raise ConfigError(f"--max-length {cfg.max_length} is longer than the model's {longest} positions "
                          f"(max_position_embeddings in {ckpt / 'config.json'})")
    if encoder.config.model_type == "mpnet" and cfg.cross_pairs and cfg.max_length < 6:
        raise ConfigError(f"--max-length {cfg.max_length}: MPNet's cross-encoded pairs need at least 6 "
                          f"(<s> a </s></s> b </s>)")
    if tokenizer.vocab_size > encoder.config.vocab_size:
        raise ConfigError(f"{ckpt}: the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
                          f"has {encoder.config.vocab_size} rows; the vocabulary belongs to another model")
    torch.manual_seed(cfg.seed)  # head initialisation
    model = MultitaskBert(encoder, cfg.pair_encoding, cfg.head_dropout, cfg.pooling, cfg.siamese_init)
    model.frozen_dropout = cfg.frozen_dropout
    settings = settings or resolve_settings(cfg, encoder.num_layers)
    try:
        model.freeze(settings.freeze_depth)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    apply_peft(model, settings.peft, settings.first_trainable_layer, cfg.seed)
    return model, tokenizer, ckpt


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
            if split == "test" and not cfg.test_predictions:
                continue
            if split == "test" and not os.path.isfile(path):
                log.warning("%s: not found; no %s test predictions will be written", path, task)
                continue
            examples = load_task_file(path, task, labelled=split != "test", strict=cfg.strict).examples
            limit = {"train": cfg.max_train_examples, "dev": cfg.max_eval_examples}.get(split)
            if limit and len(examples) > limit:  # a seeded random subset: the files are not in random order
                keep = np.random.default_rng([cfg.seed, 7 if split == "train" else 8]).permutation(len(examples))
                examples = [examples[i] for i in sorted(keep[:limit])]
            if split == "train" and cfg.pair_swap and task != "sst" and cfg.pair_encoding == "cross":
                examples = with_swapped_pairs(examples)
            target[task] = encode_task(task, examples, tokenizer, cfg.pair_encoding, cfg.max_length,
                                       both_orders=cfg.predict_both_orders and split != "train")
    return out


def schedule_for_epoch(cfg: TrainConfig, train: dict[str, TaskData], epoch: int) -> list[list[TaskBatch]]:
    """The epoch's steps; each step is a list of TaskBatch (one, or one per task in a mixed batch)."""
    sizes = {t: len(d) for t, d in train.items()}
    lengths = {t: d.lengths for t, d in train.items()} if cfg.bucket else None
    if cfg.task_sampling == "mixed":  # length-bucketed too, keeping every task in every step (docs/sampling.md)
        return mixed_schedule(sizes, cfg.batch_size, epoch=epoch, seed=cfg.seed, lengths=lengths)
    steps = epoch_schedule(sizes, cfg.batch_size, epoch=epoch, seed=cfg.seed, sampling=cfg.task_sampling,
                           num_epochs=cfg.epochs, max_batches_per_task=cfg.max_batches_per_task, lengths=lengths)
    return [[s] for s in steps]


def updates_for_epoch(cfg: TrainConfig, train: dict[str, TaskData], epoch: int) -> list[list[list[TaskBatch]]]:
    """The epoch's optimiser updates: each --grad-accum-steps consecutive steps of the schedule (the
    last update may hold fewer)."""
    steps, k = schedule_for_epoch(cfg, train, epoch), cfg.grad_accum_steps
    return [steps[i: i + k] for i in range(0, len(steps), k)]
