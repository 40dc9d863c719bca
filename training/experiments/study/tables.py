"""A study's report: report.md (its tables, in words a reader can check) and report.csv (every number
behind them, one row per depth/size/metric), written from the results so far."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from training.experiments.study.aggregate import (
    NINETY,
    comparisons,
    cost_rows,
    depth_label,
    ninety_depth,
    relative_cells,
    size_rows,
    table_rows,
    trainable_layers,
)
from training.experiments.study.recipe import Recipe
from training.results.statistics import mean_sd
from training.results.summary import metric_names


def _f(x, digits: int = 4, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _pm(mean, std, digits: int = 4) -> str:
    return _f(mean, digits) + ("" if std is None or math.isnan(std) else f" ± {_f(std, digits)}")


def settings_line(recipe: Recipe, records: list[dict]) -> str:
    s = records[0].get("settings", {}) if records else {}
    threads = sorted({r.get("threads") for r in records if r.get("threads")})
    return (f"Model `{s.get('model', '?')}` ({recipe.layers} layers), tasks {', '.join(recipe.tasks)} trained "
            f"together, {s.get('epochs', '?')} epochs, batch {s.get('batch_size', '?')}, lr {s.get('lr', '?')}, "
            f"pooling {s.get('pooling', '?')}, precision {s.get('precision', '?')}, "
            f"{'torch threads per run: ' + ', '.join(map(str, threads)) if threads else ''}; dev metrics of each "
            f"run's best evaluation on the full dev sets (data: `{s.get('data_dir', '?')}`).")


# --------------------------------------------------------------------------- depth


def depth_markdown(recipe: Recipe, records: list[dict]) -> str:
    size = recipe.sizes[0]
    lines = [f"# {recipe.title}", "", recipe.about, "", settings_line(recipe, records), "",
             f"Training examples per task: {size} (a stratified subset per seed). Relative quality: a run's dev "
             f"metric over the full fine-tuning run's of the same seed; mean ± sample std over seeds.", ""]
    protocols = [("elsa", "Elsa's protocol: every depth at the full model's learning rate")]
    if recipe.lr_grid:
        protocols.append(("tuned", "each depth at its best learning rate of the grid "
                                   f"{[recipe.base_lr] + recipe.lr_grid['lrs']} (tuned on seed(s) "
                                   f"{recipe.lr_grid['tuning_seeds']}, by the mean dev overall)"))
    for protocol, what in protocols:
        cells = relative_cells(recipe, records, size, protocol)
        lrs = _lr_column(recipe, records, size) if protocol == "tuned" else None
        lines += [f"## Quality against frozen depth: {what}", ""] + _relative_table(recipe, cells, lrs) + [""]
        deepest = [f"{m} {_depth_or_none(ninety_depth(cells, m), recipe.layers)}"
                   for m in metric_names("+".join(recipe.tasks))]
        lines += [f"Deepest depth keeping {NINETY:.0%} of full quality (mean relative quality): "
                  + ", ".join(deepest), ""]
    if recipe.lr_grid:
        best = recipe.best_lrs(records)
        lines += ["Best learning rate per depth (tuning seeds): " + ", ".join(
            f"{depth_label(d, recipe.layers)}: {lr:g}" for (d, n), lr in sorted(best.items(), key=lambda kv: kv[0][0])
            if n == size), ""]
    lines += ["## Cost against frozen depth", "",
              "Training seconds per epoch: the training steps alone (no evaluation), the median over seeds of "
              "each run's mean epoch; without the cache: the cost arm (the same depth with `--frozen-cache off`). "
              "Cache: seconds to build the frozen prefix's states once (a run that found them on disk took less). "
              "Peak RSS: the run's process at its peak; added: above the process before training.", "",
              "| depth | trainable layers | trainable params | s/epoch | s/epoch without cache | cache speed-up "
              "| vs full fine-tuning | cache build s | peak RSS MiB | added MiB | CUDA peak MiB |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = cost_rows(recipe, records, size)
    full = next((r["epoch_seconds"] for r in rows if r["depth"] is None), math.nan)
    for r in rows:
        speedup = _ratio(r["epoch_seconds_nocache"], r["epoch_seconds"])
        lines.append(f"| {depth_label(r['depth'], recipe.layers)} | {trainable_layers(r['depth'], recipe.layers)} "
                     f"| {r['trainable_params'] / 1e6:.2f}M | {_f(r['epoch_seconds'], 1)} | "
                     f"{_f(r['epoch_seconds_nocache'], 1)} | {_times(speedup)} "
                     f"| {_times(_ratio(full, r['epoch_seconds']))} "
                     f"| {_f(r['cache_seconds'], 1)} | {_f(r['peak_rss_mib'], 0)} | {_f(r['added_rss_mib'], 0)} "
                     f"| {_f(r['cuda_peak_mib'], 0)} |")
    return "\n".join(lines) + "\n"


def _times(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}x"


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def _depth_or_none(d, layers: int) -> str:
    return "none (no frozen depth reaches it)" if d is None else f"{depth_label(d, layers)}"


def _lr_column(recipe: Recipe, records: list[dict], size) -> dict:
    """depth -> the learning rate its tuned runs use, or --lr while its tuning runs are not all in."""
    base = recipe.base_lr
    best = recipe.best_lrs(records)
    return {d: (f"{best[d, size]:g}" if (d, size) in best else f"{base:g} (tuning pending)") if d is not None
            else f"{base:g}" for d in recipe.resolved_depths()}


def _relative_table(recipe: Recipe, cells, lrs: dict | None = None) -> list[str]:
    metrics = metric_names("+".join(recipe.tasks))
    lr_head, lr_rule = ("lr | ", "---|") if lrs else ("", "")
    lines = [f"| depth | {lr_head}seeds | " + " | ".join(f"{m} | {m} relative" for m in metrics) + " |",
             f"|---|{lr_rule}---:|" + "---:|---:|" * len(metrics)]
    for d in dict.fromkeys(c.depth for c in cells):
        mine = {c.metric: c for c in cells if c.depth == d}
        n = max(len(c.values) for c in mine.values())
        lr = f"{lrs[d]} | " if lrs else ""
        lines.append(f"| {depth_label(d, recipe.layers)} | {lr}{n} | " + " | ".join(
            f"{_pm(mine[m].mean, mine[m].std)} | {_pm(mine[m].rel_mean, mine[m].rel_std, 3)}" if m in mine else "- | -"
            for m in metrics) + " |")
    return lines


# --------------------------------------------------------------------------- size


def size_markdown(recipe: Recipe, records: list[dict]) -> str:
    rows = size_rows(recipe, records)
    metrics = metric_names("+".join(recipe.tasks))
    lines = [f"# {recipe.title}", "", recipe.about, "", settings_line(recipe, records), "",
             "Mean ± sample std over seeds; gap: the frozen run minus the full fine-tuning run of the same seed "
             "and size (negative: freezing lost), mean ± std.", "",
             "| examples per task | depth | seeds | " + " | ".join(f"{m} | {m} gap" for m in metrics) + " |",
             "|---:|---|---:|" + "---:|---:|" * len(metrics)]
    for n in recipe.sizes:
        for d in dict.fromkeys(r["depth"] for r in rows if r["size"] == n):
            mine = {r["metric"]: r for r in rows if r["size"] == n and r["depth"] == d}
            seeds = max(r["seeds"] for r in mine.values())
            lines.append(f"| {n} | {depth_label(d, recipe.layers)} | {seeds} | " + " | ".join(
                f"{_pm(mine[m]['mean'], mine[m]['std'])} | "
                f"{'' if d is None else _pm(mine[m]['gap'], mine[m]['gap_std'])}" if m in mine else "- | -"
                for m in metrics) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- table


def table_markdown(recipe: Recipe, records: list[dict]) -> str:
    rows = table_rows(recipe, records)
    metrics = metric_names("+".join(recipe.tasks))
    published = any(r["published"] for r in rows)  # a reproduction: the paper's figures beside ours
    lines = [f"# {recipe.title}", "", recipe.about, "", settings_line(recipe, records), "",
             f"Training examples per task: {recipe.sizes[0]}. Ours: mean ± sample std over seeds"
             + ("; published: the report's dev figures (BERT-base, the course's full training sets), where it "
                "gives them; its overall here is the course's formula applied to its three figures (the report's "
                "own 'Overall' averages the raw Pearson)." if published else
                "; train s: the training steps of a run (its caches' building included), mean over seeds, "
                "measured while another run shared the machine's two cores."), "",
             "| recipe | frozen layers | seeds | "
             + " | ".join(f"{m}{' | published' if published else ''}" for m in metrics)
             + ("" if published else " | train s") + " |",
             "|---|---:|---:|" + ("---:|---:|" if published else "---:|") * len(metrics)
             + ("" if published else "---:|")]
    for r in rows:
        seeds = max(len(v) for v in r["values"].values())
        cells = []
        for m in metrics:
            mean, sd = mean_sd(list(r["values"][m].values())) if r["values"][m] else (math.nan, math.nan)
            pub = r["published"].get(m)
            if m == "overall" and r["published"] and pub is None:
                p = r["published"]
                pub = (p["sst_acc"] + p["para_acc"] + (p["sts_pearson"] + 1) / 2) / 3
            cells.append(f"{_pm(mean, sd)} | {_f(pub, 3)}" if published else _pm(mean, sd))
        if not published:
            cells.append(_f(mean_sd(r["train_seconds"])[0], 0) if r["train_seconds"] else "-")
        frozen = "0" if r["depth"] is None else str(max(r["depth"], 0))
        lines.append(f"| {r['label']} | {frozen} | {seeds} | " + " | ".join(cells) + " |")
    tests = comparisons(recipe, rows)
    if tests:
        lines += ["", "Paired by seed (B - A; t: paired t-test, two-sided; with 3 seeds only a large, steady "
                      "difference reaches p < 0.05):", "",
                  "| A | B | metric | seeds | B - A | sd | t p | Wilcoxon p |",
                  "|---|---|---|---:|---:|---:|---:|---:|"]
        for t in tests:
            lines.append(f"| {t['a']} | {t['b']} | {t['metric']} | {t['n']} | {_f(t['diff'], sign=True)} | "
                         f"{_f(t['diff_sd'])} | {_f(t['t_p'], 3)} | {_f(t['wilcoxon_p'], 3)} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CSV

CSV_COLUMNS = ["study", "protocol", "size", "depth", "arm", "metric", "seeds", "mean", "std", "relative_mean",
               "relative_std", "gap_mean", "gap_std"]


def write_csv(recipe: Recipe, records: list[dict], path: Path) -> None:
    """Every aggregate of the study, one row per (protocol or arm, size, depth, metric)."""
    rows = []
    if recipe.kind == "depth":
        for protocol in ("elsa", "tuned") if recipe.lr_grid else ("elsa",):
            for c in relative_cells(recipe, records, recipe.sizes[0], protocol):
                rows.append({"protocol": protocol, "size": recipe.sizes[0], "depth": c.depth, "metric": c.metric,
                             "seeds": len(c.values), "mean": c.mean, "std": c.std, "relative_mean": c.rel_mean,
                             "relative_std": c.rel_std})
    elif recipe.kind == "size":
        for r in size_rows(recipe, records):
            rows.append({**{k: r[k] for k in ("size", "depth", "metric", "seeds", "mean", "std")},
                         "gap_mean": r["gap"], "gap_std": r["gap_std"]})
    else:
        for r in table_rows(recipe, records):
            for m, vals in r["values"].items():
                if vals:
                    mean, sd = mean_sd(list(vals.values()))
                    rows.append({"protocol": r["label"], "size": recipe.sizes[0], "depth": r["depth"], "arm": r["arm"],
                                 "metric": m, "seeds": len(vals), "mean": mean, "std": sd})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            r = {"study": recipe.path.stem, **r}
            w.writerow({k: _csv_value(k, r.get(k)) for k in CSV_COLUMNS})


def _csv_value(key, v):
    if key == "depth":
        return "none" if v is None else v
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.6f}" if isinstance(v, float) else v


MARKDOWN = {"depth": depth_markdown, "size": size_markdown, "table": table_markdown}
