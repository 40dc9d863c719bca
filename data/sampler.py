"""Which examples go into which training step, for multi-task training.

The sampler deals only in indices into each task's example list (and, optionally, their token
lengths); it never sees text or tensors. Everything is a pure function of (seed, epoch): no
global RNG state, no iterator state carried between epochs, so a resumed run gets exactly the
schedule it would have had.

The building block is one infinite *batch stream* per task: pass p is a permutation of the
task's examples (seeded by (seed, p, task), not by epoch) cut into batches, the last one
possibly smaller, and the passes follow each other. An epoch that takes b batches of a task
takes batches e*b .. e*b+b-1 of that stream, so
  - uncapped (b = batches per pass): epoch e is exactly pass e, every example once;
  - capped (b = max_batches_per_task): successive epochs continue where the last one stopped,
    rotating through the large task instead of re-drawing its first c batches every epoch;
  - the sampled modes ("proportional", "annealed", "round-robin") draw a varying number of
    batches per task and epoch; each epoch reads on from where that task's earlier epochs
    stopped (recomputed from (seed, epoch) like everything else), so no batch is skipped or
    replayed and a task drawn more often than a pass's worth runs on into a fresh permutation.

Mixed steps (mixed_schedule, for PCGrad) hold several tasks' groups; given lengths, their task
mix is stratified and each group length-bucketed (docs/sampling.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from minbert.tokenizer import padded_length

SAMPLING_MODES = ("mtdnn", "proportional", "round-robin", "annealed")

# 50 batches per bucket: on the course training files at batch size 32 (whitespace tokens +
# specials) this gives padding efficiency ~0.98 on SST and ~0.96 on STS, against ~0.50 and
# ~0.45 for random batches; 20 already clears 0.9 (~0.94 / ~0.93) but leaves little margin for
# subword tokenisation's longer tail. Bigger chunks buy little more padding and make each batch
# a narrower length band, so 50 is the knee.
DEFAULT_BUCKET_BATCHES = 50

# Purpose tags for the seed keys. Every key has the same length (4) because SeedSequence
# zero-pads short keys, so [s, e, t] and [s, e, t, 0] would give the same stream.
_PASS, _POOL, _CHOICE, _MIXED_PASS, _MIXED_POOL, _BUCKET_ORDER, _MIXED_STEPS, _MIXED_BUCKET = range(1, 9)


@dataclass(frozen=True)
class TaskBatch:
    task: str
    indices: tuple[int, ...]  # into that task's example list


def _rng(seed: int, a: int, tag: int, b: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, a, tag, b])


def annealing_alpha(epoch: int, num_epochs: int) -> float:
    """Stickland & Murray's exponent: 1 (proportional) at the first epoch, 0.2 at the last."""
    if num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
    if not 0 <= epoch < num_epochs:
        raise ValueError(f"epoch must be in [0, num_epochs={num_epochs}), got {epoch}")
    return 1.0 if num_epochs == 1 else 1.0 - 0.8 * epoch / (num_epochs - 1)


def _check_common(sizes: dict[str, int], batch_size: int, epoch: int, seed: int) -> None:
    if not sizes:
        raise ValueError("sizes is empty: need at least one task")
    for task, n in sizes.items():
        if int(n) < 1:
            raise ValueError(f"task {task!r} has {n} examples; every task needs at least one")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if epoch < 0 or seed < 0:  # SeedSequence only takes non-negative entropy
        raise ValueError(f"epoch and seed must be >= 0, got epoch={epoch}, seed={seed}")


def _check_lengths(sizes: dict[str, int], lengths: dict[str, Sequence[int]] | None) -> None:
    if lengths is None:
        return
    for task, n in sizes.items():
        if task not in lengths:
            raise ValueError(f"lengths has no entry for task {task!r}")
        if len(lengths[task]) != n:
            raise ValueError(f"lengths[{task!r}] has {len(lengths[task])} entries but sizes says {n}")


