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


@pytest.mark.parametrize("multiple", [8, 32])
def test_padding_to_a_multiple_matches_pad_to_multiple_of(sentences, multiple):
    """--pad-multiple's batches against BertTokenizerFast's pad_to_multiple_of, under --max-length 128."""
    ckpt = resolve_checkpoint("minilm-l6")
    ours, ref = Tokenizer.from_checkpoint(ckpt), BertTokenizerFast.from_pretrained(str(ckpt))
    singles, pairs = sentences
    for args in [(singles[:13],), ([p[0] for p in pairs[:9]], [p[1] for p in pairs[:9]])]:
        got = ours.pad(ours.encode(*args, max_length=128), multiple=multiple, cap=128)
        exp = ref(*args, max_length=128, truncation="longest_first", padding="longest", pad_to_multiple_of=multiple,
                  return_tensors="pt")
        assert got["input_ids"].shape[1] % multiple == 0
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert got[key].tolist() == exp[key].tolist()


def test_a_multiple_never_pads_past_the_cap():
    from minbert.tokenizer import padded_length
    assert [padded_length(37, 8, 128), padded_length(37, 32, 128), padded_length(127, 32, 128)] == [40, 64, 128]
    assert padded_length(20, 16, 24) == 24 and padded_length(5) == 5 and padded_length(30, 1, 24) == 30
    ours = Tokenizer.from_checkpoint(resolve_checkpoint("minilm-l6"))
    batch = ours.pad(ours.encode(["a b c d e f g h i j"], max_length=10), multiple=8, cap=10)
    assert batch["input_ids"].shape == (1, 10)  # 16 would pass --max-length 10: stop at the cap
