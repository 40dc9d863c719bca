"""What training less costs: a training step of LoRA (a few ranks) and BitFit against full fine-tuning and
the freezing depths, with each arm's trainable parameters, step time and peak memory.

One MT-DNN batch per task (sst, para, sts: the first bucketed batch of each in the epoch-0 schedule of the
course's training data, as bench/smart_cost.py takes them) is stepped through `Stepper.step`; a round is one
step on each of the three batches. Arms (each its own model and optimiser, built as a run builds them):

    full                  everything trains
    freeze N              --freeze-upto N for each N of --depths, from the frozen-prefix cache (built once,
                          untimed), as the trainer runs it
    bitfit                --peft bitfit
    lora rR               --peft lora:r=R for each R of --ranks (all linear maps, alpha 8)

Time: rounds interleaved over all arms (order reversed every other round) after warm-up; per arm the median
and the interquartile range of its seconds per step, and full fine-tuning's time over the arm's, the median of
the per-round ratios [IQR]. Memory: on CUDA the allocator's peak over the arm's timed steps; on CPU each arm
again in a fresh process (--memory-steps steps), its peak resident memory and what the steps added to what
the built arm held (its peak resident memory reset after building, through /proc/self/clear_refs: Linux),
since one process's peak covers all its arms and the loading of the data files.

    python bench/peft_cost.py --threads 1                      # MiniLM-L6, batch 32, course data
    python bench/peft_cost.py --threads 1 --ranks 4 8 16 --depths 3 5 --steps 7
"""
from __future__ import annotations

import gc
import multiprocessing
import statistics
from pathlib import Path

import torch
from common import add_clock_arg, cpu_model, paired_ratios, pick_clock, step_bench_parser  # noqa: E402  (puts the repo on sys.path)
from smart_cost import task_batches  # noqa: E402

from data.batching import make_batch  # noqa: E402
from training.common.device import autocast_dtype  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.methods.frozen_cache import build_frozen_cache  # noqa: E402
from training.methods.peft import trainable_counts  # noqa: E402
from training.methods.stepper import Stepper  # noqa: E402
from training.run.build import build_model  # noqa: E402


