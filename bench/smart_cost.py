"""Cost of SMART: a training step with --smart against the same step without, in one run.

One MT-DNN batch per task (sst, para, sts; the first bucketed batch of each in the epoch-0
schedule of the course training data) is stepped through `training.stepper.Stepper.step`; a
"round" is one step on each of the three batches. Arms, all on the same batches:

    plain                       no SMART
    smart@embeddings            SMART perturbing the embedding output (layer 0's input)
    smart@first-trainable       SMART perturbing the input of the first trainable layer
    bregman-only                --smart --smart-lambda 0: the Bregman term alone, no adversarial pass

each without freezing and with --freeze-upto (default 3 = L-3 for MiniLM-L6). Unfrozen, the
two perturbation points are the same layer (0) and should time alike. Rounds are interleaved
over all arms (order reversed every other round) after warm-up; medians are reported, and
ratios are against the plain arm with the same freezing. Target with K=1: SMART <= 3-3.5x
plain; well under that with deep freezing + first-trainable.

    python bench/smart_cost.py                       # MiniLM-L6, batch 32, K=1, course data
    python bench/smart_cost.py --smart-steps 2 --steps 3
"""
from __future__ import annotations

import platform
import statistics
import time

import torch

from common import step_bench_parser  # noqa: E402  (puts the repository on sys.path)
from data.batching import encode_task, make_batch  # noqa: E402
from data.loaders import load_task_file  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.build import build_model, schedule_for_epoch  # noqa: E402
from training.device import autocast_dtype  # noqa: E402
from training.stepper import Stepper, build_optimizer, linear_warmup_decay  # noqa: E402


def parse_args(argv=None):
    p = step_bench_parser(__doc__, "examples per task batch", steps=5, warmup=1)
    p.add_argument("--freeze-upto", type=int, default=3,
                   help="the frozen configuration's --freeze-upto (default: %(default)s = L-3 for MiniLM-L6)")
    p.add_argument("--smart-steps", type=int, default=1, help="K, SMART's ascent steps (default: %(default)s)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="the steps' autocast; SMART's R_s runs in fp32 under either (default: %(default)s)")
    return p.parse_args(argv)


def task_batches(cfg: TrainConfig, tokenizer):
    """The first batch of each task in the epoch-0 MT-DNN schedule (bucketed, as in training)."""
    train = {}
    for t in cfg.tasks:
        examples = load_task_file(cfg.file(t, "train"), t, labelled=True).examples
        train[t] = encode_task(t, examples, tokenizer, cfg.pair_encoding, cfg.max_length)
    first = {}
    for (tb,) in schedule_for_epoch(cfg, train, 0):
        first.setdefault(tb.task, tb)
        if len(first) == len(cfg.tasks):
            break
    return [make_batch(train[t], first[t].indices, tokenizer) for t in cfg.tasks]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device("cpu")
    base = dict(model=args.model, data_dir=args.data_dir, batch_size=args.batch_size, device="cpu",
                precision=args.precision, seed=args.seed, smart_steps=args.smart_steps)
    amp = autocast_dtype(args.precision, dev)
    batches = None
    arms: dict[tuple, Stepper] = {}
    for freeze in (None, args.freeze_upto):
        cfg = TrainConfig(**base, freeze_upto=freeze)
        model, tokenizer, _ = build_model(cfg)
        if batches is None:
            batches = task_batches(cfg, tokenizer)
        opt = build_optimizer(model, cfg, dev)
        sched = linear_warmup_decay(opt, 10_000, 0.0)
        arms[(freeze, "plain")] = Stepper(model, cfg, opt, sched, dev, amp, 10_000)
        for where in ("embeddings", "first-trainable"):
            scfg = TrainConfig(**base, freeze_upto=freeze, smart=True, smart_perturb_at=where)
            arms[(freeze, f"smart@{where}")] = Stepper(model, scfg, opt, sched, dev, amp, 10_000)
        bcfg = TrainConfig(**base, freeze_upto=freeze, smart=True, smart_lambda=0.0)
        arms[(freeze, "bregman-only")] = Stepper(model, bcfg, opt, sched, dev, amp, 10_000)

    keys = list(arms)
    times: dict[tuple, list[float]] = {k: [] for k in keys}
    for i in range(args.warmup + args.steps):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            t0 = time.perf_counter()
            for b in batches:
                arms[k].step([b], i)
            if i >= args.warmup:
                times[k].append((time.perf_counter() - t0) / len(batches))

    L = arms[keys[0]].model.encoder.num_layers
    shapes = ", ".join(f"{b.task} {b.size}x{b.inputs[0]['input_ids'].shape[1]}" for b in batches)
    print(f"# SMART cost: {args.model} ({L} layers), one batch per task ({shapes}), K={args.smart_steps}, "
          f"{args.precision}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}")
    print(f"# {args.steps} timed rounds per arm after {args.warmup} warm-up, interleaved; "
          f"seconds per step (mean of the three task steps in a round), median and min over rounds")
    print(f"{'freeze-upto':<13}{'arm':<24}{'median':>9}{'min':>9}{'x plain':>9}  target")
    for k in keys:
        freeze, arm = k
        med = statistics.median(times[k])
        ratio = med / statistics.median(times[(freeze, "plain")])
        if arm in ("plain", "bregman-only"):
            target = ""
        else:
            ok = ratio <= 3.5
            target = f"<= 3.5x {'OK' if ok else 'OVER'}"
        print(f"{str(freeze):<13}{arm:<24}{med:>9.3f}{min(times[k]):>9.3f}{ratio:>8.2f}x  {target}")


if __name__ == "__main__":
    main()
