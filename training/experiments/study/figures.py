"""A study's figures (matplotlib, optional: without it the tables are still written).

- depth: relative quality against frozen depth, one panel per metric, mean ± std over seeds, for each
  protocol (Lee et al.'s figure), and the cost panels (seconds per epoch with and without the cache;
  peak memory and trainable parameters).
- size: each metric against the training-set size, one line per depth, mean ± std over seeds.
- table: each row's metrics, every seed a dot and the mean a bar, the published figure (where the
  recipe gives one) a cross beside it.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

from training.experiments.study.aggregate import NINETY, cost_rows, depth_label, relative_cells, size_rows, table_rows
from training.experiments.study.recipe import Recipe
from training.results.summary import metric_names

log = logging.getLogger(__name__)

DPI = 100
PANEL = (4.6, 3.8)  # inches per panel


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (with a warning) where it is not installed."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed: tables only, no figures (pip install -e '.[plots]')")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _depth_axis(ax, depths, layers):
    ax.set_xticks(range(len(depths)), [depth_label(d, layers).replace(" (heads only)", "\n(heads)")
                                        .replace(" (full)", "\n(full)").replace("embeddings", "emb.")
                                        for d in depths])
    ax.set_xlabel("frozen: embeddings + layers 0..N-1")
    ax.grid(alpha=0.3)


def depth_figures(recipe: Recipe, records: list[dict], out: Path) -> list[Path]:
    plt = pyplot()
    if plt is None:
        return []
    size, metrics = recipe.sizes[0], metric_names("+".join(recipe.tasks))
    protocols = ["elsa"] + (["tuned"] if recipe.lr_grid else [])
    fig, axes = _grid(plt, len(metrics))
    for j, protocol in enumerate(protocols):
        cells = relative_cells(recipe, records, size, protocol)
        depths = list(dict.fromkeys(c.depth for c in cells))
        for ax, metric in zip(axes, metrics):
            pts = [(i + (j - (len(protocols) - 1) / 2) * 0.1, c) for i, d in enumerate(depths)
                   for c in cells if c.depth == d and c.metric == metric and c.relative]
            ax.errorbar([x for x, _ in pts], [c.rel_mean for _, c in pts],
                        yerr=[0.0 if math.isnan(c.rel_std) else c.rel_std for _, c in pts], marker="o", capsize=3,
                        color=f"C{j}", label={"elsa": "full model's lr", "tuned": "best lr per depth"}[protocol])
            _depth_axis(ax, depths, recipe.layers)
            ax.set_title(f"dev {metric}")
    for ax in axes:
        ax.axhline(1.0, color="grey", linewidth=1)
        ax.axhline(NINETY, color="grey", linestyle="--", linewidth=1, label=f"{NINETY:.0%} of full")
        ax.set_ylabel("relative to full fine-tuning")
    axes[0].legend(fontsize="small")
    fig.suptitle(f"Quality against frozen depth ({recipe.layers}-layer model, {size} examples per task,\n"
                 f"mean ± std over seeds)")
    fig.tight_layout()
    paths = [_save(fig, plt, out / "relative_quality.png")]
    paths.append(cost_figure(recipe, records, out / "cost.png", plt))
    return paths


def cost_figure(recipe: Recipe, records: list[dict], path: Path, plt) -> Path:
    rows = cost_rows(recipe, records, recipe.sizes[0])
    depths = [r["depth"] for r in rows]
    x = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(PANEL[0] * 2, PANEL[1]), dpi=DPI)
    left.plot(x, [r["epoch_seconds"] for r in rows], marker="o", label="with the frozen-prefix cache")
    left.plot(x, [r["epoch_seconds_nocache"] for r in rows], marker="s", linestyle=":", label="without it")
    left.set_ylim(bottom=0)
    left.set_ylabel("training seconds per epoch")
    left.legend(fontsize="small")
    right.plot(x, [r["peak_rss_mib"] for r in rows], marker="o", color="C2", label="peak RSS (MiB)")
    right.set_ylabel("peak resident memory, MiB")
    twin = right.twinx()
    twin.plot(x, [r["trainable_params"] / 1e6 for r in rows], marker="^", color="C3", linestyle="--",
              label="trainable parameters (M)")
    twin.set_ylabel("trainable parameters, millions")
    twin.set_ylim(bottom=0)
    right.legend(loc="upper right", fontsize="small")
    twin.legend(loc="lower left", fontsize="small")
    for ax in (left, right):
        _depth_axis(ax, depths, recipe.layers)
    fig.suptitle("Cost against frozen depth")
    fig.tight_layout()
    return _save(fig, plt, path)


def size_figures(recipe: Recipe, records: list[dict], out: Path) -> list[Path]:
    plt = pyplot()
    if plt is None:
        return []
    rows, metrics = size_rows(recipe, records), metric_names("+".join(recipe.tasks))
    fig, axes = _grid(plt, len(metrics))
    depths = list(dict.fromkeys(r["depth"] for r in rows))
    for ax, metric in zip(axes, metrics):
        for j, d in enumerate(depths):
            pts = [r for r in rows if r["depth"] == d and r["metric"] == metric and r["size"] != "all"]
            ax.errorbar([r["size"] for r in pts], [r["mean"] for r in pts],
                        yerr=[0.0 if math.isnan(r["std"]) else r["std"] for r in pts], marker="o", capsize=3,
                        color=f"C{j}", label=f"frozen: {depth_label(d, recipe.layers)}")
        ax.set_xscale("log")
        ax.set_xlabel("training examples per task")
        ax.set_ylabel(f"dev {metric}")
        ax.set_title(f"dev {metric}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle("Quality against training-set size, per frozen depth\n(mean ± std over seeds)")
    fig.tight_layout()
    return [_save(fig, plt, out / "size.png")]


def table_figures(recipe: Recipe, records: list[dict], out: Path) -> list[Path]:
    plt = pyplot()
    rows = table_rows(recipe, records)
    if plt is None or not any(v for r in rows for v in r["values"].values()):
        return []
    metrics = metric_names("+".join(recipe.tasks))
    fig, axes = _grid(plt, len(metrics))
    for ax, metric in zip(axes, metrics):
        for i, r in enumerate(rows):
            seeds = list(r["values"][metric].values())
            if seeds:
                ax.bar(i, sum(seeds) / len(seeds), color=f"C{i % 10}", alpha=0.35)
                ax.scatter([i] * len(seeds), seeds, color=f"C{i % 10}", s=14, zorder=3)
            published = r["published"].get(metric)
            if published is not None:
                first = next(j for j, q in enumerate(rows) if q["published"].get(metric) is not None)
                ax.scatter([i + 0.3], [published], marker="x", color="black", zorder=3,
                           label="published" if i == first else None)  # one legend entry
        ax.set_xticks(range(len(rows)), [r["label"] for r in rows], rotation=35, ha="right", fontsize="x-small")
        ax.set_title(f"dev {metric}")
        ax.grid(alpha=0.3, axis="y")
        lows = [v for r in rows for v in r["values"][metric].values()]
        if lows:
            ax.set_ylim(bottom=max(0.0, min(lows) - 0.1))
        if any(r["published"].get(metric) is not None for r in rows):
            ax.legend(fontsize="x-small")
    fig.suptitle(f"{recipe.title}\n(bars: mean over seeds; dots: each seed)", fontsize="medium")
    fig.tight_layout()
    return [_save(fig, plt, out / "table.png")]


def _grid(plt, panels: int):
    """A figure of `panels` panels, two to a row; the panels' axes in reading order."""
    cols = min(2, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(PANEL[0] * cols, PANEL[1] * rows), dpi=DPI, squeeze=False)
    flat = list(axes.flat)
    for ax in flat[panels:]:
        ax.axis("off")
    return fig, flat[:panels]


def _save(fig, plt, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


FIGURES = {"depth": depth_figures, "size": size_figures, "table": table_figures}
