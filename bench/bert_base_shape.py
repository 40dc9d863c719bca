"""Writes a BERT of bert-base's shape (12 layers, hidden 768, 12 heads, FFN 3072) with random weights
(BERT's initialisation, std 0.02) and MiniLM's vocabulary (bert-base-uncased's 30522 word pieces) in the
Hugging Face layout: a stand-in that `--model DIR` trains where bert-base itself cannot be had (the
lent GPU machine has no internet, and its 418 MiB are over what one call carries). Its speed and memory
are bert-base's; its scores mean nothing.

    python bench/bert_base_shape.py DIR
    python bench/step_ops.py --device cuda --profile 20 -- --model DIR --precision bf16
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for common (which puts the repository on the path)
from common import write_bert_base_shape  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 allow_abbrev=False)
    ap.add_argument("out", help="the folder to write (config.json, model.safetensors, vocab.txt, ...)")
    ap.add_argument("--seed", type=int, default=0, help="the weights' seed (default 0)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"{ap.prog}: error: {out} exists and is not an empty folder: name a new one (nothing there is "
              "overwritten)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    path = write_bert_base_shape(out, args.seed)
    print(f"wrote {path}: bert-base's shape, random weights (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
