"""data.loaders against the real course files and against small files holding each quirk and each
kind of bad row; data.download's offline, skip-existing and atomic-write paths."""
from __future__ import annotations

import io
import logging
import os
import re
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from data import download
from data.loaders import COURSE_FILES, TASKS, BadRow, DataError, Example, load_task_file, load_task_split

SPLITS = ("train", "dev", "test")
ALL_FILES = [(t, s) for t in TASKS for s in SPLITS]
HEADER = {"sst": "\tid\tsentence\tsentiment\n",
          "para": "\tid\tsentence1\tsentence2\tis_duplicate\n",
          "sts": "\tid\tsentence1\tsentence2\tsimilarity\n"}
GOOD = {"sst": "0\tid1\tA fine film .\t3\n", "para": "0\tid1\tHow?\tWhy?\t1.0\n",
        "sts": "0\tid1\tA cat.\tA dog.\t2.5\n"}
GOOD_LAST = {"sst": "9\tid3\tA bad film .\t0\n", "para": "9\tid3\tWho?\tWhom?\t0.0\n",
             "sts": "9\tid3\tA man.\tA woman.\t1.0\n"}


def write(tmp_path: Path, content: str | bytes, name: str = "f.csv") -> Path:
    p = tmp_path / name
    p.write_bytes(content.encode() if isinstance(content, str) else content)
    return p


# ---------------------------------------------------------------- the real files

def _readme_rows(data_dir: Path) -> dict[str, int]:
    """Row counts from the README table beside the shared copy; {} for a downloaded folder."""
    readme = data_dir.parent / "README.md"
    if not readme.is_file():
        return {}
    return {m[1]: int(m[2]) for m in re.finditer(r"^\|\s*([\w-]+\.csv)\s*\|\s*(\d+)\s*\|", readme.read_text(), re.M)}


