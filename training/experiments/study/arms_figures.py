"""An arms study's figures (matplotlib, optional):

- quality.png: each point's dev overall on every reporting seed (dots) and its mean with the 95% t
  interval, beside the trivial predictor's line;
- depth.png (a recipe whose plain points freeze more than one depth): the plain depth points (no arm, no
  borrowed rate) against the number of encoder layers frozen, one panel per task and one for the overall,
  every reporting seed a dot and the mean with its interval, beside the lines a reader needs: the trivial
  predictor, the untrained model's zero-shot score where a task has one, full fine-tuning's mean;
- front.png: quality against cost, each point its mean dev overall (95% interval) against its end-to-end
  cost modelled from the cost measured apart (arms_cost.py: in full fine-tuning epochs, the range over the
  seeds as a horizontal bar), or, without that measurement, the median training seconds of its reporting
  runs (as the study measured them: runs shared the machine); a dashed line joins the front (the points no
  cheaper point matches); the marker says the point's kind (a fixed depth, a parameter-efficient method, a
  freezing schedule, a confound or twin), and a second panel enlarges the crowded top;
- curves.png: the learning curves, the tuning split's overall at each evaluation, each reporting seed
  (thin) and the mean of the seeds still training, one colour per point, a panel per kind of point;
- tuning.png: the tuning as a rate x point map, each cell the tuning-split score of a rate the point tried,
  coloured by its distance below the point's best, the chosen rate boxed;
- size_depth.png (a recipe whose points train on several sizes): the gap as a map, each size x depth
  cell the normalised quality against the point it is measured against (its "vs": the same size's full
  fine-tuning), full fine-tuning's own row against the whole files'.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from training.experiments.study.arms import size_column
from training.experiments.study.figures import DPI, PANEL, _save, pyplot
from training.experiments.study.protocol import Protocol, borrows


def arms_figures(recipe, records: list[dict], rows: list[dict], baselines: dict | None, out: Path,
                 costs: list[dict] | None = None) -> list[Path]:
    plt = pyplot()
    if plt is None or not records:
        return []
    overall = [r for r in rows if r["metric"] == "overall"]
    paths = []
    if overall:
        paths.append(quality_figure(plt, overall, baselines, out / "quality.png", recipe.points[0]["label"]))
        if len(plain_depths(recipe)) > 1:  # one depth (a recipe comparing flags) is quality.png again
            paths.append(depth_figure(plt, recipe, rows, baselines, out / "depth.png"))
        paths += [front_figure(plt, recipe, records, overall, out / "front.png", costs),
                  curves_figure(plt, recipe, records, out / "curves.png")]
    paths.append(tuning_figure(plt, recipe, records, out / "tuning.png"))
    sizes, columns, grid = size_depth_grid(recipe, overall)
    if len(sizes) > 1 and not np.isnan(grid).all():
        paths.append(size_depth_figure(plt, sizes, columns, grid, out / "size_depth.png"))
    return paths


#: each figure's caption in report.md's "Figures" section, in the order they appear there
CAPTIONS = {"depth.png": "Quality against frozen depth, per task, beside the trivial predictor and the zero-shot "
                         "cosine",
            "quality.png": "Dev overall of every point: each reporting seed and the mean with its 95% interval",
            "front.png": "Quality against end-to-end cost (the dashed line joins the front)",
            "size_depth.png": "Normalised quality per training-set size and depth",
            "curves.png": "Learning curves on the tuning split",
            "tuning.png": "The tuning: the tuning-split score of every rate each point tried"}


def figure_lines(paths: list[Path]) -> str:
    """report.md's closing section embedding the figures written (none without matplotlib: no section)."""
    names = [name for name in CAPTIONS if name in {p.name for p in paths}]
    if not names:
        return ""
    return "\n## Figures\n\n" + "\n\n".join(f"![{CAPTIONS[n]}]({n})" for n in names) + "\n"


def size_depth_grid(recipe, rows: list[dict]) -> tuple[list, list, np.ndarray]:
    """(sizes, columns, normalised quality[size, column]) of the overall rows of a recipe whose points
    name their size: sizes ascending with the whole files last, columns (size_column) in the recipe's
    order; nan where a point has no reporting runs yet."""
    sized = [p for p in recipe.points if "size" in p]
    sizes = sorted({p["size"] for p in sized}, key=lambda n: (n == "all", 0 if n == "all" else n))
    columns = list(dict.fromkeys(size_column(recipe, p) for p in sized))
    grid = np.full((len(sizes), len(columns)), np.nan)
    by_label = {r["label"]: r for r in rows}
    for p in sized:
        if p["label"] in by_label:
            grid[sizes.index(p["size"]), columns.index(size_column(recipe, p))] = by_label[p["label"]]["normalised"]
    return sizes, columns, grid


