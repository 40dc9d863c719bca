"""The numbers a study reports, from its results.jsonl records: quality relative to full fine-tuning per
depth (paired by seed), the deepest depth keeping 90% of full quality, cost per depth, the size grid's
gaps, and a table's rows with paired tests. Plain functions of records, so each is checked by hand.

Relative quality is Lee et al.'s: a frozen run's dev metric divided by the full fine-tuning run's of
the same seed (and size); its mean and sample standard deviation are over the seeds' ratios.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from training.experiments.study.protocol import lr_name
from training.experiments.study.recipe import COST_ARM, Recipe
from training.experiments.sweep.records import RunKey
from training.results.statistics import paired_tests
from training.results.summary import metric_names, summarize

NINETY = 0.9


def depth_order(d) -> tuple:
    """Full fine-tuning first, then ever more frozen: none, -1 (embeddings), 0, 1, ..."""
    return (-2,) if d is None else (d,)


def depth_label(d, layers: int | None = None) -> str:
    if d is None:
        return "none (full)"
    if d in (-1, 0):
        return "embeddings"
    return f"{d} (heads only)" if d == layers else str(d)


def trainable_layers(d, layers: int) -> int:
    return layers if d is None else layers - max(d, 0)


def by_key(records: list[dict]) -> dict[RunKey, dict]:
    """The last record of each key (a key run twice, as by two workers racing, counts once)."""
    return {RunKey.of(r): r for r in records}


@dataclass
class Cell:
    """One (depth, metric) of a relative-quality table."""
    depth: int | None
    metric: str
    values: list[float]    # the metric per seed
    relative: list[float]  # metric / the full run's, per seed
    seeds: list[int]

    @property
    def mean(self) -> float:
        return summarize(self.values)["mean"]

    @property
    def std(self) -> float:
        return summarize(self.values)["std"]

    @property
    def rel_mean(self) -> float:
        return summarize(self.relative)["mean"] if self.relative else math.nan

    @property
    def rel_std(self) -> float:
        return summarize(self.relative)["std"] if self.relative else math.nan


def arm_for(recipe: Recipe, records: list[dict], protocol: str):
    """(depth, size, seed) -> the arm whose run stands for that point: "" under Elsa's protocol (every
    depth at the full model's rate), each depth's best rate under "tuned"."""
    if protocol == "elsa" or not recipe.lr_grid:
        return lambda d, n, s: ""
    best, base_lr = recipe.best_lrs(records), recipe.base_lr

    def arm(d, n, s):
        lr = best.get((d, n))
        return "" if d is None or lr is None or lr == base_lr else lr_name(lr)
    return arm


def relative_cells(recipe: Recipe, records: list[dict], size, protocol: str = "elsa") -> list[Cell]:
    """One Cell per (depth, metric) at one size: seeds that have both the run and the full run."""
    runs, tasks = by_key(records), "+".join(recipe.tasks)
    arm = arm_for(recipe, records, protocol)
    cells = []
    for d in sorted(recipe.resolved_depths(), key=depth_order):
        for metric in metric_names(tasks):
            values, relative, seeds = [], [], []
            for s in recipe.seeds:
                r = runs.get(RunKey(tasks, d, size, s, arm(d, size, s)))
                full = runs.get(RunKey(tasks, None, size, s, ""))
                if r is None:
                    continue
                values.append(r["dev"][metric])
                seeds.append(s)
                if full is not None and full["dev"][metric]:
                    relative.append(r["dev"][metric] / full["dev"][metric])
            if values:
                cells.append(Cell(d, metric, values, relative, seeds))
    return cells


def ninety_depth(cells: list[Cell], metric: str, threshold: float = NINETY):
    """The deepest depth (most layers frozen) whose mean relative quality on `metric` is at least the
    threshold; None (full fine-tuning) when no frozen depth reaches it. Depths are taken as they
    come, not assuming quality falls with depth: a deeper depth that recovers counts."""
    ok = [c.depth for c in cells if c.metric == metric and c.depth is not None and c.relative
          and c.rel_mean >= threshold]
    return max(ok, key=depth_order) if ok else None


# --------------------------------------------------------------------------- cost


def cost_rows(recipe: Recipe, records: list[dict], size) -> list[dict]:
    """Per depth (the base arm over its seeds): trainable parameters, training seconds per epoch with
    the cache (and, from the cost arm, without it; the median over seeds, which one run slowed by other
    work on the machine moves least), what building the cache took, peak memory (mean)."""
    runs, tasks, rows = by_key(records), "+".join(recipe.tasks), []
    for d in sorted(recipe.resolved_depths(), key=depth_order):
        mine = [runs[k] for k in (RunKey(tasks, d, size, s, "") for s in recipe.seeds) if k in runs]
        if not mine:
            continue
        nocache = [runs[k] for k in (RunKey(tasks, d, size, s, COST_ARM) for s in recipe.seeds) if k in runs]
        built = [r["frozen_cache_seconds"] for r in mine if r.get("frozen_cache_seconds")]
        rows.append({"depth": d, "seeds": len(mine), "trainable_params": mine[0]["trainable_params"],
                     "total_params": mine[0]["total_params"],
                     "epoch_seconds": _median(per_epoch(r) for r in mine),
                     "epoch_seconds_nocache": _median(per_epoch(r) for r in nocache) if nocache else math.nan,
                     "cache_seconds": max(built) if built else math.nan,
                     "peak_rss_mib": _mean(r.get("peak_rss_mib") for r in mine),
                     "added_rss_mib": _mean(_added(r) for r in mine),
                     "cuda_peak_mib": _mean(r.get("cuda_peak_mib") for r in mine)})
    return rows


def per_epoch(r: dict) -> float:
    """Training seconds per epoch: the epochs' own times where recorded, else the total over epochs."""
    times = r.get("epoch_seconds") or []
    return sum(times) / len(times) if times else r["train_seconds"] / r["epochs"]


