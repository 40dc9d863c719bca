"""Running a trained model over encoded examples: the heads' outputs in file order, both pair orders
averaged, predictions. What training.evaluate, the trainer and training.api share; and where a
checkpoint's tokenizer is."""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from data.batching import EvalBatching, TaskData
from heads import MultitaskBert, predict
from training.common.progress import progress
from training.inference.metrics import metrics_of

SHOW_PROGRESS_FROM = 20  # batches: below that a call is quick, and a line for each would be noise


@torch.inference_mode()
def raw_outputs(model: MultitaskBert, data: TaskData, tokenizer, batching: EvalBatching, device,
                autocast=contextlib.nullcontext, cache=None) -> torch.Tensor:
    """The heads' outputs (logits / scores) in the order of data.examples, in fp32 on the CPU; batches
    cut and padded as `batching` says (sorted by length).
    cache: a frozen-prefix cache (training.methods.frozen_cache) holding `data`'s states entering the first
    trainable layer; the batches then run only the layers above it."""
    was_training = model.training
    model.eval()
    out = None
    try:
        groups = batching.plan(data, device.type)
        if len(groups) >= SHOW_PROGRESS_FROM:  # a dev or test set, not an API call on a few sentences
            groups = progress(groups, desc=f"predicting {data.task} ({len(data)} examples)", total=len(groups))
        cached = cache is not None and cache.covers(data)
        for indices in groups:  # the cache's states need no tokenising
            batch = (cache.batch(data, indices, batching.multiple, batching.cap) if cached
                     else batching.batch(data, indices, tokenizer)).to(device)
            with autocast():
                o = model(data.task, batch.inputs, cache.layer if cached else 0).float().cpu()
            if out is None:
                out = torch.empty((len(data), *o.shape[1:]))
            out[torch.as_tensor(batch.indices)] = o
    finally:
        model.train(was_training)
    return out if out is not None else torch.empty(0)


def task_outputs(model: MultitaskBert, data: TaskData, tokenizer, batching: EvalBatching, device,
                 autocast=contextlib.nullcontext, cache=None) -> torch.Tensor:
    """raw_outputs, except that where data has a `.swapped` copy (pairs in both orders) the two
    orders' outputs are averaged: the paraphrase logits, the similarity scores."""
    out = raw_outputs(model, data, tokenizer, batching, device, autocast, cache)
    if data.swapped is not None:
        out = (out + raw_outputs(model, data.swapped, tokenizer, batching, device, autocast, cache)) / 2
    return out


def predict_task(model: MultitaskBert, data: TaskData, tokenizer, batching: EvalBatching, device,
                 autocast=contextlib.nullcontext, cache=None) -> np.ndarray:
    """Predictions in the order of data.examples, from task_outputs."""
    out = task_outputs(model, data, tokenizer, batching, device, autocast, cache)
    return predict(data.task, out).double().numpy()


def predict_sets(model, sets: dict[str, TaskData], tokenizer, batching: EvalBatching, device,
                 autocast=contextlib.nullcontext, cache=None) -> dict[str, np.ndarray]:
    """predict_task for each task's set: task -> predictions in the order of its examples."""
    return {task: predict_task(model, data, tokenizer, batching, device, autocast, cache)
            for task, data in sets.items()}


def evaluate(model, dev: dict[str, TaskData], tokenizer, batching: EvalBatching, device,
             autocast=contextlib.nullcontext) -> dict[str, float]:
    """Dev metrics of `model`, its batches cut as `batching` says."""
    return metrics_of(dev, predict_sets(model, dev, tokenizer, batching, device, autocast))


def run_tokenizer_dir(checkpoint, given: str | None) -> Path:
    """--tokenizer, else the run's tokenizer/ beside best.pt, or one folder up for checkpoints/step-N.pt."""
    if given:
        return Path(given)
    run = Path(checkpoint).parent
    found = [d / "tokenizer" for d in (run, run.parent) if (d / "tokenizer").is_dir()]
    if not found:
        raise FileNotFoundError(f"no tokenizer/ beside {checkpoint} or one folder up (where run_multitask.py "
                                f"writes it): pass --tokenizer DIR, e.g. the pretrained model's folder")
    return found[0]
