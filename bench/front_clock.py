"""How far a study's modelled speed-ups are from the clock: one reporting run of each point on the
quality-against-cost front (and of full fine-tuning, the reference) trained again end to end, one at a
time, on an otherwise idle machine, through the study's own code path (the same subsets, tuning split,
rate, early stopping, evaluations and dev scoring), and its seconds set beside the cost the study's report
models for that same run from the cost measured apart (training/experiments/study/arms_cost.py).

    python bench/front_clock.py --results docs/freezing-study/whole --threads 1 \\
        --out /tmp/clock --json docs/freezing-study/whole/clock/clock.json
    python bench/front_clock.py --results docs/freezing-study/whole --points "2/6 of the layers frozen" --dry-run
    python bench/front_clock.py --recipe mpnet-depth --results docs/freezing-study/mpnet-depth --dry-run

A recipe that names its model (mpnet-depth.json's "train") trains again on it without --model.

Per run: the epochs it trained and its dev overall, recorded and again (the same bits where the machine and
the code compute alike); its wall seconds (model loading, the cache's building, the epochs, an evaluation
after each, the dev scoring) and training seconds (the cache's building and the epochs, what the model
counts); the speed-up over full fine-tuning by each clock, and the one the model gives for the same runs
as they trained again (a run whose code changed since its record may train other epochs). The reruns'
records go to --out/results.jsonl in the study's format (commit and machine in each); a run found there is
not trained again, so that a stopped clock goes on where it stopped (time it on the same idle machine). Without
--points: the front (the points no cheaper point matches or beats in mean dev overall, costs as
modelled). One round: a run of whole files takes minutes to an hour; the reference trains first.
"""
from __future__ import annotations

import json
import logging
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from common import cpu_model, data_parser  # noqa: E402  (puts the repository on sys.path)

from training.common.progress import setup_logging  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.experiments.study.arms_cost import cache_scale, cost_rows, measured, read_cost, run_cost, stretches  # noqa: E402
from training.experiments.study.arms_figures import pareto_front  # noqa: E402
from training.experiments.study.cli import base_config, study_layers  # noqa: E402
from training.experiments.study.protocol import ArmOverrides, Protocol  # noqa: E402
from training.experiments.study.recipe import load_recipe  # noqa: E402
from training.experiments.sweep.engine import Workers, one_run  # noqa: E402
from training.experiments.sweep.records import RESULTS, RunKey, completed_settings, read_results, settings_of  # noqa: E402
from training.experiments.sweep.subsets import Grid, training_subsets  # noqa: E402

log = logging.getLogger("front_clock")


def front_labels(recipe, records: list[dict], measurements: list[dict], reference: str) -> list[str]:
    """The points on the front, cheapest first, as the report's front.png draws it: mean dev overall of the
    reporting runs against the modelled mean end-to-end cost (the reference's runs at its own cost)."""
    protocol = Protocol(recipe, records)
    rows = cost_rows(recipe, records, measurements, reference)
    cost = {r["label"]: r["cost"] for r in rows}
    cost[reference] = rows[0]["cost"] * rows[0]["speedup"] if rows else 1.0
    mean = {label: statistics.mean(r["dev"]["overall"] for r in protocol.reporting(label).values()) for label in cost}
    front = set(pareto_front([(cost[label], mean[label]) for label in cost]))
    return [label for label in sorted(cost, key=cost.get) if (cost[label], mean[label]) in front]


def modelled_speedup(recipe, measurements: list[dict], label: str, record: dict, reference: str,
                     reference_record: dict) -> float:
    """The reference run's modelled end-to-end cost over this run's, as the study's report models them:
    from the first measurement that holds both points (arms_cost.cost_rows' choice)."""
    points = {p["label"]: p for p in recipe.points}
    for m in measurements:
        full, plan = measured(recipe, m, points[reference]), stretches(recipe, m, points[label], record)
        if full is not None and plan is not None:
            return (run_cost(reference_record, [(0, full)], full)
                    / run_cost(record, plan, full, cache_factor=cache_scale(m, record)))
    raise ValueError(f"--points {label!r}: no cost measurement in cost/ holds its figures")


def rerun(recipe, base: TrainConfig, record: dict, out: Path, threads: int | None) -> dict:
    """The recorded run trained again by the study's engine into out/results.jsonl; its new record (the one
    there already, where an earlier call of this script trained it: a stopped clock goes on where it stopped)."""
    key = RunKey.of(record)
    done = {RunKey.of(r): r for r in read_results(out / RESULTS)}
    if key in done:
        log.info("%s: trained again already (%s)", key.name, out / RESULTS)
        return done[key]
    grid = Grid(recipe.tasks, recipe.sizes, [key.seed], recipe.tuning_split)
    subsets = training_subsets(grid, base, flag="--results' recipe sizes")
    if isinstance(subsets, str):
        raise ValueError(subsets)
    got = one_run(grid, Workers(threads), base, key, subsets, out, out / "runs", settings_of(base),
                  ArmOverrides(recipe).get(key.arm))
    if isinstance(got, str):
        raise RuntimeError(got)
    return got


