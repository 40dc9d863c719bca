"""Data-parallel training over torch.distributed ranks (launched by torchrun; see docs/distributed.md).

Every rank builds the same epoch schedule from the shared seed, so all ranks train on the same
task(s) at every step; each takes its contiguous slice of each task group (data.sampler.shard).

No DistributedDataParallel wrapper: DDP's reducer expects one forward through the wrapper and one
backward per step, while a step here may take one backward per task (PCGrad), calls the model's
hidden_at/from_hidden directly, and uses one head of three. Instead, after the backward passes,
the gradients of the parameters that have one are summed over the ranks in ONE all-reduce of one
flat buffer (a single bucket), together with the step's few scalars (losses, a non-finite flag).
Frozen parameters have no gradient, so they are never communicated; heads not in the step have
none either, on every rank alike. Each rank's loss for a task is weighted by its share of that
task's global batch, n_local / n_global, so the SUM of the ranks' gradients is exactly the
gradient of the global batch's mean loss: the update equals a single process's on the same
global batch, and clipping, PCGrad surgery and AdamW all see that global gradient.

A rank whose slice of a task group is empty runs the task on the group's first example with
weight 0: the same graph as the other ranks, a zero gradient. So every rank has gradients for the
same parameters (the flat buffers line up, and AdamW skips the same grad-less ones) and the same
PCGrad task rows.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from data.sampler import TaskBatch, shard

# Rank 0 alone evaluates and writes predictions while the others wait in a collective; NCCL's
# default 10 minutes could run out on a large dev/test set.
TIMEOUT = datetime.timedelta(minutes=60)


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum_(self, tensors: list[torch.Tensor]) -> None:
        """Sum each tensor over the ranks, in place, in one collective over one flat buffer."""
        flat = _flatten_dense_tensors(tensors)
        dist.all_reduce(flat)
        for t, summed in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
            t.copy_(summed)

    def any(self, flag: bool) -> bool:
        """True on every rank if it is true on any (e.g. a stop signal that reached one rank first)."""
        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t)
        return bool(t.item() > 0)

    def barrier(self) -> None:
        dist.barrier()

    def all_gather_object(self, obj) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        """Rank 0's obj on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


@contextlib.contextmanager
def init_distributed(device_name: str = "auto"):
    """Yields a Dist when launched by torchrun with WORLD_SIZE > 1, else None (a plain run never
    touches torch.distributed). CUDA: cuda:LOCAL_RANK and NCCL; CPU: gloo. An already initialised
    process group (a caller that set one up itself) is used and left alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not (dist.is_available() and dist.is_initialized()):
        yield None
        return
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    want_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    if want_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if want_cuda else "gloo", timeout=TIMEOUT)
    d = Dist(dist.get_rank(), dist.get_world_size(), local_rank,
             int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())), device)
    try:
        yield d
    finally:
        if owns:
            dist.destroy_process_group()


def local_step(tbs: list[TaskBatch], rank: int, world_size: int) -> tuple[list[TaskBatch], list[float]]:
    """This rank's part of one step: per task group, its slice and weight n_local / n_global.
    An empty slice becomes the group's first example with weight 0 (see the module docstring)."""
    out, weights = [], []
    for tb in tbs:
        if not tb.indices:
            continue
        mine = shard(tb, rank, world_size)
        if mine.indices:
            out.append(mine)
            weights.append(len(mine.indices) / len(tb.indices))
        else:
            out.append(TaskBatch(tb.task, tb.indices[:1]))
            weights.append(0.0)
    return out, weights


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """The seed of a rank's own random streams (dropout, SMART noise): a function of (seed, rank, step)."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


class StepReduce:
    """One step's all-reduce: the gradients of the parameters that have one, plus the step's loss
    parts (each rank's weighted by its share, so their sum is the global batch's mean) and a count
    of non-finite losses, summed over the ranks in one collective. Call it with no argument after
    the backward passes, or hand it to PCGrad.backward as `reduce` (it then also sums PCGrad's
    (T, P) per-task rows of the shared parameters, whose .grad PCGrad has emptied)."""

    def __init__(self, d: Dist, params: list[torch.nn.Parameter], parts: dict[str, dict[str, float]],
                 weights: list[float], nonfinite: int):
        self.d, self.params, self.parts, self.weights = d, params, parts, weights
        self.nonfinite_local = nonfinite
        self.nonfinite = 0  # over all ranks, after the call

    def __call__(self, rows: torch.Tensor | None = None) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        like = grads[0] if grads else rows
        weight = dict(zip(self.parts, self.weights))  # parts are in the order of the step's batches
        keys = [(t, k) for t in self.parts for k in self.parts[t]]
        scalars = [float(self.nonfinite_local)] + [self.parts[t][k] * weight[t] for t, k in keys]
        scalars = torch.tensor(scalars, dtype=torch.float32, device=like.device)
        self.d.all_reduce_sum_(([rows] if rows is not None else []) + grads + [scalars])
        self.nonfinite = int(scalars[0].item())
        for (t, k), v in zip(keys, scalars[1:].tolist()):
            self.parts[t][k] = v
