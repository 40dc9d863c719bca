"""What a score must be compared with, besides full fine-tuning: the trivial predictor of each task and
the untrained model's own zero-shot scores. Written once per study to OUT/baselines.json.

- trivial: the training part's majority class for SST and Quora, a constant for STS (Pearson 0, the
  convention training.evaluate.score uses where a correlation is undefined), and their course overall.
- unseen: for the embeddings question, the dev examples holding a word piece that no training example
  of any task holds (the pieces whose embedding rows training never updates), per task, by index.
- zero-shot: the pretrained encoder, untouched, each sentence pooled as the study pools it (mean or
  [CLS]), the cosine of a pair's two vectors: STS's Pearson on dev needs nothing more; Quora's accuracy
  takes the cosine threshold that is best on the tuning split. SST has no zero-shot score here.
"""
from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np

from data.loaders import load_task_file
from training.config.train_config import TrainConfig
from training.experiments.sweep.subsets import TUNE
from training.inference.metrics import METRIC, overall, score

log = logging.getLogger(__name__)
FILE = "baselines.json"


def labels_digest(labels) -> str:
    """A fingerprint of a dev file's labels, in order: a report checks it reads the files the runs were
    scored on."""
    import hashlib
    return hashlib.sha1(",".join(f"{float(y):.6g}" for y in labels).encode()).hexdigest()[:16]


def majority_label(labels) -> float:
    """The most frequent label (ties: the smallest)."""
    counts = Counter(labels)
    return min(counts, key=lambda y: (-counts[y], y))


def trivial_scores(train_labels: dict[str, list], dev_labels: dict[str, list]) -> dict[str, float]:
    """Each task's score of the trivial predictor, and their course overall."""
    out = {}
    for task, dev in dev_labels.items():
        if task == "sts":
            out[METRIC[task]] = 0.0
        else:
            out[METRIC[task]] = score(task, np.full(len(dev), majority_label(train_labels[task])), dev)
    return {**out, "overall": overall(out)}


def best_threshold(cosines: np.ndarray, labels: np.ndarray) -> float:
    """The cosine threshold (predict 1 at or above it) with the best accuracy on these pairs: each
    midpoint between sorted distinct cosines, and both ends, is tried; a tie takes the lowest."""
    xs = np.unique(cosines)
    candidates = np.concatenate([[xs[0]], (xs[:-1] + xs[1:]) / 2, [xs[-1] + 1e-6]])
    accuracy = [np.mean((cosines >= t) == labels) for t in candidates]
    return float(candidates[int(np.argmax(accuracy))])


def zero_shot_cosines(model: str, pooling: str, examples, max_length: int, threads: int | None = None) -> np.ndarray:
    """The cosine of each pair's two pooled sentence vectors under the untrained encoder."""
    import torch
    import torch.nn.functional as F

    from data.batching import encode_task, eval_batches
    from heads import MultitaskBert
    from minbert import Tokenizer, load_bert, resolve_checkpoint

    ckpt = resolve_checkpoint(model)
    tokenizer = Tokenizer.from_checkpoint(ckpt)
    net = MultitaskBert(load_bert(ckpt), "siamese", dropout=0.0, pooling=pooling).eval()
    data = encode_task("sts", examples, tokenizer, "siamese", max_length)
    out = torch.empty(len(data))
    with torch.inference_mode():
        for batch in eval_batches(data, tokenizer, 128):
            y1, y2 = (net.pool(h, s["attention_mask"], 0) for h, s in zip(net.hidden_at(batch.inputs, 0), batch.inputs))
            out[list(batch.indices)] = F.cosine_similarity(y1.float(), y2.float(), dim=-1)
    return out.double().numpy()


def compute_baselines(base: TrainConfig, tasks: list[str], subsets: dict, seed: int, size) -> dict:
    """The study's baselines on the dev sets; subsets: training_subsets' (a seed's training examples of
    each task at `size`, and the tuning split)."""
    dev = {t: load_task_file(base.file(t, "dev"), t, labelled=True).examples for t in tasks}
    dev_labels = {t: [e.label for e in ex] for t, ex in dev.items()}
    train_labels = {t: [e.label for e in subsets[t, seed][size]] for t in tasks if t != "sts"}
    out = {"trivial": trivial_scores(train_labels, dev_labels), "model": base.model, "pooling": base.pooling,
           "dev_labels": {t: labels_digest(v) for t, v in dev_labels.items()}, "zero_shot": {},
           "unseen": unseen_by_task(base, tasks, {t: subsets[t, seed][size] for t in tasks}, dev)}
    if "sts" in tasks:
        cos = zero_shot_cosines(base.model, base.pooling, dev["sts"], base.max_length)
        out["zero_shot"]["sts_pearson"] = score("sts", cos, dev_labels["sts"])
    if "para" in tasks:
        tune = subsets["para", TUNE]
        threshold = best_threshold(zero_shot_cosines(base.model, base.pooling, tune, base.max_length),
                                   np.array([e.label for e in tune]))
        cos = zero_shot_cosines(base.model, base.pooling, dev["para"], base.max_length)
        out["zero_shot"]["para_acc"] = score("para", (cos >= threshold).astype(float), dev_labels["para"])
        out["zero_shot"]["para_threshold"] = threshold
    return out


def pieces(tokenizer, examples, max_length: int) -> list[set[int]]:
    """Each example's word-piece ids (both sentences of a pair; the special tokens and padding aside)."""
    special = tokenizer.special_ids
    out = []
    for e in examples:
        ids = set(tokenizer.encode([e.text_a], max_length=max_length)[0][0])
        if e.text_b is not None:
            ids |= set(tokenizer.encode([e.text_b], max_length=max_length)[0][0])
        out.append(ids - special)
    return out


def unseen_examples(train_pieces: set[int], dev_pieces: list[set[int]]) -> list[int]:
    """Indices of the dev examples holding a piece outside train_pieces."""
    return [i for i, p in enumerate(dev_pieces) if p - train_pieces]


def unseen_by_task(base: TrainConfig, tasks: list[str], train: dict[str, list], dev: dict[str, list]) -> dict:
    from minbert import Tokenizer, resolve_checkpoint

    tokenizer = Tokenizer.from_checkpoint(resolve_checkpoint(base.model))
    seen = set().union(*(p for t in tasks for p in pieces(tokenizer, train[t], base.max_length)))
    return {t: unseen_examples(seen, pieces(tokenizer, dev[t], base.max_length)) for t in tasks}


def write_baselines(recipe, base: TrainConfig, subsets: dict, results: Path) -> dict:
    """OUT/baselines.json, computed once (it depends on the model, the data and the tuning split only)."""
    path = results / FILE
    if path.is_file() and "dev_labels" in json.loads(path.read_text()):  # an older file lacks the newer parts
        return json.loads(path.read_text())
    log.info("computing the baselines (trivial predictors, the untrained model's zero-shot scores)")
    found = compute_baselines(base, recipe.tasks, subsets, recipe.seeds[0], recipe.sizes[0])
    found["tuning_split"] = recipe.tuning_split
    path.write_text(json.dumps(found, indent=1) + "\n")
    return found


def read_baselines(results: Path) -> dict | None:
    path = Path(results) / FILE
    return json.loads(path.read_text()) if path.is_file() else None