def settings_drift(record: dict, base: TrainConfig) -> list[str]:
    """The recorded settings this code would train differently (the data folder aside)."""
    now, then = settings_of(base), completed_settings(record.get("settings", {}))
    return [f"{k}: {then.get(k)!r} then, {now.get(k)!r} now" for k in sorted(set(now) | set(then))
            if k != "data_dir" and now.get(k) != then.get(k)]


def table(rows: list[dict]) -> str:
    full = rows[0]
    lines = ["| point | epochs (recorded / again) | dev overall (recorded / again) | wall s | training s | "
             "speed-up by wall | by training s | modelled | training / modelled |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        by_wall = full["wall"] / r["wall"]
        # a tiny run's epochs can round to 0 s (the trainer records tenths): no ratio then
        by_train = full["train"] / r["train"] if r["train"] else None
        train = "n/a" if by_train is None else f"{by_train:.2f}x"
        error = "n/a" if by_train is None else f"{by_train / r['modelled']:.2f}"
        lines.append(f"| {r['label']} | {r['epochs'][0]} / {r['epochs'][1]} | {r['dev'][0]:.4f} / {r['dev'][1]:.4f} "
                     f"| {r['wall']:.0f} | {r['train']:.0f} | {by_wall:.2f}x | {train} | {r['modelled']:.2f}x | "
                     f"{error} |")
    return "\n".join(lines)


def row(label: str, old: dict, new: dict, modelled: float) -> dict:
    """One rerun beside its record; modelled: its modelled speed-up over the reference's run."""
    return {"label": label, "seed": old["seed"], "epochs": [old["epochs_run"], new["epochs_run"]],
            "dev": [old["dev"]["overall"], new["dev"]["overall"]], "same_scores": old["dev"] == new["dev"],
            "wall": new["wall_seconds"], "train": new["train_seconds"] + (new["frozen_cache_seconds"] or 0),
            "modelled": modelled, "recorded_commit": old.get("commit"), "commit": new.get("commit"),
            "cpu": new.get("cpu")}


def main(argv: list[str] | None = None) -> int:
    p = data_parser(__doc__, model_default=None)
    p.add_argument("--recipe", default="whole", help="the study's recipe (default: %(default)s)")
    p.add_argument("--results", required=True, type=Path, help="the study's results folder (results.jsonl, cost/)")
    p.add_argument("--points", nargs="+", default=None, help="the points' labels (default: the front)")
    p.add_argument("--seed", type=int, default=1,
                   help="the reporting seed whose runs train again (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("runs/front-clock"),
                   help="the reruns' folder (default: %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows there (default: none)")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their modelled speed-ups, train nothing")
    args = p.parse_args(argv)
    setup_logging(logging.INFO)
    try:
        recipe = load_recipe(args.recipe)
        recipe = recipe.resolve(study_layers(recipe, args.model))  # the depths on the model its runs train
        records, measurements = read_results(args.results / RESULTS), read_cost(args.results)
        if not measurements:
            raise ValueError(f"{args.results / 'cost'}: no cost measurement (bench/study_cost.py --json)")
        reference, protocol = recipe.points[0]["label"], Protocol(recipe, records)
        if not protocol.reporting(reference):
            raise ValueError(f"{args.results / RESULTS}: no reporting run of {reference!r}, the reference of "
                             f"--recipe {args.recipe} (is it this study's recipe?)")
        labels = [reference] + [x for x in args.points or front_labels(recipe, records, measurements, reference)
                                if x != reference]
        runs = [(label, protocol.reporting(label).get(args.seed)) for label in labels]
        missing = [label for label, r in runs if r is None]
        if missing:
            raise ValueError(f"--points {missing[0]!r}: no reporting run of seed {args.seed} in {args.results}")
        modelled = {label: modelled_speedup(recipe, measurements, label, r, reference, runs[0][1])
                    for label, r in runs}
    except (ValueError, KeyError) as e:
        print(f"front_clock: error: {e}", file=sys.stderr)
        return 2
    # the study's own run settings, its loss logging at the trainer's default (fewer lines in a timed run)
    base = replace(base_config(recipe, args), log_every=TrainConfig.log_every)
    for label, r in runs:
        print(f"{label}: seed {args.seed}, {r['epochs_run']} epochs, modelled {modelled[label]:.2f}x"
              + "".join(f"\n  settings differ: {d}" for d in settings_drift(r, base)), flush=True)
    if args.dry_run:
        return 0
    again = {}
    for label, old in runs:
        again[label] = rerun(recipe, base, old, args.out, args.threads)
        print(f"{label}: {again[label]['wall_seconds']:.0f} s wall", flush=True)
    # the model asked about the runs as they trained again (a run whose code changed since may train
    # other epochs than its record's)
    rows = [row(label, old, again[label], modelled_speedup(recipe, measurements, label, again[label], reference,
                                                           again[reference])) for label, old in runs]
    where = "; ".join(dict.fromkeys(f"{m['machine']}, {m['date']}" for m in measurements))
    print(f"\n# {cpu_model()}, {args.threads} thread(s); seed {args.seed}; modelled from the cost measured on {where}"
          f"\n\n{table(rows)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": cpu_model(), "threads": args.threads, "seed": args.seed,
                                         "modelled_from": [[m["machine"], m["date"]] for m in measurements],
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