def _physical_lines(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8").splitlines()


@pytest.mark.parametrize("task,split", ALL_FILES)
def test_real_file_loads_every_row(course_data_dir, task, split):
    path = course_data_dir / COURSE_FILES[task][split]
    res = load_task_split(course_data_dir, task, split)
    lines = _physical_lines(path)
    # None of the course files has a record spanning lines, so the records are the non-blank
    # lines after the header: nothing may vanish without a BadRow.
    n_records = sum(1 for line in lines[1:] if line.strip())
    assert len(res.examples) + len(res.bad_rows) == n_records
    expected = _readme_rows(course_data_dir).get(path.name)
    if expected is not None:
        assert n_records == expected
    assert res.path == str(path)
    assert len({e.id for e in res.examples}) == len(res.examples)
    for e in res.examples:
        assert e.text_a and e.text_a == e.text_a.strip()
        if task == "sst":
            assert e.text_b is None
        else:
            assert e.text_b and e.text_b == e.text_b.strip()
        if split == "test":
            assert e.label is None
        elif task == "sst":
            assert type(e.label) is int and 0 <= e.label <= 4
        elif task == "para":
            assert type(e.label) is int and e.label in (0, 1)
        else:
            assert type(e.label) is float and 0.0 <= e.label <= 5.0
    for b in res.bad_rows:
        assert b.path == str(path) and 2 <= b.line <= len(lines) and b.reason


@pytest.mark.parametrize("task,split", ALL_FILES)
def test_real_file_rows_match_a_plain_tab_split(course_data_dir, task, split):
    """Every quote-free line, split by hand, is exactly one returned example (by column name)."""
    path = course_data_dir / COURSE_FILES[task][split]
    lines = _physical_lines(path)
    cols = lines[0].split("\t")
    by_id = {e.id: e for e in load_task_split(course_data_dir, task, split).examples}
    text_cols = ["sentence"] if task == "sst" else ["sentence1", "sentence2"]
    label_col = {"sst": "sentiment", "para": "is_duplicate", "sts": "similarity"}[task]
    checked = 0
    for line in lines[1:]:
        parts = line.split("\t")
        if '"' in line or len(parts) != len(cols) or not all(p.strip() for p in parts[1:]):
            continue
        row = dict(zip(cols, parts))
        e = by_id[row["id"]]
        assert e.text_a == row[text_cols[0]].strip()
        if task != "sst":
            assert e.text_b == row[text_cols[1]].strip()
        if split != "test":
            assert e.label == float(row[label_col])
        checked += 1
    assert checked > 0.9 * len(by_id)


def test_real_sst_test_header_is_odd_but_loads(course_data_dir):
    path = course_data_dir / COURSE_FILES["sst"]["test"]
    lines = _physical_lines(path)
    header = lines[0].split("\t")
    assert header[:2] != ["", "id"] and header.index("id") == 2  # the quirk is really there
    res = load_task_file(path, "sst")  # label column detected as absent
    first = lines[1].split("\t")
    assert res.examples[0] == Example(first[2], first[3].strip(), None, None)
    assert not res.bad_rows
    with pytest.raises(DataError, match=re.escape(str(path)) + ".*sentiment"):
        load_task_file(path, "sst", labelled=True)


def test_real_quora_train_bad_rows_point_at_the_broken_lines(course_data_dir):
    path = course_data_dir / COURSE_FILES["para"]["train"]
    lines = _physical_lines(path)
    res = load_task_split(course_data_dir, "para", "train")
    assert len(res.bad_rows) >= 2
    for b in res.bad_rows:
        fields = lines[b.line - 1].split("\t")
        # a stray quote swallowed the fields after it: sentence2 or is_duplicate is empty
        assert "" in [f.strip() for f in fields[3:]] or len(fields) != 5, (b, fields)
        assert "empty" in b.reason
    with pytest.raises(DataError, match=re.escape(f"{path}:{res.bad_rows[0].line}: ")):
        load_task_split(course_data_dir, "para", "train", strict=True)


def test_real_dev_files_detect_labels_and_reject_the_wrong_task(course_data_dir):
    sst_dev = course_data_dir / COURSE_FILES["sst"]["dev"]
    assert all(e.label is not None for e in load_task_file(sst_dev, "sst").examples)
    assert all(e.label is None for e in load_task_file(sst_dev, "sst", labelled=False).examples)
    with pytest.raises(DataError, match=re.escape(str(sst_dev)) + ".*sentence1"):
        load_task_file(sst_dev, "para")


# ---------------------------------------------------------------- quirks, in small files

def test_embedded_quotes_are_unescaped(tmp_path):
    p = write(tmp_path, HEADER["para"]
              + '0\tq1\t"""What does """"x"""" mean?"""\t"He said ""hi"" twice"\t0.0\n'
              + '1\tq2\tIt\'s a "plain" one\tUnquoted 5" disk\t1.0\n')
    ex = load_task_file(p, "para").examples
    assert ex[0] == Example("q1", '"What does ""x"" mean?"', 'He said "hi" twice', 0)
    assert ex[1] == Example("q2", 'It\'s a "plain" one', 'Unquoted 5" disk', 1)


def test_leading_and_trailing_spaces_are_stripped_but_case_is_kept(tmp_path):
    p = write(tmp_path, HEADER["sst"] + "0\t id7 \t It 's GOOD .  \t 4 \n")
    assert load_task_file(p, "sst").examples == [Example("id7", "It 's GOOD .", None, 4)]


@pytest.mark.parametrize("task,raw,label", [
    ("para", "1.0", 1), ("para", "0.0", 0), ("para", "1", 1), ("sst", "3.0", 3), ("sst", "0", 0),
    ("sts", "4.25", 4.25), ("sts", "5", 5.0), ("sts", "0.0", 0.0), ("sts", "3e0", 3.0)])
def test_float_valued_labels(tmp_path, task, raw, label):
    row = f"0\tx\ts\t{raw}\n" if task == "sst" else f"0\tx\ts\tt\t{raw}\n"
    (ex,) = load_task_file(write(tmp_path, HEADER[task] + row), task).examples
    assert ex.label == label and type(ex.label) is type(label)


def test_crlf_line_endings_give_the_same_examples_and_line_numbers(tmp_path):
    text = HEADER["sts"] + GOOD["sts"] + "1\tid2\tA.\t\t3.0\n" + GOOD_LAST["sts"]
    lf = load_task_file(write(tmp_path, text, "lf.csv"), "sts")
    crlf = load_task_file(write(tmp_path, text.replace("\n", "\r\n"), "crlf.csv"), "sts")
    assert crlf.examples == lf.examples and len(lf.examples) == 2
    assert not any("\r" in (e.text_b or "") + e.text_a + e.id for e in crlf.examples)
    assert [b.line for b in crlf.bad_rows] == [b.line for b in lf.bad_rows] == [3]


def test_columns_are_found_by_name_not_position(tmp_path):
    p = write(tmp_path, "\tsimilarity\tsentence2\tid\tsentence1\textra\n0\t1.5\tB\tk\tA\tz\n")
    assert load_task_file(p, "sts").examples == [Example("k", "A", "B", 1.5)]
    p = write(tmp_path, "0\t\tid\tsentence\n1\t0.0\tk9\t Odd header .\n", "sst-test.csv")
    assert load_task_file(p, "sst").examples == [Example("k9", "Odd header .", None, None)]


def test_bom_blank_lines_and_multiline_records_keep_line_numbers_right(tmp_path):
    content = ("\ufeff" + HEADER["sst"] + GOOD["sst"] + "\n"            # lines 1-3
               + '1\tid2\t"A sentence\nover two lines"\t2\n'             # lines 4-5
               + "2\tid3\tbroken\n"                                      # line 6
               + '3\tid4\t"two\nlines"\n'                                # lines 7-8, 3 fields
               + GOOD_LAST["sst"].replace("id3", "id5"))                 # line 9
    res = load_task_file(write(tmp_path, content), "sst")
    assert [e.id for e in res.examples] == ["id1", "id2", "id5"]
    assert res.examples[1].text_a == "A sentence\nover two lines"
    assert [b.line for b in res.bad_rows] == [6, 7, 8]  # line 8, read again on its own, is one field
    assert "joined lines 7-8" in res.bad_rows[1].reason and "line 8 read again on its own" in res.bad_rows[1].reason


# ---------------------------------------------------------------- every kind of bad row

BAD_ROWS = [  # (task, the bad line, which is line 3 of the file, a regex its reason must match)
    ("sst", "1\tid2\tmissing a field\n", r"expected 4 tab-separated fields, got 3"),
    ("sst", "1\tid2\ttext\t3\textra\n", r"expected 4 .*got 5"),
    ("para", "1\tid2\tonly one sentence\t1.0\n", r"expected 5 .*got 4"),
    ("sst", "1\tid2\t   \t3\n", r"empty sentence"),
    ("para", "1\tid2\tq1\t\t1.0\n", r"empty sentence2"),
    ("sts", "1\tid2\t \t\t1.0\n", r"empty sentence1 and sentence2"),
    ("sst", "1\tid2\ttext\t\n", r"empty sentiment"),
    ("para", "1\tid2\tq1\tq2\t \n", r"empty is_duplicate"),
    ("sst", "1\tid2\ttext\tpositive\n", r"sentiment 'positive' is not a number"),
    ("sst", "1\tid2\ttext\t5\n", r"not an integer in 0\.\.4"),
    ("sst", "1\tid2\ttext\t2.5\n", r"not an integer in 0\.\.4"),
    ("sst", "1\tid2\ttext\t-1\n", r"not an integer in 0\.\.4"),
    ("sst", "1\tid2\ttext\t3_0\n", r"not a number"),
    ("para", "1\tid2\tq1\tq2\t2.0\n", r"is_duplicate '2.0' is not 0 or 1"),
    ("para", "1\tid2\tq1\tq2\t0.5\n", r"not 0 or 1"),
    ("sts", "1\tid2\ta\tb\t5.1\n", r"similarity '5.1' is outside \[0, 5\]"),
    ("sts", "1\tid2\ta\tb\t-0.1\n", r"outside \[0, 5\]"),
    ("sts", "1\tid2\ta\tb\t1e999\n", r"outside \[0, 5\]"),
    ("sts", "1\tid2\ta\tb\tnan\n", r"not a number"),
    ("sts", "1\tid2\ta\tb\tinf\n", r"not a number"),
    ("sst", "1\t\ttext\t3\n", r"empty id"),
    ("sst", "1\tid1\tsame id again\t3\n", r"duplicate id 'id1' \(first on line 2"),
    ("sst", b"1\tid2\tbad \xff\xfe byte\t3\n", r"invalid UTF-8 on line 3"),
    ("sst", '1\tid2\t"quoted"junk\t3\n', r"malformed CSV"),
]


@pytest.mark.parametrize("task,bad,reason", BAD_ROWS)
def test_bad_row_is_reported_with_its_line_and_skipped(tmp_path, task, bad, reason):
    bad = bad if isinstance(bad, bytes) else bad.encode()
    p = write(tmp_path, HEADER[task].encode() + GOOD[task].encode() + bad + GOOD_LAST[task].encode())
    res = load_task_file(p, task)
    assert [e.id for e in res.examples] == ["id1", "id3"]  # the rows around it survive
    assert len(res.bad_rows) == 1
    b = res.bad_rows[0]
    assert (b.path, b.line) == (str(p), 3)
    assert re.search(reason, b.reason), b.reason
    with pytest.raises(DataError, match=re.escape(f"{p}:3: ") + ".*" + reason):
        load_task_file(p, task, strict=True)


def test_an_unterminated_quote_costs_its_own_record_not_the_rest_of_the_file(tmp_path):
    """The quote on line 3 never closes: the csv module reads to the end of the file. The lines after the
    record it opened are read again on their own (a stray quote once cost the 97 records after it, the
    warning saying one row was skipped)."""
    after = "".join(f"{i}\tid{i}\ttext {i}\t2\n" for i in range(4, 40))  # lines 4-39
    p = write(tmp_path, HEADER["sst"] + GOOD["sst"] + '1\tid2\t"never closed\t3\n' + after)
    res = load_task_file(p, "sst")
    assert [e.id for e in res.examples] == ["id1"] + [f"id{i}" for i in range(4, 40)]
    assert [(b.line, "malformed CSV" in b.reason, "lines 4-39 read again on their own" in b.reason)
            for b in res.bad_rows] == [(3, True, True)]


def test_one_warning_lists_the_count_and_the_first_positions(tmp_path, caplog):
    bad = "".join(f"{i}\tb{i}\ttext\t9\n" for i in range(7))  # lines 3..9
    p = write(tmp_path, HEADER["sst"] + GOOD["sst"] + bad)
    with caplog.at_level(logging.WARNING, logger="data.loaders"):
        res = load_task_file(p, "sst", max_report=5)
    assert len(res.bad_rows) == 7 and [b.line for b in res.bad_rows] == list(range(3, 10))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "skipped 7 bad row(s)" in msg and "and 2 more" in msg
    assert all(f"{p}:{n}: " in msg for n in range(3, 8)) and f"{p}:8: " not in msg


def test_clean_file_logs_no_warning(tmp_path, caplog):
    p = write(tmp_path, HEADER["sst"] + GOOD["sst"])
    with caplog.at_level(logging.WARNING, logger="data.loaders"):
        assert load_task_file(p, "sst").bad_rows == []
    assert not caplog.records


# ---------------------------------------------------------------- whole-file errors

def test_missing_file_and_directory_name_the_path_and_the_fix(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(DataError, match=re.escape(str(missing)) + ".*python -m data.download.*--data-dir"):
        load_task_file(missing, "sst")
    with pytest.raises(DataError, match=re.escape(str(tmp_path)) + ".*directory"):
        load_task_file(tmp_path, "sst")
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "sts-dev.csv"))):
        load_task_split(tmp_path, "sts", "dev")


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\r\n", b"\xef\xbb\xbf"])
def test_empty_file(tmp_path, content):
    p = write(tmp_path, content)
    with pytest.raises(DataError, match=re.escape(str(p)) + ": empty file"):
        load_task_file(p, "para")


