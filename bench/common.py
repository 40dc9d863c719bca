"""What the step benchmarks share: the repository on sys.path, and their common flags."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from anywhere without installing

from training.common.device import cpu_model  # noqa: E402,F401  (the scripts import it from here)


def data_parser(doc: str, data_help: str = "folder with the course CSV files",
                model_default: str | None = "minilm-l6") -> argparse.ArgumentParser:
    """A script's parser with --data-dir (the shared course data beside the checkout) and --model
    (model_default None: a study's script, where the recipe names its model)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "cs224n"),
                   help=f"{data_help} (default: %(default)s)")
    default = "%(default)s" if model_default else "the recipe's, else minilm-l6"
    p.add_argument("--model", default=model_default, help=f"checkpoint alias or directory (default: {default})")
    return p


def step_bench_parser(doc: str, batch_help: str, steps: int, warmup: int,
                      seed: int = 11711) -> argparse.ArgumentParser:
    """--data-dir, --model, --batch-size, --steps, --warmup, --threads and --seed; a script adds its own."""
    p = data_parser(doc)
    p.add_argument("--batch-size", type=int, default=32, help=f"{batch_help} (default: %(default)s)")
    p.add_argument("--steps", type=int, default=steps, help="timed rounds per arm (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed rounds per arm first (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=seed, help="schedule and model seed (default: %(default)s)")
    return p


def paired_ratios(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Median and interquartile range of the per-round ratios num[i] / den[i] (arms timed in the same
    round): the median of paired ratios, which background load shifts less than a ratio of medians."""
    ratios = sorted(a / b for a, b in zip(num, den))
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), q1, q3


def add_clock_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clock", choices=["auto", "wall", "cpu"], default="auto",
                   help="what a time is: wall-clock seconds, or this process's CPU seconds, which leave out "
                        "the time other processes hold the cores (on a shared machine most of the noise); "
                        "auto: cpu with one thread, wall otherwise (default: %(default)s)")


def pick_clock(kind: str, threads: int | None) -> tuple[Callable[[], float], str]:
    """The timer for --clock and its name. CPU time only means step time when one thread computes:
    with more, it sums the threads (spin-waits included)."""
    if kind == "cpu" or (kind == "auto" and threads == 1):
        return time.process_time, "process CPU time"
    return time.perf_counter, "wall-clock time"


def write_bert_base_shape(out, seed: int) -> Path:
    """A BERT of bert-base's shape (12 layers, hidden 768, 12 heads, FFN 3072; BERT's initialisation, std
    0.02, from `seed`) with MiniLM's vocabulary (bert-base-uncased's 30522 word pieces), written in the
    Hugging Face layout to `out`: bert-base's speed and memory where bert-base itself cannot be had."""
    import torch

    from minbert import Bert, BertConfig, resolve_checkpoint, save_hf
    torch.manual_seed(seed)
    return save_hf(Bert(BertConfig()), out, vocab_src=resolve_checkpoint("minilm-l6"))


# all-mpnet-base-v2's config.json, less what no forward pass reads (MPNetConfig's own defaults differ: 512
# positions, LayerNorm eps 1e-12)
MPNET_BASE_SHAPE = {"vocab_size": 30527, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                    "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 514,
                    "layer_norm_eps": 1e-5, "relative_attention_num_buckets": 32, "pad_token_id": 1,
                    "bos_token_id": 0, "eos_token_id": 2, "hidden_dropout_prob": 0.1,
                    "attention_probs_dropout_prob": 0.1}


def write_mpnet_base_shape(out, seed: int) -> Path:
    """An MPNet of all-mpnet-base-v2's shape (12 layers, hidden 768, 12 heads, FFN 3072, 32 relative-position
    buckets, its 30527-token vocabulary's size) with random weights (transformers' initialisation, std 0.02,
    from `seed`), written by transformers' own MPNetModel to `out`: the file both arms load, MPNet's speed
    and memory where the real one cannot be had. Its vocab.txt holds MPNet's four special tokens and then
    placeholders, only so that the folder loads: the step benchmarks draw random ids, and tokenize nothing."""
    import torch
    from transformers import MPNetConfig, MPNetModel  # benchmark-only dependency

    torch.manual_seed(seed)
    MPNetModel(MPNetConfig(**MPNET_BASE_SHAPE)).save_pretrained(out)
    special = ["<s>", "<pad>", "</s>", "<unk>"]
    words = special + [f"[unused{i}]" for i in range(MPNET_BASE_SHAPE["vocab_size"] - len(special))]
    (Path(out) / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return Path(out)
