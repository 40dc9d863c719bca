"""One table of several runs: the options that differ between them, the kept evaluation's dev metrics, and
the training time; optionally as CSV, and their dev curves overlaid in one figure.

    python -m training.compare runs/full runs/frozen-3 runs/lora --csv compare.csv -o compare.png

The same table as `python -m training.report --compare RUN ...`.
"""
from __future__ import annotations

import sys

from training.args import Parser
from training.common.progress import setup_logging
from training.report import compare
from training.results.summary import RunDirError

PROG = "python -m training.compare"


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    p.add_argument("-o", "--output", metavar="PNG", help="draw the runs' dev curves overlaid there (needs matplotlib)")
    args = p.parse_args(argv)
    setup_logging()
    try:
        print(compare(args.runs, args.csv, args.output), end="")
    except RunDirError as e:
        p.fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
