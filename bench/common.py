"""What the step benchmarks share: the repository on sys.path, and their common flags."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from anywhere without installing


def step_bench_parser(doc: str, batch_help: str, steps: int, warmup: int,
                      seed: int = 11711) -> argparse.ArgumentParser:
    """--data-dir, --model, --batch-size, --steps, --warmup, --threads and --seed; a script adds its own."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "cs224n"),
                   help="folder with the course CSV files (default: %(default)s)")
    p.add_argument("--model", default="minilm-l6", help="checkpoint alias or directory (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help=f"{batch_help} (default: %(default)s)")
    p.add_argument("--steps", type=int, default=steps, help="timed rounds per arm (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed rounds per arm first (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=seed, help="schedule and model seed (default: %(default)s)")
    return p