def column_name(column: tuple) -> str:
    depth, options = column
    name = "full" if depth is None else f"{depth} frozen"
    return "\n".join([name] + [value for _, value in options])


def size_depth_figure(plt, sizes: list, columns: list, grid: np.ndarray, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(PANEL[0] * 1.3, PANEL[1]), dpi=DPI)
    ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for i, j in np.ndindex(grid.shape):
        ax.text(j, i, "-" if np.isnan(grid[i, j]) else f"{grid[i, j]:.2f}", ha="center", va="center",
                color="white" if not np.isnan(grid[i, j]) and grid[i, j] < 0.6 else "black")
    ax.set_xticks(range(len(columns)), [column_name(c) for c in columns])
    ax.set_yticks(range(len(sizes)), [f"{n} per task" if n != "all" else "whole files" for n in sizes])
    ax.set_title("Normalised quality against the same size's full fine-tuning\n"
                 "(full fine-tuning's own column: against the whole files')", fontsize="medium")
    fig.tight_layout()
    return _save(fig, plt, path)


def mean_error(row: dict) -> list | None:
    """A row's 95% interval as errorbar's yerr (below and above its mean); None where it has none (one seed)."""
    lo, hi = row["ci"]
    return None if math.isnan(lo) else [[row["mean"] - lo], [hi - row["mean"]]]


def seeds_and_mean(ax, row: dict, x_seeds: float, x_mean: float, size: int, capsize: int) -> None:
    """Each reporting seed's value (grey dots) at x_seeds, and the mean with its interval at x_mean."""
    ax.scatter([x_seeds] * len(row["values"]), list(row["values"].values()), color="grey", s=size, zorder=2)
    ax.errorbar([x_mean], [row["mean"]], yerr=mean_error(row), marker="o", color="C0", capsize=capsize, zorder=3)


def quality_figure(plt, rows: list[dict], baselines: dict | None, path: Path, reference: str | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(PANEL[0] * 2, PANEL[1] * 1.2), dpi=DPI)
    for i, r in enumerate(rows):
        seeds_and_mean(ax, r, i, i + 0.15, size=12, capsize=4)
    ref = next((r for r in rows if r["label"] == reference), None)
    if ref:  # the point the others are measured against
        ax.axhline(ref["mean"], color="C0", linestyle=":", linewidth=1, label=f"{reference}'s mean")
    if baselines:
        ax.axhline(baselines["trivial"]["overall"], color="C3", linestyle="--", linewidth=1,
                   label="trivial predictor (majority class, constant)")
    if ref or baselines:
        ax.legend(fontsize="small", loc="lower left")
    ax.set_xticks(range(len(rows)), [r["label"] for r in rows], rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("dev overall (course score)")
    ax.set_title("Dev overall per point: each reporting seed (grey) and the mean with its 95% interval")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, plt, path)


#: the panels of depth.png: the metric, its title, and the zero-shot baseline's key where it has one
DEPTH_PANELS = [("overall", "dev overall", None), ("sst_acc", "SST accuracy", None),
                ("para_acc", "Quora accuracy", "para_acc"), ("sts_pearson", "STS Pearson", "sts_pearson")]


def depth_position(depth: int | None) -> int:
    """Where a depth sits on depth.png's axis, in encoder layers frozen: full fine-tuning -1, the
    embeddings alone 0 (recipe depth -1), N layers N (the embeddings frozen with them)."""
    return -1 if depth is None else max(depth, 0)


def plain_labels(recipe) -> set[str]:
    """The plain depth points: no arm (the confounds, the twins and the parameter-efficient methods are
    points of their own) and no rate borrowed."""
    return {p["label"] for p in recipe.points if p.get("arm", "") == "" and not borrows(p)}


def plain_depths(recipe) -> set:
    """The depths the plain depth points freeze: depth.png's axis."""
    plain = plain_labels(recipe)
    return {recipe.depth(p["depth"]) for p in recipe.points if p["label"] in plain}


