"""What one training step asks of the host: the operations it dispatches (on CUDA, about one kernel
launch each), the host synchronisations among them (each `.item()`, `bool(tensor)` and the like waits
for the GPU to drain its queue), and the batches' host-to-device copies, per phase of the step.

On a GPU a small model's step is bound by these, not by the arithmetic (docs/benchmarks.md, the H200
section: 9% busy). Counted on the CPU, where the same Python code runs: the counts are what a change to
our loop must cut, measured without a GPU. CPU-only paths inflate the CPU's count a little (our
dropout's mask, the matmul attention where CUDA takes sdpa, the CPU's fused AdamW).

    python bench/step_ops.py [--steps 4] [--skip 2] -- RUN_MULTITASK_FLAGS...
    python bench/step_ops.py -- --epochs 3 --smart --smart-lambda 0 --pooling mean --ema-decay 0.998 --precision bf16
    python bench/step_ops.py --device cuda --profile 20 -- --smart --smart-lambda 0 --pooling mean --ema-decay 0.998

--profile N then times --steps more steps under torch.profiler and prints the top N ops by the host's
own time and, on CUDA, by the device's, and the device's busy share: its kernels' time (each kernel
once, the profiler's "Self CUDA time total") over the steps' wall time (where it is low, the host is what
the step waits for).

Counts are per step, the mean over --steps steady-state steps after --skip; each synchronisation is
listed with the line of ours that asked for it.
"""
from __future__ import annotations

import argparse
import collections
import functools
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data import batching  # noqa: E402
from training.methods import smart, stepper  # noqa: E402
from training.run.build import updates_for_epoch  # noqa: E402
from training.run.trainer import Run  # noqa: E402
from training.train import parse  # noqa: E402

# where our code reads tensors still on the host (a batch before its copy): no wait for the device
HOST_SIDE = ("data/batching.py",)
# ops that copy a device value to the host: a synchronisation on CUDA
SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique", "_unique2",
         "repeat_interleave"}


class Counter(TorchDispatchMode):
    """Counts every dispatched op under the phase named last by `enter`, and where each sync came from."""

    def __init__(self):
        super().__init__()
        self.phase = ["other"]
        self.ops = collections.Counter()     # phase -> ops that compute (views left out)
        self.syncs = collections.Counter()   # (phase, op, our line) -> count
        self.copies = 0                      # tensors Batch.to sent to the device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not (func.is_view or name in ("detach", "alias", "lift_fresh")):
            self.ops[self.phase[-1]] += 1
        if name in SYNCS:
            self.syncs[(self.phase[-1], name, our_line())] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        # reads of a whole tensor into Python dispatch no op on a CPU tensor, but wait for a CUDA one
        self.saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
        for name, method in self.saved.items():
            setattr(torch.Tensor, name, self._counted(name, method))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self.saved.items():
            setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)

    def _counted(self, name: str, method):
        def read(tensor, *a, **kw):
            self.syncs[(self.phase[-1], name, our_line())] += 1
            return method(tensor, *a, **kw)
        return read

    def enter(self, name: str, fn):
        @functools.wraps(fn)
        def wrapped(*a, **kw):
            self.phase.append(name)
            try:
                return fn(*a, **kw)
            finally:
                self.phase.pop()
        return wrapped


def our_line() -> str:
    """The innermost frame of this repository's code (not this script) that led here."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = Path(frame.filename)
        if REPO in path.parents and path.name != Path(__file__).name:
            return f"{path.relative_to(REPO)}:{frame.lineno} ({frame.name})"
    return "?"


def instrument(run: Run, count: Counter) -> None:
    """Names the step's phases by wrapping the methods that do them (the innermost wins)."""
    step = run.stepper
    model = run.model
    model.hidden_at = count.enter("forward: embeddings", model.hidden_at)
    model.from_hidden = count.enter("forward: encoder, pooling, head", model.from_hidden)
    stepper.task_loss = count.enter("loss", stepper.task_loss)
    stepper.bregman_loss = count.enter("SMART: Bregman term", stepper.bregman_loss)
    smart.EMATeacher.__call__ = count.enter("SMART: teacher forward", smart.EMATeacher.__call__)
    smart.EMATeacher.update = count.enter("SMART: teacher update", smart.EMATeacher.update)
    stepper.Stepper._backward = count.enter("backward", stepper.Stepper._backward)
    torch.nn.utils.clip_grad_norm_ = count.enter("gradient clipping", torch.nn.utils.clip_grad_norm_)
    step.optimizer.step = count.enter("optimiser", step.optimizer.step)
    step.optimizer.zero_grad = count.enter("optimiser", step.optimizer.zero_grad)
    if step.ema is not None:
        step.ema.update = count.enter("weight average", step.ema.update)
    run.load_batch = count.enter("batch", run.load_batch)
    to_device = batching.Batch.to

    def counted_to(batch, device):
        count.copies += sum(torch.is_tensor(v) for s in batch.inputs for v in s.values()) + (batch.labels is not None)
        return to_device(batch, device)
    batching.Batch.to = counted_to


