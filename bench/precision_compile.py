"""bf16 (and fp16) autocast and --compile against plain fp32: seconds per training step, in one run.

One MT-DNN batch per task (sst, para, sts; the first bucketed batch of each in the epoch-0
schedule of the course training data, as in bench/smart_cost.py) is stepped through
`training.methods.stepper.Stepper.step` (forward, loss, backward, clipping, fused AdamW). Arms, each
with its own copy of the model:

    fp32            --precision fp32 (the CPU default)
    bf16            --precision bf16 (torch.autocast to bfloat16)
    fp16            --precision fp16 (float16 with the dynamic loss scale), with --fp16: for CUDA devices
                    without bf16 (a CPU without AMX-FP16 emulates float16)
    fp32+compile    --compile        (torch.compile of each encoder layer, dynamic shapes)
    bf16+compile    --precision bf16 --compile

--compile-mode reduce-overhead compiles those arms as the trainer's --compile-mode does: each layer's
kernels replayed as CUDA graphs, one per batch shape (three here), which is what a launch-bound GPU
step would gain from.

Rounds (one step on each of the three batches) are interleaved over the arms, order reversed
every other round, after warm-up rounds that also absorb compilation; medians are reported, and each
arm's speed-up is the median of its per-round ratios to fp32 with their interquartile range.
The last column is how far each arm's loss after the timed steps is from fp32's, a first check
that bf16 trains the same way (eager arms draw the same dropout masks; compiled code draws its own,
so its column also holds dropout noise). The accuracy check is a real run: see docs/benchmarks.md.

    python bench/precision_compile.py                # MiniLM-L6, CPU, course data
    python bench/precision_compile.py --no-compile --steps 10
    python bench/precision_compile.py --device cuda --fp16    # a T4 / V100: fp16 against fp32 (and bf16)
    python bench/precision_compile.py --device cuda --compile-mode reduce-overhead

The first line says what --precision auto resolves to on the device.
"""
from __future__ import annotations

import platform
import statistics
import time

import torch
from common import paired_ratios, step_bench_parser  # noqa: E402  (puts the repository on sys.path)
from smart_cost import task_batches  # noqa: E402

from data.batching import make_batch  # noqa: E402
from minbert import Tokenizer, resolve_checkpoint  # noqa: E402
from training.common.device import DTYPES, pick_device, resolve_precision  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.methods.compiling import compile_layers  # noqa: E402
from training.methods.stepper import Stepper  # noqa: E402
from training.run.build import build_model  # noqa: E402


def parse_args(argv=None):
    p = step_bench_parser(__doc__, "examples per task batch", steps=5, warmup=2)  # warm-up includes compiling
    p.add_argument("--freeze-upto", type=int, default=None, help="freeze as in training (default: none)")
    p.add_argument("--no-compile", action="store_true", help="time only the eager arms")
    p.add_argument("--fp16", action="store_true", help="add an fp16 arm (eager; with the loss scale)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead"],
                   help="the compiled arms' torch.compile mode; reduce-overhead: CUDA graphs (default: %(default)s)")
    return p.parse_args(argv)


def make_arm(args, precision: str, compiled: bool) -> Stepper:
    cfg = TrainConfig(model=args.model, data_dir=args.data_dir, batch_size=args.batch_size, device=args.device,
                      precision=precision, seed=args.seed, freeze_upto=args.freeze_upto, head_dropout=0.0,
                      warmup_ratio=0.0, compile=compiled, compile_mode=args.compile_mode)
    dev = pick_device(args.device)
    model, _, _ = build_model(cfg)  # the same seed: every arm starts from the same weights and heads
    model.to(dev)
    if compiled:
        compile_layers(model.encoder, mode=args.compile_mode)  # the Stepper marks each step for CUDA graphs
    return Stepper.build(model, cfg, 10_000, dev, DTYPES[precision])


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [("fp32", False), ("bf16", False)] + [("fp16", False)] * args.fp16
    names += [] if args.no_compile else [("fp32", True), ("bf16", True)]
    arms = {f"{p}{'+compile' if c else ''}": make_arm(args, p, c) for p, c in names}
    first = next(iter(arms.values()))
    tokenizer = Tokenizer.from_checkpoint(resolve_checkpoint(args.model))
    dev = pick_device(args.device)
    batches = [make_batch(d, range(len(d)), tokenizer).to(dev) for d in task_batches(first.cfg, tokenizer)]

    keys = list(arms)
    times: dict[str, list[float]] = {k: [] for k in keys}
    last_loss: dict[str, float] = {}
    for i in range(args.warmup + args.steps):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            torch.manual_seed(i)  # the same dropout masks in every eager arm
            t0 = time.perf_counter()
            parts = [arms[k].step([b], i) for b in batches]
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i >= args.warmup:
                times[k].append((time.perf_counter() - t0) / len(batches))
            last_loss[k] = sum(p[b.task]["loss"] for p, b in zip(parts, batches))

    L = first.model.encoder.num_layers
    print("# --precision auto here: %s (%s)" % resolve_precision("auto", dev))
    shapes = ", ".join(f"{b.task} {b.size}x{b.inputs[0]['input_ids'].shape[1]}" for b in batches)
    print(f"# {args.model} ({L} layers, freeze-upto {args.freeze_upto}), one batch per task ({shapes}), "
          f"{dev}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}")
    print(f"# {args.steps} timed rounds per arm after {args.warmup} warm-up, interleaved; seconds per step "
          f"(mean of the three task steps in a round), median and min over rounds")
    print(f"{'arm':<16}{'median':>9}{'min':>9}{'speed-up [IQR]':>22}  {'loss - fp32 loss after the last round':>38}")
    for k in keys:
        up, q1, q3 = paired_ratios(times["fp32"], times[k])  # fp32's round over the arm's: > 1 is faster
        print(f"{k:<16}{statistics.median(times[k]):>9.3f}{min(times[k]):>9.3f}{up:>9.2f}x [{q1:.2f}-{q3:.2f}]"
              f"  {last_loss[k] - last_loss['fp32']:>+38.4f}")


if __name__ == "__main__":
    main()
