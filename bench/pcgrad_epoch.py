"""Cost of a PCGrad epoch against a default epoch, through the trainer, on the same data.

`bench/pcgrad_overhead.py` isolates the surgery within one mixed step; what a user pays is an
epoch: PCGrad's mixed batches (every task in every step, length-bucketed since issue 24), one
backward per task group and the surgery, against the default MT-DNN schedule (one task per step,
length-bucketed). Arms, each on the same --max-train-examples subset of the course training files:

    default     --task-sampling mtdnn
    mixed       --task-sampling mixed (PCGrad's batches without the surgery)
    pcgrad      --pcgrad (mixed batches + gradient surgery; --variant dominant for the other one)

A round trains one epoch of each arm from a freshly built model (built untimed; the order reversed
every other round) with `training.run.trainer.Run.train_epoch`, leaving out the dev evaluation and the
checkpoint at its end. Reported per arm: steps, padding efficiency, median seconds per epoch, and
its ratio to the default arm (median of the per-round ratios, with the IQR). Targets (issue 24):
pcgrad <= 1.3x default, padding efficiency >= 0.9.

    python bench/pcgrad_epoch.py --threads 1                    # MiniLM-L6, 300 examples per task
    python bench/pcgrad_epoch.py --threads 1 --examples 1000 --steps 3
"""
from __future__ import annotations

import logging
import statistics
import tempfile
import types

import torch
from common import add_clock_arg, cpu_model, paired_ratios, pick_clock, step_bench_parser  # noqa: E402

from training.config.train_config import TrainConfig  # noqa: E402
from training.run.trainer import Run  # noqa: E402

ARMS = {"default": {"task_sampling": "mtdnn"}, "mixed": {"task_sampling": "mixed"}, "pcgrad": {"pcgrad": True}}


class EpochOnly(Run):
    """A Run whose epoch ends without the evaluation and checkpoint, and writes nothing to its folder."""

    def end_epoch(self, epoch: int, train_time: float, padding_eff: float) -> None:
        self.padding_eff = padding_eff

    def save_checkpoint(self, epoch_start: float) -> None:
        pass

    def claim_out_dir(self, resume_step: int | None = None) -> None:
        pass


def parse_args(argv=None):
    p = step_bench_parser(__doc__, "examples per step", steps=3, warmup=0)
    p.add_argument("--examples", type=int, default=300, help="training examples per task (default: %(default)s)")
    p.add_argument("--variant", choices=["pcgrad", "dominant"], default="pcgrad", help="PCGrad's variant")
    p.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16"], help="(default: %(default)s)")
    add_clock_arg(p)
    return p.parse_args(argv)


def one_epoch(arm: str, args, out_dir: str, clock) -> tuple[float, float, int]:
    """(seconds, padding efficiency, steps) of one epoch of a freshly built run of `arm`."""
    cfg = TrainConfig(model=args.model, data_dir=args.data_dir, batch_size=args.batch_size, device="cpu",
                      precision=args.precision, seed=args.seed, max_train_examples=args.examples, epochs=1,
                      pcgrad_variant=args.variant, log_every=10**9, out_dir=out_dir, **ARMS[arm])
    run = EpochOnly(cfg).build()
    run.stop = types.SimpleNamespace(requested=False)  # fit()'s signal handler, not needed here
    t0 = clock()
    run.train_epoch(0)
    return clock() - t0, run.padding_eff, run.steps_per_epoch


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.ERROR)  # not the data loaders' notes on every build
    clock, clock_name = pick_clock(args.clock, args.threads)
    times = {arm: [] for arm in ARMS}
    info = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.warmup + args.steps):
            for arm in (list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]):
                seconds, eff, steps = one_epoch(arm, args, tmp, clock)
                info[arm] = (eff, steps)
                if i >= args.warmup:
                    times[arm].append(seconds)
    print(f"# PCGrad epoch: {args.model}, {args.examples} training examples per task, batch {args.batch_size}, "
          f"{args.precision}, PCGrad variant {args.variant}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, {cpu_model()}")
    print(f"# {args.steps} rounds, arms interleaved, {clock_name}; seconds per epoch (training steps only), median; "
          f"x default: median of the per-round ratios [IQR]")
    print(f"{'arm':<10}{'steps':>7}{'padding':>9}{'seconds':>10}{'x default':>11}  {'IQR':<12} target")
    for arm in ARMS:
        ratio, q1, q3 = paired_ratios(times[arm], times["default"])
        eff, steps = info[arm]
        target = "" if arm != "pcgrad" else (f"<= 1.3x {'OK' if ratio <= 1.3 else 'OVER'}, padding >= 0.9 "
                                             f"{'OK' if eff >= 0.9 else 'UNDER'}")
        print(f"{arm:<10}{steps:>7}{eff:>9.3f}{statistics.median(times[arm]):>10.1f}{ratio:>10.2f}x  "
              f"[{q1:.2f}-{q3:.2f}]  {target}")


if __name__ == "__main__":
    main()
