"""A sweep's records summarised per (tasks, depth, size): mean, spread and the majority-class baseline; and a
finished run's directory read back for a comparison.
"""
from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path

from data.loaders import COURSE_FILES, load_task_file
from training.inference.metrics import METRIC
from training.run.metrics_file import kept_evaluation, read_metrics, training_seconds

log = logging.getLogger(__name__)


class RunDirError(ValueError):
    """A folder that is not a finished run directory: the message is one line."""


def summarize(values) -> dict:
    """n, mean, median, std (sample, ddof=1; nan for one value), min, max; each nan where a value is (a run's
    score nan: sorted() would leave it anywhere, and min and max would be wrong)."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        raise ValueError("no values to summarise")
    if any(math.isnan(x) for x in xs):
        return {"seeds": n, **dict.fromkeys(("mean", "median", "std", "min", "max"), math.nan)}
    mean = math.fsum(xs) / n
    median = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else math.nan
    return {"seeds": n, "mean": mean, "median": median, "std": std, "min": xs[0], "max": xs[-1]}


def _mean(values) -> float:
    xs = [float(v) for v in values if v is not None]
    return math.fsum(xs) / len(xs) if xs else math.nan


def depth_order(d) -> tuple:
    return (-2,) if d is None else (d,)


def size_order(n) -> tuple:
    return (1, 0) if n == "all" else (0, n)


def metric_names(tasks: str) -> list[str]:
    names = [METRIC[t] for t in tasks.split("+")]
    return names + ["overall"] if len(names) > 1 else names


def summary_rows(records: list[dict], baselines: dict[str, float] | None = None) -> list[dict]:
    """One row per (task set, depth, size, metric), in sweep order."""
    baselines = baselines or {}
    groups: dict[tuple, list[dict]] = {}
    for r in records:  # an arm: a freezing schedule (the sweep's --schedules) or the study's named overrides
        groups.setdefault((r["tasks"], r["depth"], r["size"], r.get("arm", "")), []).append(r)
    rows = []
    for tasks, depth, size, arm in sorted(groups, key=lambda k: (k[0], size_order(k[2]), depth_order(k[1]), k[3])):
        group = groups[tasks, depth, size, arm]
        seeds = {r["seed"] for r in group}
        if len(seeds) < len(group):
            log.warning("%s depth %s size %s: %d records for %d seeds; each seed counted once (the last)",
                        tasks, depth, size, len(group), len(seeds))
            group = list({r["seed"]: r for r in group}.values())
        for metric in metric_names(tasks):
            values = [r["dev"][metric] for r in group if metric in r.get("dev", {})]
            if not values:
                continue
            rows.append({"tasks": tasks, "depth": depth, "arm": arm, "size": size, "metric": metric,
                         **summarize(values),
                         "baseline": baselines.get(metric, math.nan),
                         "wall_seconds": _mean(r.get("wall_seconds") for r in group),
                         "train_seconds": _mean(r.get("train_seconds") for r in group),
                         "peak_rss_mib": _mean(r.get("peak_rss_mib") for r in group),
                         "trainable_params": _mean(r.get("trainable_params") for r in group)})
    return rows


def majority_baselines(records: list[dict], data_dir: str | None = None) -> dict[str, float]:
    """{metric: score of the dev set's majority label} for the tasks in the records; sts_pearson: 0."""
    out = {}
    tasks = sorted({t for r in records for t in r["tasks"].split("+")})
    for task in tasks:
        if task == "sts":
            out["sts_pearson"] = 0.0
            continue
        d = data_dir or next((r.get("settings", {}).get("data_dir") for r in records if r.get("settings")), None)
        path = Path(d or "data") / COURSE_FILES[task]["dev"]
        if not path.is_file():
            log.warning("%s: not found; no %s baseline (pass --data-dir)", path, task)
            continue
        labels = [e.label for e in load_task_file(path, task, labelled=True).examples]
        out[METRIC[task]] = Counter(labels).most_common(1)[0][1] / len(labels)
    return out


def read_run(run_dir: Path) -> dict:
    """A run directory's config, records, kept evaluation (the first with the best dev_overall: the trainer
    keeps an evaluation only when it beats the best so far) and training seconds."""
    run_dir = Path(run_dir)
    for name in ("config.json", "metrics.jsonl"):
        if not (run_dir / name).is_file():
            raise RunDirError(f"{run_dir / name}: no such file (is {run_dir} a run directory?)")
    config = json.loads((run_dir / "config.json").read_text())
    records = read_metrics(run_dir / "metrics.jsonl")
    kept = kept_evaluation(records)
    if kept is None:
        raise RunDirError(f"{run_dir / 'metrics.jsonl'}: no dev evaluation recorded yet")
    return {"dir": run_dir, "config": config, "records": records, "kept": kept,
            "train_seconds": training_seconds(records)}
