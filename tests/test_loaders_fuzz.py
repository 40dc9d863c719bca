"""Property tests for data.loaders: whatever the bytes, only DataError escapes and nothing is
returned that is not in the file; valid rows always come back exactly, whatever junk is mixed in.
"""
from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data.loaders import TASKS, DataError, Example, LoadResult, load_task_file

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADER = {"sst": "\tid\tsentence\tsentiment\n",
          "para": "\tid\tsentence1\tsentence2\tis_duplicate\n",
          "sts": "\tid\tsentence1\tsentence2\tsimilarity\n"}
N_FIELDS = {"sst": 4, "para": 5, "sts": 5}


def good_fields(task: str, ex_id: str) -> list[str]:
    """A valid row's fields: index, id, sentence(s), label."""
    return ["0", ex_id, "s", "1"] if task == "sst" else ["0", ex_id, "s", "t", "1"]


def _load(data: bytes, task: str, **kw) -> LoadResult | None:
    """Load data from a real file; None when it raised DataError (anything else fails the test)."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f.csv"
        p.write_bytes(data)
        try:
            res = load_task_file(p, task, **kw)
        except DataError as e:
            assert str(p) in str(e)
            return None
    assert len(res.examples) == len({e.id for e in res.examples})
    assert all(str(p) == b.path and b.line >= 1 and b.reason for b in res.bad_rows)
    return res


def _assert_all_from_file(res: LoadResult | None, data: bytes) -> None:
    """Every returned field is text of the file: verbatim, or csv-quoted (with "" for ")."""
    if res is None:
        return
    # surrogateescape, not replace: text from an undecodable line must not match anything here
    text = data.decode("utf-8", errors="surrogateescape")
    for e in res.examples:
        for field in (e.id, e.text_a, e.text_b):
            if field is None:
                continue
            assert field and field == field.strip()
            assert field in text or field.replace('"', '""') in text, (field, data)


# Characters that stress the parser: separators, quotes, line ends of every kind, NUL, wide text.
NASTY = st.sampled_from(list('ab "\t\n\r\x00\x0b\x1c\u2028\u00a0\ufeffé中01.5-e') + ['""', '\r\n', "nan"])
nasty_text = st.lists(NASTY, max_size=40).map("".join)


@SETTINGS
@given(task=st.sampled_from(TASKS), with_header=st.booleans(), body=st.binary(max_size=600))
def test_random_bytes_raise_only_data_error(task, with_header, body):
    data = (HEADER[task].encode() if with_header else b"") + body
    _assert_all_from_file(_load(data, task), data)


@SETTINGS
@given(task=st.sampled_from(TASKS), lines=st.lists(nasty_text, max_size=12),
       ending=st.sampled_from(["\n", "\r\n", "\r"]), strict=st.booleans())
def test_random_quoting_and_junk_lines(task, lines, ending, strict):
    data = (HEADER[task] + ending.join(lines)).encode()
    _assert_all_from_file(_load(data, task, strict=strict), data)


@SETTINGS
@given(task=st.sampled_from(TASKS), size=st.sampled_from([50_000, 131_072, 131_073, 300_000]),
       quoted=st.booleans(), where=st.integers(0, 4))
def test_huge_fields(task, size, quoted, where):
    huge = ('"' + "x" * size + '"') if quoted else "y" * size
    fields = good_fields(task, "big")
    fields[where % N_FIELDS[task]] = huge
    after = "\t".join(good_fields(task, "after"))
    data = (HEADER[task] + "\t".join(fields) + "\n" + after + "\n").encode()
    res = _load(data, task)
    _assert_all_from_file(res, data)
    assert res is not None and res.examples[-1].id == "after"  # one huge field costs one row at most
    assert len(res.examples) + len(res.bad_rows) == 2
    if size > 131_072:  # beyond the csv module's field limit: reported, not returned
        assert [(b.line, "malformed CSV" in b.reason) for b in res.bad_rows] == [(2, True)]


@SETTINGS
@given(task=st.sampled_from(TASKS), counts=st.lists(st.integers(1, 8), max_size=6))
def test_wrong_column_counts_are_each_reported(task, counts):
    # every junk line is bad: a wrong field count, or the right count with the label "w"
    body = "".join("\t".join((["0", f"w{i}"] + ["w"] * 8)[:c]) + "\n" for i, c in enumerate(counts))
    good = "\t".join(good_fields(task, "g"))
    data = (HEADER[task] + body + good + "\n").encode()
    res = _load(data, task)
    assert res is not None and [e.id for e in res.examples] == ["g"]
    assert [b.line for b in res.bad_rows] == [i + 2 for i in range(len(counts))]
    assert [b.line for b in res.bad_rows if "fields" in b.reason] == [
        i + 2 for i, c in enumerate(counts) if c != N_FIELDS[task]]


# ------------------------------------------------------- valid rows, written by csv.writer

def _label(task: str):
    if task == "sst":
        return st.integers(0, 4).flatmap(lambda k: st.sampled_from([(str(k), k), (f"{k}.0", k)]))
    if task == "para":
        return st.integers(0, 1).flatmap(lambda k: st.sampled_from([(str(k), k), (f"{k}.0", k)]))
    return st.floats(0.0, 5.0, allow_nan=False).map(lambda x: (repr(x), x))


# Sentences: anything that is not blank, with quotes, tabs or line breaks that the writer quotes
# (not both in one field: the loader takes that for a stray quote's work).
sentence = nasty_text.filter(lambda s: s.strip() != "" and not ("\t" in s and ("\n" in s or "\r" in s)))


@st.composite
def valid_rows(draw, task: str):
    ids = draw(st.lists(st.text("0123456789abcdef", min_size=1, max_size=8), unique=True, max_size=8))
    rows = []
    for i in ids:
        texts = [draw(sentence) for _ in range(1 if task == "sst" else 2)]
        raw_label, label = draw(_label(task))
        rows.append((i, texts, raw_label, label))
    return rows


# Junk that cannot reach its neighbours: no quote and no line break, and bad in exactly one way.
safe_text = st.text(st.sampled_from(list("ab .é0")), min_size=1, max_size=10).filter(lambda s: s.strip())
BAD_LABELS = {"sst": ["", "x", "nan", "5", "-1", "2.5", "inf", "1_0"], "para": ["", "x", "2", "0.5", "-1", "1e0x"],
              "sts": ["", "x", "nan", "5.5", "-0.5", "inf", "1e999"]}


@st.composite
def junk_line(draw, task: str) -> bytes:
    n = N_FIELDS[task]
    fields = ["7", "j" + draw(safe_text).strip()] + [draw(safe_text) for _ in range(n - 3)] + ["1"]
    kind = draw(st.sampled_from(["count", "empty_text", "label", "bytes", "empty_id"]))
    if kind == "count":
        fields = fields[: draw(st.integers(1, n - 1))] if draw(st.booleans()) else fields + ["x"]
    elif kind == "empty_text":
        fields[draw(st.integers(2, n - 2))] = draw(st.sampled_from(["", " ", "\u00a0 "]))
    elif kind == "label":
        fields[-1] = draw(st.sampled_from(BAD_LABELS[task]))
    elif kind == "empty_id":
        fields[1] = " "
    line = "\t".join(fields).encode()
    if kind == "bytes":
        line = line.replace(b"j", b"j\xff\xc3", 1)
    return line


@SETTINGS
@given(data=st.data(), task=st.sampled_from(TASKS),
       quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]),
       ending=st.sampled_from(["\n", "\r\n"]))
