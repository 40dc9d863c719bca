"""Tiny trained runs for the tests of what comes after training (the API, export, analysis, comparison,
submission): a 2-layer, hidden-32 random BERT over a 25-word vocabulary, a few examples per task in the
course's file format, a few full-batch epochs (a second or two on one thread).

Initialised wider than BERT (std 0.5) with dropout off, as in tests/test_training.py, so that different
sentences get clearly different outputs; what is learnt does not matter here, only that the run's files
are real ones written by `train`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from data.loaders import COURSE_FILES
from minbert import Bert, BertConfig, save_hf
from training.config.train_config import TrainConfig
from training.run.trainer import train

WORDS = ("apple river stone cloud lamp tiger honey piano garden silver rocket paper window forest candle "
         "mirror ocean pepper violin desert").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
N = 12  # labelled examples per task (train = dev)
STS_GOLD = [0.0, 0.4, 1.0, 1.0, 2.2, 2.5, 2.5, 2.5, 3.6, 4.0, 4.8, 5.0]  # ties, for Spearman's average ranks


def random_batch(g: torch.Generator, B: int, T: int, vocab_size: int, padded: int = 1, pair: bool = False) -> dict:
    """B random sequences of T ids (first id 2, [CLS]); the last sequence's final `padded` positions padding;
    token types 1 from T // 2 on where `pair`."""
    ids = torch.randint(5, vocab_size, (B, T), generator=g)
    ids[:, 0] = 2
    mask = torch.ones(B, T, dtype=torch.long)
    mask[-1, T - padded:] = 0
    ids[-1, T - padded:] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    if pair:
        types[:, T // 2:] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def sent(i: int, k: int = 3) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(k))


def make_encoder(d: Path, vocab: list[str] = VOCAB, hidden: int = 32, layers: int = 2) -> Path:
    """A random BERT without dropout, its matrices std 0.5, saved with `vocab` in the Hugging Face layout."""
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=2 * hidden, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    bert = Bert(cfg)
    with torch.no_grad():
        for p in bert.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.5)
    save_hf(bert, d)
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return d


def make_mpnet_encoder(d: Path, hidden: int = 32, layers: int = 2) -> Path:
    """A random MPNet (transformers' own class and writer: config.json, model.safetensors, its tokenizer's
    files) over tiny_runs' words, matrices and the relative bias table std 0.5, without dropout."""
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizer

    torch.manual_seed(0)
    vocab = ["<s>", "<pad>", "</s>", "<unk>", *WORDS, "<mask>"]
    cfg = MPNetConfig(vocab_size=len(vocab) + 4, hidden_size=hidden,  # room for the special tokens the tokenizer adds
                      num_hidden_layers=layers, num_attention_heads=2,
                      intermediate_size=2 * hidden, max_position_embeddings=130, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
    model = MPNetModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.5)
    model.save_pretrained(d)
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    MPNetTokenizer.from_pretrained(str(d)).save_pretrained(d)
    return d


def write_data(d: Path) -> Path:
    """Course-format files; dev = train. Sentence lengths vary, so that length-sorted batches come in
    another order than the file's; test ids are out of numeric order."""
    d.mkdir(parents=True, exist_ok=True)
    sst = "\tid\tsentence\tsentiment\n" + "".join(f"{i}\ts{i}\t{sent(i, 2 + i % 3)}\t{i % 5}\n" for i in range(N))
    para = "\tid\tsentence1\tsentence2\tis_duplicate\n" + "".join(
        f"{i}\tp{i}\t{sent(i + 1, 2 + i % 2)}\t{sent(i + 9)}\t{float(i % 3 == 0)}\n" for i in range(N))
    sts = "\tid\tsentence1\tsentence2\tsimilarity\n" + "".join(
        f"{i}\tt{i}\t{sent(i + 2, 4 - i % 3)}\t{sent(i + 5, 2)}\t{STS_GOLD[i]}\n" for i in range(N))
    test_ids = ["z9", "a3", "m1", "b7", "q0"]
    sst_test = "\tid\tsentence\n" + "".join(f"{j}\t{t}\t{sent(3 * j + 1, 4 - j % 3)}\n" for j, t in enumerate(test_ids))
    pair_test = "\tid\tsentence1\tsentence2\n" + "".join(
        f"{j}\t{t}\t{sent(j + 4, 2 + j % 3)}\t{sent(j + 11)}\n" for j, t in enumerate(test_ids))
    for task, (labelled, unlabelled) in {"sst": (sst, sst_test), "para": (para, pair_test),
                                         "sts": (sts, pair_test)}.items():
        for split in ("train", "dev"):
            (d / COURSE_FILES[task][split]).write_text(labelled)
        (d / COURSE_FILES[task]["test"]).write_text(unlabelled)
    return d


def inputs(root: Path) -> tuple[Path, Path]:
    """(data folder, encoder folder) under root, made once."""
    data, enc = root / "data", root / "encoder"
    if not data.is_dir():
        write_data(data)
    if not enc.is_dir():
        make_encoder(enc)
    return data, enc


def tiny_config(root: Path, name: str = "run", **kw) -> TrainConfig:
    data, enc = inputs(root)
    base = dict(model=str(enc), data_dir=str(data), epochs=3, batch_size=N, eval_batch_size=5, lr=1e-2,
                warmup_ratio=0.0, head_dropout=0.0, seed=3, device="cpu", precision="fp32", log_every=1,
                out_dir=str(root / name), predictions_dir=str(root / name / "predictions"))  # the default place
    return TrainConfig(**{**base, **kw})


def tiny_run(root: Path, name: str = "run", **kw) -> tuple[TrainConfig, dict]:
    """Train a tiny run into root/name; returns its config and best dev metrics."""
    cfg = tiny_config(root, name, **kw)
    return cfg, train(cfg)