def _pass_batches(n: int, batch_size: int, seed: int, task_id: int, p: int,
                  lengths: Sequence[int] | None, bucket_batches: int) -> list[tuple[int, ...]]:
    """Pass p of a task's batch stream: a fresh permutation cut into batches."""
    perm = _rng(seed, p, _PASS, task_id).permutation(n)
    if lengths is None:
        return [tuple(perm[i:i + batch_size].tolist()) for i in range(0, n, batch_size)]
    lens = np.asarray(lengths)
    chunk = bucket_batches * batch_size
    batches: list[tuple[int, ...]] = []
    for c in range(0, n, chunk):
        part = perm[c:c + chunk]
        # Stable sort: equal lengths keep their random order, so ties do not group by index.
        part = part[np.argsort(lens[part], kind="stable")]
        batches += [tuple(part[i:i + batch_size].tolist()) for i in range(0, len(part), batch_size)]
    # Sorted chunks make neighbouring batches similar in length; shuffle so that a capped epoch
    # (a run of consecutive batches) or a stream reader does not see lengths in order.
    order = _rng(seed, p, _BUCKET_ORDER, task_id).permutation(len(batches))
    return [batches[i] for i in order]


def _stream(n: int, batch_size: int, seed: int, task_id: int, start: int, count: int,
            lengths: Sequence[int] | None, bucket_batches: int) -> list[tuple[int, ...]]:
    """Batches start .. start+count-1 of a task's infinite batch stream."""
    per_pass = math.ceil(n / batch_size)
    out: list[tuple[int, ...]] = []
    pos = start
    while len(out) < count:
        p, off = divmod(pos, per_pass)
        batches = _pass_batches(n, batch_size, seed, task_id, p, lengths, bucket_batches)
        take = batches[off:off + count - len(out)]
        out += take
        pos += len(take)
    return out


def epoch_schedule(sizes: dict[str, int], batch_size: int, *, epoch: int, seed: int,
                   sampling: str = "mtdnn",
                   num_epochs: int = 1,
                   max_batches_per_task: int | None = None,
                   lengths: dict[str, Sequence[int]] | None = None,
                   bucket_batches: int = DEFAULT_BUCKET_BATCHES) -> list[TaskBatch]:
    """One epoch of single-task steps: each step trains on one task's batch.

    "mtdnn": every task's batches for the epoch, pooled and shuffled (each example exactly once
    when uncapped). The other modes take the same number of steps but choose the task per step:
    "proportional" with probability ~ size, "annealed" ~ size**alpha (see annealing_alpha),
    "round-robin" cycling through `sizes` in order. With a cap, a task's size counts only the
    examples the cap lets in (min(n, cap * batch_size)), so the cap shifts the mix the same way
    in every mode. With `lengths`, batches are built by length bucketing (see _pass_batches).
    """
    _check_common(sizes, batch_size, epoch, seed)
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"unknown sampling mode {sampling!r}; valid modes: {', '.join(SAMPLING_MODES)}")
    if max_batches_per_task is not None and max_batches_per_task < 1:
        raise ValueError(f"max_batches_per_task must be >= 1 or None, got {max_batches_per_task}")
    if bucket_batches < 1:
        raise ValueError(f"bucket_batches must be >= 1, got {bucket_batches}")
    _check_lengths(sizes, lengths)
    if sampling == "annealed":
        annealing_alpha(epoch, num_epochs)  # checks epoch < num_epochs

    tasks = list(sizes)
    per_pass = [math.ceil(sizes[t] / batch_size) for t in tasks]
    per_epoch = [b if max_batches_per_task is None else min(b, max_batches_per_task) for b in per_pass]

    def read(i: int, start: int, count: int) -> list[tuple[int, ...]]:
        t = tasks[i]
        return _stream(sizes[t], batch_size, seed, i, start, count,
                       None if lengths is None else lengths[t], bucket_batches)

    if sampling == "mtdnn":
        pool = [TaskBatch(tasks[i], b) for i in range(len(tasks)) for b in read(i, epoch * per_epoch[i], per_epoch[i])]
        order = _rng(seed, epoch, _POOL).permutation(len(pool))
        return [pool[j] for j in order]

    def choices(e: int) -> np.ndarray:  # the task index of each step of epoch e
        steps = sum(per_epoch)
        if sampling == "round-robin":
            return np.arange(steps) % len(tasks)
        eff = np.array([sizes[t] if max_batches_per_task is None
                        else min(sizes[t], max_batches_per_task * batch_size) for t in tasks], float)
        probs = eff ** (annealing_alpha(e, num_epochs) if sampling == "annealed" else 1.0)
        return _rng(seed, e, _CHOICE).choice(len(tasks), size=steps, p=probs / probs.sum())

    def counts(e: int) -> np.ndarray:
        return np.bincount(choices(e), minlength=len(tasks))

    start = sum((counts(e) for e in range(epoch)), np.zeros(len(tasks), int))
    choice = choices(epoch)
    streams = [iter(read(i, int(start[i]), int((choice == i).sum()))) for i in range(len(tasks))]
    return [TaskBatch(tasks[i], next(streams[i])) for i in choice.tolist()]

