"""What running the task heads in fp32 under bf16 autocast costs: one multi-task training step (forward
through encoder and head, loss, backward, AdamW) with the heads in fp32 (MultitaskBert today) against the
heads inside the autocast region (as before), the arms interleaved, median of paired ratios (target:
<= 1.02). Also the distinct STS scores of each arm on a batch of dev pairs (bf16 heads round the 0-5
score to steps of 1/32 above 4).

    python bench/heads_precision.py --threads 1 --steps 10
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_clock_arg, cpu_model, paired_ratios, pick_clock, step_bench_parser  # noqa: E402

from data.batching import encode_task, make_batch  # noqa: E402
from data.loaders import load_task_split  # noqa: E402
from heads import MultitaskBert, task_loss  # noqa: E402
from minbert import Tokenizer, load_bert, resolve_checkpoint  # noqa: E402


class AutocastHeads(MultitaskBert):
    """The heads as they ran before: inside the encoder's autocast region."""

    def from_hidden(self, task, hs, masks, layer):
        return self.heads[task](*[self.pool(h, m, layer) for h, m in zip(hs, masks)])


def build(cls, ckpt, seed):
    torch.manual_seed(seed)
    return cls(load_bert(ckpt), "cross", 0.1, "mean")


def main(argv=None) -> int:
    p = step_bench_parser(__doc__, "pairs per step", steps=10, warmup=2)
    add_clock_arg(p)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock, clock_name = pick_clock(args.clock, args.threads)
    ckpt = resolve_checkpoint(args.model)
    tok = Tokenizer.from_checkpoint(ckpt)
    sts = load_task_split(args.data_dir, "sts", "dev").examples[: args.batch_size * 4]
    data = encode_task("sts", sts, tok, "cross", 128)
    batches = [make_batch(data, list(range(i, i + args.batch_size)), tok) for i in range(0, len(sts), args.batch_size)]
    arms = {"fp32 heads": build(MultitaskBert, ckpt, args.seed),
            "autocast heads": build(AutocastHeads, ckpt, args.seed)}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-5) for k, m in arms.items()}
    times = {k: [] for k in arms}
    for r in range(args.warmup + args.steps):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for name in order:
            batch = batches[r % len(batches)]
            t0 = clock()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = arms[name]("sts", batch.inputs)
            task_loss("sts", out, batch.labels).backward()
            optims[name].step()
            optims[name].zero_grad(set_to_none=True)
            if r >= args.warmup:
                times[name].append(clock() - t0)
    med, q1, q3 = paired_ratios(times["fp32 heads"], times["autocast heads"])
    print(f"{cpu_model()}, {torch.get_num_threads()} thread(s), bf16 autocast, batch {args.batch_size} STS pairs, "
          f"{args.steps} rounds, {clock_name}")
    for name, ts in times.items():
        print(f"  {name:15s} median {statistics.median(ts) * 1000:8.1f} ms per step")
    print(f"  fp32 heads / autocast heads: {med:.3f} [IQR {q1:.3f}-{q3:.3f}] (target <= 1.02)")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for name, model in arms.items():
            model.eval()
            scores = torch.cat([model("sts", b.inputs).float() for b in batches])
            print(f"  {name:15s} distinct STS scores: {len(set(scores.tolist()))} of {len(scores)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
