"""Cost of SMART: a training step with --smart against the same step without, in one run.

One MT-DNN batch per task (sst, para, sts; the first bucketed batch of each in the epoch-0
schedule of the course training data) is stepped through `training.methods.stepper.Stepper.step`; a
"round" is one step on each of the three batches. Arms, all on the same batches:

    plain                       no SMART
    smart@embeddings            SMART perturbing the embedding output (layer 0's input)
    smart@first-trainable       SMART perturbing the input of the first trainable layer
    reference@embeddings        SMART with --smart-perturbation reference (the MT-DNN code's step)
    bregman-only                --smart --smart-lambda 0: the Bregman term alone, no adversarial pass

each without freezing and with --freeze-upto (default 3 = L-3 for MiniLM-L6). Frozen, every arm
runs as the trainer runs it: from the frozen-prefix cache (the states entering the first trainable
layer, built once, untimed) wherever the trainer keeps the cache on, that is everywhere but
smart@embeddings and reference@embeddings (their perturbation needs the frozen layers' graph every step); bregman-only
perturbs nothing, so it keeps the cache (TrainConfig.perturbs_embeddings).

Unfrozen, the two perturbation points are the same layer (0) and should time alike. Rounds are
interleaved over all arms (order reversed every other round) after warm-up; per arm the median
and min seconds per step, and the ratio to the plain arm with the same freezing: the median of
the per-round ratios (the two arms timed in the same round), with its interquartile range.
Target with K=1: SMART <= 3-3.5x plain; well under that with deep freezing + first-trainable.

    python bench/smart_cost.py --threads 1           # MiniLM-L6, batch 32, K=1, course data
    python bench/smart_cost.py --threads 1 --smart-steps 2 --steps 3
"""
from __future__ import annotations

import statistics

import torch
from common import add_clock_arg, cpu_model, paired_ratios, pick_clock, step_bench_parser  # noqa: E402  (puts the repo on sys.path)

from data.batching import TaskData, encode_task, make_batch  # noqa: E402
from data.loaders import load_task_file  # noqa: E402
from training.common.device import autocast_dtype  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.methods.frozen_cache import build_frozen_cache  # noqa: E402
from training.methods.stepper import Stepper  # noqa: E402
from training.run.build import build_model, schedule_for_epoch  # noqa: E402