def parse_args(argv=None):
    p = step_bench_parser(__doc__, "examples per task batch", steps=5, warmup=1)
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16], help="LoRA ranks (default: %(default)s)")
    p.add_argument("--depths", type=int, nargs="+", default=[2, 4], help="--freeze-upto depths (default: %(default)s)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="(default: %(default)s)")
    p.add_argument("--memory-steps", type=int, default=2, help="CPU: rounds of each arm's memory process "
                   "(0: no memory figures; default: %(default)s)")
    add_clock_arg(p)
    return p.parse_args(argv)


def arm_options(args) -> dict[str, dict]:
    arms = {"full": {}}
    arms.update({f"freeze {d}": {"freeze_upto": d} for d in args.depths})
    arms["bitfit"] = {"peft": "bitfit"}
    arms.update({f"lora r{r}": {"peft": f"lora:r={r}"} for r in args.ranks})
    return arms


def build_arm(base: dict, options: dict, batches, tokenizer, dev, amp):
    """(stepper, the batches it steps on: cached above a frozen prefix, as the trainer would serve them)."""
    cfg = TrainConfig(**base, **options)
    model, _, _ = build_model(cfg)
    model.to(dev)
    arm_batches = [make_batch(d, range(len(d)), tokenizer) for d in batches]
    if model.first_trainable_layer >= 1:
        cache = build_frozen_cache(model, {d.task: d for d in batches}, tokenizer, dev, "memory", compute_dtype=amp)
        arm_batches = [cache.batch(d, range(len(d))) for d in batches]
    return Stepper.build(model, cfg, 10_000, dev, amp), [b.to(dev) for b in arm_batches]


def _memory_child(base: dict, options: dict, steps: int, threads, conn) -> None:
    """One arm alone in a fresh process: (peak RSS MiB, MiB the steps added to the built arm's peak)."""
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device("cpu")
    _, tokenizer, _ = build_model(TrainConfig(**base))
    batches = task_batches(TrainConfig(**base), tokenizer)
    stepper, arm_batches = build_arm(base, options, batches, tokenizer, dev, autocast_dtype(base["precision"], dev))
    del batches
    gc.collect()
    # the peak so far is loading the data files; Linux resets it (VmHWM) on writing 5 to clear_refs
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_mib("VmRSS")
    for i in range(steps):
        for b in arm_batches:
            stepper.step([b], i)
    peak = _status_mib("VmHWM")
    conn.send((peak, peak - before))
    conn.close()


def _status_mib(key: str) -> float:
    """A memory figure of this process from /proc/self/status (kB there), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {key}: the CPU memory figures need Linux")


def cpu_memory(base: dict, options: dict, steps: int, threads) -> tuple[float, float]:
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_memory_child, args=(base, options, steps, threads, theirs))
    p.start()
    result = mine.recv()
    p.join()
    return result


def time_arms(arms: dict, args, dev) -> tuple[dict, dict]:
    """Seconds per step of each arm over the timed rounds; on CUDA also each arm's allocator peak (MiB)."""
    clock, _ = pick_clock(args.clock, args.threads)
    names = list(arms)
    times, peaks = {n: [] for n in names}, {n: 0.0 for n in names}
    for i in range(args.warmup + args.steps):
        for name in (names if i % 2 == 0 else names[::-1]):
            stepper, batches = arms[name]
            if dev.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = clock()
            for b in batches:
                stepper.step([b], i)
            if dev.type == "cuda":
                torch.cuda.synchronize()
                if i >= args.warmup:  # the timed steps' peak, as the docstring says: not the warm-up's
                    peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated() / 2**20)
            if i >= args.warmup:
                times[name].append((clock() - t0) / len(batches))
    return times, peaks


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = dict(model=args.model, data_dir=args.data_dir, batch_size=args.batch_size, device=dev.type,
                precision=args.precision, seed=args.seed)
    amp = autocast_dtype(args.precision, dev)
    _, tokenizer, _ = build_model(TrainConfig(**base))
    batches = task_batches(TrainConfig(**base), tokenizer)
    options = arm_options(args)
    arms = {name: build_arm(base, o, batches, tokenizer, dev, amp) for name, o in options.items()}
    counts = {name: trainable_counts(stepper.model) for name, (stepper, _) in arms.items()}
    times, peaks = time_arms(arms, args, dev)
    memory = {}
    if dev.type == "cpu" and args.memory_steps:
        memory = {name: cpu_memory(base, o, args.memory_steps, args.threads) for name, o in options.items()}

    L = arms["full"][0].model.encoder.num_layers
    _, clock_name = pick_clock(args.clock, args.threads)
    shapes = ", ".join(f"{d.task} {len(d)}x{int(d.lengths.max())}" for d in batches)
    print(f"# PEFT cost: {args.model} ({L} layers), one batch per task ({shapes}), {args.precision}, {dev.type}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_model()}")
    print(f"# {args.steps} timed rounds per arm after {args.warmup} warm-up, interleaved, {clock_name}; seconds per "
          f"step (mean of the three task steps in a round): median [IQR]; speed-up: full's time / the arm's, the "
          f"median of the per-round ratios [IQR]; memory: " + ("CUDA allocator peak MiB" if dev.type == "cuda" else
                                                                 f"peak RSS MiB of the arm alone, {args.memory_steps} "
                                                                 f"rounds (and what they added)"))
    print(f"{'arm':<12}{'trainable':>12}{'share':>9}{'median s':>10}  {'IQR':<15}{'speed-up':>9}  {'IQR':<13}memory")
    for name in arms:
        trainable, total = counts[name]
        q = statistics.quantiles(times[name], n=4, method="inclusive") if len(times[name]) > 1 else [times[name][0]] * 3
        ratio, r1, r3 = paired_ratios(times["full"], times[name])
        mem = (f"{peaks[name]:.0f}" if dev.type == "cuda" else
               f"{memory[name][0]:.0f} (+{memory[name][1]:.0f})" if name in memory else "-")
        print(f"{name:<12}{trainable:>12,}{100 * trainable / total:>8.2f}%{statistics.median(times[name]):>10.3f}  "
              f"[{q[0]:.3f}-{q[2]:.3f}]  {ratio:>8.2f}x  [{r1:.2f}-{r3:.2f}]  {mem}")


if __name__ == "__main__":
    main()
