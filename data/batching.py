"""Tokenise each task's examples once, then build padded batches from index lists.

Batches are padded to their own longest sequence (dynamic padding); with the sampler's
length bucketing most of the tokens computed are real ones.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from minbert import Tokenizer
from minbert.tokenizer import padded_length

from .loaders import Example


@dataclass
class TaskData:
    """One task's examples with their token ids, ready for batching.
    `sequences` holds one list of (ids, type_ids) per input sequence: one for a single sentence
    or a cross-encoded pair, two for a siamese pair."""
    task: str
    examples: list[Example]
    sequences: list[list[tuple[list[int], list[int]]]]
    swapped: "TaskData | None" = None  # the same pairs as (b, a), for predicting in both orders

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def side_lengths(self) -> np.ndarray:
        """(sides, n) tokens of each sequence a batch pads (each side to its own longest): one row, or two
        for a siamese pair."""
        return np.array([[len(ids) for ids, _ in seq] for seq in self.sequences])

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example: what bucketing sorts by (the longer side of a siamese pair)."""
        return self.side_lengths.max(axis=0)

    def digest(self) -> str:
        """sha256 of the labels and token ids: what training reads, so a resume can tell that
        a file changed even when its number of rows did not."""
        h = hashlib.sha256()
        for ex, seq in zip(self.examples, self.sequences):
            h.update(repr((ex.label, seq)).encode())
        return h.hexdigest()


@dataclass
class Batch:
    task: str
    inputs: list[dict[str, torch.Tensor]]  # per sequence: input_ids, token_type_ids, attention_mask (B, T)
    labels: torch.Tensor | None
    ids: list[str]
    indices: Sequence[int]  # into TaskData.examples

    @property
    def size(self) -> int:
        return len(self.ids)

    def to(self, device) -> "Batch":
        inputs = [_sequences_to(seq, device) for seq in self.inputs]
        labels = None if self.labels is None else self.labels.to(device, non_blocking=True)
        return Batch(self.task, inputs, labels, self.ids, self.indices)


def _sequences_to(seq: dict, device) -> dict:
    """One sequence's tensors on `device`. Whether the batch has any padding is decided here, on the
    host, and carried on the mask as `.unpadded`, so that the model's test (minbert.model.padding_bias)
    need not wait for the GPU to answer it."""
    out = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in seq.items()}
    mask = seq.get("attention_mask")
    if torch.is_tensor(mask) and mask.device.type == "cpu":
        out["attention_mask"].unpadded = bool(mask.all())
    return out


def encode_task(task: str, examples: list[Example], tokenizer: Tokenizer, pair_encoding: str = "cross",
                max_length: int = 128, both_orders: bool = False) -> TaskData:
    """`both_orders` (cross-encoded pairs only): also encode every pair as (b, a) in `.swapped`,
    so that predictions can average the two orders."""
    a, b = [e.text_a for e in examples], [e.text_b for e in examples]
    swapped = None
    if task == "sst":
        sequences = [tokenizer.encode(a, max_length=max_length)]
    elif pair_encoding == "cross":
        sequences = [tokenizer.encode(a, b, max_length=max_length)]
        if both_orders:
            swapped = TaskData(task, examples, [tokenizer.encode(b, a, max_length=max_length)])
    else:
        sequences = [tokenizer.encode(a, max_length=max_length), tokenizer.encode(b, max_length=max_length)]
    return TaskData(task, examples, sequences, swapped)


def with_swapped_pairs(examples: list[Example]) -> list[Example]:
    """The examples followed by each pair in the other order (id suffixed "#swap"). Paraphrase and
    similarity are symmetric, but a cross-encoder reads [CLS] a [SEP] b [SEP] as an ordered
    sequence: training on both orders doubles the pairs it learns from (--pair-swap)."""
    return examples + [Example(f"{e.id}#swap", e.text_b, e.text_a, e.label) for e in examples]


def batch_labels(data: TaskData, indices: Sequence[int]) -> torch.Tensor | None:
    """The batch's labels, or None where one of its examples has none (a test set, or an API call's mix of
    labelled and unlabelled examples, whose predictions need no label)."""
    labels = [data.examples[i].label for i in indices]
    if any(label is None for label in labels):
        return None
    return torch.tensor(labels, dtype=torch.long if data.task == "sst" else torch.float)


