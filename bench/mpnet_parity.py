"""Our MPNet against transformers.MPNetModel on a real checkpoint (e.g. all-mpnet-base-v2), fp32: the largest
absolute difference of every hidden state (0 = the embeddings' output, then each layer's) and of the
pooler output, over single sentences and sentence pairs, padded to the longest in each batch, for both
of our attention paths (matmul, sdpa) against transformers' eager attention, over the real tokens. The sdpa
path sums in another order, so both it and transformers' fp32 are also measured against the same model
in fp64. It also checks that our tokenizer gives transformers' (AutoTokenizer) ids for the same inputs.

    python bench/mpnet_parity.py /path/to/all-mpnet-base-v2
    python bench/mpnet_parity.py /path/to/all-mpnet-base-v2 --sentences 256 --max-length 128

The sentences are the first --sentences pairs of STS dev and Quora dev (--data-dir); where those files are
missing, a few sentences written here. Exit status 1 when the matmul path differs by more than --atol
(default 1e-5, the issue's bar), when the sdpa path is further from fp64 than 1.5x transformers' fp32
(or --atol, the larger), or when the tokenizers disagree.
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from common import REPO  # puts the repository on sys.path

from minbert import Tokenizer, load_bert

FALLBACK = [("A man is playing a guitar.", "A man plays the guitar on stage."),
            ("How do I stay calm before a competitive exam?", "What are tips for staying calm during an exam?"),
            ("No one goes unindicted here.", "ok"),
            ("Two black dogs are playing on the grass.", "Dogs play."),
            ("UN chief welcomes peaceful presidential elections in Guinea", "Guinea votes")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("model", help="a Hugging Face MPNet folder (config.json with model_type mpnet, the weights, "
                                 "tokenizer.json or vocab.txt)")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "cs224n"),
                   help="folder with the course's sts-dev.csv and quora-dev.csv (default: %(default)s)")
    p.add_argument("--sentences", type=int, default=64, help="pairs read from each file (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per batch (default: %(default)s)")
    p.add_argument("--max-length", type=int, default=128, help="truncate to this many tokens (default: %(default)s)")
    p.add_argument("--atol", type=float, default=1e-5, help="the largest difference that passes (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    return p.parse_args(argv)


def read_pairs(data_dir: Path, n: int) -> list[tuple[str, str]]:
    pairs = []
    for name in ("sts-dev.csv", "quora-dev.csv"):
        if not (data_dir / name).is_file():
            continue
        with open(data_dir / name, newline="", encoding="utf-8") as f:
            rows = (r for r in csv.DictReader(f, delimiter="\t") if r.get("sentence1") and r.get("sentence2"))
            pairs += [(r["sentence1"], r["sentence2"]) for _, r in zip(range(n), rows)]
    return pairs or FALLBACK


def tokenizer_mismatches(ours: Tokenizer, ref, pairs, max_length: int) -> int:
    """Sequences whose ids differ between our tokenizer and transformers', singles and pairs."""
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    bad = 0
    for args in ((a,), (a, b)):
        got = [ids for ids, _ in ours.encode(*args, max_length=max_length)]
        want = ref(*args, max_length=max_length, truncation="longest_first")["input_ids"]
        bad += sum(g != w for g, w in zip(got, want))
    return bad


@torch.no_grad()
def largest_differences(ours, ref, batches) -> list[float]:
    """Per hidden state (embeddings, then each layer), then the pooler: the largest |ours - ref|, over the
    real tokens (no head reads a padding position's state; the pooler reads position 0)."""
    worst = None
    for batch in batches:
        real = batch["attention_mask"].bool()
        o = ours(batch["input_ids"], batch["attention_mask"], output_hidden_states=True)
        r = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        diffs = [(x.double() - y.double())[real].abs().max().item() for x, y in zip(o.hidden_states, r.hidden_states)]
        diffs.append((o.pooler_output.double() - r.pooler_output.double()).abs().max().item())
        worst = diffs if worst is None else [max(w, d) for w, d in zip(worst, diffs)]
    return worst


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer, MPNetModel

    path = Path(args.model)
    tok = Tokenizer.from_checkpoint(path)
    if tok.model_type != "mpnet":
        raise SystemExit(f"{path}: not an MPNet checkpoint (config.json's model_type is not mpnet)")
    ref = MPNetModel.from_pretrained(str(path)).float().eval()
    pairs = read_pairs(Path(args.data_dir), args.sentences)
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    bs = args.batch_size
    inputs = {"singles": [tok(a[i:i + bs], max_length=args.max_length) for i in range(0, len(a), bs)],
              "pairs": [tok(a[i:i + bs], b[i:i + bs], max_length=args.max_length) for i in range(0, len(a), bs)]}
    columns, table = [], []
    for impl in ("matmul", "sdpa"):
        ours = load_bert(path, attn_impl=impl).eval()
        for kind, batches in inputs.items():
            columns.append(f"{kind}, {impl}")
            table.append(largest_differences(ours, ref, batches))
    # fp32's own rounding, for scale: a path that sums in another order (sdpa) is judged by how far it and
    # transformers' fp32 each land from the same model in fp64
    exact = MPNetModel.from_pretrained(str(path)).double().eval()
    rounding = {}
    for name, model in (("transformers fp32", ref), ("ours sdpa", load_bert(path, attn_impl="sdpa").eval())):
        columns.append(f"{name} vs fp64")
        table.append(largest_differences(model, exact, inputs["pairs"]))
        rounding[name] = max(table[-1])
    n_pad = sum(int((x["attention_mask"] == 0).sum()) for bat in inputs.values() for x in bat)
    print(f"# {path}: {len(pairs)} singles and {len(pairs)} pairs in batches of {bs}, {n_pad} padding positions; "
          f"fp32, transformers' MPNetModel (eager) as the reference")
    print(f"{'':<12}" + "".join(f"{c:>18}" for c in columns))
    rows = ["embeddings"] + [f"layer {i}" for i in range(1, len(table[0]) - 1)] + ["pooler"]
    for i, name in enumerate(rows):
        print(f"{name:<12}" + "".join(f"{col[i]:>18.3g}" for col in table))
    matmul = max(max(col) for col in table[:2])
    sdpa_ok = rounding["ours sdpa"] <= max(args.atol, 1.5 * rounding["transformers fp32"])
    mismatches = tokenizer_mismatches(tok, AutoTokenizer.from_pretrained(str(path)), pairs, args.max_length)
    print(f"matmul path: largest difference {matmul:.3g} ({'within' if matmul <= args.atol else 'PAST'} --atol "
          f"{args.atol:g}); sdpa path: {rounding['ours sdpa']:.3g} from fp64 against transformers' fp32 "
          f"{rounding['transformers fp32']:.3g} ({'within' if sdpa_ok else 'PAST'} 1.5x); "
          f"tokenizer: {mismatches} of {2 * len(pairs)} sequences differ from transformers'")
    return 0 if matmul <= args.atol and sdpa_ok and mismatches == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
