"""Do a study's runs score alike on two machines, or in two precisions? The runs that two results folders
both hold (the same run names: tasks, depth, size, seed, arm), trained on machine A and machine B (or under
two recipes differing in one setting), paired by name; the reporting runs, or with --roles the tuning
runs too (each is the same configuration trained twice, whichever rate it tried).

    python bench/device_twin.py docs/freezing-study/whole docs/gpu/2026-11-26-h100-b/full-on-gpu \\
        --names "CPU (bf16)" "H100 (bf16)"
    python bench/device_twin.py docs/freezing-study/whole-size-bf16 docs/freezing-study/whole-size \\
        --names bf16 fp32 --roles reporting tuning

Per dev metric: each machine's mean and sd over the runs, the paired difference B - A (mean, 95% t
interval, paired t p) and a paired bootstrap over the dev examples (each resample scores every run of
both on the same examples; the 95% interval of the difference of their means). bench/same_bits.py asks
whether two commits compute the same bits on one machine; this asks whether two machines, which never
compute the same bits (other kernels, other summation orders), give the same answers within the seeds'
spread, so that a study may take runs from both.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from common import REPO  # noqa: F401  (puts the repository on sys.path)

from training.experiments.study.arms import METRICS, paired_bootstrap, read_predictions, t_interval  # noqa: E402
from training.experiments.study.arms_report import dev_labels, machines_phrase  # noqa: E402
from training.experiments.sweep.records import RunKey, read_results  # noqa: E402
from training.results.statistics import interval, mean_sd, paired_tests  # noqa: E402


def pair_runs(a_records: list[dict], b_records: list[dict], roles: tuple[str, ...] = ("reporting",)
              ) -> list[tuple[dict, dict]]:
    """The runs of the given seed roles both folders hold, as (A's record, B's record), in name order."""
    a = {RunKey.of(r): r for r in a_records if r.get("seed_role", "reporting") in roles}
    b = {RunKey.of(r): r for r in b_records if r.get("seed_role", "reporting") in roles}
    return [(a[k], b[k]) for k in sorted(set(a) & set(b), key=lambda k: k.name)]


def compare_pairs(pairs: list[tuple[dict, dict]], folders: tuple[Path, Path], labels: dict[str, np.ndarray] | None,
                  reps: int = 2000, seed: int = 0) -> list[dict]:
    """One row per metric: the two machines' mean and sd, the paired tests, the bootstrap's interval."""
    boot = {}
    if labels is not None:
        preds = [[read_predictions(folder, pair[i]) for pair in pairs] for i, folder in enumerate(folders)]
        boot = paired_bootstrap(preds[0], preds[1], labels, reps, seed)
    rows = []
    for metric in METRICS:
        a = [pa["dev"][metric] for pa, _ in pairs]
        b = [pb["dev"][metric] for _, pb in pairs]
        rows.append({"metric": metric, "a": mean_sd(a), "b": mean_sd(b), **paired_tests(a, b),
                     "ci": t_interval(np.subtract(b, a)),
                     "boot_ci": interval(boot[metric]) if metric in boot else None})
    return rows


def table(rows: list[dict], names: tuple[str, str]) -> str:
    head = (f"| metric | {names[0]}: mean (sd) | {names[1]}: mean (sd) | {names[1]} - {names[0]} [95% t interval] "
            f"| paired t p | bootstrap over dev examples, 95% |")
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        boot = "-" if r["boot_ci"] is None else f"[{r['boot_ci'][0]:+.4f}, {r['boot_ci'][1]:+.4f}]"
        lines.append(f"| {r['metric']} | {r['a'][0]:.4f} ({r['a'][1]:.4f}) | {r['b'][0]:.4f} ({r['b'][1]:.4f}) | "
                     f"{r['diff']:+.4f} [{r['ci'][0]:+.4f}, {r['ci'][1]:+.4f}] | {r['t_p']:.3f} | {boot} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("a", type=Path, help="results folder of machine A (results.jsonl, dev-predictions/)")
    p.add_argument("b", type=Path, help="results folder of machine B")
    p.add_argument("--names", nargs=2, default=("A", "B"), help="the two machines' names in the table")
    p.add_argument("--data-dir", help="the course files the runs were scored on, for the bootstrap "
                                      "(default: A's records' data folder; checked against A's baselines.json)")
    p.add_argument("--no-bootstrap", action="store_true", help="the paired tests alone")
    p.add_argument("--roles", nargs="+", choices=("reporting", "tuning"), default=["reporting"],
                   help="the seed roles whose runs pair (default: reporting)")
    args = p.parse_args(argv)
    records = [read_results(folder / "results.jsonl") for folder in (args.a, args.b)]
    pairs = pair_runs(*records, roles=tuple(args.roles))
    if len(pairs) < 2:
        print(f"device_twin: {args.a} and {args.b} share {len(pairs)} {'/'.join(args.roles)} run(s); "
              f"the paired tests need 2",
              file=sys.stderr)
        return 2
    labels = None if args.no_bootstrap else dev_labels([a for a, _ in pairs], ["sst", "para", "sts"], args.a,
                                                       args.data_dir)
    print(f"{len(pairs)} runs in both: {', '.join(RunKey.of(a).name for a, _ in pairs)}")
    print(f"A: {machines_phrase([a for a, _ in pairs])}; B: {machines_phrase([b for _, b in pairs])}\n")
    print(table(compare_pairs(pairs, (args.a, args.b), labels), tuple(args.names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
