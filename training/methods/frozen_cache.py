"""Frozen-prefix cache: compute the hidden states entering the first trainable layer once.

With --freeze-upto N the embeddings and layers 0..N-1 have no trainable parameters and run in
eval mode (no dropout), so the hidden states they hand to layer N are a fixed function of each
input. We compute them in one pass over each training set, store them packed (sequences back to
back, no padding) in fp16, and every later step runs only layers N.. on a gathered batch.

Stored in memory, or in a memory-mapped file on disk (--frozen-cache disk) so a Quora-sized
task fits. The disk cache is keyed by a hash of the frozen parameters themselves and of every
token id, so a different model, checkpoint, tokeniser, max length, data file or N never reuses
a stale cache.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from data.batching import Batch, TaskData, batch_labels, eval_batch_indices, eval_batches, eval_token_budget
from heads import MultitaskBert
from minbert.tokenizer import padded_length
from training.common.progress import progress

log = logging.getLogger(__name__)

_DTYPES = {"float16": np.float16, "float32": np.float32}  # storage dtype names -> numpy


@dataclass
class PackedStates:
    """Variable-length (T_i, H) hidden states back to back: example i is rows offsets[i]:offsets[i+1]."""
    data: np.ndarray  # (total tokens, H), an in-memory array or a read-only np.memmap
    offsets: np.ndarray  # (N + 1,)

    def gather(self, indices, multiple: int = 1, cap: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded (B, T, H) float32 hidden states and their (B, T) attention mask; T as Tokenizer.pad's."""
        lengths = self.offsets[np.asarray(indices) + 1] - self.offsets[np.asarray(indices)]
        B, T, H = len(indices), padded_length(int(lengths.max()), multiple, cap), self.data.shape[1]
        hidden = np.zeros((B, T, H), dtype=np.float32)
        mask = np.zeros((B, T), dtype=np.int64)
        for row, (i, n) in enumerate(zip(indices, lengths)):
            hidden[row, :n] = self.data[self.offsets[i]:self.offsets[i] + n]
            mask[row, :n] = 1
        return torch.from_numpy(hidden), torch.from_numpy(mask)


class FrozenCache:
    def __init__(self, layer: int, states: dict[str, list[PackedStates]], sources: dict[str, TaskData] | None = None,
                 origin: str = ""):
        self.layer = layer
        self.states = states  # task -> one PackedStates per input sequence (two for siamese pairs)
        self.sources = sources or {}  # task -> the TaskData the states were computed from
        self.origin = origin  # "": computed from the token ids; else "layer:origin" of the cache it deepened

    def covers(self, data: TaskData) -> bool:
        """Whether the states are those of `data` itself (not, say, its pairs in the other order)."""
        return self.sources.get(data.task) is data

    def batch(self, data: TaskData, indices, multiple: int = 1, cap: int | None = None) -> Batch:
        """The same batch make_batch would give, with `hidden` entering self.layer instead of token ids."""
        inputs = []
        for packed in self.states[data.task]:
            hidden, mask = packed.gather(indices, multiple, cap)
            inputs.append({"hidden": hidden, "attention_mask": mask, "cache_layer": self.layer})
        return Batch(data.task, inputs, batch_labels(data, indices), [data.examples[i].id for i in indices], indices)


def estimate_bytes(train: dict[str, TaskData], hidden: int, itemsize: int = 2) -> int:
    return sum(len(ids) for d in train.values() for seq in d.sequences for ids, _ in seq) * hidden * itemsize


def cache_key(model: MultitaskBert, train: dict[str, TaskData], layer: int, dtype: str,
              compute_dtype: torch.dtype | None = None, origin: str = "") -> str:
    """Hash of what the cached states depend on: the frozen parameters, every token id, the precision
    they were computed and stored in, and the caches they were deepened from (rounded to their dtype)."""
    h = hashlib.sha256(f"layer={layer};dtype={dtype};compute={compute_dtype or 'fp32'}".encode())
    if origin:
        h.update(f";from={origin}".encode())
    for name, t in sorted(model.encoder.state_dict().items()):
        if name.startswith("embeddings.") or any(name.startswith(f"layers.{i}.") for i in range(layer)):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
    for task in sorted(train):
        h.update(task.encode())
        for seq in train[task].sequences:
            for ids, types in seq:
                h.update(np.asarray(ids, dtype=np.int32).tobytes() + b"|" + np.asarray(types, dtype=np.int8).tobytes())
    return h.hexdigest()[:20]


def _offsets(seq) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(ids) for ids, _ in seq])]).astype(np.int64)


@torch.inference_mode()
def _fill(model: MultitaskBert, data: TaskData, s: int, out: np.ndarray, offsets: np.ndarray, tokenizer,
          layer: int, device, batch_size: int, compute_dtype: torch.dtype | None, base: FrozenCache | None) -> None:
    """The states entering `layer` of sequence s of every example, into `out`: from the token ids, or
    from `base`'s states by running only its layers base.layer..layer-1. Batched as evaluation is."""
    budget = eval_token_budget("auto", device.type)
    plan = eval_batch_indices(data, batch_size, budget)
    batches = eval_batches(data, tokenizer, batch_size, budget) if base is None else plan
    name = f"frozen cache: {data.task}" + (f" sentence {s + 1}" if len(data.sequences) > 1 else "")
    for batch, indices in progress(zip(batches, plan), desc=name, total=len(plan)):
        with torch.autocast(device.type, dtype=compute_dtype, enabled=compute_dtype is not None):
            if base is None:
                h = model.hidden_at([{k: v.to(device) for k, v in batch.inputs[s].items()}], layer)[0]
            else:
                hidden, mask = base.states[data.task][s].gather(indices)
                h = model.encoder.encode(hidden.to(device), mask.to(device), start=base.layer, end=layer)
        h = h.float().cpu().numpy()
        for row, i in enumerate(indices):
            n = offsets[i + 1] - offsets[i]
            out[offsets[i]:offsets[i] + n] = h[row, :n]