def depth_rows(recipe, rows: list[dict], metric: str) -> list[tuple[int, dict]]:
    """(axis position, row) of the plain depth points for one metric, by depth."""
    plain = plain_labels(recipe)
    return sorted((depth_position(r["depth"]), r) for r in rows if r["metric"] == metric and r["label"] in plain)


def depth_figure(plt, recipe, rows: list[dict], baselines: dict | None, path: Path) -> Path:
    fig, axes = plt.subplots(1, len(DEPTH_PANELS), figsize=(PANEL[0] * 2.6, PANEL[1] * 1.1), dpi=DPI)
    trivial, zero_shot = (baselines or {}).get("trivial", {}), (baselines or {}).get("zero_shot", {})
    for ax, (metric, title, zero_key) in zip(axes, DEPTH_PANELS):
        placed = depth_rows(recipe, rows, metric)
        for x, r in placed:
            seeds_and_mean(ax, r, x - 0.12, x + 0.12, size=10, capsize=3)
        if placed and placed[0][0] == -1:
            ax.axhline(placed[0][1]["mean"], color="C0", linestyle=":", linewidth=1, label="full fine-tuning")
        if metric in trivial:
            ax.axhline(trivial[metric], color="C3", linestyle="--", linewidth=1, label="trivial predictor")
        if zero_key and zero_key in zero_shot:
            ax.axhline(zero_shot[zero_key], color="C2", linestyle="-.", linewidth=1,
                       label="untrained, zero-shot cosine")
        ticks = sorted({x for x, _ in placed} | {-1, recipe.layers})
        ax.set_xticks(ticks, ["none" if x == -1 else "emb." if x == 0 else "all" if x == recipe.layers else str(x)
                              for x in ticks], rotation=45, fontsize="small")
        ax.set_xlabel("encoder layers frozen")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="xx-small", loc="lower left")
    fig.suptitle("Quality against frozen depth: each reporting seed (grey), the mean with its 95% interval")
    fig.tight_layout()
    return _save(fig, plt, path)


#: the marker of each kind of point on front.png, so that a reader finds a family without the legend
FAMILY_MARKERS = {"fixed depth": "o", "parameter-efficient": "s", "freezing schedule": "^", "confound or twin": "D"}


def point_family(recipe, point: dict) -> str:
    """Which of FAMILY_MARKERS' kinds a recipe point is, from its arm's options (a size study's arms set its
    sizes' epochs: a point whose arm sets nothing else is a fixed depth)."""
    options = recipe.arms.get(point.get("arm", ""), {})
    if point["label"] in plain_labels(recipe) or ("size" in point and not borrows(point)
                                                  and not size_column(recipe, point)[1]):
        return "fixed depth"
    if "peft" in options:
        return "parameter-efficient"
    return "freezing schedule" if "unfreeze_schedule" in options else "confound or twin"


def front_points(recipe, records: list[dict], rows: list[dict], costs: list[dict] | None) -> list[dict]:
    """Each point front.png places: its label, family, x (modelled cost, else median training seconds) with
    the seeds' range, y (mean dev overall) with its interval."""
    protocol, modelled, points = Protocol(recipe, records), {c["label"]: c for c in costs or []}, []
    by_label = {p["label"]: p for p in recipe.points}
    for r in rows:
        if modelled:
            if r["label"] not in modelled:
                continue
            c = modelled[r["label"]]
            x, xerr = c["cost"], [[c["cost"] - c["cost_range"][0]], [c["cost_range"][1] - c["cost"]]]
        else:
            seconds = [run["train_seconds"] for run in protocol.reporting(r["label"]).values()
                       if run.get("train_seconds")]
            if not seconds:
                continue
            x, xerr = float(np.median(seconds)), None
        points.append({"label": r["label"], "family": point_family(recipe, by_label[r["label"]]), "x": x,
                       "xerr": xerr, "y": r["mean"], "yerr": mean_error(r)})
    return points


def zoom_limits(points: list[dict], below: float = 0.02) -> tuple[tuple, tuple] | None:
    """The crowded corner: the points within `below` of the best mean, their x and y extents padded, or None
    when too few points sit there to need a panel of their own."""
    best = max(p["y"] for p in points)
    near = [p for p in points if p["y"] >= best - below]
    if len(near) < 4 or len(near) == len(points):
        return None
    xs, ys = [p["x"] for p in near], [p["y"] for p in near]
    reach = max((max(p["yerr"][0][0], p["yerr"][1][0]) for p in near if p["yerr"]), default=0.0)
    return (min(xs) / 1.15, max(xs) * 1.15), (min(ys) - reach * 1.2, max(ys) + reach * 1.2)


