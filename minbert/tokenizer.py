"""WordPiece tokenisation through the `tokenizers` library (Rust, batched).

Loaded from a checkpoint's tokenizer.json, or built from vocab.txt with BERT's normalisation
(lower-casing as tokenizer_config.json says, True when it says nothing, as for BERT itself).
Padding and truncation are ours to decide: a tokenizer.json may carry its own (all-MiniLM-L6-v2's
pads everything to 128), which we switch off.

MPNet's vocabulary is BERT's WordPiece with RoBERTa's special tokens: sentences are `<s> A </s>`, pairs
`<s> A </s></s> B </s>`, and token types are unused (all 0). Which kind a checkpoint is comes from its
config.json (model_type), or, in a folder of tokenizer files alone, from tokenizer_config.json.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tokenizers import Tokenizer as _Backend
from tokenizers.implementations import BertWordPieceTokenizer
from tokenizers.processors import TemplateProcessing

# The special tokens of each model_type. BERT's pair template is its files' own ([CLS] A [SEP] B [SEP],
# B's token types 1); MPNet's is set here whatever its tokenizer.json says: a converter's template gives
# B token type 1, which transformers' MPNetTokenizer does not (RobertaProcessing: all 0).
SPECIAL_TOKENS = {
    "bert": {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"},
    "mpnet": {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "unk": "[UNK]", "mask": "<mask>"},
}


def _check_utf8(path: Path) -> None:
    """A ValueError naming the line of the first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); a "
                         f"vocabulary is one UTF-8 token per line") from None


def checkpoint_model_type(path: Path) -> str:
    """"mpnet" or "bert": config.json's model_type, else tokenizer_config.json's tokenizer_class (a training
    run's tokenizer/ folder has no config.json), else "bert". A file that cannot be read says nothing here:
    its reader reports it."""
    for name, key in (("config.json", "model_type"), ("tokenizer_config.json", "tokenizer_class")):
        try:
            value = json.loads((path / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):  # missing, not JSON, or not an object
            continue
        if isinstance(value, str) and value.lower().startswith("mpnet"):
            return "mpnet"
        if value is not None:
            return "bert"
    return "bert"


class Tokenizer:
    def __init__(self, backend: _Backend, model_type: str = "bert"):
        self.backend = backend
        self.backend.no_padding()
        self.backend.no_truncation()
        self._max_length = None
        self.model_type = model_type
        special = SPECIAL_TOKENS[model_type]
        self.pad_id = self._token_id(special["pad"])
        self.cls_id = self._token_id(special["cls"])
        self.sep_id = self._token_id(special["sep"])
        self.special_ids = frozenset((self.pad_id, self.cls_id, self.sep_id))
        if model_type == "mpnet":  # the number of special tokens also sets truncation's budget: 4 for a pair
            cls, sep = special["cls"], special["sep"]
            self.backend.post_processor = TemplateProcessing(
                single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
                special_tokens=[(cls, self.cls_id), (sep, self.sep_id)])

    def _token_id(self, token: str) -> int:
        i = self.backend.token_to_id(token)
        if i is None:
            name = {"bert": "a BERT", "mpnet": "an MPNet"}[self.model_type]
            raise ValueError(f"the vocabulary has no {token} token; is this {name} vocabulary?")
        return i

    @classmethod
    def from_checkpoint(cls, path: str | Path, model_type: str | None = None) -> "Tokenizer":
        """The checkpoint folder's tokenizer; model_type (bert or mpnet) as its files say, if not given."""
        path = Path(path)
        model_type = model_type or checkpoint_model_type(path)
        if (path / "tokenizer.json").is_file():
            try:
                return cls(_Backend.from_file(str(path / "tokenizer.json")), model_type)
            except Exception as e:  # the Rust side raises plain Exceptions
                raise ValueError(f"{path / 'tokenizer.json'}: cannot read the tokenizer: {e}") from e
        if (path / "vocab.txt").is_file():
            settings = {}
            if (path / "tokenizer_config.json").is_file():
                try:
                    settings = json.loads((path / "tokenizer_config.json").read_text())
                except ValueError as e:
                    raise ValueError(f"{path / 'tokenizer_config.json'}: cannot read it: {e}") from None
                if not isinstance(settings, dict):
                    raise ValueError(f"{path / 'tokenizer_config.json'}: cannot read it: not a JSON object")
            _check_utf8(path / "vocab.txt")  # else a bare Exception from the Rust side
            special = {f"{k}_token": v for k, v in SPECIAL_TOKENS[model_type].items()}
            try:  # the normalisation the config sets, with transformers' BertTokenizer's defaults
                wp = BertWordPieceTokenizer(str(path / "vocab.txt"), lowercase=settings.get("do_lower_case", True),
                                            strip_accents=settings.get("strip_accents"), clean_text=True,
                                            handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
                                            **special)
                return cls(wp._tokenizer, model_type)
            except Exception as e:  # "cls_token not found in the vocabulary", and the Rust side's plain ones
                raise ValueError(f"{path / 'vocab.txt'}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
                    from None
        raise FileNotFoundError(f"{path}: no tokenizer.json or vocab.txt")

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
               max_length: int = 128) -> list[tuple[list[int], list[int]]]:
        """Token ids (and token type ids) of single sentences or sentence pairs, unpadded,
        truncated to max_length: longest-first for pairs, as the `tokenizers` library (and so transformers'
        AutoTokenizer) does it, which leaves an odd budget's extra token to the second sentence where the two
        are cut to the same length (Google BERT's _truncate_seq_pair leaves it to the first)."""
        if max_length != self._max_length:
            self.backend.enable_truncation(max_length, strategy="longest_first")
            self._max_length = max_length
        inputs = list(texts) if pairs is None else list(zip(texts, pairs))
        return [(e.ids, e.type_ids) for e in self.backend.encode_batch(inputs)]

    def pad(self, encoded: Sequence[tuple[Sequence[int], Sequence[int]]], device=None, multiple: int = 1,
            cap: int | None = None) -> dict[str, torch.Tensor]:
        """Pad to the longest sequence in the batch (dynamic padding), rounded up to a multiple of
        `multiple` tokens but not past `cap` (padded_length). Filled in numpy and handed to torch once: row
        by row in torch, a batch of 32 cost about 100 dispatched ops, each a little host time that a GPU
        step, short and host-bound, feels (bench/step_ops.py)."""
        B, T = len(encoded), padded_length(max(len(ids) for ids, _ in encoded), multiple, cap)
        input_ids = np.full((B, T), self.pad_id, dtype=np.int64)
        token_type_ids = np.zeros((B, T), dtype=np.int64)
        attention_mask = np.zeros((B, T), dtype=np.int64)
        for i, (ids, types) in enumerate(encoded):
            n = len(ids)
            input_ids[i, :n] = ids
            token_type_ids[i, :n] = types
            attention_mask[i, :n] = 1
        batch = {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(token_type_ids),
                 "attention_mask": torch.from_numpy(attention_mask)}
        return {k: v.to(device) for k, v in batch.items()} if device is not None else batch

    def __call__(self, texts, pairs=None, max_length: int = 128, device=None) -> dict[str, torch.Tensor]:
        return self.pad(self.encode(texts, pairs, max_length), device=device)


def padded_length(longest: int, multiple: int = 1, cap: int | None = None) -> int:
    """A batch's length: its longest sequence rounded up to a multiple of `multiple`, but never past
    `cap` (--max-length) nor below the longest itself."""
    rounded = -(-longest // multiple) * multiple
    return max(longest, min(rounded, cap)) if cap is not None else rounded
