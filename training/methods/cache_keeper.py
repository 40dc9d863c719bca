"""The frozen-prefix caches of a run, kept at the frozen depth of each phase of its freezing schedule.

A run holds at most one training cache (float16) and one dev cache (float32), both of the states entering
the model's first trainable layer. When the frozen prefix deepens (adaptive freezing), the new caches are
computed from the old ones through the newly frozen layers alone, and the old ones go once the new ones are
complete (two caches at once for that moment). When it gets shallower (LP-FT, gradual unfreezing), states
entering a deeper layer cannot give those entering a shallower one: the old caches go first and the new ones
are computed from the token ids, one pass of the new prefix, so memory never holds more than one of each.

Under --frozen-cache auto a scheduled phase is cached only when it is long enough to repay the pass that
builds its cache: when its steps visit at least as many training examples as the cache holds (an uncached
step runs the frozen prefix without a graph on its own batch; the cache runs it once on every example).
A fixed depth is cached for the whole run, as before.

For exact resume the keeper remembers the depths its caches went through since they were last computed from
the tokens (`chain`): a resumed run recomputes them the same way, to the same bits.
"""
from __future__ import annotations

import logging
import os
import time

import torch

from data.batching import TaskData
from heads import MultitaskBert
from training.config.freeze_spec import parse_schedule
from training.config.train_config import TrainConfig, default_of
from training.methods.frozen_cache import build_frozen_cache, estimate_bytes

log = logging.getLogger(__name__)


class CacheKeeper:
    def __init__(self, cfg, model, data, tokenizer, device, amp_dtype, dist=None):
        self.cfg, self.model, self.data, self.tokenizer = cfg, model, data, tokenizer
        self.device, self.amp_dtype, self.dist = device, amp_dtype, dist
        self.train = None  # FrozenCache of the training sets, or None
        self.dev = None  # FrozenCache of the dev sets (one process only: see dev_frozen_cache below)
        self.chain: list[int] = []  # the layers the caches entered since they were built from the tokens
        self.seconds: float | None = None  # time spent building caches since the last epoch record
        _warn_of_unused_options(cfg, model)

    def worth_caching(self, steps: int | None) -> bool:
        """Whether a scheduled phase of `steps` updates repays its cache (module docstring); None: a fixed depth."""
        if steps is None or self.cfg.frozen_cache != "auto":
            return True
        examples = self.cfg.batch_size * self.cfg.grad_accum_steps * steps
        return examples >= sum(len(d) for d in self.data.train.values())

    def serve(self, phase_steps: int | None = None) -> None:
        """Caches for the model's frozen depth as it is now (the model was just frozen to it)."""
        layer = self.model.first_trainable_layer
        if self.train is not None and self.train.layer == layer:
            return
        if layer >= 1 and self.train is not None and self.train.layer < layer and self.dist is None:
            return self._build(deepen=True)
        self.drop()  # shallower, or nothing frozen: these states serve no more
        if layer >= 1 and self.worth_caching(phase_steps):
            self._build(deepen=False)
        elif layer >= 1:
            log.info("frozen-prefix cache: not built for the %d steps of this phase (they visit fewer examples "
                     "than the cache would hold; --frozen-cache memory or disk builds it anyway)", phase_steps)

    def _build(self, deepen: bool) -> None:
        """The caches entering the first trainable layer: from the current ones (deepen) or the tokens."""
        cfg, model, data, t0 = self.cfg, self.model, self.data, time.perf_counter()
        train, dev = (self.train, self.dev) if deepen else (None, None)
        self.train = maybe_frozen_cache(cfg, model, data.train, self.tokenizer, self.device, self.dist,
                                        self.amp_dtype, base=train)
        if self.train is not None and self.dist is None:
            self.dev = dev_frozen_cache(cfg, model, data.dev, self.tokenizer, self.device, self.amp_dtype, base=dev)
        if self.train is not None:
            self.chain = self.chain + [self.train.layer] if deepen else [self.train.layer]
            self.seconds = (self.seconds or 0.0) + time.perf_counter() - t0

    def drop(self) -> None:
        self.train, self.dev, self.chain = None, None, []

    def state_dict(self) -> dict:
        return {"chain": list(self.chain)}

    def restore(self, state: dict | None, phase_steps: int | None = None) -> None:
        """A resumed run's caches, computed as the run that wrote the checkpoint computed them (each layer
        of the chain is still frozen, the model being at the checkpoint's depth or deeper)."""
        chain = (state or {}).get("chain") or []
        if not chain:
            return self.serve(phase_steps)
        depth = self.model.frozen_upto
        try:
            for k, layer in enumerate(chain):
                self.model.frozen_upto = layer  # what first_trainable_layer tells the builders
                self._build(deepen=k > 0)
        finally:
            self.model.frozen_upto = depth


