"""Training step time, ours / transformers.BertModel (MPNetModel for an MPNet), over a grid of batch sizes x
lengths, padded and not.

A step is: forward in train mode (dropout 0.1 on both), loss on the pooled output, backward, AdamW
step, each model with its own optimiser, all on the same batch. Arms:

    ours          Bert(**batch).pooler_output: the same work as the reference (every position of
                  every layer)
    ours-cls      the path the trainer runs with --pooling cls: encode(..., first_only=True), so
                  the last layer computes [CLS] alone (same loss and gradients, less work)
    hf-sdpa       transformers.BertModel, attn_implementation="sdpa" (its default)
    hf-eager      the same with "eager" attention (--ref-attn sdpa eager); for an MPNet (--mpnet-base, or
                  --model of an MPNet folder) MPNetModel, the one arm (its attention is eager only)

Each cell: --warmup untimed rounds, then --repeats timed rounds; a round times every arm once, back
to back, in an order that rotates from round to round, so background load hits all arms alike. A
cell's ratio is the median over rounds of (ours time / reference time) within the round, with its
interquartile range: the ratio of paired times, not of medians. Padded cells draw each sequence's
length uniformly from [T/4, T] (one sequence is T long, as dynamic padding pads to the longest).
With one thread (the default) steps are timed in process CPU seconds (--clock): on a machine
shared with other jobs, wall-clock time mostly measures how long the scheduler kept us waiting.

    python bench/encoder_grid.py --quick                     # MiniLM-L6, one thread, 3 timed rounds
    python bench/encoder_grid.py --bert-base --batch-sizes 8 --lengths 64 128
    python bench/encoder_grid.py --mpnet-base --batch-sizes 32 --lengths 64 --padding unpadded
    python bench/encoder_grid.py --attn-core                 # the attention core alone: matmul vs sdpa

--attn-core times the attention core (scores, mask, softmax, dropout, values; forward and backward,
and forward alone without dropout) on the matmul path and on torch's sdpa, the measurement behind
minbert.model.SDPA_MIN_SCORES_CPU (where "auto" switches to sdpa on CPU).
"""
from __future__ import annotations

import argparse
import datetime
import math
import statistics
import tempfile

import torch
import torch.nn.functional as F
from common import add_clock_arg, cpu_model, paired_ratios, pick_clock  # noqa: E402  (puts the repository on sys.path)
from encoder_vs_hf import add_model_flags, as_batch, checkpoint_dir, load_reference, make_optimizer, model_label