def test_a_file_without_usable_rows_is_an_error(tmp_path):
    p = write(tmp_path, HEADER["sts"])
    with pytest.raises(DataError, match=re.escape(str(p)) + r": no usable rows .*\(0 bad row"):
        load_task_file(p, "sts")
    p = write(tmp_path, HEADER["sst"] + "0\tid1\ttext\t9\n1\tid2\t\t1\n")
    with pytest.raises(DataError, match=re.escape(str(p)) + r": no usable rows .*2 bad row.*" + re.escape(f"{p}:2: ")):
        load_task_file(p, "sst")


def test_a_stray_quote_that_keeps_the_field_count_still_costs_only_its_record(tmp_path):
    # The quote opened on line 3 closes on line 4: 4 fields, as the header wants, but the
    # sentence holds all of the record on line 4. Line 3's record is reported, never returned;
    # line 4, read again on its own, is a record of the file (its sentence ends in the quote).
    p = write(tmp_path, HEADER["sst"] + GOOD["sst"] + '1\tid2\t"stray\t3\n2\tid3\ttext"\t2\n'
              + GOOD_LAST["sst"].replace("id3", "id4"))
    res = load_task_file(p, "sst")
    assert [(e.id, e.text_a) for e in res.examples][1:] == [("id3", 'text"'), ("id4", res.examples[2].text_a)]
    assert res.examples[0].id == "id1"
    assert [(b.line, "joined lines 3-4" in b.reason, "sentence" in b.reason) for b in res.bad_rows] == [(3, True, True)]


