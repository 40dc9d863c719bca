"""What a freezing schedule's whole run costs against full fine-tuning at the same number of steps, the
frozen-prefix cache on (--frozen-cache auto, which caches a phase when it repays its building).

    python bench/schedules.py --threads 1 --examples 500 --rounds 3

Each round trains every arm once, end to end (model loading, the caches, the steps, a dev evaluation per
epoch, no prediction files), the arms' order rotating from round to round so that background load hits
all alike. Reported per arm: its dev overall score, its time, and the median over rounds of full
fine-tuning's time / the arm's (the speed-up; IQR beside it), with the adaptive arm's freezes. AutoFreeze's
figure (Liu et al. 2021) is 2.55x end to end on one GPU for BERT at the same accuracy; this CPU run is
much shorter than theirs, so adaptive freezing has fewer steps left to save on.
"""
from __future__ import annotations

import datetime
import json
import logging
import tempfile
from pathlib import Path

import torch
from common import add_clock_arg, cpu_model, data_parser, paired_ratios, pick_clock  # noqa: E402  (repo on sys.path)

from training.config.train_config import TrainConfig  # noqa: E402
from training.run.trainer import train  # noqa: E402

ARMS = {"full fine-tuning": {}, "fixed: 2 layers frozen": {"freeze_upto": 2},
        "LP-FT: heads 1 epoch, then all": {"unfreeze_schedule": "lp-ft:1epoch,probe-lr=1e-3"},
        "gradual: a layer every 8 steps": {"unfreeze_schedule": "gradual:8steps"},
        "adaptive: median rule, every 10": {"unfreeze_schedule": "adaptive:10steps,percentile=50"}}


def run_arm(base: dict, options: dict, out: Path, clock) -> tuple[float, float, list]:
    """One whole run: (its time, its best dev overall, the depths it went through by step)."""
    cfg = TrainConfig(**{**base, **options, "out_dir": str(out), "predictions_dir": str(out / "pred")})
    t0 = clock()
    metrics = train(cfg)
    seconds = clock() - t0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return seconds, metrics["overall"], [(r["step"], r["frozen_depth"]) for r in records if "frozen_depth" in r]


def main():
    p = data_parser(__doc__)
    p.add_argument("--examples", type=int, default=500, help="training examples per task (default: %(default)s)")
    p.add_argument("--eval-examples", type=int, default=500, help="dev examples per task (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="runs of every arm (default: %(default)s)")
    p.add_argument("--arms", nargs="+", type=int, default=list(range(len(ARMS))), metavar="I",
                   help="which arms, by their place in the table (0: full fine-tuning, always run; "
                        f"{', '.join(f'{i}: {n}' for i, n in enumerate(ARMS) if i)})")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    add_clock_arg(p)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    clock, clock_name = pick_clock(args.clock, args.threads)
    base = dict(model=args.model, data_dir=args.data_dir, max_train_examples=args.examples, epochs=args.epochs,
                max_eval_examples=args.eval_examples, pooling="mean", precision="fp32", device="cpu",
                test_predictions=False, frozen_cache="auto", log_every=1000)
    names = [n for i, n in enumerate(ARMS) if i == 0 or i in args.arms]
    times = {n: [] for n in names}
    scores = {n: [] for n in names}
    depths = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, name in enumerate(names[r % len(names):] + names[:r % len(names)]):
                seconds, overall, changes = run_arm(base, ARMS[name], Path(tmp) / f"r{r}-{i}", clock)
                times[name].append(seconds)
                scores[name].append(overall)
                depths[name] = changes
                print(f"round {r + 1}: {name:34s} {seconds:7.1f} s  dev overall {overall:.4f}", flush=True)
    print(f"\n# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {datetime.date.today()}; "
          f"{args.examples} training and {args.eval_examples} dev examples per task, {args.epochs} epochs, "
          f"{args.rounds} rounds, {clock_name}")
    full = names[0]
    for name in names:
        med, q1, q3 = paired_ratios(times[full], times[name])
        mean_score = sum(scores[name]) / len(scores[name])
        print(f"{name:34s} {sum(times[name]) / len(times[name]):7.1f} s  speed-up vs full {med:.2f}x "
              f"[IQR {q1:.2f}-{q3:.2f}]  dev overall {mean_score:.4f}")
    adaptive = [n for n in names if n.startswith("adaptive")]
    if adaptive:
        print(f"\nadaptive freezes (step, depth) in its last run: {depths[adaptive[0]] or 'none'}")


if __name__ == "__main__":
    main()
