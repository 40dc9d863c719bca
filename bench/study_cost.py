"""What each point of the freezing study costs, measured apart from the study on an otherwise idle
machine: the points trained one at a time, interleaved over rounds, end to end (model loading, the
frozen-prefix cache's building, the epochs, an evaluation per epoch), each in a fresh process.

    python bench/study_cost.py --threads 1 --examples 2000 --epochs 2 --rounds 3
    python bench/study_cost.py --results docs/freezing-study/whole --points "full fine-tuning" "3 layers frozen" \
        --json docs/freezing-study/whole/cost/cost.json

Per point: seconds per training epoch (median and interquartile range over rounds), the whole run's
seconds, the cache's building, peak resident memory of the run's process, the time to reach a share
(--share, 95%) of full fine-tuning's best dev overall of the same round (the cache's building and the
training epochs up to the first evaluation at or above it), and, for points with frozen layers, the same
run with `--frozen-cache off`: the cache's own gain. The rates are the study's choices where --results
holds them, else the middle of each point's grid; the order of the points rotates from round to round so
that background load hits all alike. --json writes the same figures for the study's report, which models
each whole-file run's end-to-end cost from them (training/experiments/study/arms_cost.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
from pathlib import Path

from common import data_parser, paired_ratios  # noqa: E402  (puts the repository on sys.path)

from data.loaders import load_task_split  # noqa: E402
from training.common.device import machine_name  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.experiments.study.arms_cost import COST_FREE, epoch_kind  # noqa: E402
from training.experiments.study.protocol import Protocol  # noqa: E402
from training.experiments.study.recipe import load_recipe  # noqa: E402
from training.experiments.sweep.engine import model_layers  # noqa: E402
from training.experiments.sweep.measure import measure_isolated
from training.experiments.sweep.records import RESULTS, read_results

NOCACHE = " (cache off)"


def arms(recipe, records: list[dict], labels: list[str] | None, cache_off: bool = True) -> dict[str, dict]:
    """label -> the point's options (its arm, depth and rate), and a cache-off twin for frozen depths. The
    arm's epochs and early stopping are left out: the benchmark trains every point for --epochs."""
    protocol = Protocol(recipe, records)
    out = {}
    for point in recipe.points:
        if labels and point["label"] not in labels or "lr_of" in point:
            continue
        grid = sorted(point.get("lrs") or recipe.lr_grid["lrs"])
        lr = protocol.chosen(point["label"]) or grid[len(grid) // 2]
        depth = recipe.depth(point["depth"])
        options = {k: v for k, v in recipe.arms[point["arm"]].items() if k not in COST_FREE}
        out[point["label"]] = {**options, "freeze_upto": depth, "lr": lr}
        if cache_off and depth is not None and depth >= 1:
            out[point["label"] + NOCACHE] = {**out[point["label"]], "frozen_cache": "off"}
    return out


def one_run(base: dict, options: dict, out: Path, threads: int | None) -> dict:
    cfg = TrainConfig(**{**base, **options, "out_dir": str(out), "predictions_dir": str(out / "pred"),
                         "cache_dir": str(out / "cache")})
    m = measure_isolated(cfg, threads)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if "train_seconds" in r]
    return {"wall": m["wall_seconds"], "epochs": [r["train_seconds"] for r in epochs], "rss": m["peak_rss_mib"],
            "cuda_mib": m.get("cuda_peak_mib"),
            "cache": sum(r.get("frozen_cache_seconds") or 0 for r in epochs),
            "curve": [(r["epoch"], r["dev_overall"]) for r in rows if r.get("dev_overall") is not None]}


def time_to(run: dict, target: float) -> float | None:
    """The cache's building and the training epochs up to the first evaluation at or above target."""
    spent = run["cache"]
    for (epoch, score), seconds in zip(run["curve"], run["epochs"]):
        spent += seconds
        if score >= target:
            return spent
    return None


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return med, q1, q3