def front_figure(plt, recipe, records: list[dict], rows: list[dict], path: Path, costs: list[dict] | None = None
                 ) -> Path:
    points, colour = front_points(recipe, records, rows, costs), point_colours(plt)
    index = {p["label"]: j for j, p in enumerate(recipe.points)}
    zoom = zoom_limits(points) if points else None
    fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(PANEL[0] * (2.6 if zoom else 1.6), PANEL[1] * 1.6),
                             dpi=DPI, squeeze=False)
    front = pareto_front([(p["x"], p["y"]) for p in points])
    for k, ax in enumerate(axes[0]):
        for p in points:
            ax.errorbar([p["x"]], [p["y"]], xerr=p["xerr"], yerr=p["yerr"], marker=FAMILY_MARKERS[p["family"]],
                        capsize=3, color=colour(index[p["label"]]), label=p["label"] if k == 0 else None)
        if len(front) > 1:
            ax.plot(*zip(*front), linestyle="--", color="grey", linewidth=1, zorder=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
        ax.set_xlabel("end-to-end cost, in epochs of full fine-tuning (modelled from the cost measured apart)"
                      if costs else "training seconds of a run (median over the reporting seeds; runs shared the "
                      "machine)", fontsize="small")
        ax.grid(alpha=0.3)
        if k == 1:
            ax.set_xlim(*zoom[0])
            ax.set_ylim(*zoom[1])
            ax.set_title("the top, enlarged", fontsize="medium")
    axes[0][0].set_ylabel("dev overall (mean, 95% interval)")
    axes[0][0].set_title("Quality against cost", fontsize="medium")
    if not points:  # a study with no run timed yet has nothing to name
        fig.tight_layout()
        return _save(fig, plt, path)
    families = [f for f in FAMILY_MARKERS if any(p["family"] == f for p in points)]
    axes[0][0].legend(handles=[plt.Line2D([], [], marker=FAMILY_MARKERS[f], color="black", linestyle="none",
                                          label=f) for f in families], fontsize="x-small", loc="lower right")
    rows = math.ceil(len(points) / 3)
    fig.legend(fontsize="x-small", loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, min(0.5, 0.028 * rows + 0.01), 1, 1))
    return _save(fig, plt, path)