def test_valid_rows_come_back_exactly_and_junk_is_reported_by_line(data, task, quoting, ending):
    rows = data.draw(valid_rows(task))
    junk = data.draw(st.lists(junk_line(task), max_size=5))
    order = data.draw(st.permutations([("row", r) for r in rows] + [("junk", j) for j in junk]
                                      + [("blank", None)] * data.draw(st.integers(0, 2))))
    out, line, junk_lines = [HEADER[task].replace("\n", ending).encode()], 2, []
    for k, (kind, item) in enumerate(order):
        if kind == "row":
            i, texts, raw_label, _ = item
            buf = io.StringIO()
            # The writer quotes \r or \n only when in its lineterminator: with "\n" alone it
            # leaves a bare \r in a field, a line break that breaks the record for any reader.
            csv.writer(buf, delimiter="\t", quoting=quoting, lineterminator="\r\n").writerow(
                [str(k), i, *texts, raw_label])
            chunk = (buf.getvalue()[:-2] + ending).encode()
        elif kind == "junk":
            junk_lines.append(line)
            chunk = item + ending.encode()
        else:
            chunk = ending.encode()
        out.append(chunk)
        line += len(chunk.splitlines())
    file_bytes = b"".join(out)

    res = _load(file_bytes, task)
    if not rows:  # junk alone: no usable rows is an error
        assert res is None
        return
    assert res is not None
    expected = [Example(i, texts[0].strip(), texts[1].strip() if task != "sst" else None, label)
                for kind, (i, texts, _, label) in ((k, it) for k, it in order if k == "row")]
    assert res.examples == expected
    assert [b.line for b in res.bad_rows] == junk_lines
    _assert_all_from_file(res, file_bytes)
    if junk_lines:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "f.csv"
            p.write_bytes(file_bytes)
            with pytest.raises(DataError) as e:
                load_task_file(p, task, strict=True)
        assert str(e.value).startswith(f"{p}:{junk_lines[0]}: ")
    else:
        again = _load(file_bytes, task, strict=True)
        assert again is not None and again.examples == res.examples and not again.bad_rows