def test_header_problems(tmp_path):
    p = write(tmp_path, "\tid\ttext\tsentiment\n0\ta\tb\t1\n")
    with pytest.raises(DataError, match=re.escape(str(p)) + r".*'sentence'"):
        load_task_file(p, "sst")
    p = write(tmp_path, HEADER["sts"].replace("similarity", "score") + "0\ta\tb\tc\t1\n")
    with pytest.raises(DataError, match=re.escape(str(p)) + r".*'similarity'"):
        load_task_file(p, "sts", labelled=True)
    assert load_task_file(p, "sts").examples == [Example("a", "b", "c", None)]  # detected: unlabelled
    p = write(tmp_path, b"\tid\tsent\xffence\tsentiment\n")
    with pytest.raises(DataError, match=re.escape(f"{p}:1: ") + "header is not valid UTF-8"):
        load_task_file(p, "sst")
    p = write(tmp_path, "\tid\tsentence\tid\n0\ta\tb\tc\n")
    with pytest.raises(DataError, match="more than once"):
        load_task_file(p, "sst")


def test_labelled_false_ignores_the_label_column(tmp_path):
    p = write(tmp_path, HEADER["para"] + "0\tk\ta\tb\tnot-a-label\n")
    assert load_task_file(p, "para", labelled=False).examples == [Example("k", "a", "b", None)]


