"""One training step of our encoder vs transformers.BertModel (MPNetModel for an MPNet): same weights, same
batch, same optimizer.

A step is: forward (train mode, dropout 0.1 on both), loss on the pooled output, backward, AdamW step.
The two models are timed interleaved (A B, then B A, ...) after warm-up, so that background load
hits both alike; the table gives the median and min seconds per step and the ratio ours/reference
(the median over rounds of the two steps' ratio within a round, with its interquartile range),
the achieved model TFLOP/s (6 x non-embedding parameters x tokens + 12 x layers x hidden x T per
token for attention, the PaLM paper's count; padding counted as computed), model FLOPs utilisation
against --peak-tflops, and on CUDA the step's peak memory above what was allocated before it.

    python bench/encoder_vs_hf.py                                # MiniLM-L6, B=32, T=64, CPU
    python bench/encoder_vs_hf.py --ref-attn eager --padded
    python bench/encoder_vs_hf.py --bert-base --steps 5          # bert-base shape, random weights
    python bench/encoder_vs_hf.py --mpnet-base --precision bf16  # all-mpnet-base-v2's shape, random weights
    python bench/encoder_vs_hf.py --model mpnet-base             # the real all-mpnet-base-v2 (or any MPNet folder)

An MPNet (config.json's model_type) is timed against transformers' MPNetModel, whose attention is eager only.

One shape per run; bench/encoder_grid.py times the batch x length grid.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing
from common import cpu_model, paired_ratios, write_bert_base_shape, write_mpnet_base_shape  # noqa: E402

from minbert import load_bert, resolve_checkpoint  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    add_model_flags(p)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per batch (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default: %(default)s)")
    p.add_argument("--padded", action="store_true", help="realistic padding: each sequence's length is uniform "
                   "in [seq_len/4, seq_len], the rest is padding (default: no padding)")
    p.add_argument("--steps", type=int, default=10, help="measured steps per implementation (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto = cuda when available, else cpu (default: %(default)s)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="bf16: both arms' steps under bf16 autocast (on CPU too); auto = bf16 on cuda, fp32 on cpu "
                        "(default: %(default)s)")
    p.add_argument("--ref-attn", choices=["sdpa", "eager"], default=None,
                   help="attn_implementation of the reference (default: sdpa for a BERT; eager for an MPNet, "
                        "the only one transformers' MPNetModel has)")
    p.add_argument("--ours-attn", choices=["auto", "sdpa", "matmul"], default="auto",
                   help="our attn_impl; auto = matmul on CPU, sdpa on CUDA (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0, help="seed for the batch and dropout (default: %(default)s)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's peak dense TFLOP/s for MFU (default: 989 on H100/H200 SXM in bf16, else no MFU)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device")
    if min(args.batch_size, args.seq_len, args.steps) < 1 or args.warmup < 0:
        p.error("--batch-size, --seq-len and --steps must be >= 1, --warmup >= 0")
    return args


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """--model, --bert-base and --mpnet-base, which checkpoint_dir and model_label read."""
    p.add_argument("--model", default="minilm-l6", help="checkpoint: alias, local HF-layout dir or hub id, a BERT "
                   "or an MPNet (default: %(default)s); ignored with --bert-base or --mpnet-base")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--bert-base", action="store_true", help="bert-base shape (12 layers, hidden 768, 12 heads, "
                       "FFN 3072) with random weights, written once in the HF layout to a temp dir, loaded by every "
                       "arm")
    shape.add_argument("--mpnet-base", action="store_true", help="all-mpnet-base-v2's shape (bert-base's, with "
                       "MPNet's relative position bias) with random weights, written once by transformers' "
                       "MPNetModel to a temp dir, loaded by every arm")


def checkpoint_dir(args, tmp: str) -> Path:
    if args.bert_base:
        return write_bert_base_shape(tmp, args.seed)
    if args.mpnet_base:
        return write_mpnet_base_shape(tmp, args.seed)
    return resolve_checkpoint(args.model)


def model_label(args) -> str:
    return ("bert-base shape, random" if args.bert_base else "mpnet-base shape, random" if args.mpnet_base
            else args.model)


def load_reference(path: Path, attn: str | None):
    """transformers' model of the folder's config.json model_type (MPNetModel for "mpnet", else BertModel)
    with `attn` (None: sdpa for a BERT, eager for an MPNet), and the attention it runs."""
    from transformers import BertModel, MPNetModel  # the reference; benchmark-only dependency
    mpnet = json.loads((Path(path) / "config.json").read_text()).get("model_type") == "mpnet"
    if mpnet and attn == "sdpa":
        raise SystemExit("--ref-attn sdpa: transformers' MPNetModel has eager attention only")
    attn = attn or ("eager" if mpnet else "sdpa")
    return (MPNetModel if mpnet else BertModel).from_pretrained(str(path), attn_implementation=attn), attn


def as_batch(ids, mask, cfg) -> dict:
    """ids (B, T) and mask as the model's batch: [CLS] first (MPNet: <s>), its padding id where mask is 0,
    and zero token types for a BERT (an MPNet has none)."""
    mpnet = cfg.model_type == "mpnet"
    ids = ids.clone()
    ids[:, 0] = 0 if mpnet else 101
    ids = torch.where(mask.bool(), ids, cfg.pad_token_id)
    batch = {"input_ids": ids, "attention_mask": mask}
    return batch if mpnet else {**batch, "token_type_ids": torch.zeros_like(ids)}


def make_batch(args, cfg, device):
    g = torch.Generator().manual_seed(args.seed)
    B, T = args.batch_size, args.seq_len
    ids = torch.randint(1000, cfg.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if args.padded:
        lengths = torch.randint(max(1, T // 4), T + 1, (B,), generator=g)
        mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return {k: v.to(device) for k, v in as_batch(ids, mask, cfg).items()}


def make_optimizer(model, device):
    """AdamW, fused where this torch supports it on this device, else foreach (same choice for both)."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
        opt.zero_grad(set_to_none=True)
        return opt, "fused"
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, lr=1e-5, foreach=True), "foreach"