from minbert import BertConfig, load_bert  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    add_model_flags(p)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 64], help="(default: %(default)s)")
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256], help="(default: %(default)s)")
    p.add_argument("--padding", choices=["both", "padded", "unpadded"], default="both",
                   help="which cells: padded batches, unpadded ones, or both (default: %(default)s)")
    p.add_argument("--ref-attn", nargs="+", choices=["sdpa", "eager"], default=None,
                   help="the reference's attention implementations, one arm each (default: sdpa for a BERT, "
                        "eager for an MPNet)")
    p.add_argument("--no-cls-arm", dest="cls_arm", action="store_false",
                   help="leave out the ours-cls arm (the trainer's first_only path)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds per cell (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds per cell first (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="3 timed rounds after 1 warm-up (a shared machine)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads, pinned (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for the batches and dropout (default: %(default)s)")
    p.add_argument("--attn-core", action="store_true", help="time the attention core alone instead (see above)")
    add_clock_arg(p)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup = 3, 1
    if min(args.batch_sizes + args.lengths + [args.repeats, args.threads]) < 1 or args.warmup < 0:
        p.error("--batch-sizes, --lengths, --repeats and --threads must be >= 1, --warmup >= 0")
    return args


def make_batch(B: int, T: int, padded: bool, cfg: BertConfig, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, cfg.vocab_size, (B, T), generator=g)
    lengths = torch.full((B,), T)
    if padded:
        lengths = torch.randint(max(1, T // 4), T + 1, (B,), generator=g)
        lengths[0] = T  # dynamic padding pads to the longest sequence
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T)
    return as_batch(ids, mask, cfg)  # [CLS] first, padding's id, token types for a BERT


def pooled_full(model, batch):  # ours and the reference: every position of every layer
    return model(**batch).pooler_output


def pooled_cls(model, batch):  # ours as the trainer runs it with --pooling cls
    h = model.embed(batch["input_ids"], batch.get("token_type_ids"))
    return model.pool(model.encode(h, batch["attention_mask"], first_only=True))  # (B, 1, H) -> (B, H)


def step_seconds(model, opt, forward, batch, clock) -> float:
    t0 = clock()
    opt.zero_grad(set_to_none=True)
    forward(model, batch).pow(2).mean().backward()
    opt.step()
    return clock() - t0


def build_arms(args, path) -> dict:
    arms = {"ours": (load_bert(path, attn_impl="auto").train(), pooled_full)}
    if args.cls_arm:
        arms["ours-cls"] = (load_bert(path, attn_impl="auto").train(), pooled_cls)
    for attn in args.ref_attn or [None]:  # None: the reference's default (sdpa; eager for an MPNet)
        ref, attn = load_reference(path, attn)
        arms[f"hf-{attn}"] = (ref.train(), pooled_full)
    return {name: (model, make_optimizer(model, torch.device("cpu"))[0], fwd) for name, (model, fwd) in arms.items()}


def time_cell(arms: dict, batch, warmup: int, repeats: int, clock) -> dict[str, list[float]]:
    names = list(arms)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:  # rotate the order every round
            model, opt, fwd = arms[name]
            t = step_seconds(model, opt, fwd, batch, clock)
            if r >= warmup:
                times[name].append(t)
    return times


def header(args, what: str, cfg=None) -> None:
    print(f"# {what}  {datetime.datetime.now():%Y-%m-%d %H:%M}  CPU: {cpu_model()}  threads {torch.get_num_threads()}"
          f"  torch {torch.__version__}  timed by {pick_clock(args.clock, args.threads)[1]}")
    if cfg is not None:
        print(f"# model: {model_label(args)} ({cfg.model_type}, {cfg.num_hidden_layers} layers, hidden "
              f"{cfg.hidden_size}, {cfg.num_attention_heads} heads)  "
              f"{args.repeats} timed rounds after {args.warmup} warm-up per cell, arms rotated every round")


def run_grid(args) -> None:
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        arms = build_arms(args, checkpoint_dir(args, tmp))
    cfg = arms["ours"][0].config
    header(args, f"training step, ours / transformers {transformers.__version__}", cfg)
    refs = [n for n in arms if n.startswith("hf-")]
    ours = [n for n in arms if n.startswith("ours")]
    cols = [f"{o} / {r}" for r in refs for o in ours]
    print("| batch | length | padded | real tokens | " + " | ".join(f"{n} ms" for n in arms) + " | "
          + " | ".join(f"{c} median [IQR]" for c in cols) + " |")
    print("|" + "---|" * (4 + len(arms) + len(cols)))
    paddings = {"both": (False, True), "padded": (True,), "unpadded": (False,)}[args.padding]
    torch.manual_seed(args.seed)
    for padded in paddings:
        for B in args.batch_sizes:
            for T in args.lengths:
                batch = make_batch(B, T, padded, cfg, args.seed + 1000 * B + T)
                times = time_cell(arms, batch, args.warmup, args.repeats, pick_clock(args.clock, args.threads)[0])
                ms = [f"{statistics.median(times[n]) * 1e3:.0f}" for n in arms]
                ratios = [paired_ratios(times[o], times[r]) for r in refs for o in ours]
                print(f"| {B} | {T} | {'yes' if padded else 'no'} | {int(batch['attention_mask'].sum())} | "
                      + " | ".join(ms) + " | " + " | ".join(f"{m:.2f} [{a:.2f}-{b:.2f}]" for m, a, b in ratios)
                      + " |", flush=True)


def attention_core(q, k, v, bias, p: float, impl: str):
    """minbert.model.Layer.attention's two paths, after the projections."""
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)
    att = (q @ k.transpose(-2, -1)).mul_(1.0 / math.sqrt(q.shape[-1]))
    if bias is not None:
        att += bias
    return F.dropout(att.softmax(-1), p) @ v


def run_attn_core(args) -> None:
    """sdpa / matmul time of the attention core per shape: training (dropout 0.1, forward and backward)
    and dropout-free forward (evaluation, frozen layers)."""
    from minbert.model import padding_bias
    heads, hd = (12, 64) if args.bert_base or args.mpnet_base else (12, 32)
    clock = pick_clock(args.clock, args.threads)[0]
    header(args, f"attention core, sdpa / matmul, {heads} heads of {hd}")
    print(f"# {args.repeats} timed rounds after {args.warmup} warm-up, each round 3 calls per arm")
    print("| batch | length | padded | scores B x heads x T x T | train (p=0.1, fwd+bwd) median [IQR] "
          "| eval (no dropout, fwd) median [IQR] |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator().manual_seed(args.seed)
    paddings = {"both": (False, True), "padded": (True,), "unpadded": (False,)}[args.padding]
    for padded in paddings:
        for B in args.batch_sizes:
            for T in args.lengths:
                q, k, v = (torch.randn(B, heads, T, hd, generator=g, requires_grad=True) for _ in range(3))
                mask = make_batch(B, T, padded, BertConfig(vocab_size=2000), args.seed)["attention_mask"]
                bias = padding_bias(mask, torch.float32)
                grad = torch.randn(B, heads, T, hd, generator=g)
                cells = []
                for p, backward in ((0.1, True), (0.0, False)):
                    def call(impl, p=p, backward=backward):
                        with torch.set_grad_enabled(backward):
                            for _ in range(3):
                                y = attention_core(q, k, v, bias, p, impl)
                                if backward:
                                    y.backward(grad)
                    times = {"sdpa": [], "matmul": []}
                    for r in range(args.warmup + args.repeats):
                        for impl in (("sdpa", "matmul") if r % 2 else ("matmul", "sdpa")):
                            t0 = clock()
                            call(impl)
                            if r >= args.warmup:
                                times[impl].append(clock() - t0)
                    cells.append(paired_ratios(times["sdpa"], times["matmul"]))
                print(f"| {B} | {T} | {'yes' if padded else 'no'} | {B * heads * T * T} | "
                      + " | ".join(f"{m:.2f} [{a:.2f}-{b:.2f}]" for m, a, b in cells) + " |", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    run_attn_core(args) if args.attn_core else run_grid(args)


if __name__ == "__main__":
    main()
