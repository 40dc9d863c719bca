"""Dev evaluation time: a fixed number of examples per batch (today's default, 256) against batches
capped by a padded-token budget, on the three dev sets, in one run.

Each arm is `training.evaluate.evaluate` over the same model and dev sets (the course files,
MiniLM-L6 with freshly initialised heads: the timing and the agreement of the outputs do not
depend on training). A round evaluates every arm once, the order rotating from round to round,
after --warmup untimed rounds; a ratio is the median over rounds of (default / arm) within a round (> 1: faster),
printed with its interquartile range. Also printed: batches, padding efficiency (real tokens /
tokens computed) and the largest difference of any dev metric from the default arm's.

    python bench/eval_speed.py --threads 1 --examples 600 --steps 3   # a subset, on a shared machine
    python bench/eval_speed.py --threads 1 --budgets 2048 4096 8192     # the whole dev sets
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from common import add_clock_arg, cpu_model, paired_ratios, pick_clock, step_bench_parser  # noqa: E402  (puts the repo on sys.path)

from data.batching import CPU_EVAL_TOKENS, EvalBatching, _sorted_spans, encode_task  # noqa: E402
from data.loaders import COURSE_FILES, load_task_file  # noqa: E402
from training.common.device import seed_everything  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.inference.outputs import evaluate  # noqa: E402
from training.run.build import build_model  # noqa: E402


def parse_args(argv=None):
    p = step_bench_parser(__doc__, "the default arm's examples per batch (today's --eval-batch-size)",
                          steps=3, warmup=1)
    p.set_defaults(batch_size=256)
    p.add_argument("--budgets", type=int, nargs="+", default=[CPU_EVAL_TOKENS],
                   help="padded tokens per batch, one arm each (default: %(default)s)")
    p.add_argument("--examples", type=int, default=None,
                   help="evaluate the first N examples of each dev set only (default: all)")
    add_clock_arg(p)
    args = p.parse_args(argv)
    if min(args.budgets + [args.batch_size, args.steps]) < 1 or args.warmup < 0:
        p.error("--budgets, --batch-size and --steps must be >= 1, --warmup >= 0")
    return args


def dev_sets(cfg: TrainConfig, tokenizer, limit: int | None):
    dev = {}
    for task in cfg.tasks:
        examples = load_task_file(f"{cfg.data_dir}/{COURSE_FILES[task]['dev']}", task, labelled=True).examples
        dev[task] = encode_task(task, examples[:limit], tokenizer, cfg.pair_encoding, cfg.max_length)
    return dev


def padding_stats(dev, batch_size: int, budget: int | None) -> tuple[int, float]:
    batches = real = computed = 0
    for data in dev.values():
        lengths = np.sort(data.lengths)
        for a, b in _sorted_spans(lengths, batch_size, budget):
            batches += 1
            real += int(lengths[a:b].sum())
            computed += int(lengths[b - 1]) * (b - a)
    return batches, real / computed


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainConfig(model=args.model, data_dir=args.data_dir, seed=args.seed)
    seed_everything(cfg.seed)
    model, tokenizer, _ = build_model(cfg)
    model.eval()
    dev = dev_sets(cfg, tokenizer, args.examples)
    dev_cpu = torch.device("cpu")
    arms = {f"batch {args.batch_size}": None, **{f"tokens {b}": b for b in args.budgets}}
    names = list(arms)
    clock, clock_name = pick_clock(args.clock, args.threads)
    times: dict[str, list[float]] = {n: [] for n in names}
    metrics: dict[str, dict[str, float]] = {}
    for r in range(args.warmup + args.steps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = clock()
            metrics[name] = evaluate(model, dev, tokenizer, EvalBatching(args.batch_size, arms[name]), dev_cpu)
            if r >= args.warmup:
                times[name].append(clock() - t0)

    sizes = ", ".join(f"{t} {len(d)}" for t, d in dev.items())
    print(f"# dev evaluation: {args.model}, dev sets {sizes}, CPU: {cpu_model()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print(f"# {args.steps} timed rounds after {args.warmup} warm-up, arms rotated every round, timed by {clock_name}")
    print(f"{'arm':<14}{'batches':>8}{'padding eff':>12}{'median s':>10}{'x faster':>10}  IQR of the ratio  "
          f"max |metric - default|")
    base = names[0]
    for name in names:
        n_batches, eff = padding_stats(dev, args.batch_size, arms[name])
        med, q1, q3 = paired_ratios(times[base], times[name])  # default / arm: > 1 is faster
        diff = max(abs(metrics[name][m] - metrics[base][m]) for m in metrics[base])
        print(f"{name:<14}{n_batches:>8}{eff:>12.3f}{statistics.median(times[name]):>10.2f}{med:>9.2f}x"
              f"  [{q1:.2f}-{q3:.2f}]        {diff:.1e}")


if __name__ == "__main__":
    main()