def test_bad_arguments_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        load_task_file(tmp_path / "x.csv", "mnli")
    with pytest.raises(ValueError, match="unknown split"):
        load_task_split(tmp_path, "sst", "validation")


def test_badrow_str_is_path_line_reason():
    assert str(BadRow("a/b.csv", 12, "empty id")) == "a/b.csv:12: empty id"


# ---------------------------------------------------------------- data.download, offline

ALL_NAMES = [n for splits in COURSE_FILES.values() for n in splits.values()]


def _fake_course_file(name: str) -> bytes:
    task, split = next((t, s) for t, splits in COURSE_FILES.items() for s, n in splits.items() if n == name)
    header, row = HEADER[task], GOOD[task]
    if split == "test":  # drop the label column
        header, row = header.rsplit("\t", 1)[0] + "\n", row.rsplit("\t", 1)[0] + "\n"
    return (header + row).encode()


class _CutShort(io.BytesIO):
    def read(self, n=-1):
        data = super().read(n)
        if not data:
            raise urllib.error.URLError("connection reset")
        return data


def test_download_offline_says_which_url_and_what_to_do(tmp_path, monkeypatch, capsys):
    def offline(url, *a, **k):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    dest = tmp_path / "dl"
    assert download.main(["--dest", str(dest)]) == 1
    err = capsys.readouterr().err
    assert download.BASE_URL + ALL_NAMES[0] in err
    assert "name resolution" in err and str(dest) in err and "--data-dir" in err and "by hand" in err
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("response", [_CutShort(b"\tid\tsentence\tsentiment\n0\ta\tb"),
                                      io.BytesIO(b"<html>Rate limited</html>"),
                                      io.BytesIO(b"version https://git-lfs.github.com/spec/v1\noid sha256:0\n")])
