"""Does a frozen point's gap to full fine-tuning change with the training-set size, against either of full
fine-tuning's two near-tied rates? The size study's comparison (training.experiments.study.arms.gap_changes: the whole
files' gap minus a smaller size's, Welch's t over the two sizes' seeds, Holm over the six comparisons), its
t test alone, with the reference at each size either the rate its tuning chose or the runner-up rate its
twin trained at (docs/freezing-study/whole-size/rates/).

    python bench/size_gaps.py docs/freezing-study/whole-size
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import REPO  # noqa: F401  (puts the repository on sys.path)
from equivalence import group  # noqa: E402

from training.experiments.study.arms import holm, welch  # noqa: E402

REFERENCE = {"chosen": {"all": "freezenone-nall-e3-lr3e-05", 3000: "freezenone-n3000-e8-lr3e-05",
                        1000: "freezenone-n1000-e24-lr0.0001"},
             "runner-up": {"all": "freezenone-nall-e3-lr0.0001", 3000: "freezenone-n3000-e8-lr0.0001",
                           1000: "freezenone-n1000-e24-lr3e-05"}}
POINTS = {"half the layers frozen": {"all": "freeze3-nall-e3-lr0.0001", 3000: "freeze3-n3000-e8-lr3e-05",
                                     1000: "freeze3-n1000-e24-lr0.0003"},
          "the heads alone": {"all": "freeze6-nall-e3-lr0.03", 3000: "freeze6-n3000-e8-lr0.1",
                              1000: "freeze6-n1000-e24-lr0.01"},
          "the heads alone, siamese": {"all": "freeze6-nall-e3-siamese-lr0.001",
                                       3000: "freeze6-n3000-e8-siamese-lr0.0003",
                                       1000: "freeze6-n1000-e24-siamese-lr0.0003"}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("results", nargs="?", type=Path, default=Path("docs/freezing-study/whole-size"),
                   help="the size study's results folder (default: %(default)s)")
    folder = p.parse_args(argv).results

    def gaps(point: str, ref: str) -> list[float]:
        a, b = group(f"{folder}:{ref}"), group(f"{folder}:{point}")
        return [b[s]["dev"]["overall"] - a[s]["dev"]["overall"] for s in sorted(set(a) & set(b))]

    print("| reference rates | point | from | change of the overall gap [95% Welch t] | t p | Holm |")
    print("|---|---|---:|---:|---:|---:|")
    for name, ref in REFERENCE.items():
        rows = [(p, small, *welch(gaps(by["all"], ref["all"]), gaps(by[small], ref[small])))
                for p, by in POINTS.items() for small in (1000, 3000)]
        for (p, small, d, ci, pv), h in zip(rows, holm([r[4] for r in rows])):
            print(f"| {name} | {p} | {small} | {d:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}] | {pv:.3f} | {h:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