def train_flops(cfg, batch_size: int, seq_len: int) -> float:
    """Model FLOPs of one training step (forward + backward), PaLM appendix B: 6N per token for the
    N non-embedding parameters, plus 12 L H T per token for the attention scores and values."""
    H, L, F = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    per_layer = 4 * H * H + 2 * H * F  # qkv + attention output, FFN in + out (weights only)
    n = L * per_layer + H * H  # + pooler
    tokens = batch_size * seq_len
    return 6 * n * tokens + 12 * L * H * seq_len * tokens


def peak_tflops(args, dev) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    name = torch.cuda.get_device_name() if dev.type == "cuda" else ""
    if any(k in name for k in ("H100", "H200")) and not any(k in name for k in ("PCIe", "NVL")):
        return 989.0  # dense bf16 tensor-core peak of the SXM parts; PCIe and NVL parts are slower
    return None  # unknown: no MFU column figure unless --peak-tflops gives the peak


def train_step(model, opt, batch, device, bf16: bool) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        pooled = model(**batch).pooler_output
    loss = pooled.float().pow(2).mean()
    loss.backward()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def time_interleaved(runs: dict, batch: dict, dev: torch.device, args) -> tuple[dict, dict]:
    """Seconds per step of each implementation, their steps alternated (A B, B A, ...: no order bias), and
    on CUDA each one's peak memory added by a step."""
    times, peak_mem = {name: [] for name in runs}, dict.fromkeys(runs, 0)
    torch.manual_seed(args.seed)
    for i in range(args.warmup + args.steps):
        for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
            model, opt, _, _ = runs[name]
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            t = train_step(model, opt, batch, dev, args.precision == "bf16")
            if i >= args.warmup:
                times[name].append(t)
                if dev.type == "cuda":
                    peak_mem[name] = max(peak_mem[name], torch.cuda.max_memory_allocated() - before)
    return times, peak_mem


def main(argv=None):
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                       else "cpu")
    if args.precision == "auto":
        args.precision = "bf16" if dev.type == "cuda" else "fp32"
    ours_attn = args.ours_attn if args.ours_attn != "auto" else ("sdpa" if dev.type == "cuda" else "matmul")
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint_dir(args, tmp)
        ours = load_bert(path, attn_impl=args.ours_attn).to(dev).train()
        ref, ref_attn = load_reference(path, args.ref_attn)
        ref = ref.to(dev).train()
    batch = make_batch(args, ours.config, dev)

    ours.eval(), ref.eval()  # sanity: same function before any step
    with torch.no_grad():
        diff = (ours(**batch).pooler_output - ref(**batch).pooler_output).abs().max().item()
    ours.train(), ref.train()

    runs = {"minbert": (ours, *make_optimizer(ours, dev), ours_attn),
            "transformers": (ref, *make_optimizer(ref, dev), ref_attn)}
    times, peak_mem = time_interleaved(runs, batch, dev, args)

    cfg = ours.config
    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M}  torch {torch.__version__}  threads {torch.get_num_threads()}"
          f"  device {dev} ({'bf16 autocast' if args.precision == 'bf16' else 'fp32'})"
          f"{' ' + torch.cuda.get_device_name() if dev.type == 'cuda' else ''}")
    print(f"# CPU: {cpu_model()}")
    print(f"# model: {model_label(args)} ({cfg.model_type}, {cfg.num_hidden_layers} layers, "
          f"hidden {cfg.hidden_size})  batch {args.batch_size}x{args.seq_len}"
          f"{' padded, ' + str(int(batch['attention_mask'].sum())) + ' real tokens' if args.padded else ''}  "
          f"steps {args.steps} (+{args.warmup} warm-up)  AdamW {runs['minbert'][2]}  "
          f"eval pooled max|diff| {diff:.1e}")
    ratio, q1, q3 = paired_ratios(times["minbert"], times["transformers"])
    flops, peak = train_flops(cfg, args.batch_size, args.seq_len), peak_tflops(args, dev)
    print(f"{'implementation':<14} {'attn':<7} {'median s/step':>13} {'min':>8} {'TFLOP/s':>8}"
          f" {'MFU':>7} {'step peak MiB':>14}")
    for name, (_, _, _, attn) in runs.items():
        med = statistics.median(times[name])
        tflops = flops / med / 1e12
        mfu = f"{tflops / peak:7.2%}" if peak else f"{'-':>7}"  # 2 decimals: a summary judges the target on it
        mem = f"{peak_mem[name] / 2**20:14.0f}" if dev.type == "cuda" else f"{'-':>14}"
        print(f"{name:<14} {attn:<7} {med:>13.4f} {min(times[name]):>8.4f} {tflops:>8.2f} {mfu} {mem}")
    # 3 decimals: bench/gpu_summary.py judges the 0.9 target on the printed figure
    print(f"ratio minbert / transformers: {ratio:.3f}x (median of {args.steps} paired steps, IQR {q1:.3f}-{q3:.3f})")


if __name__ == "__main__":
    main()