def test_download_leaves_no_partial_or_bogus_file(tmp_path, monkeypatch, capsys, response):
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, *a, **k: response)
    assert download.main(["--dest", str(tmp_path)]) == 1
    assert list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    assert ALL_NAMES[0] in err and ".part" not in err  # not the temporary name


def test_download_skips_existing_files_and_fetches_only_the_missing(tmp_path, monkeypatch):
    for name in ALL_NAMES[:-1]:
        (tmp_path / name).write_text("kept")
    asked = []

    def serve(url, *a, **k):
        asked.append(url)
        return io.BytesIO(_fake_course_file(url.rsplit("/", 1)[1]))
    monkeypatch.setattr(urllib.request, "urlopen", serve)
    assert download.main(["--dest", str(tmp_path), "--base-url", "http://mirror/x/"]) == 0
    assert asked == ["http://mirror/x/" + ALL_NAMES[-1]]
    assert all((tmp_path / n).read_text() == "kept" for n in ALL_NAMES[:-1])
    assert load_task_file(tmp_path / ALL_NAMES[-1], "sts").examples  # written, complete
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(ALL_NAMES)  # no temp files left


def test_download_force_replaces_everything(tmp_path, monkeypatch):
    for name in ALL_NAMES:
        (tmp_path / name).write_text("stale")
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda url, *a, **k: io.BytesIO(_fake_course_file(url.rsplit("/", 1)[1])))
    old_umask = os.umask(0o027)
    try:
        assert download.main(["--dest", str(tmp_path), "--force"]) == 0
    finally:
        os.umask(old_umask)
    for task, split in ALL_FILES:
        assert len(load_task_split(tmp_path, task, split, strict=True).examples) == 1
    # the umask's mode, as any new file gets (the temp file was owner-only)
    assert {stat.S_IMODE((tmp_path / n).stat().st_mode) for n in ALL_NAMES} == {0o640}


def test_download_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        download.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(opt in out for opt in ("--dest", "--force", "--base-url", "--data-dir"))


def test_download_reports_bad_rows_under_the_final_name(tmp_path, monkeypatch, caplog):
    def serve(url, *a, **k):
        name = url.rsplit("/", 1)[1]
        body = _fake_course_file(name)
        return io.BytesIO(body + b"1\tid2\t\t3\n" if name == "ids-sst-train.csv" else body)
    monkeypatch.setattr(urllib.request, "urlopen", serve)
    with caplog.at_level(logging.INFO):
        assert download.main(["--dest", str(tmp_path)]) == 0
    msgs = [r.getMessage() for r in caplog.records]
    assert [m for m in msgs if ".part" in m] == []
    assert [m for m in msgs if "bad row" in m] == [
        f"{tmp_path / 'ids-sst-train.csv'}: 1 bad row(s) the loader will skip, the first on line 3: empty sentence"]