class NoBar:
    """The progress bar train_step reports to: not shown here."""

    def set_postfix(self, *a, **kw):
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage="%(prog)s [options] -- FLAGS...",
                                 allow_abbrev=False)
    ap.add_argument("--steps", type=int, default=4, help="steps counted (default 4)")
    ap.add_argument("--skip", type=int, default=2, help="steps run first, not counted (default 2)")
    ap.add_argument("--examples", type=int, default=128, help="training examples per task (default 128)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: counts do not depend on it)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the steps run")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile --steps more steps and print their top N ops (default 0: not)")
    ap.add_argument("flags", nargs="*", help="run_multitask.py's flags, after --")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)
    out = tempfile.mkdtemp(prefix="step-ops-")
    _, cfg = parse([*args.flags, "--device", args.device, "--max-train-examples", str(args.examples),
                    "--out-dir", out, "--overwrite"])
    run = Run(cfg).setup()
    count = Counter()
    instrument(run, count)
    total = args.skip + args.steps * (2 if args.profile else 1)
    updates = updates_for_epoch(cfg, run.data.train, 0)[:total]
    if len(updates) < total:
        ap.error(f"only {len(updates)} steps in an epoch of {args.examples} examples per task: raise --examples")
    bar = NoBar()
    for i, update in enumerate(updates[: args.skip + args.steps]):
        if i == args.skip:
            count.ops.clear()
            count.syncs.clear()
            count.copies = 0
        with count:
            run.train_step(update, bar)
    n = args.steps
    print(f"# {' '.join(args.flags) or '(defaults)'}: {cfg.model}, precision {cfg.precision}, "
          f"{n} steps after {args.skip}, torch {torch.__version__}")
    print(f"{'phase':<34} {'ops per step':>12}")
    for phase, k in count.ops.most_common():
        print(f"{phase:<34} {k / n:>12.1f}")
    print(f"{'all':<34} {sum(count.ops.values()) / n:>12.1f}")
    device_syncs = sum(k for (_, _, line), k in count.syncs.items() if not line.startswith(HOST_SIDE))
    print(f"host syncs per step: {device_syncs / n:.1f}; tensors copied to the device per step: {count.copies / n:.1f}")
    for (phase, op, line), k in count.syncs.most_common():
        host = "  (a host tensor: no wait)" if line.startswith(HOST_SIDE) else ""
        print(f"  {k / n:4.1f}  {op:<20} {phase:<34} {line}{host}")
    if args.profile:
        profile_steps(run, updates[args.skip + args.steps:], bar, args.profile)
    return 0


def profile_steps(run: Run, updates: list, bar, rows: int) -> None:
    """The steps under torch.profiler: top ops by host time (and device time on CUDA), device busy share."""
    from torch.profiler import ProfilerActivity, profile
    cuda = run.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for update in updates:
            run.train_step(update, bar)
        sync()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    print(f"\n# profiled {len(updates)} steps: {1000 * wall / len(updates):.2f} ms a step (wall)")
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows))
    if cuda:  # torch >= 2.4 names the device's time "device" (it was "cuda")
        print(events.table(sort_by="self_device_time_total", row_limit=rows))
        kernels = kernel_seconds(events)
        print(f"device busy: {kernels:.3f} s of kernels in {wall:.3f} s of steps ({kernels / wall:.0%})")


def kernel_seconds(events) -> float:
    """The device's time in the profiled events, each kernel once: the table's "Self CUDA time total".

    Under the CUDA activity a kernel shows twice in key_averages(): as its own event (device_type CUDA)
    and in the self device time of the aten op that launched it (a CPU event holding the kernel), so a
    sum over every event counts each kernel twice (before 2026-11-27 this script did: its busy shares
    were about double). Only the device's own events are summed, less the user annotations (a
    record_function range such as Optimizer.step#AdamW.step, timed on the device over kernels counted
    already), as torch's table does for its total."""
    def once(e) -> bool:
        if e.device_type == DeviceType.CPU:
            return e.is_legacy  # the legacy profiler's kernels live on their CPU events alone
        return not e.is_user_annotation
    return sum(e.self_device_time_total for e in events if once(e)) / 1e6  # microseconds -> seconds


if __name__ == "__main__":
    sys.exit(main())