def parse_args(argv=None):
    p = step_bench_parser(__doc__, "examples per task batch", steps=5, warmup=1)
    p.add_argument("--freeze-upto", type=int, default=3,
                   help="the frozen configuration's --freeze-upto (default: %(default)s = L-3 for MiniLM-L6)")
    p.add_argument("--smart-steps", type=int, default=1, help="K, SMART's ascent steps (default: %(default)s)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="the steps' autocast; SMART's R_s runs in fp32 under either (default: %(default)s)")
    add_clock_arg(p)
    return p.parse_args(argv)


def task_batches(cfg: TrainConfig, tokenizer) -> list[TaskData]:
    """The examples of the first batch of each task in the epoch-0 MT-DNN schedule (bucketed, as in
    training), each as a TaskData of its own: make_batch(d, range(len(d))) or a cache over d."""
    train = {}
    for t in cfg.tasks:
        examples = load_task_file(cfg.file(t, "train"), t, labelled=True).examples
        train[t] = encode_task(t, examples, tokenizer, cfg.pair_encoding, cfg.max_length)
    first = {}
    for (tb,) in schedule_for_epoch(cfg, train, 0):
        first.setdefault(tb.task, tb)
        if len(first) == len(cfg.tasks):
            break
    return [TaskData(t, [train[t].examples[i] for i in first[t].indices],
                     [[seq[i] for i in first[t].indices] for seq in train[t].sequences]) for t in cfg.tasks]


def add_arms(arms: dict, base: dict, freeze: int | None, batches: list[TaskData], tokenizer, dev, amp) -> None:
    """The arms of one freezing, sharing one model and optimiser. Arms that keep the frozen-prefix
    cache step on cached batches (the cache built here, untimed)."""
    cfg = TrainConfig(**base, freeze_upto=freeze)
    model, _, _ = build_model(cfg)
    plain = [make_batch(d, range(len(d)), tokenizer) for d in batches]
    cached = plain
    if freeze is not None and freeze >= 1:  # a frozen encoder layer to cache
        cache = build_frozen_cache(model, {d.task: d for d in batches}, tokenizer, dev, "memory", compute_dtype=amp)
        cached = [cache.batch(d, range(len(d))) for d in batches]
    configs = {"plain": ({}, cached),
               "smart@embeddings": ({"smart": True, "smart_perturb_at": "embeddings"}, plain),
               "smart@first-trainable": ({"smart": True, "smart_perturb_at": "first-trainable"}, cached),
               "reference@embeddings": ({"smart": True, "smart_perturbation": "reference"}, plain),
               "bregman-only": ({"smart": True, "smart_lambda": 0.0}, cached)}  # perturbs nothing: cache kept
    for arm, (extra, arm_batches) in configs.items():
        stepper = Stepper.build(model, TrainConfig(**base, freeze_upto=freeze, **extra), 10_000, dev, amp)
        arms[(freeze, arm)] = (stepper, arm_batches)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device("cpu")
    base = dict(model=args.model, data_dir=args.data_dir, batch_size=args.batch_size, device="cpu",
                precision=args.precision, seed=args.seed, smart_steps=args.smart_steps)
    amp = autocast_dtype(args.precision, dev)
    _, tokenizer, _ = build_model(TrainConfig(**base))
    batches = task_batches(TrainConfig(**base), tokenizer)
    arms: dict[tuple, tuple] = {}
    for freeze in (None, args.freeze_upto):
        add_arms(arms, base, freeze, batches, tokenizer, dev, amp)

    keys = list(arms)
    clock, clock_name = pick_clock(args.clock, args.threads)
    times: dict[tuple, list[float]] = {k: [] for k in keys}
    for i in range(args.warmup + args.steps):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            stepper, arm_batches = arms[k]
            t0 = clock()
            for b in arm_batches:
                stepper.step([b], i)
            if i >= args.warmup:
                times[k].append((clock() - t0) / len(arm_batches))

    L = arms[keys[0]][0].model.encoder.num_layers
    shapes = ", ".join(f"{d.task} {len(d)}x{int(d.lengths.max())}" for d in batches)
    print(f"# SMART cost: {args.model} ({L} layers), one batch per task ({shapes}), K={args.smart_steps}, "
          f"{args.precision}, torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_model()}")
    print(f"# {args.steps} timed rounds per arm after {args.warmup} warm-up, interleaved, {clock_name}; seconds "
          f"per step (mean of the three task steps in a round), median and min over rounds; x plain: median of "
          f"the per-round ratios [IQR]")
    print(f"{'freeze-upto':<13}{'arm':<24}{'cache':<7}{'median':>9}{'min':>9}{'x plain':>9}  {'IQR':<12} target")
    for k in keys:
        freeze, arm = k
        med = statistics.median(times[k])
        ratio, q1, q3 = paired_ratios(times[k], times[(freeze, "plain")])
        target = "" if arm == "plain" else (f"<= 1.2x {'OK' if ratio <= 1.2 else 'OVER'}" if "bregman" in arm
                                            else f"<= 3.5x {'OK' if ratio <= 3.5 else 'OVER'}")
        cached = "yes" if "hidden" in arms[k][1][0].inputs[0] else "no"
        print(f"{str(freeze):<13}{arm:<24}{cached:<7}{med:>9.3f}{min(times[k]):>9.3f}{ratio:>8.2f}x  "
              f"[{q1:.2f}-{q3:.2f}]  {target}")


if __name__ == "__main__":
    main()
