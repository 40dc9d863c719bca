"""The dev metrics: each task's score, the course's overall score, and a model's metrics on dev sets."""
from __future__ import annotations

import contextlib

import numpy as np
import torch
from scipy.stats import pearsonr

from data.batching import EvalBatching, TaskData
from training.inference.outputs import predict_sets

METRIC = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_pearson"}


@torch.inference_mode()
def score(task: str, preds: np.ndarray, labels) -> float:
    labels = np.asarray(labels, dtype=np.float64)
    if task == "sts":
        if len(labels) < 2 or np.std(preds) == 0 or np.std(labels) == 0:
            return 0.0  # Pearson is undefined for constant inputs; count it as no correlation
        return float(pearsonr(preds, labels)[0])
    return float(np.mean(preds == labels))


def overall(metrics: dict[str, float]) -> float:
    """The course's score: mean of SST accuracy, paraphrase accuracy and (Pearson + 1) / 2."""
    parts = [metrics["sst_acc"]] if "sst_acc" in metrics else []
    parts += [metrics["para_acc"]] if "para_acc" in metrics else []
    parts += [(metrics["sts_pearson"] + 1) / 2] if "sts_pearson" in metrics else []
    return float(np.mean(parts))


def metrics_of(dev: dict[str, TaskData], preds: dict[str, np.ndarray]) -> dict[str, float]:
    """Each task's dev metric of `preds`, and the course's overall score."""
    metrics = {METRIC[task]: score(task, preds[task], [e.label for e in data.examples]) for task, data in dev.items()}
    metrics["overall"] = overall(metrics)
    return metrics


def evaluate(model, dev: dict[str, TaskData], tokenizer, batching: EvalBatching, device,
             autocast=contextlib.nullcontext) -> dict[str, float]:
    """Dev metrics of `model`, its batches cut as `batching` says."""
    return metrics_of(dev, predict_sets(model, dev, tokenizer, batching, device, autocast))
