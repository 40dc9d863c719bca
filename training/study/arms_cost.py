"""What each point of an arms study costs end to end, modelled from the cost measured apart.

The study's runs share the machine (two workers, pauses while tests run), so their seconds are not cost
figures; what is theirs is how many epochs each trained and when it reached a score. The cost benchmark
(bench/study_cost.py --json, kept as cost/cost.json beside the results) measured each point's seconds per
epoch and its cache's building on an otherwise idle machine. Together, in units of one epoch of full
fine-tuning (so that the scale of the benchmark's data drops out: an epoch and the cache's building both
grow with the examples):

    a run's cost          = (cache building + epochs it trained x the point's seconds per epoch) / full's
    its cost to a share   = the same, up to its first evaluation at or above that share of full
                            fine-tuning's mean kept tuning-split score (its reporting seeds)

A point the benchmark did not measure takes the figures of a measured point with the same depth and arm
(the rate does not change an epoch's cost); else it has none. Evaluations are left out (the same tuning
split for every point).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from training.study.protocol import Protocol, tune_score

COST = Path("cost") / "cost.json"
SHARES = (0.95, 0.99)


def read_cost(results: Path) -> dict | None:
    """The benchmark's figures kept beside the study's results, or None."""
    path = Path(results) / COST
    return json.loads(path.read_text()) if path.is_file() else None


def point_cost(recipe, cost: dict, label: str) -> dict | None:
    """The benchmark's figures for a point: its own, else a measured point's with the same depth and arm."""
    measured = cost["points"]
    if label in measured:
        return measured[label]
    point = next(p for p in recipe.points if p["label"] == label)
    twins = [p["label"] for p in recipe.points if p["label"] in measured
             and (p["depth"], p["arm"]) == (point["depth"], point["arm"])]
    return measured[twins[0]] if twins else None


def run_cost(record: dict, mine: dict, full: dict, target: float | None = None) -> float | None:
    """A run's end-to-end cost in full fine-tuning epochs; with target, its cost up to the first evaluation
    whose tuning-split overall reaches it (None if none does)."""
    epochs = record["epochs_run"]
    if target is not None:
        reached = [i for i, (_, _, score) in enumerate(record["tune_curve"]) if score >= target]
        if not reached:
            return None
        epochs = reached[0] + 1  # one evaluation after each epoch
    return (mine["cache_s"] + epochs * mine["s_per_epoch"][0]) / full["s_per_epoch"][0]


def cost_rows(recipe, records: list[dict], cost: dict, reference: str) -> list[dict]:
    """Per point with reporting runs: its per-epoch speed-up, epochs trained, end-to-end cost (mean, min,
    max over the reporting seeds) and speed-up against the reference's mean cost, and for each share its
    median cost to reach it over the seeds that did (and how many did)."""
    protocol, full = Protocol(recipe, records), point_cost(recipe, cost, reference)
    reference_runs = list(protocol.reporting(reference).values())
    if full is None or not reference_runs:
        return []
    base = statistics.mean(tune_score(r) for r in reference_runs)
    reference_cost = statistics.mean(run_cost(r, full, full) for r in reference_runs)
    rows = []
    for point in recipe.points:
        runs, mine = list(protocol.reporting(point["label"]).values()), point_cost(recipe, cost, point["label"])
        if not runs or mine is None:
            continue
        costs = [run_cost(r, mine, full) for r in runs]
        row = {"label": point["label"], "epoch_speedup": full["s_per_epoch"][0] / mine["s_per_epoch"][0],
               "epochs": statistics.mean(r["epochs_run"] for r in runs), "cost": statistics.mean(costs),
               "cost_range": (min(costs), max(costs)), "speedup": reference_cost / statistics.mean(costs),
               "seeds": len(runs), "to": {}}
        for share in SHARES:
            got = [c for c in (run_cost(r, mine, full, share * base) for r in runs) if c is not None]
            row["to"][share] = (statistics.median(got) if got else None, len(got))
        rows.append(row)
    return rows


def cost_lines(rows: list[dict], cost: dict, reference: str) -> list[str]:
    shares = " | ".join(f"to {s:.0%} of {reference}" for s in SHARES)
    lines = [f"Modelled from the cost measured apart ({cost['machine']}, {cost['date']}, {cost.get('threads')} "
             f"thread(s); [cost/](cost/)): in epochs of {reference}, the cache's building included; to a share: up "
             f"to the first evaluation at that share of {reference}'s mean kept tuning-split score (median over the "
             "seeds that reached it, and how many did).", "",
             f"| point | per-epoch speed-up | epochs trained (mean) | end-to-end cost [min, max] | end-to-end "
             f"speed-up | {shares} |", "|---|---:|---:|---:|---:|" + "---:|" * len(SHARES)]
    for r in rows:
        reach = " | ".join("not reached" if c is None else f"{c:.2f} ({n}/{r['seeds']})"
                           for c, n in (r["to"][s] for s in SHARES))
        lo, hi = r["cost_range"]
        lines.append(f"| {r['label']} | {r['epoch_speedup']:.2f}x | {r['epochs']:.1f} | {r['cost']:.2f} [{lo:.2f}, "
                     f"{hi:.2f}] | {r['speedup']:.2f}x | {reach} |")
    return lines