def padding_efficiency(schedule: list[TaskBatch], lengths: dict[str, Sequence[int]], multiple: int = 1,
                       cap: int | None = None) -> float:
    """Real tokens / tokens computed when each batch is padded to its longest member (rounded up to a
    multiple of `multiple` tokens, at most `cap`: --pad-multiple). lengths[task]: (n,) tokens per example, or
    (sides, n) for sequences padded side by side (a siamese pair's two: TaskData.side_lengths)."""
    real = computed = 0
    for b in schedule:
        if not b.indices:
            continue
        for side in np.atleast_2d(np.asarray(lengths[b.task])):
            lens = [int(side[i]) for i in b.indices]
            real += sum(lens)
            computed += padded_length(max(lens), multiple, cap) * len(lens)
    if computed == 0:
        raise ValueError("schedule has no tokens: padding efficiency is undefined")
    return real / computed


def mixed_schedule(sizes: dict[str, int], batch_size: int, *, epoch: int, seed: int,
                   max_examples_per_task: int | None = None,
                   lengths: dict[str, Sequence[int]] | None = None,
                   bucket_batches: int = DEFAULT_BUCKET_BATCHES) -> list[list[TaskBatch]]:
    """PCGrad-style steps: batches drawn from all tasks' examples pooled together.

    Each step is one TaskBatch per task present in it, in the order of `sizes`, so the caller
    can compute one loss (and one gradient) per task. Uncapped, every example appears exactly
    once per epoch; with a cap, each task contributes its next max_examples_per_task examples
    of a per-pass permutation, rotating across epochs like epoch_schedule's cap, never one twice in an
    epoch (_mixed_passes).

    Without `lengths`: the pooled examples in a random order, cut into steps of batch_size (each
    step's task mix multinomial). With `lengths`: stratified and length-bucketed steps (see
    _bucketed_steps): every step holds each task's share of the pool (a task with at least as many
    examples as the epoch has steps is in every step), and each task's group is length-homogeneous.
    """
    _check_common(sizes, batch_size, epoch, seed)
    if max_examples_per_task is not None and max_examples_per_task < 1:
        raise ValueError(f"max_examples_per_task must be >= 1 or None, got {max_examples_per_task}")
    if bucket_batches < 1:
        raise ValueError(f"bucket_batches must be >= 1, got {bucket_batches}")
    _check_lengths(sizes, lengths)
    tasks = list(sizes)
    example_ids = [_mixed_epoch_examples(sizes[t], i, epoch, seed, max_examples_per_task)
                   for i, t in enumerate(tasks)]
    if lengths is not None:
        groups = _bucketed_steps(example_ids, [np.asarray(lengths[t]) for t in tasks], batch_size, epoch, seed,
                                 bucket_batches)
        return [[TaskBatch(t, tuple(g[i].tolist())) for i, t in enumerate(tasks) if len(g[i])] for g in groups]
    task_ids = [np.full(len(x), i) for i, x in enumerate(example_ids)]
    order = _rng(seed, epoch, _MIXED_POOL).permutation(sum(len(x) for x in example_ids))
    tid, eid = np.concatenate(task_ids)[order], np.concatenate(example_ids)[order]
    steps: list[list[TaskBatch]] = []
    for s in range(0, len(order), batch_size):
        bt, be = tid[s:s + batch_size], eid[s:s + batch_size]
        steps.append([TaskBatch(t, tuple(be[bt == i].tolist())) for i, t in enumerate(tasks) if (bt == i).any()])
    return steps


def _mixed_epoch_examples(n: int, task_id: int, epoch: int, seed: int, cap: int | None) -> np.ndarray:
    """A task's examples for the epoch, in random order: all n, or its next `cap` of the passes' stream."""
    k = n if cap is None else min(n, cap)
    start = epoch * k
    first, last = start // n, (start + k - 1) // n  # an epoch spans at most two passes
    stream = np.concatenate(_mixed_passes(n, task_id, seed, k, first, last))
    return stream[start - first * n:start - first * n + k]


