"""What meeting a new batch shape costs: training steps over an epoch's first batches, a first pass (every
length new to the process) against a second pass over the same batches, per precision, with and without
--pad-multiple.

Why: on the first GPU lent (an H200, 2026-11-26) the first epoch under bf16 autocast took about twice the
later ones (46-56 s against 24-26 s) while fp32's did not. Dynamic padding gives an epoch many distinct
batch lengths (74 on the data copy's training files), and a GPU library picks its kernels per shape the
first time it meets one (and torch.compile compiles per shape); --pad-multiple N rounds the lengths up to
a few. If the per-shape cost is what slows the first epoch, the first pass here costs much more than the
second without it, and little more with it. Each arm runs in a fresh process: those choices are cached
per process, so an arm run after another would find its shapes already met.

On the H100 (2026-11-26) it did: bf16's first pass cost 341 ms more per new length, and torch.profiler put
80% of those steps' host time in cuDNN's attention (aten::_cudnn_attention_forward and _backward), which
builds a graph per shape; fp32 never takes that kernel. `--cudnn-attention on off` adds, for bf16 and fp16,
an arm with sdpa's cuDNN backend switched off (torch.backends.cuda.enable_cudnn_sdp(False)): the other
kernels need no per-shape build, so if the graph building is the cost, that arm's first pass costs about
what its second does, and its second shows what the other kernels cost a step.

    python bench/shape_warmup.py                         # MiniLM-L6, CPU, fp32 and bf16, multiples 1 and 32
    python bench/shape_warmup.py --device cuda --batches 120 --cudnn-attention on off

Prints, per arm: the batch lengths new to the first pass (two warm-up steps on the first batch take the
one-time costs, the optimiser's state and the like, out of it), the first and second pass's seconds,
their ratio, and the first pass's excess over the second per new length.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from common import data_parser  # noqa: E402  (puts the repository on sys.path)

from data.batching import encode_task, make_batch  # noqa: E402
from data.loaders import load_task_file  # noqa: E402
from minbert import Tokenizer, resolve_checkpoint  # noqa: E402
from training.common.device import DTYPES, pick_device  # noqa: E402
from training.config.train_config import TrainConfig  # noqa: E402
from training.methods.stepper import Stepper  # noqa: E402
from training.run.build import build_model, schedule_for_epoch  # noqa: E402


def parse_args(argv=None):
    p = data_parser(__doc__)
    p.add_argument("--batches", type=int, default=48, help="training batches per pass (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per batch (default: %(default)s)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "fp16"],
                   help="autocast precisions, one arm each (default: %(default)s)")
    p.add_argument("--multiples", nargs="+", type=int, default=[1, 32],
                   help="--pad-multiple values, one arm each (default: %(default)s)")
    p.add_argument("--cudnn-attention", nargs="+", default=["on"], choices=["on", "off"],
                   help="sdpa's cuDNN backend on CUDA, one arm each under bf16 and fp16 (fp32 never takes it) "
                        "(default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--arm", nargs=3, metavar=("PRECISION", "MULTIPLE", "CUDNN"),
                   help=argparse.SUPPRESS)  # internal: run one arm in this process and print its JSON
    return p.parse_args(argv)


def epoch_batches(cfg: TrainConfig, tokenizer, n: int) -> list:
    """The first n training batches of epoch 0's schedule (bucketed, as training draws them), unbuilt."""
    train = {t: encode_task(t, load_task_file(cfg.file(t, "train"), t, labelled=True).examples, tokenizer,
                            cfg.pair_encoding, cfg.max_length) for t in cfg.tasks}
    schedule = [tb for (tb,) in schedule_for_epoch(cfg, train, 0)][:n]
    return [(train[tb.task], tb.indices) for tb in schedule]


def run_arm(args, precision: str, multiple: int, cudnn: str = "on") -> dict:
    """Two passes of training steps over the same batches, in this process; seconds of each."""
    torch.backends.cuda.enable_cudnn_sdp(cudnn == "on")
    cfg = TrainConfig(model=args.model, data_dir=args.data_dir, batch_size=args.batch_size, device=args.device,
                      precision=precision, pad_multiple=multiple, warmup_ratio=0.0)
    dev = pick_device(args.device)
    model, _, _ = build_model(cfg)
    stepper = Stepper.build(model.to(dev), cfg, 10_000, dev, DTYPES[precision])
    tokenizer = Tokenizer.from_checkpoint(resolve_checkpoint(args.model))
    batches = [make_batch(d, idx, tokenizer, multiple, cfg.max_length)
               for d, idx in epoch_batches(cfg, tokenizer, args.batches)]
    for i in range(2):  # one-time costs (the optimiser's state, the allocator) out of the first pass
        stepper.step([batches[0].to(dev)], i)
    lengths = {b.inputs[0]["input_ids"].shape[1] for b in batches[1:]} - {batches[0].inputs[0]["input_ids"].shape[1]}
    passes = []
    for _ in range(2):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            stepper.step([b.to(dev)], i)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        passes.append(time.perf_counter() - t0)
    cudnn_used = "on" if torch.backends.cuda.cudnn_sdp_enabled() else "off"  # as this process ran it
    return {"precision": precision, "multiple": multiple, "cudnn": cudnn_used, "lengths": len(lengths),
            "passes": passes}


def arms(args) -> list[tuple[str, int, str]]:
    """(precision, multiple, cuDNN attention) per arm; fp32 once per multiple (cuDNN's attention is bf16/fp16 only)."""
    return [(precision, multiple, cudnn) for precision in args.precisions for multiple in args.multiples
            for cudnn in (args.cudnn_attention if precision != "fp32" else ["on"])]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.arm:
        print(json.dumps(run_arm(args, args.arm[0], int(args.arm[1]), args.arm[2])))
        return
    common = list(argv if argv is not None else sys.argv[1:])  # each arm's process gets the same flags
    print(f"# {args.model}, {args.batches} training batches of {args.batch_size} per pass, {args.device}, "
          f"torch {torch.__version__}; each arm in a fresh process")
    print(f"{'arm':<22}{'lengths':>8}{'first s':>9}{'second s':>10}{'ratio':>7}{'excess ms per length':>22}")
    for precision, multiple, cudnn in arms(args):
        # in this folder, as relative --model and --data-dir paths were given
        out = subprocess.run([sys.executable, __file__, *common, "--arm", precision, str(multiple), cudnn],
                             capture_output=True, text=True)
        if out.returncode:
            last = (out.stderr.strip().splitlines() or ["no message"])[-1]
            sys.exit(f"shape_warmup.py: the arm {precision} x{multiple} failed (exit {out.returncode}): {last}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        first, second = r["passes"]
        excess = f"{(first - second) / r['lengths'] * 1e3:.1f}" if r["lengths"] else "-"
        label = f"{precision} x{multiple}" + (" no-cudnn" if r["cudnn"] == "off" else "")
        print(f"{label:<22}{r['lengths']:>8}{first:>9.2f}{second:>10.2f}{first / second:>7.2f}{excess:>22}")


if __name__ == "__main__":
    main()