def build_frozen_cache(model: MultitaskBert, train: dict[str, TaskData], tokenizer, device, mode: str = "auto",
                       cache_dir: str | os.PathLike = ".cache/frozen", dtype: str = "float16",
                       batch_size: int = 128, compute_dtype: torch.dtype | None = None,
                       base: FrozenCache | None = None) -> FrozenCache:
    """Compute (or, on disk, reuse) the states entering model.first_trainable_layer for every example.
    compute_dtype: the autocast dtype training runs the frozen layers in (None: fp32), so that the
    cached states are the ones an uncached step would compute. dtype: how they are stored (float16
    for training batches; float32 for the dev sets, whose scores should not move by a rounding).
    base: a cache of the same sets at a shallower layer: the new states are computed from its states
    through the layers between (a freezing schedule deepening the frozen prefix), not from the tokens."""
    layer = model.first_trainable_layer
    if layer < 1:
        raise ValueError("the frozen cache needs at least one frozen encoder layer (--freeze-upto >= 1)")
    if base is not None and base.layer >= layer:
        raise ValueError(f"a cache entering layer {base.layer} cannot give the states entering layer {layer}")
    origin = f"{base.layer}:{base.origin}" if base is not None else ""
    np_dtype = _DTYPES[dtype]
    H = model.encoder.config.hidden_size
    size = estimate_bytes(train, H, np.dtype(np_dtype).itemsize)
    if mode == "auto":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        mode = "memory" if size < ram // 4 else "disk"
    log.info("frozen-prefix cache: states entering layer %d for %s, about %.0f MiB (%s, %s%s)", layer,
             ", ".join(f"{len(d)} {t}" for t, d in train.items()), size / 2**20, mode, dtype,
             f", from the cache entering layer {base.layer}" if base is not None else "")
    was_training = model.training
    model.eval()
    try:
        if mode == "memory":
            states = {}
            for task, data in train.items():
                states[task] = []
                for s, seq in enumerate(data.sequences):
                    offsets = _offsets(seq)
                    out = np.empty((offsets[-1], H), dtype=np_dtype)
                    _fill(model, data, s, out, offsets, tokenizer, layer, device, batch_size, compute_dtype, base)
                    states[task].append(PackedStates(out, offsets))
            return FrozenCache(layer, states, dict(train), origin)
        if mode != "disk":
            raise ValueError(f"frozen cache mode must be auto, memory or disk, not {mode!r}")
        return _disk_cache(model, train, tokenizer, device, Path(cache_dir), layer, dtype, batch_size,
                           compute_dtype, base, origin)
    finally:
        model.train(was_training)


def _disk_cache(model, train, tokenizer, device, cache_dir: Path, layer: int, dtype: str, batch_size: int,
                compute_dtype: torch.dtype | None, base: FrozenCache | None, origin: str):
    np_dtype = _DTYPES[dtype]
    H = model.encoder.config.hidden_size
    root = cache_dir / cache_key(model, train, layer, dtype, compute_dtype, origin)
    meta_path = root / "meta.json"
    if meta_path.is_file():
        log.info("frozen-prefix cache: reusing %s", root)
    else:
        root.mkdir(parents=True, exist_ok=True)
        # Temp names of this process's own: two runs building the same entry at once (the same
        # model, data and depth) each write complete files and rename them into place.
        tmp = f"{os.getpid()}.tmp"
        for task, data in train.items():
            for s, seq in enumerate(data.sequences):
                offsets = _offsets(seq)
                out = np.lib.format.open_memmap(root / f"{task}.{s}.{tmp}.npy", mode="w+", dtype=np_dtype,
                                                shape=(int(offsets[-1]), H))
                _fill(model, data, s, out, offsets, tokenizer, layer, device, batch_size, compute_dtype, base)
                out.flush()
                del out
                np.save(root / f"{task}.{s}.offsets.{tmp}.npy", offsets)
                os.replace(root / f"{task}.{s}.{tmp}.npy", root / f"{task}.{s}.npy")
                os.replace(root / f"{task}.{s}.offsets.{tmp}.npy", root / f"{task}.{s}.offsets.npy")
        # meta.json last: its presence says every array before it was written completely
        (root / f"meta.{tmp}.json").write_text(json.dumps({"layer": layer, "dtype": dtype,
                                                          "tasks": {t: len(d.sequences) for t, d in train.items()}}))
        os.replace(root / f"meta.{tmp}.json", meta_path)
        log.info("frozen-prefix cache: wrote %s", root)
    states = {task: [PackedStates(np.load(root / f"{task}.{s}.npy", mmap_mode="r"),
                                  np.load(root / f"{task}.{s}.offsets.npy"))
                     for s in range(len(data.sequences))]
              for task, data in train.items()}
    return FrozenCache(layer, states, dict(train), origin)