def _mixed_passes(n: int, task_id: int, seed: int, k: int, first: int, last: int) -> list[np.ndarray]:
    """Passes first..last of a task's stream, epochs of k cut from it: each pass a fresh permutation of the n
    examples, except that where an epoch reaches over from the pass before, the pass begins with the
    examples that epoch still needs drawn among those the earlier pass's tail did not hold (so that no epoch,
    and no step, holds an example twice). Where k divides n (and uncapped) no epoch reaches over. A pass
    that begins with an epoch (every k / gcd(n, k)-th) depends on none before it: the walk starts at the last
    such pass, so an uncapped epoch draws one permutation, as it did before passes could depend."""
    passes, order = [], None
    period = k // math.gcd(n, k)  # passes p with p * n a multiple of k: no epoch reaches into them
    for p in range(first - first % period, last + 1):
        perm = _rng(seed, p, _MIXED_PASS, task_id).permutation(n)
        tail = p * n - (p * n // k) * k  # examples of pass p - 1 in the epoch that reaches into pass p
        if tail:
            in_tail = np.zeros(n, dtype=bool)
            in_tail[order[n - tail:]] = True
            head = perm[~in_tail[perm]][:k - tail]
            taken = np.zeros(n, dtype=bool)
            taken[head] = True
            perm = np.concatenate([head, perm[~taken[perm]]])
        order = perm
        if p >= first:
            passes.append(order)
    return passes


def _step_counts(k: np.ndarray, steps: int) -> np.ndarray:
    """(tasks, steps): how many of each task's k_t examples each step takes. Every step gets k_t // steps;
    the k_t % steps left over go one per step, all tasks' leftovers laid end to end around the steps,
    so step sizes differ by at most one and none exceeds ceil(sum(k) / steps)."""
    counts = np.repeat((k // steps)[:, None], steps, axis=1)
    start = 0
    for t, r in enumerate(k % steps):
        counts[t, (start + np.arange(r)) % steps] += 1
        start += int(r)
    return counts


def _bucketed_steps(example_ids: list[np.ndarray], lengths: list[np.ndarray], batch_size: int, epoch: int,
                    seed: int, bucket_batches: int) -> list[list[np.ndarray]]:
    """Per step, each task's group of example indices (possibly empty).

    The epoch keeps the unbucketed mode's number of steps, ceil(pooled / batch_size). Each task's
    examples are split evenly over them (_step_counts; which steps take one more is shuffled), so
    a step's task mix is the pool's to within one example. Then, per task: its steps are visited
    in a random order, and the task's examples (already in random order) are cut into chunks of
    bucket_batches steps' worth, each chunk sorted by length and dealt out in that order, as
    epoch_schedule buckets one task's batches. An example's step is uniform over the epoch's
    steps: which run of the sorted chunk it falls in depends on its length, but the step that run
    goes to is drawn at random."""
    k = np.array([len(x) for x in example_ids])
    steps = math.ceil(int(k.sum()) / batch_size)
    counts = _step_counts(k, steps)[:, _rng(seed, epoch, _MIXED_STEPS).permutation(steps)]
    groups = [[np.empty(0, dtype=np.int64)] * len(k) for _ in range(steps)]
    for t, (ids, lens) in enumerate(zip(example_ids, lengths)):
        visit = _rng(seed, epoch, _MIXED_BUCKET, t).permutation(steps)
        visit = visit[counts[t, visit] > 0]
        bounds = np.concatenate([[0], np.cumsum(counts[t, visit])])
        for c in range(0, len(visit), bucket_batches):
            hi = min(c + bucket_batches, len(visit))
            part = ids[bounds[c]:bounds[hi]]
            part = part[np.argsort(lens[part], kind="stable")]  # ties keep their random order
            for j in range(c, hi):
                groups[visit[j]][t] = part[bounds[j] - bounds[c]:bounds[j + 1] - bounds[c]]
    return groups


def shard(batch: TaskBatch, rank: int, world_size: int) -> TaskBatch:
    """This rank's contiguous slice of a step's global batch (numpy.array_split sizes).

    All ranks keep the task, so every rank runs the same head at each step. A batch smaller
    than world_size leaves some ranks an empty slice; the caller decides what to do with it.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    q, r = divmod(len(batch.indices), world_size)
    start = rank * q + min(rank, r)
    return TaskBatch(batch.task, batch.indices[start:start + q + (rank < r)])
