"""Does recipe B beat recipe A? Statistics over seeds and over dev examples.

    minbert stats runs/plain-s1 runs/plain-s2 runs/plain-s3 \\
        --vs runs/smart-s1 runs/smart-s2 runs/smart-s3 --names plain smart --data-dir data

Each argument is a run directory of run_multitask.py: its metrics.jsonl gives the dev metrics of
its best evaluation (the one best.pt holds), its config.json its seed, and its dev prediction files
({task}-dev-output.csv, in RUN/predictions or else the run's --predictions-dir) the per-example
predictions the bootstrap needs. The runs of the two groups are paired by seed. An argument may also
be a prediction set with its manifest.json (an ensemble's --predictions-dir from training.ensemble):
its dev metrics are the manifest's, it has no seed, so it is paired by order (--pair-by-order), e.g.
`minbert stats runs/s5 --vs ens --pair-by-order --data-dir data` for an ensemble against
its best member (one pair: no t-test, the bootstrap alone).

For each dev metric (sst_acc, para_acc, sts_pearson, overall):
- mean +- sd over the seeds of each group (sample sd, ddof 1);
- the paired differences B - A: their mean, the paired t-test (scipy.stats.ttest_rel) and the
  Wilcoxon signed-rank test (scipy.stats.wilcoxon; exact for few seeds, so its smallest two-sided
  p is 0.25 with 3 seeds and 0.0625 with 5: it can only ever agree with the t-test from 6 seeds on);
- with --data-dir, a paired bootstrap over the dev examples: --bootstrap resamples of each dev set,
  each scored for every run on the same resampled examples, giving the difference of the groups'
  mean metrics on each resample and the 2.5 and 97.5 percentiles of those differences (overall:
  the course's mean of the three tasks, each task's dev set resampled on its own). The t-test asks
  whether the difference could be the seeds' doing, the bootstrap whether it could be the dev
  set's (which examples it happens to hold).

The verdict claims "B > A" (or "A > B") only when the paired t-test gives p < --alpha and, where
the bootstrap ran, its 95% interval excludes 0; otherwise "no claim".
"""
from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

from data.loaders import DataError
from training.args import Parser, check_outputs
from training.common.progress import setup_logging
from training.results.statistics import CI_LEVEL, StatsError, compare, read_run

log = logging.getLogger(__name__)

PROG = "python -m training.experiments.stats"


def _num(x: float, digits: int = 4, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def markdown(rows: list[dict], names: tuple[str, str]) -> str:
    n = rows[0]["pairs"] if rows else 0
    lines = [f"| dev metric | A: {names[0]} ({n} seeds) | B: {names[1]} | B - A | paired t (p) | Wilcoxon p "
             f"| bootstrap B - A, {CI_LEVEL:.0%} CI | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = "-" if math.isnan(r["t"]) else f"{r['t']:.2f} ({_num(r['t_p'], 3)})"
        ci = f"[{_num(r['boot_lo'], sign=True)}, {_num(r['boot_hi'], sign=True)}]" if "boot_lo" in r else "-"
        lines.append(f"| {r['metric']} | {_num(r['mean_a'])} ± {_num(r['sd_a'])} | {_num(r['mean_b'])} ± "
                     f"{_num(r['sd_b'])} | {_num(r['diff'], sign=True)} | {t} | {_num(r['wilcoxon_p'], 3)} | {ci} "
                     f"| {r['verdict']} |")
    return "\n".join(lines)


def main(argv=None, prog: str = PROG) -> int:
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("a", nargs="+", metavar="A_RUN", help="run directories of recipe A, one per seed")
    p.add_argument("--vs", nargs="+", required=True, metavar="B_RUN", help="run directories of recipe B")
    p.add_argument("--names", nargs=2, default=["A", "B"], metavar=("A", "B"), help="the recipes' names in the table")
    p.add_argument("--data-dir", default=None,
                   help="the course's dev files: with it, the paired bootstrap over dev examples runs")
    p.add_argument("--bootstrap", type=int, default=10_000, metavar="N", help="resamples (default: %(default)s)")
    p.add_argument("--bootstrap-seed", dest="seed", type=int, default=0,
                   help="the bootstrap's random seed (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=0.05, help="the t-test's level for a verdict (default: %(default)s)")
    p.add_argument("--pair-by-order", action="store_true",
                   help="pair the i-th run of A with the i-th of B instead of by seed")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows to FILE as JSON")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json FILE")
    args = p.parse_args(argv)
    setup_logging()
    if args.bootstrap < 1:
        p.error(f"--bootstrap must be >= 1, not {args.bootstrap}")
    if not 0 < args.alpha < 1:
        p.error(f"--alpha must be in (0, 1), not {args.alpha}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        p.error(f"--data-dir {args.data_dir}: no such directory")
    # before the runs are read and the bootstrap runs
    check_outputs(p, files={"--json": args.json}, overwrite=args.overwrite)
    try:
        a, b = [read_run(r) for r in args.a], [read_run(r) for r in args.vs]
        rows = compare(a, b, args.data_dir, args.bootstrap, args.seed, args.alpha, args.pair_by_order)
    except (StatsError, DataError) as e:
        p.fail(str(e))
    print(markdown(rows, tuple(args.names)))
    if args.json:
        plain = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]
        Path(args.json).write_text(json.dumps(plain, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
