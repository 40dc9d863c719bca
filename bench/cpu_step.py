"""The encoder's training step against the CPU's own matmul rate and against transformers, per precision.

    python bench/cpu_step.py --threads 1                  # MiniLM, batch 32 x 128, fp32 and bf16
    python bench/cpu_step.py --threads 1 --profile 12     # and each precision's top ops of one step

A step is the encoder's forward and backward in training mode (dropout on) on a random batch of
--batch-size x --length tokens, no padding, loss = mean of the last hidden states squared. Arms, each its
own copy of the same weights, their rounds interleaved (the order reversed every other round):

    ours              minbert's Bert, its dropout drawing masks in float32 uniforms in every dtype
    ours, nn.Dropout  the same with torch's nn.Dropout (the bf16 path before: Bernoulli in bf16)
    transformers      transformers.BertModel (sdpa attention), when installed

Printed per precision: each arm's median step time; the model's FLOPs per step counted analytically
(the matmuls: 2 per multiply-add, the backward twice the forward) over that time; the one-thread rate of
the step's own GEMMs (every linear's forward, input-gradient and weight-gradient product and the
attention's batched products, each timed alone in the precision's dtype); the step's share of it; and the
median of paired per-round ratios against transformers and against the nn.Dropout arm.
"""
from __future__ import annotations

import datetime
import statistics
import time

import torch
from common import cpu_model, paired_ratios, step_bench_parser  # noqa: E402  (repo on sys.path)

from minbert import load_bert, resolve_checkpoint  # noqa: E402
from minbert.model import Dropout  # noqa: E402

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # fp16: emulated without AMX-FP16


def parse_args(argv=None):
    p = step_bench_parser(__doc__, "sequences per batch", steps=5, warmup=2)
    p.add_argument("--length", type=int, default=128, help="tokens per sequence (default: %(default)s)")
    p.add_argument("--precisions", nargs="+", choices=list(DTYPES), default=["fp32", "bf16"],
                   help="(default: %(default)s)")
    p.add_argument("--no-transformers", action="store_true", help="leave the transformers arm out")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N ops of one step")
    return p.parse_args(argv)


def step_flops(cfg, B: int, T: int) -> float:
    """Matmul FLOPs of one forward and backward: per layer the four H x H projections (q, k, v, out), the
    two H x I ones, and the attention's two T x T x H products; the backward twice the forward."""
    H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    forward = L * (2 * B * T * (4 * H * H + 2 * H * I) + 2 * 2 * B * T * T * H)
    return 3.0 * forward


def gemm_rate(cfg, B: int, T: int, dtype, repeats: int = 3) -> float:
    """FLOP/s of the step's own GEMMs, each timed alone (the best of `repeats`), one after the other."""
    H, I, nh = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
    M = B * T
    shapes = [(M, H, 3 * H), (M, H, H), (M, H, I), (M, I, H)]  # x (M, K) @ W^T (K, N)
    products = []
    for m, k, n in shapes:
        products += [((m, k), (k, n)), ((m, n), (n, k)), ((n, m), (m, k))]  # forward, d input, d weight
    bmm = [((B * nh, T, H // nh), (B * nh, H // nh, T)), ((B * nh, T, T), (B * nh, T, H // nh))]
    flops = seconds = 0.0
    for a_shape, b_shape in products + bmm * 3:  # the attention's two products, forward and backward
        a, b = torch.randn(a_shape, dtype=dtype or torch.float32), torch.randn(b_shape, dtype=dtype or torch.float32)
        f = torch.bmm if a.ndim == 3 else torch.mm
        f(a, b)
        best = min(_timed(f, a, b) for _ in range(repeats))
        flops += 2.0 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.ndim == 3 else 1)
        seconds += best
    return flops / seconds


def _timed(f, a, b) -> float:
    t0 = time.perf_counter()
    f(a, b)
    return time.perf_counter() - t0


def arms(args):
    path = resolve_checkpoint(args.model)
    out = {"ours": load_bert(path).train()}
    plain = load_bert(path).train()
    for m in plain.modules():
        if isinstance(m, Dropout):
            m.forward = torch.nn.Dropout.forward.__get__(m)  # torch's own dropout, as before
    out["ours, nn.Dropout"] = plain
    if not args.no_transformers:
        try:
            from transformers import BertModel
            out["transformers"] = BertModel.from_pretrained(str(path), attn_implementation="sdpa",
                                                            add_pooling_layer=False).train()
        except ImportError:
            print("# transformers is not installed: its arm is left out")
    return out


def run_step(name: str, model, ids, dtype) -> None:
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        if name == "transformers":
            h = model(input_ids=ids).last_hidden_state
        else:
            h = model.encode(model.embed(ids))
    h.float().pow(2).mean().backward()
    for p in model.parameters():
        p.grad = None


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = arms(args)
    cfg = models["ours"].config
    B, T = args.batch_size, args.length
    ids = torch.randint(1000, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(args.seed))
    flops = step_flops(cfg, B, T)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {datetime.date.today()}; "
          f"{args.model} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), batch {B} x {T}, "
          f"{flops / 1e9:.0f} GFLOP a step; {args.steps} timed rounds after {args.warmup}, medians")
    for precision in args.precisions:
        dtype = DTYPES[precision]
        times = {name: [] for name in models}
        names = list(models)
        for i in range(args.warmup + args.steps):
            for name in names if i % 2 == 0 else names[::-1]:
                torch.manual_seed(i)
                t0 = time.perf_counter()
                run_step(name, models[name], ids, dtype)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
        rate = gemm_rate(cfg, B, T, dtype)
        print(f"\n{precision}: the step's GEMMs alone run at {rate / 1e9:.0f} GFLOP/s")
        for name in names:
            med = statistics.median(times[name])
            line = (f"  {name:18s} {med * 1000:8.0f} ms  {flops / med / 1e9:6.0f} GFLOP/s  "
                    f"{flops / med / rate:5.0%} of GEMM")
            for other in ("transformers", "ours, nn.Dropout"):
                if other in times and other != name:
                    r, q1, q3 = paired_ratios(times[name], times[other])
                    line += f"  x{r:.2f} of {other} [{q1:.2f}-{q3:.2f}]"
            print(line, flush=True)
        if args.profile:
            profile_step(models["ours"], ids, dtype, args.profile)


def profile_step(model, ids, dtype, rows: int) -> None:
    from torch.profiler import ProfilerActivity, profile
    run_step("ours", model, ids, dtype)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_step("ours", model, ids, dtype)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


if __name__ == "__main__":
    main()
