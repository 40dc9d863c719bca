"""Our tokeniser against `transformers.BertTokenizerFast` on sentences from the course data."""
import csv
import re

import pytest
from transformers import BertTokenizerFast

from minbert import Tokenizer, resolve_checkpoint


def _read(path, cols, n=150):
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t")
        return [tuple(r[c] for c in cols) for _, r in zip(range(n), rows) if all(r[c] for c in cols)]


@pytest.fixture(scope="module")
def sentences(course_data_dir):
    sst = [s for (s,) in _read(course_data_dir / "ids-sst-train.csv", ["sentence"])]
    pairs = _read(course_data_dir / "quora-train.csv", ["sentence1", "sentence2"]) + \
        _read(course_data_dir / "sts-train.csv", ["sentence1", "sentence2"])
    # accents, CJK, control characters and odd spacing, which BERT's normaliser handles
    sst += ["Café crème à la Mode", "naïve résumé", "東京 is big", "tab\there", "  spaces  ", "ÀÉÎ Ünïcödé"]
    return sst, pairs


@pytest.mark.parametrize("source", ["tokenizer.json", "vocab.txt"])
@pytest.mark.parametrize("max_length", [128, 16])
def test_matches_bert_tokenizer_fast(tmp_path, sentences, source, max_length):
    ckpt = resolve_checkpoint("minilm-l6")
    if source == "vocab.txt":  # a checkpoint that ships only vocab.txt (+ tokenizer_config.json)
        for name in ("vocab.txt", "tokenizer_config.json"):
            (tmp_path / name).write_bytes((ckpt / name).read_bytes())
        ckpt = tmp_path
    ours = Tokenizer.from_checkpoint(ckpt)
    ref = BertTokenizerFast.from_pretrained(str(ckpt))
    singles, pairs = sentences
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    for args in [(singles,), (a, b)]:
        got = ours(*args, max_length=max_length)
        exp = ref(*args, max_length=max_length, truncation="longest_first", padding="longest", return_tensors="pt")
        assert got["input_ids"].tolist() == exp["input_ids"].tolist()
        assert got["token_type_ids"].tolist() == exp["token_type_ids"].tolist()
        assert got["attention_mask"].tolist() == exp["attention_mask"].tolist()
    assert max(len(ids) for ids, _ in ours.encode(singles, max_length=max_length)) <= max_length


def test_file_padding_settings_are_ignored():
    """MiniLM's tokenizer.json pads to 128; we pad to the longest in the batch."""
    ours = Tokenizer.from_checkpoint(resolve_checkpoint("minilm-l6"))
    batch = ours(["a b c", "a"])
    assert batch["input_ids"].shape == (2, 5)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


def test_uncased_vocab_respects_do_lower_case_false(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cat", "Cat"]))
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    ids = Tokenizer.from_checkpoint(tmp_path).encode(["Cat cat"])[0][0]
    assert ids == [2, 6, 5, 3]


@pytest.mark.parametrize("vocab, config, names", [
    (["[PAD]", "[UNK]", "[SEP]", "cat"], None, "vocab.txt: cls_token not found"),
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "cat"], "{not json", "tokenizer_config.json: cannot read it"),
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "cat"], "[1, 2]", "tokenizer_config.json: cannot read it"),
])
def test_a_broken_vocabulary_names_its_file(tmp_path, vocab, config, names):
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(config)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / names.split(':')[0]}:") + names.split(":", 1)[1]):
        Tokenizer.from_checkpoint(tmp_path)