def main() -> None:
    p = data_parser(__doc__)
    p.add_argument("--recipe", default="whole", help="the study's recipe (default: %(default)s)")
    p.add_argument("--results", default=None, help="the study's --out folder, for its chosen rates (default: none)")
    p.add_argument("--points", nargs="+", default=None, help="the points' labels (default: every tuned point)")
    p.add_argument("--examples", type=int, default=2000, help="training examples per task (default: %(default)s)")
    p.add_argument("--eval-examples", type=int, default=1000, help="dev examples per task (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="runs of every point (default: %(default)s)")
    p.add_argument("--share", type=float, default=0.95,
                   help="of full fine-tuning's best dev overall (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's choice)")
    p.add_argument("--cache-off", action=argparse.BooleanOptionalAction, default=True,
                   help="also run each frozen depth with --frozen-cache off: the cache's own gain (default: yes)")
    p.add_argument("--json", default=None, help="also write the figures there, for the study's report (default: none)")
    args = p.parse_args()
    recipe = load_recipe(args.recipe).resolve(model_layers(args.model))
    records = read_results(Path(args.results) / RESULTS) if args.results else []
    points = arms(recipe, records, args.points, args.cache_off)
    base = {**recipe.train, "model": args.model, "data_dir": args.data_dir, "max_train_examples": args.examples,
            "max_eval_examples": args.eval_examples, "epochs": args.epochs, "early_stop_patience": None,
            "test_predictions": False, "save_every": 0, "keep_last": 1, "log_every": 1000, "frozen_cache":
            recipe.train.get("frozen_cache", "auto")}
    names, runs = list(points), {n: [] for n in points}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, name in enumerate(names[r % len(names):] + names[:r % len(names)]):
                runs[name].append(one_run(base, points[name], Path(tmp) / f"r{r}-{i}", args.threads))
                print(f"round {r + 1}: {name:48s} {runs[name][-1]['wall']:7.1f} s", flush=True)
    figures = {name: summary(runs[name], points[name]) for name in names}
    report(args, names, runs, figures)
    if args.json:
        write_json(Path(args.json), args, figures, recipe.tasks)


def summary(runs: list[dict], options: dict) -> dict:
    """One point's figures: seconds per epoch (median, first and third quartile), run, cache, peak MiB, and
    what its epochs' cost depends on (its kind: a study's point of the same kind takes these figures)."""
    return {"kind": epoch_kind(options.get("freeze_upto"), options),
            "s_per_epoch": list(quartiles([s for run in runs for s in run["epochs"]])),
            "run_s": statistics.median(r["wall"] for r in runs),
            "cache_s": statistics.median(r["cache"] for r in runs),
            "peak_rss_mib": statistics.median(r["rss"] for r in runs),
            "cuda_peak_mib": None if any(r["cuda_mib"] is None for r in runs)
            else statistics.median(r["cuda_mib"] for r in runs)}


def write_json(path: Path, args, figures: dict[str, dict], tasks: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "machine": machine_name(), "date": str(datetime.date.today()), "threads": args.threads,
        "examples_per_task": args.examples, "n_eval": eval_examples(args, tasks), "epochs": args.epochs,
        "rounds": args.rounds, "points": figures}, indent=1) + "\n")


def eval_examples(args, tasks: list[str]) -> dict[str, int]:
    """The dev examples each run evaluated on, per task (and its cache held: arms_cost.cache_scale)."""
    return {t: min(args.eval_examples, len(load_task_split(args.data_dir, t, "dev").examples)) for t in tasks}


def report(args, names: list[str], runs: dict[str, list[dict]], figures: dict[str, dict]) -> None:
    full = runs[names[0]]  # the recipe's first point: full fine-tuning
    print(f"\n# {machine_name()}, {args.threads or 'default'} thread(s), {datetime.date.today()}; {args.examples} "
          f"training and {args.eval_examples} dev examples per task, {args.epochs} epochs, {args.rounds} rounds")
    print(f"{'point':48s} {'s/epoch median [IQR]':>24s} {'run s':>7s} {'cache s':>7s} {'peak MiB':>8s} "
          f"{f'to {args.share:.0%} of full':>14s}"
          + ("  GPU peak MiB" if any(f["cuda_peak_mib"] is not None for f in figures.values()) else ""))
    for name in names:
        fig = figures[name]
        med, q1, q3 = fig["s_per_epoch"]
        reach = [time_to(run, args.share * max(s for _, s in f["curve"])) for run, f in zip(runs[name], full)]
        got = [x for x in reach if x is not None]
        print(f"{name:48s} {med:8.1f} [{q1:6.1f}-{q3:6.1f}] {fig['run_s']:7.1f} {fig['cache_s']:7.1f} "
              f"{fig['peak_rss_mib']:8.0f} "
              f"{(f'{statistics.median(got):10.1f} s' if got else 'not reached'):>14s}"
              + (f" ({len(got)}/{len(reach)} rounds)" if got and len(got) < len(reach) else "")
              + (f"  {fig['cuda_peak_mib']:.0f}" if fig["cuda_peak_mib"] is not None else ""))
    for name in names:
        if name + NOCACHE in runs:  # per round: the cache-off run's mean epoch over the cache-on run's
            on = [statistics.mean(r["epochs"]) for r in runs[name]]
            off = [statistics.mean(r["epochs"]) for r in runs[name + NOCACHE]]
            gain = ("n/a (epochs under the clock's resolution)" if min(on) <= 0
                    else "{:.2f}x [IQR {:.2f}-{:.2f}]".format(*paired_ratios(off, on)))
            print(f"cache gain per epoch, {name}: {gain}")


if __name__ == "__main__":
    main()