def _added(r: dict):
    if r.get("peak_rss_mib") is None or r.get("base_rss_mib") is None:
        return None
    return r["peak_rss_mib"] - r["base_rss_mib"]


def _median(values) -> float:
    xs = [float(v) for v in values if v is not None]
    return summarize(xs)["median"] if xs else math.nan


def _mean(values) -> float:
    xs = [float(v) for v in values if v is not None]
    return math.fsum(xs) / len(xs) if xs else math.nan


# --------------------------------------------------------------------------- size grid and tables


def size_rows(recipe: Recipe, records: list[dict]) -> list[dict]:
    """Per (size, depth, metric): mean and std over seeds, and the paired gap to full fine-tuning at the
    same size (frozen - full: negative is a loss), mean and std over the seeds."""
    runs, tasks, rows = by_key(records), "+".join(recipe.tasks), []
    for n in recipe.sizes:
        for d in sorted(recipe.resolved_depths(), key=depth_order):
            for metric in metric_names(tasks):
                got = {s: runs[k]["dev"][metric] for s in recipe.seeds
                       for k in [RunKey(tasks, d, n, s, "")] if k in runs}
                full = {s: runs[k]["dev"][metric] for s in recipe.seeds
                        for k in [RunKey(tasks, None, n, s, "")] if k in runs}
                if not got:
                    continue
                gaps = [got[s] - full[s] for s in got if s in full]
                stats = summarize(got.values())
                rows.append({"size": n, "depth": d, "metric": metric, "seeds": len(got), "mean": stats["mean"],
                             "std": stats["std"], "gap": summarize(gaps)["mean"] if gaps else math.nan,
                             "gap_std": summarize(gaps)["std"] if gaps else math.nan})
    return rows


def table_rows(recipe: Recipe, records: list[dict]) -> list[dict]:
    """A table recipe's rows: each metric's per-seed values, mean and std, beside the published figure."""
    runs, tasks, out = by_key(records), "+".join(recipe.tasks), []
    n = recipe.sizes[0]
    for row in recipe.rows:
        d = recipe.depth(row["depth"])
        found = {s: runs[k] for s in recipe.seeds for k in [RunKey(tasks, d, n, s, row["arm"])] if k in runs}
        values = {m: {s: r["dev"][m] for s, r in found.items()} for m in metric_names(tasks)}
        out.append({"label": row["label"], "depth": d, "arm": row["arm"], "values": values,
                    "published": row.get("published", {}),
                    "train_seconds": [r["train_seconds"] for r in found.values() if r.get("train_seconds")]})
    return out


def comparisons(recipe: Recipe, rows: list[dict]) -> list[dict]:
    """For each pair the recipe compares, per metric: B - A paired by seed, with paired t and Wilcoxon p."""
    by_label, out = {r["label"]: r for r in rows}, []
    for a_label, b_label in recipe.compare:
        a, b = by_label[a_label], by_label[b_label]
        for metric, va in a["values"].items():
            seeds = [s for s in va if s in b["values"][metric]]
            if not seeds:
                continue
            tests = paired_tests([va[s] for s in seeds], [b["values"][metric][s] for s in seeds])
            out.append({"a": a_label, "b": b_label, "metric": metric, **tests})
    return out
