"""Summarise a sweep (minbert sweep), and plot it or one run's training curves.

    minbert report docs/sweep-sst --plot         # report.md, report.csv, metric_vs_depth.png
    minbert report --curves runs/sweep-sst-runs/sst-freezenone-n1000-seed1
    minbert report --compare runs/a runs/b --csv compare.csv -o compare.png

--compare prints one markdown table of the runs: the config options that differ between them (only
those), the dev metrics of each run's kept evaluation (the best overall score, the one best.pt holds)
and the training time (the epochs' train_seconds in metrics.jsonl: training steps only, no evaluation);
--csv writes the table as CSV, -o draws the runs' dev curves overlaid, the kept evaluation starred.

For each (task set, depth, size) and each dev metric: the number of seeds, the mean, median, sample
standard deviation (ddof=1; empty with a single seed), min and max over the seeds, and the mean wall
time, peak RSS and trainable parameters of a run. For reference, the majority-class baseline of each
task's dev set: the accuracy of always predicting the dev set's most frequent label (sst, para); for
sts the Pearson correlation of a constant prediction is undefined, and is reported as 0 (as
training.evaluate scores it). --plot needs matplotlib (pip install matplotlib, or the `plots` extra).
"""
from __future__ import annotations

import csv
import json
import logging
import math
import sys
from pathlib import Path

from training.args import Parser, check_outputs, existing_file_problem, output_file_problem
from training.common.progress import setup_logging
from training.config.train_config import flag_of, locations
from training.experiments.sweep.records import RESULTS, read_results
from training.results.summary import (
    RunDirError,
    depth_order,
    majority_baselines,
    metric_names,
    read_run,
    size_order,
    summary_rows,
)
from training.run.metrics_file import evaluations, read_metrics

log = logging.getLogger(__name__)

PROG = "python -m training.experiments.report"

DPI = 100

PANEL = (6.0, 4.8)  # inches per panel of metric_vs_depth.png

CURVES_SIZE = (12.0, 4.5)  # inches of a --curves figure

DODGE = 0.08  # horizontal offset between the sizes' points at one depth

PLOT = "metric_vs_depth.png"

COLUMNS = ["tasks", "depth", "size", "metric", "seeds", "mean", "median", "std", "min", "max", "baseline",
           "wall_seconds", "train_seconds", "peak_rss_mib", "trainable_params"]


def _fmt(x, digits=4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _depth_label(d, arm: str = "") -> str:
    return ("none" if d is None else str(d)) + (f", {arm}" if arm else "")


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(r[k], float) and math.isnan(r[k]) else
                            _depth_label(r[k], r.get("arm", "")) if k == "depth" else r[k]) for k in COLUMNS})


