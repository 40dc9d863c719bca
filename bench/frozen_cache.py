"""Epoch time with the frozen-prefix cache against the same freezing without it and against
full fine-tuning; and padding efficiency of length-bucketed against random batches.

    python bench/frozen_cache.py --data-dir ../shared/data/cs224n --examples 1000

All three configurations train on the same examples in the same order (an MT-DNN epoch of
`--examples` per task), their steps interleaved; times exclude building the cache (it is built
once, before the first epoch), so they are what every epoch after it costs.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import time

import torch

from common import REPO  # noqa: F401  (puts the repository on sys.path)
from data.sampler import epoch_schedule, padding_efficiency  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.frozen_cache import build_frozen_cache  # noqa: E402
from data.batching import make_batch  # noqa: E402
from training.build import build_model, load_data, schedule_for_epoch  # noqa: E402
from training.device import seed_everything  # noqa: E402
from training.stepper import Stepper, build_optimizer, linear_warmup_decay  # noqa: E402


def prepare(cfg: TrainConfig, cached: bool, max_steps: int | None):
    """Model, stepper and the epoch's batches of one arm; the cache (if any) is built here, untimed."""
    seed_everything(cfg.seed)
    model, tok, _ = build_model(cfg)
    data = load_data(cfg, tok)
    steps = schedule_for_epoch(cfg, data.train, 0)[:max_steps]
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    stepper = Stepper(model, cfg, opt, linear_warmup_decay(opt, len(steps), 0.1), torch.device("cpu"), None,
                      len(steps))
    cache = build_frozen_cache(model, data.train, tok, torch.device("cpu"), "memory") if cached else None

    def run_step(i: int) -> None:
        tb = steps[i][0]
        batch = cache.batch(data.train[tb.task], tb.indices) if cache else make_batch(data.train[tb.task],
                                                                                       tb.indices, tok)
        stepper.step([batch], i)

    return run_step, len(steps)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "cs224n"),
                   help="folder with the course CSV files (default: %(default)s)")
    p.add_argument("--model", default="minilm-l6", help="checkpoint alias or directory (default: %(default)s)")
    p.add_argument("--examples", type=int, default=1000, help="training examples per task")
    p.add_argument("--max-steps", type=int, default=None, help="time only the first N steps of the epoch")
    p.add_argument("--freeze-upto", type=int, default=None, help="default: the model's depth minus 3")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    base = TrainConfig(model=args.model, data_dir=args.data_dir, max_train_examples=args.examples, epochs=1)
    depth = build_model(base)[0].encoder.num_layers
    upto = depth - 3 if args.freeze_upto is None else args.freeze_upto
    runs = {"full fine-tuning": (TrainConfig(**{**base.__dict__}), False),
            f"freeze-upto {upto}, no cache": (TrainConfig(**{**base.__dict__, "freeze_upto": upto}), False),
            f"freeze-upto {upto}, cache": (TrainConfig(**{**base.__dict__, "freeze_upto": upto}), True)}
    # Steps of the three arms interleaved (A B C A B C ...), so background load hits all alike.
    arms = {name: prepare(cfg, cached, args.max_steps) for name, (cfg, cached) in runs.items()}
    times = dict.fromkeys(arms, 0.0)
    n = min(k for _, k in arms.values())
    for i in range(n):
        for name, (run_step, _) in arms.items():
            t0 = time.perf_counter()
            run_step(i)
            times[name] += time.perf_counter() - t0
    for name, t in times.items():
        print(f"{name:32s} {t:8.1f} s for {n} steps", flush=True)
    full, uncached, cached = times.values()
    print(f"\ncache vs uncached frozen: {uncached / cached:.2f}x faster   (target >= 2x)")
    print(f"cache vs full fine-tuning: {full / cached:.2f}x faster   (target >= 3x)")

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
    print(f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}, {datetime.date.today()}")


if __name__ == "__main__":
    main()
