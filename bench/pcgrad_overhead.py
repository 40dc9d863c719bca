"""Cost of PCGrad: one mixed training step with gradient surgery against the same step without.

Both arms run `training.methods.stepper.Stepper.step` on the same model, optimiser and mixed batch (the
first step of the epoch-0 mixed schedule of the course training data that holds all three tasks).
The plain mixed step also takes one backward per task group (that is how the loop works), so the
ratio isolates what PCGrad adds: per-task copies of the shared gradients into a (T, P) buffer,
the surgery itself, and writing the result back. Arms are interleaved (A B, then B A, ...) after
warm-up, so background load hits both alike; medians are reported, and the ratio is the median of the
per-round ratios pcgrad / plain with their interquartile range. Target: ratio <= 1.5.

    python bench/pcgrad_overhead.py                           # MiniLM-L6, batch 32, course data
    python bench/pcgrad_overhead.py --variant dominant --steps 20
"""
from __future__ import annotations

import platform
import statistics
import time

import torch
from common import paired_ratios, step_bench_parser  # noqa: E402  (puts the repository on sys.path)

from data.batching import encode_task, make_batch  # noqa: E402
from data.loaders import load_task_file  # noqa: E402
from data.sampler import mixed_schedule  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.methods.pcgrad import surgery  # noqa: E402
from training.methods.stepper import Stepper  # noqa: E402
from training.run.build import build_model  # noqa: E402


def parse_args(argv=None):
    p = step_bench_parser(__doc__, "examples per mixed step", steps=10, warmup=2)
    p.add_argument("--variant", choices=["pcgrad", "dominant"], default="pcgrad",
                   help="surgery variant (default: %(default)s)")
    p.add_argument("--freeze-upto", type=int, default=None, help="as in training (default: none frozen)")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping, as in training (default: %(default)s)")
    return p.parse_args(argv)


def mixed_batches(cfg: TrainConfig, tokenizer):
    """The first mixed step of epoch 0 that holds every task; only its examples are tokenised."""
    examples = {t: load_task_file(cfg.file(t, "train"), t, labelled=True).examples for t in cfg.tasks}
    sizes = {t: len(e) for t, e in examples.items()}
    for step in mixed_schedule(sizes, cfg.batch_size, epoch=0, seed=cfg.seed):
        if len(step) == len(cfg.tasks):
            break
    batches = []
    for tb in step:
        data = encode_task(tb.task, [examples[tb.task][i] for i in tb.indices], tokenizer, cfg.pair_encoding,
                           cfg.max_length)
        batches.append(make_batch(data, range(len(tb.indices)), tokenizer))
    return batches


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = torch.device("cpu")
    base = dict(model=args.model, data_dir=args.data_dir, batch_size=args.batch_size, task_sampling="mixed",
                device="cpu", precision="fp32", freeze_upto=args.freeze_upto, max_grad_norm=args.max_grad_norm,
                seed=args.seed, pcgrad_variant=args.variant, warmup_ratio=0.0)
    cfg_plain, cfg_pc = TrainConfig(**base, pcgrad=False), TrainConfig(**base, pcgrad=True)
    model, tokenizer, _ = build_model(cfg_plain)
    batches = mixed_batches(cfg_plain, tokenizer)
    arms = {"plain": Stepper.build(model, cfg_plain, 10_000, dev), "pcgrad": Stepper.build(model, cfg_pc, 10_000, dev)}
    P = sum(p.numel() for p in arms["pcgrad"].pcgrad.params)

    times: dict[str, list[float]] = {a: [] for a in arms}
    names = list(arms)
    for i in range(args.warmup + args.steps):
        for a in (names if i % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            arms[a].step(batches, i)
            if i >= args.warmup:
                times[a].append(time.perf_counter() - t0)

    # surgery alone, on the (T, P) buffer the last PCGrad step left behind
    pc = arms["pcgrad"].pcgrad
    buf = pc._buf[: len(batches)]
    gen = torch.Generator().manual_seed(0)
    s_times = []
    for i in range(max(3, args.steps // 2) + 1):
        t0 = time.perf_counter()
        surgery(buf, args.variant, gen)
        if i:
            s_times.append(time.perf_counter() - t0)

    med = {a: statistics.median(v) for a, v in times.items()}
    m_surg = statistics.median(s_times)
    shapes = ", ".join(f"{b.task} {b.size}x{b.inputs[0]['input_ids'].shape[1]}" for b in batches)
    print(f"# PCGrad overhead: {args.model}, mixed step of {args.batch_size} ({shapes}), variant {args.variant}, "
          f"freeze-upto {args.freeze_upto}, {P / 1e6:.1f}M shared params, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print(f"# {args.steps} timed steps per arm after {args.warmup} warm-up, interleaved; seconds")
    print(f"{'arm':<22}{'median':>10}{'min':>10}")
    for a in names:
        print(f"{a + ' step':<22}{med[a]:>10.3f}{min(times[a]):>10.3f}")
    print(f"{'surgery() alone':<22}{m_surg:>10.3f}{min(s_times):>10.3f}")
    over = med["pcgrad"] - med["plain"]
    ratio, q1, q3 = paired_ratios(times["pcgrad"], times["plain"])
    print(f"ratio pcgrad/plain: {ratio:.2f}x [IQR {q1:.2f}-{q3:.2f}] (target <= 1.5x: "
          f"{'OK' if ratio <= 1.5 else 'OVER'})")
    print(f"overhead per step: {over * 1e3:.0f} ms, of which surgery() {m_surg * 1e3:.0f} ms and "
          f"gradient copies/bookkeeping {max(over - m_surg, 0) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