# --------------------------------------------------------------------------- which cache, when

def maybe_frozen_cache(cfg: TrainConfig, model: MultitaskBert, train: dict[str, TaskData], tokenizer, device,
                       dist=None, amp_dtype: torch.dtype | None = None, base=None):
    """The frozen-prefix cache when it applies (frozen encoder layers, nothing needing their gradients).
    base: the cache of a shallower prefix, to compute the new states from (one process)."""
    if cfg.frozen_cache == "off" or model.first_trainable_layer < 1:
        return None
    if cfg.frozen_dropout:
        log.info("frozen-prefix cache off: --frozen-dropout keeps dropout in the frozen layers, so their output "
                 "is no fixed function of the input")
        return None
    if cfg.perturbs_embeddings():
        log.info("frozen-prefix cache off: SMART perturbs the embeddings, which needs gradients through the "
                 "frozen layers every step (--smart-perturb-at first-trainable keeps the cache)")
        return None
    if dist is not None:
        return frozen_cache_per_rank(dist, model, train, tokenizer, device, cfg.frozen_cache, cfg.cache_dir,
                                     amp_dtype)
    return build_frozen_cache(model, train, tokenizer, device, cfg.frozen_cache, cfg.cache_dir,
                              compute_dtype=amp_dtype, base=base)


def _warn_of_unused_options(cfg: TrainConfig, model: MultitaskBert) -> None:
    """The frozen layers' options on a run whose depth stays below one encoder layer do nothing: said once at
    the start rather than refused, as a sweep or search may fix them over trials of every depth."""
    if parse_schedule(cfg.unfreeze_schedule).kind != "fixed" or model.first_trainable_layer >= 1:
        return
    default_cache_dir = default_of(TrainConfig.__dataclass_fields__["cache_dir"])
    unused = [flag for flag, given in (("--frozen-cache " + cfg.frozen_cache, cfg.frozen_cache in ("memory", "disk")),
                                       ("--frozen-dropout", cfg.frozen_dropout),
                                       ("--cache-dir " + cfg.cache_dir, cfg.cache_dir != default_cache_dir))
              if given]
    if unused:
        log.warning("%s: %s nothing here, as no encoder layer is frozen (they are for --freeze-upto N >= 1)",
                    ", ".join(unused), "does" if len(unused) == 1 else "do")


def dev_frozen_cache(cfg: TrainConfig, model: MultitaskBert, dev: dict[str, TaskData], tokenizer, device,
                     amp_dtype: torch.dtype | None = None, base=None):
    """The dev sets' frozen-prefix states, stored in float32, for the evaluations during training: each
    then runs only the trainable layers. Where the training cache applies and one process evaluates
    (under torchrun, rank 0 alone evaluates: its own cache would be the only one, so none is made)."""
    return build_frozen_cache(model, dev, tokenizer, device, cfg.frozen_cache, cfg.cache_dir, dtype="float32",
                              compute_dtype=amp_dtype, base=base)


def frozen_cache_per_rank(d, model, train, tokenizer, device, mode: str, cache_dir, compute_dtype=None):
    """The frozen-prefix cache of the WHOLE training set on every rank (a rank's slices change every
    epoch). In memory: one copy per process, built at once; 'auto' counts each node's ranks against
    its RAM, and takes the disk everywhere if one node is short (the ranks must make the same collective
    calls: the disk's turns are barriers). On disk: the ranks take turns, so the first rank on a
    filesystem writes the cache and the others find and memory-map the same files (one copy in the page
    cache, no write races)."""
    if mode == "auto":
        size = estimate_bytes(train, model.encoder.config.hidden_size) * d.local_world_size
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        mode = "disk" if d.any(size >= ram // 4) else "memory"
    if mode != "disk":
        return build_frozen_cache(model, train, tokenizer, device, mode, compute_dtype=compute_dtype)
    cache = None
    for r in range(d.world_size):
        if r == d.rank:
            cache = build_frozen_cache(model, train, tokenizer, device, "disk", cache_dir,
                                       compute_dtype=compute_dtype)
        d.barrier()
    return cache
