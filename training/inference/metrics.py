"""The dev metrics from predictions: each task's score and the course's overall score. No model here (running
one is training.inference.outputs), so that the commands that only read scores load neither torch nor scipy."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from data.batching import TaskData

METRIC = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_pearson"}


def score(task: str, preds: np.ndarray, labels) -> float:
    labels = np.asarray(labels, dtype=np.float64)
    if task == "sts":
        # Pearson is undefined for constant inputs; count it as no correlation. ptp, not std: ten copies of
        # 0.3 have a std of 5.6e-17 (the mean rounds), and pearsonr would return nan
        if len(labels) < 2 or np.ptp(preds) == 0 or np.ptp(labels) == 0:
            return 0.0
        from scipy.stats import pearsonr  # a second of import: only once an STS score is asked for
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

