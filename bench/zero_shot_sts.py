"""STS dev Pearson of the untrained encoder: the cosine of each pair's two sentence vectors, with
the vector taken as --pooling cls (BERT's pooler on [CLS]) and as --pooling mean. It shows what
a siamese similarity head could start from before any training (docs/results.md).

    python bench/zero_shot_sts.py                       # MiniLM, ../shared/data/cs224n/sts-dev.csv
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import REPO  # noqa: E402  (puts the repository on sys.path)
from scipy.stats import pearsonr

from data.batching import encode_task, eval_batches  # noqa: E402
from data.loaders import load_task_file  # noqa: E402
from heads import MultitaskBert  # noqa: E402
from minbert import Tokenizer, load_bert, resolve_checkpoint  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--sts-dev", default=str(REPO.parent / "shared" / "data" / "cs224n" / "sts-dev.csv"),
                   help="a labelled STS file in the course format (default: %(default)s)")
    p.add_argument("--model", default="minilm-l6", help="checkpoint alias or directory (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=128, help="pairs per batch (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    ckpt = resolve_checkpoint(args.model)
    tokenizer, encoder = Tokenizer.from_checkpoint(ckpt), load_bert(ckpt).eval()
    data = encode_task("sts", load_task_file(args.sts_dev, "sts", labelled=True).examples, tokenizer, "siamese", 128)
    labels = [e.label for e in data.examples]
    print(f"# {args.model}, {args.sts_dev}: {len(data)} pairs, untrained, cosine of the two sentence vectors")
    for pooling in ("cls", "mean"):
        model = MultitaskBert(encoder, "siamese", dropout=0.0, pooling=pooling).eval()
        scores = torch.empty(len(data))
        with torch.inference_mode():
            for batch in eval_batches(data, tokenizer, args.batch_size):
                y1, y2 = (model.pool(h, s["attention_mask"], 0)
                          for h, s in zip(model.hidden_at(batch.inputs, 0), batch.inputs))
                scores[list(batch.indices)] = F.cosine_similarity(y1, y2, dim=-1)
        print(f"--pooling {pooling:<4}  Pearson {pearsonr(scores.numpy(), labels)[0]:.4f}")


if __name__ == "__main__":
    main()
