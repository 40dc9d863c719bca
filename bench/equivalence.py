"""Within a margin of each other? Paired by seed, a study's points against their reference (or one run group
against another, from any two results folders): the difference on a dev metric with its 95% t interval and
paired t p, the two one-sided tests of equivalence (TOST) at +-margin with Holm's correction over the rows,
and the machines each side trained on.

    python bench/equivalence.py --recipe whole docs/freezing-study/whole
    python bench/equivalence.py --pair docs/gpu/2026-11-26-h100-b/full-on-gpu:freezenone-nall-lr3e-05 \\
        docs/freezing-study/whole:freeze3-nall-lr0.0001 --seeds 1 2 3 4 5
    python bench/equivalence.py --recipe whole docs/freezing-study/whole --near-ties

A group in --pair is FOLDER:STEM, STEM a run name without its tasks and seed (freeze3-nall-lr0.0001: depth 3,
the whole files, arm lr0.0001), its reporting runs. The margin is fixed before looking (issue 66: 0.005 on
the overall dev score); TOST p < 0.05 says the difference lies inside it, which "not detected" does not.
--near-ties lists each point's tuning margin (its rate's tuning-split score minus the runner-up's) against
one run's sd (the recipe's near-tie rule) and against the sd of a difference of two runs, sqrt(2) x sd.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import REPO  # noqa: F401  (puts the repository on sys.path)

from training.common.errors import ConfigError  # noqa: E402
from training.experiments.study.arms import METRICS, holm, t_interval  # noqa: E402
from training.experiments.study.arms_report import choice_margin, machines_phrase, tune_spread  # noqa: E402
from training.experiments.study.cli import study_layers  # noqa: E402
from training.experiments.study.protocol import Protocol, borrows  # noqa: E402
from training.experiments.study.recipe import load_recipe  # noqa: E402
from training.experiments.sweep.records import RunKey, read_results  # noqa: E402
from training.results.statistics import paired_tests, tost  # noqa: E402


def stem(record: dict) -> str:
    key = RunKey.of(record)
    d = "none" if key.depth is None else key.depth
    return f"freeze{d}-n{key.size}" + (f"-{key.arm}" if key.arm else "")


def group(spec: str) -> dict[int, dict]:
    """seed -> reporting record of FOLDER:STEM."""
    folder, _, name = spec.rpartition(":")
    runs = {r["seed"]: r for r in read_results(Path(folder) / "results.jsonl")
            if r.get("seed_role", "reporting") == "reporting" and stem(r) == name}
    if not runs:
        raise SystemExit(f"equivalence: no reporting runs named {name} in {folder}")
    return runs


def row(label: str, ref: dict[int, dict], runs: dict[int, dict], metric: str, margin: float,
        seeds: list[int] | None) -> dict | None:
    common = sorted(s for s in runs if s in ref and (seeds is None or s in seeds))
    if len(common) < 2:
        return None
    a = [ref[s]["dev"][metric] for s in common]
    b = [runs[s]["dev"][metric] for s in common]
    return {"label": label, "seeds": common, **paired_tests(a, b), "ci": t_interval([y - x for x, y in zip(a, b)]),
            "tost_p": tost(a, b, margin)["tost_p"],
            "machines": f"{machines_phrase([runs[s] for s in common])} vs {machines_phrase([ref[s] for s in common])}"}


def resolved(name: str, layers: int | None):
    """The recipe, its depths resolved on `layers` or else on the model it names (MiniLM's 6 by default)."""
    recipe = load_recipe(name)
    return recipe.resolve(study_layers(recipe, None, layers, fix=f"give --recipe {name}'s depth with --layers"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("results", nargs="?", type=Path, help="a study's results folder (with --recipe)")
    p.add_argument("--recipe", help="the study's recipe: every point against its reference")
    p.add_argument("--pair", nargs=2, metavar=("A", "B"), help="B - A, each FOLDER:STEM")
    p.add_argument("--seeds", nargs="+", type=int, help="only these seeds (default: every seed both have)")
    p.add_argument("--metric", default="overall", choices=METRICS)
    p.add_argument("--margin", type=float, default=0.005, help="equivalence margin (default: %(default)s)")
    p.add_argument("--layers", type=int, help="the model's depth, to resolve the recipe's depths and shares "
                   "(default: the depth of the model the recipe names)")
    p.add_argument("--near-ties", action="store_true", help="with --recipe: the tuning margins against the noise")
    args = p.parse_args(argv)
    try:
        recipe = resolved(args.recipe, args.layers) if args.recipe else None
    except ConfigError as e:  # a recipe that cannot be read, or depths its model lacks: one line
        print(f"equivalence.py: error: {e}", file=sys.stderr)
        return 2
    if args.near_ties:
        if not (args.recipe and args.results):
            p.error("--near-ties needs a results folder and --recipe")
        protocol = Protocol(recipe, read_results(args.results / "results.jsonl"))
        print("| point | margin | one run's sd | sqrt(2) x sd | near tie by sd | by sqrt(2) x sd |")
        print("|---|---:|---:|---:|---|---|")
        for point in recipe.points:
            if borrows(point):
                continue
            m, sd = choice_margin(protocol, point), tune_spread(protocol, point["label"])
            if m == m and sd == sd:
                print(f"| {point['label']} | {m:.4f} | {sd:.4f} | {sd * 2 ** 0.5:.4f} | {'yes' if m < sd else ''} "
                      f"| {'yes' if m < sd * 2 ** 0.5 else ''} |")
        return 0
    rows = []
    if args.pair:
        r = row(f"{args.pair[1]} - {args.pair[0]}", group(args.pair[0]), group(args.pair[1]), args.metric,
                args.margin, args.seeds)
        rows = [r] if r else []
    elif args.recipe and args.results:
        protocol = Protocol(recipe, read_results(args.results / "results.jsonl"))
        reference = recipe.points[0]["label"]
        for point in recipe.points:
            against = point.get("vs", reference)
            if point["label"] == against or protocol.same_runs(point["label"], against):
                continue
            r = row(point["label"], protocol.reporting(against), protocol.reporting(point["label"]), args.metric,
                    args.margin, args.seeds)
            if r:
                rows.append(r)
    else:
        p.error("give a results folder with --recipe, or --pair")
    for r, adj in zip(rows, holm([r["tost_p"] for r in rows])):
        r["tost_holm"] = adj
    print(f"{args.metric}, B - A paired by seed; TOST at +-{args.margin} (Holm over the {len(rows)} rows)\n")
    print("| B (against A) | seeds | B - A [95% t] | paired t p | TOST p | TOST Holm | machines (B vs A) |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['label']} | {','.join(map(str, r['seeds']))} | {r['diff']:+.4f} [{r['ci'][0]:+.4f}, "
              f"{r['ci'][1]:+.4f}] | {r['t_p']:.3f} | {r['tost_p']:.3f} | {r['tost_holm']:.3f} | {r['machines']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
