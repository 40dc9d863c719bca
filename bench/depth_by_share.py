"""Does a freezing answer carry over from one model to another in layers or in share? Each study's plain
depth points (no arm, their own rate) against that study's full fine-tuning, paired by seed: the dev overall
difference with its 95% t interval, placed by the share of the encoder's layers frozen and by the layers
left to train. One table (markdown) and, with --out, a figure of the two placings side by side. A study is
FOLDER:RECIPE (the model's depth read from the recipe's model) or FOLDER:RECIPE:LAYERS; its points without
reporting runs yet are left out; a folder given with two recipes (its study's and its near-tie recipe) is
one study with the points of both. No correction over the rows: each study's own report holds its Holm
family; this sets the same differences side by side.

--contrast answers "in layers or in share" with intervals: for every two studies given, each pair of points
frozen to the same share, and each pair leaving the same number of layers to train, one loss minus the
other with Welch's 95% interval over the two sets of per-seed differences (the two models' runs are
independent) and its p, Holm over every contrast printed. Give it studies at one scale only: a contrast
across scales measures the scale too. Given its near-tie recipe too (FOLDER:mpnet-depth-rates.json), a
study's rows add its twins, each plain depth at its runner-up rate against the same full fine-tuning, and the
contrasts pair points at the chosen rates with each other and twins with twins (the figure draws the chosen).

    python bench/depth_by_share.py docs/freezing-study/mpnet-scale-minilm:mpnet-scale-minilm \\
        docs/freezing-study/mpnet-depth:mpnet-depth --contrast --out docs/freezing-study/depth-by-share.png
    R=training/experiments/study/recipes  # the same with each study's twins (its near-tie recipe):
    python bench/depth_by_share.py docs/freezing-study/mpnet-scale-minilm:mpnet-scale-minilm \\
        docs/freezing-study/mpnet-scale-minilm:$R/mpnet-scale-minilm-rates.json \\
        docs/freezing-study/mpnet-depth:mpnet-depth docs/freezing-study/mpnet-depth:$R/mpnet-depth-rates.json --contrast
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from pathlib import Path

from common import REPO  # noqa: F401  (puts the repository on sys.path)

from training.common.errors import ConfigError  # noqa: E402
from training.experiments.study.arms import holm, t_interval, welch  # noqa: E402
from training.experiments.study.arms_figures import depth_position, plain_labels  # noqa: E402
from training.experiments.study.cli import study_layers, study_model  # noqa: E402
from training.experiments.study.protocol import Protocol  # noqa: E402
from training.experiments.study.recipe import load_recipe  # noqa: E402
from training.experiments.sweep.records import RESULTS, read_results  # noqa: E402

MARGIN = 0.005  # issue 66's equivalence margin on the overall dev score, drawn on the figure


def study_rows(spec: str) -> list[dict]:
    """One row per plain frozen depth of the study FOLDER:RECIPE[:LAYERS] with paired reporting seeds."""
    folder, name, layers = parse_spec(spec)
    recipe = load_recipe(name)
    model = study_model(recipe, None)  # the model its runs train
    layers = study_layers(recipe, None, layers, fix=f"give its depth as {folder}:{name}:LAYERS")
    recipe = recipe.resolve(layers)
    protocol = Protocol(recipe, read_results(Path(folder) / RESULTS))
    reference, plain = protocol.reporting(recipe.points[0]["label"]), plain_labels(recipe)
    twins = {p["label"] for p in recipe.points if p.get("runner_up_of") in plain}  # plain depths' near-tie twins
    rows = []
    for point in recipe.points:
        depth = recipe.depth(point["depth"])
        runs = protocol.reporting(point["label"])
        seeds = sorted(set(runs) & set(reference))
        if point["label"] not in plain | twins or depth is None or not seeds:
            continue
        diffs = [runs[s]["dev"]["overall"] - reference[s]["dev"]["overall"] for s in seeds]
        frozen = depth_position(depth)  # encoder layers frozen: the embeddings alone (-1) freeze none
        ci = t_interval(diffs)  # nan with one seed
        rows.append({"study": Path(folder).name, "model": model, "layers": layers, "label": point["label"],
                     "frozen": frozen, "share": frozen / layers, "left": layers - frozen, "seeds": len(seeds),
                     "diff": statistics.mean(diffs), "ci": ci, "diffs": diffs,
                     "rate": "runner-up" if point["label"] in twins else "chosen"})
    return sorted(rows, key=lambda r: (r["frozen"], r["rate"]))


def parse_spec(spec: str) -> tuple[str, str, int | None]:
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ConfigError(f"{spec}: a study is FOLDER:RECIPE or FOLDER:RECIPE:LAYERS")
    if len(parts) == 3 and not parts[2].isdigit():
        raise ConfigError(f"{spec}: LAYERS must be a whole number, got {parts[2]!r}")
    return parts[0], parts[1], int(parts[2]) if len(parts) == 3 else None


def table(rows: list[dict]) -> str:
    lines = ["| study (model) | point | layers frozen | share frozen | layers trained | seeds | "
             "dev overall against its full fine-tuning [95% t CI] |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lo, hi = r["ci"]
        ci = "" if math.isnan(lo) else f" [{lo:+.4f}, {hi:+.4f}]"
        lines.append(f"| {r['study']} ({r['model']}) | {r['label']} | {r['frozen']} of {r['layers']} | "
                     f"{r['share']:.0%} | {r['left']} | {r['seeds']} | {r['diff']:+.4f}{ci} |")
    return "\n".join(lines)


def contrasts(rows: list[dict]) -> list[dict]:
    """Every two studies' points matched by share frozen, then by layers left to train, both at the rates
    their tuning chose or both at the runner-up rates (a near-tie recipe's twins): the first study's loss
    minus the second's (Welch over their per-seed differences), Holm over all of them."""
    by_study: dict[str, list[dict]] = {}
    for r in rows:
        if r["seeds"] >= 2:  # Welch needs a spread on both sides
            by_study.setdefault(r["study"], []).append(r)
    out = []
    for first, second in itertools.combinations(by_study.values(), 2):
        for key, placing in (("share", "share frozen"), ("left", "layers trained")):
            for a, b in itertools.product(first, second):
                if math.isclose(a[key], b[key]) and a["rate"] == b["rate"]:
                    diff, ci, p = welch(a["diffs"], b["diffs"])
                    out.append({"placing": f"{placing}, {a['rate']} rates", "a": a, "b": b, "diff": diff,
                                "ci": ci, "p": p})
    for c, adjusted in zip(out, holm([c["p"] for c in out])):
        c["holm"] = adjusted
    return out


def contrast_table(found: list[dict]) -> str:
    lines = ["| matched by | point (study) | its loss | against (study) | its loss | "
             "difference of the losses [95% Welch CI] | p | Holm p |", "|---|---|---:|---|---:|---:|---:|---:|"]
    for c in found:
        a, b, (lo, hi) = c["a"], c["b"], c["ci"]
        lines.append(f"| {c['placing']} | {a['label']} ({a['study']}) | {a['diff']:+.4f} | {b['label']} "
                     f"({b['study']}) | {b['diff']:+.4f} | {c['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
                     f"{c['p']:.2g} | {c['holm']:.2g} |")
    return "\n".join(lines)


def figure(rows: list[dict], path: Path) -> Path | None:
    from training.experiments.study.figures import pyplot
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=100, sharey=True)
    studies = list(dict.fromkeys((r["study"], r["model"]) for r in rows))
    placings = (("share", "by the share of layers frozen"), ("left", "by the layers left to train"))
    for ax, (key, title) in zip(axes, placings):
        for i, (study, model) in enumerate(studies):
            mine = [r for r in rows if r["study"] == study]
            err = [[0 if math.isnan(r["ci"][0]) else r["diff"] - r["ci"][0] for r in mine],
                   [0 if math.isnan(r["ci"][1]) else r["ci"][1] - r["diff"] for r in mine]]
            ax.errorbar([r[key] for r in mine], [r["diff"] for r in mine], yerr=err, marker="os^D"[i % 4],
                        capsize=3, linestyle="-", label=f"{study} ({model})")
        ax.axhline(0, color="grey", linewidth=1)
        for m in (-MARGIN, MARGIN):
            ax.axhline(m, color="grey", linestyle=":", linewidth=1)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("encoder layers frozen / layers")
    axes[1].set_xlabel("encoder layers trained")
    axes[0].set_ylabel("dev overall minus full fine-tuning's (95% t CI)")
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("studies", nargs="+", help="FOLDER:RECIPE or FOLDER:RECIPE:LAYERS, one per study "
                   "(and FOLDER:NEAR_TIE_RECIPE for its twins)")
    p.add_argument("--contrast", action="store_true",
                   help="also each two studies' losses at the same share and at the same layers trained, "
                        "Welch intervals, Holm over them (studies at one scale only)")
    p.add_argument("--out", type=Path, default=None, help="also draw the figure there (a .png; default: none)")
    args = p.parse_args(argv)
    try:
        found = {(r["study"], r["label"]): r for spec in args.studies for r in study_rows(spec)}
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    studies = list(dict.fromkeys(r["study"] for r in found.values()))  # a folder given twice is one study
    rows = sorted(found.values(), key=lambda r: (studies.index(r["study"]), r["frozen"], r["rate"]))
    print(table(rows))
    if args.contrast:
        matched = contrasts(rows)
        none = "no two studies share a share or a number of layers trained"
        print("\n" + (contrast_table(matched) if matched else none))
    chosen = [r for r in rows if r["rate"] == "chosen"]  # a twin drawn beside its point would read as a depth
    if args.out and chosen and figure(chosen, args.out):
        print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