def markdown(rows: list[dict], records: list[dict], baselines: dict[str, float]) -> str:
    s = records[0].get("settings", {}) if records else {}
    lines = ["# Sweep report", "",
             f"{len(records)} runs from `{RESULTS}`. Model `{s.get('model', '?')}`, {s.get('epochs', '?')} epochs, "
             f"lr {s.get('lr', '?')}, batch {s.get('batch_size', '?')}; dev metrics of each run's best epoch, "
             "on the full dev set.", "",
             "- depth: `--freeze-upto`, the embeddings and encoder layers 0..depth-1 frozen (-1 and 0: embeddings "
             "only); none: full fine-tuning.",
             "- size: training examples per task, a stratified subset (nested across sizes for a seed).",
             "- mean / median / std / min / max over the seeds; std is the sample standard deviation (ddof=1), "
             "empty for a single seed.",
             "- wall s: mean time of one run (model loading, training, dev evaluation each epoch, final "
             "predictions); train s: the training steps alone; peak RSS: mean peak resident memory of a "
             "run's process (Python and torch included).",
             "- baseline: the dev set's majority label (sst, para accuracy); for sts_pearson a constant "
             "prediction has no defined correlation and counts as 0.", ""]
    if baselines:
        lines += ["Majority-class baselines (dev): " + ", ".join(f"{k} {v:.4f}" for k, v in baselines.items()), ""]
    lines += ["| tasks | depth | size | metric | seeds | mean | median | std | min | max | wall s | train s "
              "| peak RSS MiB | trainable params |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append("| " + " | ".join([
            r["tasks"], _depth_label(r["depth"], r.get("arm", "")), str(r["size"]), r["metric"], str(r["seeds"]),
            _fmt(r["mean"]), _fmt(r["median"]), _fmt(r["std"]), _fmt(r["min"]), _fmt(r["max"]),
            _fmt(r["wall_seconds"], 1), _fmt(r["train_seconds"], 1), _fmt(r["peak_rss_mib"], 0),
            "" if math.isnan(r["trainable_params"]) else f"{r['trainable_params'] / 1e6:.2f}M"]) + " |")
    return "\n".join(lines) + "\n"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RunDirError("--plot and --curves need matplotlib: pip install matplotlib "
                         "(or pip install -e '.[plots]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def figure_path(given: str | Path) -> Path:
    """Where a figure named `given` goes: savefig adds .png to a name without a suffix; said here, so that the
    path checked and printed is the one written."""
    path = Path(given)
    return path if path.suffix else path.with_name(f"{path.name}.png")


def figure_problem(path: Path) -> str | None:
    """Why a figure cannot be drawn to `path` (figure_path's): output_file_problem's reasons, or a format
    matplotlib does not write."""
    problem = output_file_problem(path)
    if problem:
        return problem
    _pyplot()  # matplotlib, or the one line saying how to install it
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        return f"matplotlib draws no {path.suffix} files (it draws {', '.join(sorted(formats))})"
    return None


def plot_sweep(rows: list[dict], path: Path) -> Path:
    """One row of panels per task set: each dev metric against depth (a line per size, error bars: std
    over seeds, dashed: the majority baseline), then the mean wall time of a run. PANEL inches a panel."""
    plt = _pyplot()
    task_sets = sorted({r["tasks"] for r in rows})
    ncols = max(len(metric_names(t)) for t in task_sets) + 1
    fig, axes = plt.subplots(len(task_sets), ncols, figsize=(PANEL[0] * ncols, PANEL[1] * len(task_sets)),
                             dpi=DPI, squeeze=False)
    for row, tasks in enumerate(task_sets):
        mine = [r for r in rows if r["tasks"] == tasks]
        depths = sorted({(r["depth"], r.get("arm", "")) for r in mine}, key=lambda k: (depth_order(k[0]), k[1]))
        sizes = sorted({r["size"] for r in mine}, key=size_order)
        x_of = {d: i for i, d in enumerate(depths)}
        offsets = {n: (j - (len(sizes) - 1) / 2) * DODGE for j, n in enumerate(sizes)}  # keep error bars apart
        width = DODGE * (len(sizes) - 1)
        metrics = metric_names(tasks)
        for col in range(ncols):
            ax = axes[row][col]
            if col < len(metrics):
                metric = metrics[col]
                for j, n in enumerate(sizes):
                    pts = sorted((x_of[r["depth"], r.get("arm", "")] + offsets[n], r) for r in mine
                                 if r["size"] == n and r["metric"] == metric)
                    if not pts:
                        continue
                    ax.errorbar([p for p, _ in pts], [r["mean"] for _, r in pts],
                                yerr=[0.0 if math.isnan(r["std"]) else r["std"] for _, r in pts],
                                marker="o", capsize=4, label=f"{n} examples" + ("" if n == "all" else "/task"),
                                color=f"C{j}")
                base = next((r["baseline"] for r in mine if r["metric"] == metric and not math.isnan(r["baseline"])),
                            None)
                if base is not None:
                    ax.axhline(base, color="grey", linestyle="--", linewidth=1.2,
                               label=f"dev majority class ({base:.3f})")
                ax.set_ylabel(f"dev {metric}" + " (mean ± std over seeds)")
                ax.set_title(f"{tasks}: dev {metric}")
            elif col == ncols - 1:
                for j, n in enumerate(sizes):
                    pts = sorted({x_of[r["depth"], r.get("arm", "")]: r for r in mine if r["size"] == n}.items())
                    xs = [p for p, _ in pts]
                    label = f"{n} examples" + ("" if n == "all" else "/task")
                    ax.plot(xs, [r["wall_seconds"] for _, r in pts], marker="s", color=f"C{j}",
                            label=f"{label}: whole run")
                    ax.plot(xs, [r["train_seconds"] for _, r in pts], marker="^", linestyle=":", color=f"C{j}",
                            label=f"{label}: training steps")
                ax.set_ylim(bottom=0)
                ax.set_ylabel("seconds per run (mean over seeds)")
                ax.set_title(f"{tasks}: time per run")
            else:
                ax.axis("off")
                continue
            ax.set_xticks(range(len(depths)), [_depth_label(*d) for d in depths])
            ax.set_xlim(-0.5 - width, len(depths) - 0.5 + width)
            ax.set_xlabel("--freeze-upto (frozen layers; none = full fine-tuning)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def dev_series(records: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Each dev metric in a run's records as (epochs done, value) points. With --evals-per-epoch the
    mid-epoch records carry `epoch_progress`, and the raw weights' scores (dev_raw_*, with
    --ema-decay) come at epoch ends only."""
    evals = [r for r in records if "dev_overall" in r]
    names = list(dict.fromkeys(k for r in evals for k in r if k.startswith("dev_")))
    if len([k for k in names if not k.startswith("dev_raw_")]) == 2:  # one task: overall is the same number
        names = [k for k in names if k not in ("dev_overall", "dev_raw_overall")]
    return {k: [(r["epoch"] + r.get("epoch_progress", 1.0), r[k]) for r in evals if k in r] for k in names}


def plot_curves(run_dir: Path, path: Path | None = None) -> Path:
    """A run's metrics.jsonl: running training loss per task against the step, dev metrics per evaluation."""
    plt = _pyplot()
    run_dir = Path(run_dir)
    src = run_dir / "metrics.jsonl"
    if not src.is_file():
        raise RunDirError(f"{src}: no such file (is {run_dir} a run directory?)")
    records = read_metrics(src)
    steps = [r for r in records if "train_seconds" not in r and "dev_overall" not in r]
    epochs = [r for r in records if "train_seconds" in r]
    path = figure_path(path or run_dir / "curves.png")
    tasks = sorted({k[len("loss_"):] for r in steps for k in r if k.startswith("loss_")} |
                   {k[len("train_loss_"):] for r in epochs for k in r if k.startswith("train_loss_")})
    if not tasks and not evaluations(records):  # an empty figure would pass for a run that learnt nothing
        raise RunDirError(f"{src}: no training loss and no dev evaluation recorded (yet): nothing to draw")
    fig, (left, right) = plt.subplots(1, 2, figsize=CURVES_SIZE, dpi=DPI)
    for j, t in enumerate(tasks):
        pts = [(r["step"], r[f"loss_{t}"]) for r in steps if f"loss_{t}" in r]
        if pts:
            left.plot(*zip(*pts), color=f"C{j}", label=f"{t} (running mean)")
        ep = [(r["step"], r[f"train_loss_{t}"]) for r in epochs if f"train_loss_{t}" in r]
        if ep:
            left.plot(*zip(*ep), "o", color=f"C{j}", markeredgecolor="black", label=f"{t} (epoch mean)")
    left.set_xlabel("step")
    left.set_ylabel("training loss")
    left.set_title("training loss")
    left.grid(alpha=0.3)
    left.legend(fontsize="small")
    for j, (k, pts) in enumerate(dev_series(records).items()):
        right.plot(*zip(*pts), marker="o", color=f"C{j}", label=k)
    right.set_xlabel("epoch")
    right.set_ylabel("dev metric")
    right.set_title("dev metrics per epoch")
    if epochs:
        right.set_xticks([r["epoch"] + 1 for r in epochs])
    right.grid(alpha=0.3)
    right.legend(fontsize="small")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path

NOT_COMPARED = locations("output")  # where a run wrote, not what it trained

COMPARED_METRICS = ("sst_acc", "para_acc", "sts_pearson", "overall")

COMPARE_SIZE = (5.0, 4.0)  # inches per panel of the --compare figure


def run_labels(runs: list[dict]) -> list[str]:
    """The folders' names, or their paths where two runs share a name."""
    names = [r["dir"].name for r in runs]
    return names if len(set(names)) == len(names) else [str(r["dir"]) for r in runs]


def config_differences(configs: list[dict]) -> list[str]:
    """The options whose values are not the same in every run, in the config's order."""
    names = list(dict.fromkeys(k for c in configs for k in c))
    return [k for k in names if k not in NOT_COMPARED
            and len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]


def _value(v) -> str:
    if isinstance(v, (list, tuple)):
        return " ".join(map(str, v))
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()) or "{}"
    return "none" if v is None else str(v)


