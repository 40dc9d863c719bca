"""Do two commits train to the same bits? The check before a long study's pinned worktree moves to a newer
commit: the same short run_multitask.py runs at each (full fine-tuning and a frozen prefix, by default),
and their metrics.jsonl records (timings left out) and prediction files must be equal byte for byte.

    python bench/same_bits.py f88369c HEAD --threads 1
    python bench/same_bits.py f88369c HEAD --depths none 3 --examples 300 --precision bf16
    python bench/same_bits.py 1bb6211 HEAD --depths 4 --flags=--smart     # the runs a study has left

Each commit gets a detached git worktree in a temporary folder (removed afterwards). Exit status 0: the
same bits; 1: the first difference is printed.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, data_parser  # noqa: E402  (puts the repository on sys.path)

TIMINGS = ("seconds", "time", "rss", "it_s")  # record fields that measure the machine, not the training


def run_at(commit: str, where: Path, args, depth: str) -> Path:
    tree = where / f"tree-{commit}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, check=True,
                       capture_output=True)
    out = where / f"run-{commit}-{depth}"
    env = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    subprocess.run(run_command(args, depth, out), cwd=tree, env=env, check=True, capture_output=True)
    return out


def run_command(args, depth: str, out: Path) -> list[str]:
    """The short run both commits make: one epoch on --examples per task, the study's precision, --flags."""
    return [sys.executable, "run_multitask.py", "--data-dir", str(Path(args.data_dir).resolve()), "--model",
            args.model, "--epochs", "1", "--max-train-examples", str(args.examples), "--max-eval-examples",
            str(args.examples), "--precision", args.precision, "--freeze-upto", depth, "--seed", "1", "--out-dir",
            str(out), "--log-every", "1", *shlex.split(args.flags)]


def records(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMINGS)} for r in rows]


def first_difference(a: Path, b: Path) -> str | None:
    for i, (x, y) in enumerate(zip(records(a), records(b))):
        if x != y:
            keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
            return f"metrics.jsonl record {i + 1}: {', '.join(f'{k} {x.get(k)!r} vs {y.get(k)!r}' for k in keys)}"
    if len(records(a)) != len(records(b)):
        return f"metrics.jsonl: {len(records(a))} records against {len(records(b))}"
    for f in sorted((a / "predictions").glob("*.csv")):
        if f.read_bytes() != (b / "predictions" / f.name).read_bytes():
            return f"predictions/{f.name} differs"
    return None


def parse_args(argv=None):
    p = data_parser(__doc__)
    p.add_argument("old", help="the commit the study runs at")
    p.add_argument("new", help="the commit to move it to")
    p.add_argument("--depths", nargs="+", default=["none", "3"], help="--freeze-upto of each pair of runs")
    p.add_argument("--examples", type=int, default=300, help="training and dev examples per task")
    p.add_argument("--precision", default="bf16", help="the study's precision")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (0: the default)")
    p.add_argument("--flags", default="", help="more run_multitask.py flags for every run, one string after = (e.g. "
                   "--flags=--smart or --flags=\"--unfreeze-schedule gradual:20steps\": the points a study has left)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="same-bits-") as tmp:
        where = Path(tmp)
        try:
            for depth in args.depths:
                which = f"--freeze-upto {depth} {args.flags}".rstrip()
                a, b = run_at(args.old, where, args, depth), run_at(args.new, where, args, depth)
                problem = first_difference(a, b)
                if problem:
                    print(f"{which}: {problem}")
                    return 1
                print(f"{which}: the same bits ({len(records(a))} records, the prediction files)")
        except subprocess.CalledProcessError as e:
            print(f"a run failed: {' '.join(map(str, e.cmd))}\n{e.stderr.decode()[-2000:]}")
            return 1
        finally:
            for tree in where.glob("tree-*"):
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