def make_batch(data: TaskData, indices: Sequence[int], tokenizer: Tokenizer, multiple: int = 1,
               cap: int | None = None) -> Batch:
    """The examples at `indices`, padded to their longest (rounded up to `multiple`, at most `cap`)."""
    inputs = [tokenizer.pad([seq[i] for i in indices], multiple=multiple, cap=cap) for seq in data.sequences]
    return Batch(data.task, inputs, batch_labels(data, indices), [data.examples[i].id for i in indices], indices)


# Padded tokens per evaluation batch (examples x longest) on CPU. On the course dev sets (MiniLM,
# one thread) 512-2048 all beat a fixed 256 examples per batch, 1024 the most: small batches of a
# length-sorted file pad least, and their activations stay in cache. bench/eval_speed.py.
CPU_EVAL_TOKENS = 1024


def eval_token_budget(max_tokens: int | str | None, device_type: str) -> int | None:
    """max_tokens as given, or for "auto" the measured budget of the device: CPU_EVAL_TOKENS on
    CPU; elsewhere none (the fixed count alone), not having been measured on a GPU, which wants
    large batches."""
    if max_tokens != "auto":
        return max_tokens
    return CPU_EVAL_TOKENS if device_type == "cpu" else None


def eval_batches(data: TaskData, tokenizer: Tokenizer, batch_size: int, max_tokens: int | None = None) -> list[Batch]:
    """Batches sorted by length (least padding); predictions are put back in file order by index.

    batch_size caps the examples per batch; max_tokens (None: no cap) caps its padded size,
    examples x longest, so short sentences go in large batches and long ones in small ones: the
    tail of a length-sorted file no longer pads a full batch_size batch to its longest member,
    and every batch's activations stay about the same size. A batch holds at least one example.
    (EvalBatching cuts the same plan with each batch padded to a multiple: --pad-multiple.)"""
    return [make_batch(data, idx, tokenizer) for idx in eval_batch_indices(data, batch_size, max_tokens)]


def eval_batch_indices(data: TaskData, batch_size: int, max_tokens: int | None = None, multiple: int = 1,
                       cap: int | None = None) -> list[list[int]]:
    """eval_batches' plan alone: each batch's example indices, for callers that build the batches
    themselves (from the frozen-prefix cache, whose states need no tokens)."""
    lengths = data.lengths
    order = np.argsort(lengths, kind="stable")
    # rounding up keeps the order, so the budget counts the tokens each batch will really hold
    padded = np.array([padded_length(int(n), multiple, cap) for n in lengths[order]], dtype=np.int64)
    return [order[a:b].tolist() for a, b in _sorted_spans(padded, batch_size, max_tokens)]


@dataclass(frozen=True)
class EvalBatching:
    """How evaluation and prediction cut a set into batches (eval_batches): at most `size` examples and
    `max_tokens` padded tokens each ("auto": the device's budget, eval_token_budget; None: `size` alone),
    each padded to its longest rounded up to a multiple of `multiple` tokens, never past `cap` (a run's
    --pad-multiple and --max-length: under CUDA graphs each new batch shape records a graph of its own)."""
    size: int
    max_tokens: int | str | None = "auto"
    multiple: int = 1
    cap: int | None = None

    def plan(self, data: TaskData, device_type: str) -> list[list[int]]:
        """Each batch's example indices, shortest examples first."""
        budget = eval_token_budget(self.max_tokens, device_type)
        return eval_batch_indices(data, self.size, budget, self.multiple, self.cap)

    def batch(self, data: TaskData, indices: Sequence[int], tokenizer: Tokenizer) -> Batch:
        return make_batch(data, indices, tokenizer, self.multiple, self.cap)


def _sorted_spans(sorted_lengths: np.ndarray, batch_size: int, max_tokens: int | None) -> list[tuple[int, int]]:
    """[start, end) of consecutive batches over ascending lengths, each within both caps."""
    if batch_size < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size and max_tokens must be >= 1, got {batch_size} and {max_tokens}")
    spans, start, n = [], 0, len(sorted_lengths)
    while start < n:
        end = min(start + batch_size, n)
        if max_tokens is not None:
            # ascending: the first m examples pad to the m-th length, so the padded size
            # m * sorted_lengths[start + m - 1] grows with m; keep the longest run within budget
            padded = np.arange(1, end - start + 1) * sorted_lengths[start:end]
            end = start + max(1, int(np.searchsorted(padded, max_tokens, side="right")))
        spans.append((start, end))
        start = end
    return spans