def compare_table(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): run, the differing options, the kept evaluation's metrics and place, training time."""
    diff = config_differences([r["config"] for r in runs])
    metrics = [m for m in COMPARED_METRICS if any(f"dev_{m}" in r["kept"] for r in runs)]
    header = ["run", *map(flag_of, diff), *metrics, "kept at epoch", "kept at step", "train s"]
    rows = []
    for label, r in zip(run_labels(runs), runs):
        kept = r["kept"]
        rows.append([label, *(_value(r["config"].get(k, "")) for k in diff),
                     *(_fmt(kept.get(f"dev_{m}")) for m in metrics),
                     f"{kept['epoch'] + kept.get('epoch_progress', 1.0):.2f}", str(kept["step"]),
                     f"{r['train_seconds']:.1f}"])
    return header, rows


def compare_markdown(header: list[str], rows: list[list[str]]) -> str:
    right = {i for i, h in enumerate(header) if i >= len(header) - 3 or h in COMPARED_METRICS}
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_compare_csv(header: list[str], rows: list[list[str]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def plot_compare(runs: list[dict], path: Path) -> Path:
    """One panel per dev metric, one line per run against epochs done; a star on each run's kept evaluation."""
    plt = _pyplot()
    path = figure_path(path)
    series = [dev_series(r["records"]) for r in runs]
    metrics = [f"dev_{m}" for m in COMPARED_METRICS if any(f"dev_{m}" in s for s in series)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(COMPARE_SIZE[0] * len(metrics), COMPARE_SIZE[1]), dpi=DPI,
                             squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for j, (label, run, s) in enumerate(zip(run_labels(runs), runs, series)):
            if metric not in s:
                continue
            ax.plot(*zip(*s[metric]), marker="o", markersize=3, color=f"C{j}", label=label)
            kept = run["kept"]
            if metric in kept:
                ax.plot(kept["epoch"] + kept.get("epoch_progress", 1.0), kept[metric], marker="*", markersize=15,
                        color=f"C{j}", markeredgecolor="black", linestyle="none")
        ax.set_xlabel("epochs done")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} (star: the kept evaluation)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def compare(run_dirs: list[str], csv_path: str | None = None, plot_path: str | None = None) -> str:
    runs = [read_run(Path(d)) for d in run_dirs]
    header, rows = compare_table(runs)
    if csv_path:
        write_compare_csv(header, rows, Path(csv_path))
        log.info("wrote %s", csv_path)
    if plot_path:
        log.info("wrote %s", plot_compare(runs, Path(plot_path)))
    return compare_markdown(header, rows)


def report(out: Path, plot: bool = False, data_dir: str | None = None) -> list[dict]:
    records = read_results(out / RESULTS)
    if not records:
        raise RunDirError(f"{out / RESULTS}: no results (run minbert sweep first)")
    baselines = majority_baselines(records, data_dir)
    rows = summary_rows(records, baselines)
    (out / "report.md").write_text(markdown(rows, records, baselines))
    write_csv(rows, out / "report.csv")
    log.info("wrote %s and %s", out / "report.md", out / "report.csv")
    if plot:
        log.info("wrote %s", plot_sweep(rows, out / PLOT))
    return rows


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("out", nargs="?", help="a sweep's --out folder (holding results.jsonl); report.md and "
                   "report.csv are written there")
    p.add_argument("--plot", action="store_true", help=f"also draw OUT/{PLOT}: dev metric against depth, one "
                   "line per size, error bars = std over seeds, and the time per run")
    p.add_argument("--data-dir", default=None, help="course data for the majority baselines (default: the "
                   "sweep's --data-dir)")
    p.add_argument("--curves", metavar="RUN_DIR", help="draw one run's training curves from RUN_DIR/metrics.jsonl")
    p.add_argument("--compare", nargs="+", metavar="RUN_DIR", help="one table of these runs: the options that differ, "
                   "the kept evaluation's dev metrics, the training time")
    p.add_argument("--csv", metavar="FILE", help="--compare: also write the table as CSV")
    p.add_argument("-o", "--output", metavar="PNG", help="where --curves writes (default: RUN_DIR/curves.png); with "
                   "--compare, draw the runs' dev curves overlaid there")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --csv FILE or -o figure (the "
                   "default RUN_DIR/curves.png, that run's own, is drawn again without it)")
    args = p.parse_args(argv)
    setup_logging()
    if args.compare and (args.out or args.curves):
        p.error("--compare goes alone: not with a sweep folder or --curves")
    if args.csv and not args.compare:
        p.error("--csv is for --compare")
    if not (args.out or args.curves or args.compare):
        p.error("give a sweep folder (OUT), --curves RUN_DIR or --compare RUN_DIR ...")
    try:
        check_paths(p, args)
        run_commands(args)
    except RunDirError as e:
        p.fail(str(e))
    return 0


def check_paths(p: Parser, args) -> None:
    """The files --compare and --curves write, refused in one line before any run is read or drawn; -o
    becomes the path the figure is written to (figure_path)."""
    check_outputs(p, files={"--csv": args.csv}, overwrite=args.overwrite)
    if args.curves or (args.compare and args.output):
        given = args.output
        args.output = figure_path(given or Path(args.curves) / "curves.png")
        problem = figure_problem(args.output) or (existing_file_problem(args.output, args.overwrite, "figure")
                                                  if given else None)
        if problem:
            p.fail(f"{'-o ' if given else ''}{args.output}: {problem}")


def run_commands(args) -> None:
    if args.compare:
        print(compare(args.compare, args.csv, args.output), end="")
        return
    if args.out:
        out = Path(args.out)
        if not (out / RESULTS).is_file():
            raise RunDirError(f"{out / RESULTS}: no such file")
        report(out, args.plot, args.data_dir)
        print((out / "report.md").read_text(), end="")
    if args.curves:
        print(f"wrote {plot_curves(Path(args.curves), args.output)}")


if __name__ == "__main__":
    sys.exit(main())
