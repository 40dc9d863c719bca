"""Each run's training data: stratified nested subsets of a training file, and the tuning split held out of it.

For each task and seed, the subsets of all sizes are nested (the 1000 examples contain the 100) and
stratified: each label class gets its share of the full training set, rounded by largest remainder
(STS-B's continuous scores are stratified on int(score) clipped to 0..4).
"""
from __future__ import annotations

import csv
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, Sequence

from data.loaders import LABEL_COLUMN, TEXT_COLUMNS, Example, load_task_file
from training.config.train_config import TrainConfig

log = logging.getLogger(__name__)

TUNE = "tune"  # training_subsets' key of a task's tuning split: (task, TUNE)


@dataclass(frozen=True)
class Grid:
    """What a sweep trains, besides the depths and arms of its keys: the tasks trained together in every
    run, the training-set sizes (examples per task, or "all"), the seeds (each draws the subsets and seeds
    the run), and a study's tuning split ({"share", "seed"}) held out of each training file."""
    tasks: Sequence[str]
    sizes: Sequence[int | str]
    seeds: Sequence[int]
    tuning_split: dict | None = None


def largest_remainder(class_sizes: dict[Hashable, int], n: int) -> dict[Hashable, int]:
    """Split n among the classes in proportion to their sizes: each class gets the floor of its exact
    share n * size / total, and the seats left over go to the largest fractional parts (ties: the
    larger class, then the class first in sorted order)."""
    total = sum(class_sizes.values())
    if not 0 <= n <= total:
        raise ValueError(f"cannot take {n} of {total} examples")
    order = sorted(class_sizes, key=_sort_key)
    counts = {k: n * class_sizes[k] // total for k in order}
    rest = n - sum(counts.values())
    # exact integer arithmetic: remainder of class k is (n * size_k) mod total
    by_remainder = sorted(order, key=lambda k: (-(n * class_sizes[k] % total), -class_sizes[k]))
    for k in by_remainder[:rest]:
        counts[k] += 1
    return counts


def _sort_key(x):
    return (str(type(x)), x)


def nested_counts(class_sizes: dict[Hashable, int], sizes: Sequence[int]) -> dict[int, dict[Hashable, int]]:
    """Per-class counts for each size, by largest remainder, made monotone in the size so that the
    subsets can nest (largest remainder alone can give a class fewer seats at a larger size: the
    Alabama paradox). Where it would, the class keeps its smaller-size count and the surplus is
    taken back from the classes furthest above their exact share (ties: the reverse of
    largest_remainder's order)."""
    total = sum(class_sizes.values())
    rank = {k: i for i, k in enumerate(sorted(class_sizes, key=_sort_key))}
    out: dict[int, dict[Hashable, int]] = {}
    prev = {k: 0 for k in class_sizes}
    for n in sorted(set(sizes)):
        counts = {k: max(c, prev[k]) for k, c in largest_remainder(class_sizes, n).items()}
        while sum(counts.values()) > n:
            over = [k for k in counts if counts[k] > prev[k]]
            k = max(over, key=lambda k: (counts[k] * total - n * class_sizes[k], -class_sizes[k], rank[k]))
            counts[k] -= 1
        out[n] = counts
        prev = counts
    return out


def stratified_nested_subsets(labels: Sequence[Hashable], sizes: Sequence[int], seed: int) -> dict[int, list[int]]:
    """{size: sorted indices into labels} with label proportions as close to the full set's as
    integer counts allow (largest remainder, see nested_counts), each subset containing every smaller
    one, and the same for the same seed. One seeded permutation is drawn per label class (classes in
    sorted order) and each size takes a prefix of it. Labels must be discrete: bin continuous ones
    first (strata())."""
    import numpy as np

    labels = list(labels)
    for n in sizes:
        if not 0 <= n <= len(labels):
            raise ValueError(f"subset size {n} is not between 0 and the {len(labels)} examples available")
    members: dict[Hashable, list[int]] = {}
    for i, y in enumerate(labels):
        members.setdefault(y, []).append(i)
    rng = np.random.default_rng(seed)
    order = {k: [members[k][j] for j in rng.permutation(len(members[k]))] for k in sorted(members, key=_sort_key)}
    class_sizes = {k: len(v) for k, v in members.items()}
    counts = nested_counts(class_sizes, sizes)
    moved = [n for n in counts if counts[n] != largest_remainder(class_sizes, n)]
    if moved:  # a run key (size, seed) then names other examples beside other sizes: say so
        log.warning("subset size(s) %s: counts moved from largest remainder so that the subsets nest; the "
                    "examples of such a size depend on the other sizes drawn with it (%s): recipes sharing "
                    "a results file must list the same sizes", ", ".join(map(str, moved)),
                    ", ".join(map(str, sorted(set(sizes)))))
    return {n: sorted(i for k, c in counts[n].items() for i in order[k][:c]) for n in sizes}


def tuning_split(labels: Sequence[Hashable], share: float, seed: int) -> tuple[list[int], list[int]]:
    """(tuning indices, the rest), both sorted: a stratified share of the examples, fixed by its own seed
    (not a run's), held out of training to choose each run's epoch and each arm's learning rate, so that
    the dev sets only report. The share is rounded to whole examples, at least one."""
    n = tuning_count(len(labels), share)
    tune = stratified_nested_subsets(labels, [n], seed)[n]
    held = set(tune)
    return tune, [i for i in range(len(labels)) if i not in held]


def tuning_count(n: int, share: float) -> int:
    """How many of n examples the tuning split takes: the share, rounded, at least one and not all."""
    return min(max(round(share * n), 1), n - 1)


def strata(task: str, labels: Sequence) -> list[int]:
    """Discrete strata for a task's labels: the class for sst/para, int(score) clipped to 0..4 for sts."""
    if task == "sts":
        return [min(max(int(y), 0), 4) for y in labels]
    return [int(y) for y in labels]


def write_course_file(path: str | os.PathLike, task: str, examples: Sequence[Example]) -> None:
    """Examples as a course-format file: tab-separated, csv-quoted, a leading index column."""
    columns = ["", "id", *TEXT_COLUMNS[task], LABEL_COLUMN[task]]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(columns)
        for i, e in enumerate(examples):
            texts = [e.text_a] if task == "sst" else [e.text_a, e.text_b]
            w.writerow([i, e.id, *texts, repr(float(e.label)) if task == "sts" else int(e.label)])
    os.replace(tmp, path)


def training_subsets(grid: Grid, base: TrainConfig, flag: str = "--sizes") -> dict | str:
    """Every training subset, (task, seed) -> size -> examples, made before any training (a bad size fails
    now, not an hour in); or the error, naming `flag`. With grid.tuning_split ({"share", "seed"};
    training.experiments.study's), a stratified tuning split is first taken out of each training file,
    kept as (task, TUNE) -> examples, and the subsets are drawn from the rest ("all": the whole rest)."""
    subsets: dict[tuple[str, int | str], dict[int | str, list[Example]] | list[Example]] = {}
    split = grid.tuning_split
    for task in grid.tasks:
        full = load_task_file(base.file(task, "train"), task, labelled=True).examples
        if split:
            tune, rest = tuning_split(strata(task, [e.label for e in full]), split["share"], split["seed"])
            subsets[task, TUNE] = [full[i] for i in tune]
            full = [full[i] for i in rest]
        wanted = [len(full) if n == "all" else n for n in grid.sizes]
        too_big = [n for n in wanted if n > len(full)]
        if too_big:
            return (f"{flag} {too_big[0]}: {task} has only {len(full)} training examples in "
                    f"{base.file(task, 'train')}")
        labels = strata(task, [e.label for e in full])
        for seed in grid.seeds:
            idx = stratified_nested_subsets(labels, wanted, seed)
            subsets[task, seed] = {n: [full[i] for i in idx[w]] for n, w in zip(grid.sizes, wanted)}
    return subsets