def point_colours(plt):
    """The j-th point's colour: tab20's ten dark hues, then its ten light ones (matplotlib's ten default
    colours would repeat over a recipe's 18 points)."""
    tab20 = plt.get_cmap("tab20")
    return lambda j: tab20((2 * j) % 20 + (j // 10) % 2)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (cost, quality) points that no cheaper-or-equal point matches or beats, cheapest first: the front
    the dashed line joins."""
    front = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def mean_curve(curves: list[list]) -> list[tuple[int, float]]:
    """(evaluation, mean score) over the runs that reached each evaluation ([step, epoch, score] each)."""
    longest = max(len(c) for c in curves)
    return [(i + 1, float(np.mean([c[i][2] for c in curves if len(c) > i]))) for i in range(longest)]


def point_curves(recipe, records: list[dict]) -> list[tuple[int, str, list]]:
    """(the point's index, its label, its reporting runs' tuning-split curves) of each point with curves,
    but a point whose runs are the reference's own (a borrowed rate that is the reference's)."""
    protocol, reference = Protocol(recipe, records), recipe.points[0]["label"]
    out = []
    for j, point in enumerate(recipe.points):
        curves = [run["tune_curve"] for run in protocol.reporting(point["label"]).values() if run.get("tune_curve")]
        if curves and not protocol.same_runs(point["label"], reference):
            out.append((j, point["label"], curves))
    return out


#: curves.png's panels: a title and the kinds of point (point_family) each shows
CURVE_PANELS = [("The fixed depths", {"fixed depth"}),
                ("Parameter-efficient methods and freezing schedules", {"parameter-efficient", "freezing schedule"}),
                ("Confounds and twins", {"confound or twin"})]


def curves_figure(plt, recipe, records: list[dict], path: Path) -> Path:
    """A panel per kind of point, so that twenty points stay legible, each beside full fine-tuning's mean
    (dashed) where it is not one of the panel's own; a point keeps its colour."""
    colour, reference = point_colours(plt), recipe.points[0]["label"]
    family = {p["label"]: point_family(recipe, p) for p in recipe.points}
    panels = [(title, kinds) for title, kinds in CURVE_PANELS if kinds & set(family.values())]
    fig, axes = plt.subplots(1, len(panels), figsize=(PANEL[0] * 1.1 * len(panels), PANEL[1] * 1.3), dpi=DPI,
                             sharey=True, squeeze=False)
    axes = axes[0]
    for ax, (title, kinds) in zip(axes, panels):
        for j, label, curves in point_curves(recipe, records):
            ours = family[label] in kinds
            if not (ours or label == reference):
                continue
            if ours:
                for c in curves:  # each seed, thin: early stopping ends them at different evaluations
                    ax.plot(range(1, len(c) + 1), [e[2] for e in c], color=colour(j), alpha=0.3, linewidth=0.8)
            ax.plot(*zip(*mean_curve(curves)), marker="o" if ours else None, linestyle="-" if ours else "--",
                    color=colour(j), label=label)
        ax.set_xlabel("evaluation (epoch)")
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    axes[0].set_ylabel("tuning-split overall (seeds thin; mean of the seeds still training)")
    fig.suptitle("Learning curves (full fine-tuning dashed where it is not a panel's own)")
    fig.tight_layout()
    return _save(fig, plt, path)


def tuning_grid(recipe, records: list[dict]) -> tuple[list[str], list[float], np.ndarray, list]:
    """(point labels, every rate any point tried ascending, tuning-split score[point, rate], each point's
    chosen rate or None): the points that tune (not those that borrow a rate), with at least one rate's
    tuning runs all in; nan where a point did not try a rate or its runs are missing."""
    protocol, scored = Protocol(recipe, records), {}
    for point in (p for p in recipe.points if not borrows(p)):
        lrs, best = protocol.tried(point)
        cells = {lr: score for lr in lrs if (score := protocol.score(point, lr)) is not None}
        if cells:
            scored[point["label"]] = (cells, best)
    rates = sorted({lr for cells, _ in scored.values() for lr in cells})
    grid = np.full((len(scored), len(rates)), np.nan)
    for i, (cells, _) in enumerate(scored.values()):
        for lr, score in cells.items():
            grid[i, rates.index(lr)] = score
    return list(scored), rates, grid, [best for _, best in scored.values()]


def tuning_figure(plt, recipe, records: list[dict], path: Path) -> Path:
    return _save(tuning_map(plt, recipe, records), plt, path)


def tuning_map(plt, recipe, records: list[dict]):
    """The figure of tuning.png: rate x point, each cell a tuning-split score, the choice boxed."""
    labels, rates, grid, chosen = tuning_grid(recipe, records)
    labels = [textwrap.fill(label, 40) for label in labels]  # long point names would squeeze the map off the page
    rows = sum(label.count("\n") + 1 for label in labels)
    fig, ax = plt.subplots(figsize=(PANEL[0] * 1.8, 1.6 + 0.3 * max(rows, 2)), dpi=DPI)
    if labels:
        # colour: how far below the row's best (rows differ by 0.1 overall, so absolute colour would hide them)
        below = grid - np.nanmax(grid, axis=1, keepdims=True)
        ax.imshow(np.clip(below, -0.05, 0), cmap="viridis", vmin=-0.05, vmax=0, aspect="auto")
        for i, j in np.ndindex(grid.shape):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.4f}", ha="center", va="center", fontsize="x-small",
                        color="white" if below[i, j] < -0.03 else "black")
        for i, best in enumerate(chosen):
            if best is not None:
                ax.add_patch(plt.Rectangle((rates.index(best) - 0.5, i - 0.5), 1, 1, fill=False,
                                           edgecolor="C3", linewidth=2))
        ax.set_xticks(range(len(rates)), [f"{lr:g}" for lr in rates], fontsize="x-small", rotation=30)
        ax.set_yticks(range(len(labels)), labels, fontsize="x-small")
    ax.set_xlabel("peak learning rate")
    fig.suptitle("The tuning: tuning-split overall per rate tried\n(boxed: the choice; colour: distance below "
                 "the point's best, 0 to -0.05)", fontsize="small")
    fig.tight_layout()
    return fig
