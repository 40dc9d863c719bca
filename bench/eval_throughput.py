"""Inference throughput: `training.evaluate` on the Quora dev set against a plain `transformers` forward
over the same sentence pairs, at the same precision, in sentences (pairs) per second.

Arms, each a full pass over the dev pairs (cross-encoded, as the course recipe predicts them), timed
interleaved after warm-up passes (A B C, then C B A, ...), so that background load hits all alike:

    minbert          training.evaluate.raw_outputs: our MultitaskBert (--pooling, random paraphrase
                     head), batches sorted by length, padding and host->device copies included
    hf-file-order    transformers.BertModel (sdpa) on the same token ids in file order, each batch
                     padded to its longest pair: how one would write it plainly; mean pooling
    hf-sorted        the same model on our length-sorted batches: our kernels against theirs alone

Every pass ends with its outputs on the CPU, as evaluation needs them. The table gives the median
seconds per pass, pairs per second, and the median over passes of the per-pass ratio minbert /
arm with its interquartile range (below 1: ours is faster).

    python bench/eval_throughput.py                              # CUDA + bf16 where available
    python bench/eval_throughput.py --device cpu --max-examples 64 --passes 1 --warmup 0
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
from common import data_parser, paired_ratios  # noqa: E402  (puts the repository on sys.path)

from data.batching import EvalBatching, encode_task  # noqa: E402
from data.loaders import load_task_file  # noqa: E402
from heads import MultitaskBert  # noqa: E402
from minbert import Tokenizer, load_bert, resolve_checkpoint  # noqa: E402
from training.inference.outputs import raw_outputs  # noqa: E402


def parse_args(argv=None):
    p = data_parser(__doc__, "folder with quora-dev.csv")
    p.add_argument("--batch-size", type=int, default=256, help="pairs per batch, as --eval-batch-size "
                   "(default: %(default)s)")
    p.add_argument("--pooling", choices=["cls", "mean"], default="mean",
                   help="our heads' pooling (the README's best recipe: mean) (default: %(default)s)")
    p.add_argument("--max-examples", type=int, default=None, help="only the first N dev pairs (default: all)")
    p.add_argument("--passes", type=int, default=5, help="timed passes per arm (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes per arm first (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto = cuda when available (default: %(default)s)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="autocast for every arm; auto = bf16 on CUDA, fp32 on CPU (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device")
    if min(args.batch_size, args.passes) < 1 or args.warmup < 0 or (args.max_examples or 1) < 1:
        p.error("--batch-size, --passes and --max-examples must be >= 1, --warmup >= 0")
    return args


def hf_pass(ref, batches, device, autocast) -> torch.Tensor:
    """One pass of the reference: mean-pooled last hidden states, on the CPU."""
    outs = []
    with torch.inference_mode():
        for batch in batches:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast():
                h = ref(**batch).last_hidden_state
            m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
            outs.append(((h * m).sum(1) / m.sum(1)).float().cpu())
    return torch.cat(outs)


def file_order_batches(data, tokenizer: Tokenizer, batch_size: int) -> list[dict]:
    seqs = data.sequences[0]
    return [tokenizer.pad(seqs[i:i + batch_size]) for i in range(0, len(seqs), batch_size)]


def sorted_batches(data, tokenizer: Tokenizer, batch_size: int) -> list[dict]:
    from data.batching import eval_batches
    return [b.inputs[0] for b in eval_batches(data, tokenizer, batch_size)]


def build_arms(args, device, autocast):
    from transformers import BertModel  # the reference; benchmark-only dependency
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    ckpt = resolve_checkpoint(args.model)
    tokenizer = Tokenizer.from_checkpoint(ckpt)
    path = f"{args.data_dir}/quora-dev.csv"
    examples = load_task_file(path, "para", labelled=True).examples[: args.max_examples]
    data = encode_task("para", examples, tokenizer, "cross")
    torch.manual_seed(0)  # the heads' initialisation
    ours = MultitaskBert(load_bert(ckpt), "cross", dropout=0.1, pooling=args.pooling).to(device).eval()
    # .float(): an fp16 checkpoint (bench/gpu_prepare.py) becomes fp32 in both, as load_bert makes it
    ref = BertModel.from_pretrained(str(ckpt), attn_implementation="sdpa").float().to(device).eval()
    arms = {
        "minbert": lambda: raw_outputs(ours, data, tokenizer, EvalBatching(args.batch_size), device, autocast),
        # the batches are padded inside the pass, as raw_outputs pads its own
        "hf-file-order": lambda: hf_pass(ref, file_order_batches(data, tokenizer, args.batch_size), device, autocast),
        "hf-sorted": lambda: hf_pass(ref, sorted_batches(data, tokenizer, args.batch_size), device, autocast),
    }
    return arms, len(data), path


def time_pass(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()  # every arm ends with its outputs copied to the CPU: a synchronisation
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    bf16 = args.precision == "bf16" or (args.precision == "auto" and device.type == "cuda")

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    arms, n, path = build_arms(args, device, autocast)
    times = {k: [] for k in arms}
    keys = list(arms)
    for i in range(args.warmup + args.passes):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            t = time_pass(arms[k], device)
            if i >= args.warmup:
                times[k].append(t)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"# {path}: {n} pairs, cross-encoded, batch {args.batch_size}, {args.model}, --pooling {args.pooling}, "
          f"{'bf16 autocast' if bf16 else 'fp32'}, {device} ({name}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.passes} timed passes per arm after {args.warmup}")
    print(f"{'arm':<16}{'median s/pass':>14}{'pairs/s':>10}{'minbert/arm [IQR]':>25}")
    for k in keys:
        ratio, q1, q3 = paired_ratios(times["minbert"], times[k])
        med = statistics.median(times[k])
        print(f"{k:<16}{med:>14.4f}{n / med:>10.0f}{ratio:>12.2f}x [{q1:.2f}-{q3:.2f}]")


if __name__ == "__main__":
    main()
