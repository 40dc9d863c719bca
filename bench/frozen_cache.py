"""Epoch time with the frozen-prefix cache against the same freezing without it and against
full fine-tuning; and padding efficiency of length-bucketed against random batches.

    python bench/frozen_cache.py --threads 1 --examples 1000

All three configurations train on the same examples in the same order (an MT-DNN epoch of
`--examples` per task), their steps interleaved (the order rotating from step to step); times
exclude building the cache (it is built once, before the first epoch), so they are what every
epoch after it costs. The first --warmup steps of each arm run untimed (allocator, oneDNN
primitive caches). Reported: the timed steps' total per arm, their ratio, and the median of the
per-step ratios (the same batch in both arms) with its interquartile range.
"""
from __future__ import annotations

import datetime

import torch
from common import add_clock_arg, cpu_model, data_parser, paired_ratios, pick_clock  # noqa: E402  (repo on sys.path)

from data.batching import make_batch  # noqa: E402
from data.sampler import epoch_schedule, mixed_schedule, padding_efficiency  # noqa: E402
from training.common.device import seed_everything  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.methods.frozen_cache import build_frozen_cache  # noqa: E402
from training.methods.stepper import Stepper  # noqa: E402
from training.run.build import build_model, load_data, schedule_for_epoch  # noqa: E402


def prepare(cfg: TrainConfig, cached: bool, max_steps: int | None):
    """Model, stepper and the epoch's batches of one arm; the cache (if any) is built here, untimed."""
    seed_everything(cfg.seed)
    model, tok, _ = build_model(cfg)
    data = load_data(cfg, tok)
    steps = schedule_for_epoch(cfg, data.train, 0)[:max_steps]
    stepper = Stepper.build(model, cfg, len(steps))
    cache = build_frozen_cache(model, data.train, tok, torch.device("cpu"), "memory") if cached else None

    def run_step(i: int) -> None:
        tb = steps[i][0]
        batch = cache.batch(data.train[tb.task], tb.indices) if cache else make_batch(data.train[tb.task],
                                                                                       tb.indices, tok)
        stepper.step([batch], i)

    return run_step, len(steps)


def main():
    p = data_parser(__doc__)
    p.add_argument("--examples", type=int, default=1000, help="training examples per task")
    p.add_argument("--max-steps", type=int, default=None, help="run only the first N steps of the epoch")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first, per arm (default: %(default)s)")
    p.add_argument("--freeze-upto", type=int, default=None, help="default: the model's depth minus 3")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    add_clock_arg(p)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    base = TrainConfig(model=args.model, data_dir=args.data_dir, max_train_examples=args.examples, epochs=1)
    depth = build_model(base)[0].encoder.num_layers
    upto = depth - 3 if args.freeze_upto is None else args.freeze_upto
    runs = {"full fine-tuning": (TrainConfig(**{**base.__dict__}), False),
            f"freeze-upto {upto}, no cache": (TrainConfig(**{**base.__dict__, "freeze_upto": upto}), False),
            f"freeze-upto {upto}, cache": (TrainConfig(**{**base.__dict__, "freeze_upto": upto}), True)}
    # Steps of the three arms interleaved, the order rotating, so background load hits all alike.
    arms = {name: prepare(cfg, cached, args.max_steps) for name, (cfg, cached) in runs.items()}
    names = list(arms)
    clock, clock_name = pick_clock(args.clock, args.threads)
    times: dict[str, list[float]] = {name: [] for name in names}
    n = min(k for _, k in arms.values())
    if n <= args.warmup:
        p.error(f"--warmup {args.warmup} leaves none of the epoch's {n} steps to time")
    for i in range(n):
        for name in names[i % 3:] + names[:i % 3]:
            t0 = clock()
            arms[name][0](i)
            if i >= args.warmup:
                times[name].append(clock() - t0)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {datetime.date.today()}; "
          f"{n - args.warmup} timed steps per arm after {args.warmup} warm-up, {clock_name}")
    for name, t in times.items():
        print(f"{name:32s} {sum(t):8.1f} s", flush=True)
    full, uncached, cached = names
    print()
    for other, label, target in ((uncached, "cache vs uncached frozen: ", ">= 2x"),
                                 (full, "cache vs full fine-tuning:", ">= 3x")):
        med, q1, q3 = paired_ratios(times[other], times[cached])
        print(f"{label} {sum(times[other]) / sum(times[cached]):.2f}x faster in total, per step median "
              f"{med:.2f}x [IQR {q1:.2f}-{q3:.2f}]   (target {target})")

    # padding efficiency on the full training files, real tokenizer lengths, batches of 32
    cfg = TrainConfig(model=args.model, data_dir=args.data_dir)
    _, tok, _ = build_model(cfg)
    train = load_data(cfg, tok).train
    lengths = {t: d.lengths for t, d in train.items()}
    sizes = {t: len(d) for t, d in train.items()}
    print("\npadding efficiency (real tokens / tokens computed), batch 32:")
    for t in train:
        one = {t: sizes[t]}
        rand = padding_efficiency(epoch_schedule(one, 32, epoch=0, seed=0), {t: lengths[t]})
        buck = padding_efficiency(epoch_schedule(one, 32, epoch=0, seed=0, lengths={t: lengths[t]}), {t: lengths[t]})
        print(f"  {t:5s} random {rand:.2f}  bucketed {buck:.2f}")
    mixed = [mixed_schedule(sizes, 32, epoch=0, seed=0, lengths=lens) for lens in (None, lengths)]
    rand, buck = (padding_efficiency([b for step in m for b in step], lengths) for m in mixed)
    print(f"  mixed batches (--task-sampling mixed) random {rand:.2f}  bucketed {buck:.2f}")


if __name__ == "__main__":
    main()
