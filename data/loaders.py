"""Loaders for the CS224N multitask files: SST-5 ("sst"), Quora ("para") and STS-B ("sts").

The course files are tab-separated and csv-quoted, with an unnamed pandas index column and a
header row, and they are not clean: stray quotes swallow fields, binary labels are floats,
sentences carry leading spaces. The course's own loader skips bad rows silently; we skip them
loudly: every skipped record comes back as a BadRow naming the line it starts on, one warning
per file gives the count, and `strict=True` turns the first one into an error. A quoted field may
hold a tab or a line break, but not both: that is a quote which opened in one record and closed
in a later one, swallowing the records between (which may leave the field count right). A bad
record of several lines that bears such a quote's marks (unreadable, the wrong field count, or that
field) has the lines after its first read again on their own, so that the stray quote costs one record,
not the rest of the file.
A file without a single usable row is an error. An id holding a comma or a line break is a bad row
too: the prediction files, one `id , prediction` per line, could not carry it.

Two promises, which tests/test_loaders_fuzz.py holds us to: no file content makes us raise
anything but DataError, and every Example returned is a record that is really in the file.
"""
from __future__ import annotations

import codecs
import csv
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

TASKS = ("sst", "para", "sts")
SPLITS = ("train", "dev", "test")
COURSE_FILES: dict[str, dict[str, str]] = {
    "sst": {"train": "ids-sst-train.csv", "dev": "ids-sst-dev.csv", "test": "ids-sst-test-student.csv"},
    "para": {"train": "quora-train.csv", "dev": "quora-dev.csv", "test": "quora-test-student.csv"},
    "sts": {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test-student.csv"},
}

# Columns are found by name: ids-sst-test-student.csv has an extra leading column, so
# positions differ between files of the same task.
ID_COLUMN = "id"
TEXT_COLUMNS = {"sst": ("sentence",), "para": ("sentence1", "sentence2"), "sts": ("sentence1", "sentence2")}
LABEL_COLUMN = {"sst": "sentiment", "para": "is_duplicate", "sts": "similarity"}
SENTIMENTS = ("negative", "somewhat negative", "neutral", "somewhat positive", "positive")  # SST-5's labels 0..4

# what the line of an unusable course file suggests; a command reading a file of the user's own passes
# its own (training.predict: --text), since fetching the course's files would not mend that one
FETCH_HINT = ("run `python -m data.download`, or pass --data-dir pointing at a folder that holds "
              "the course's CSV files")

# A plain decimal literal. float() alone would also accept "nan", "1_0", "٣" and "infinity",
# none of which is a label anyone meant to write.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


class DataError(ValueError):
    """A bad or missing data file; the message names the path (and line)."""


@dataclass(frozen=True)
class Example:
    id: str
    text_a: str
    text_b: str | None  # None for sst
    label: int | float | None  # sst: int 0..4; para: int 0/1; sts: float in [0, 5]; None when unlabelled


@dataclass(frozen=True)
class BadRow:
    path: str
    line: int  # 1-based physical line on which the record starts
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class LoadResult:
    examples: list[Example]
    bad_rows: list[BadRow]
    path: str


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def _parse_label(task: str, raw: str) -> tuple[int | float | None, str | None]:
    """(label, None) or (None, why not)."""
    col = LABEL_COLUMN[task]
    s = raw.strip()
    if not s:
        return None, f"empty {col}"
    if not _NUMBER.fullmatch(s):
        return None, f"{col} {raw!r} is not a number"
    x = float(s)  # "1e999" gives inf, caught by the range checks below
    if task == "sts":
        if not (math.isfinite(x) and 0.0 <= x <= 5.0):
            return None, f"similarity {raw!r} is outside [0, 5]"
        return x, None
    hi = 4 if task == "sst" else 1
    if not (math.isfinite(x) and x.is_integer() and 0 <= x <= hi):
        want = "an integer in 0..4" if task == "sst" else "0 or 1"
        return None, f"{col} {raw!r} is not {want}"
    return int(x), None


def _read_lines(path: Path, hint: str | None = FETCH_HINT) -> tuple[list[str], set[int]]:
    """The file's physical lines (endings kept) and the numbers of those that are not UTF-8.

    We decode line by line, not the whole file, so one bad byte costs one row, not the file.
    An undecodable line is kept (with replacement characters) so the csv parser still sees the
    file's structure; the record it belongs to is rejected later.
    """
    more = f"; {hint}" if hint else ""
    if not path.exists():
        raise DataError(f"{path}: no such file{more}")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a CSV file{more}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from e
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    lines, undecodable = [], set()
    # bytes.splitlines breaks only on \n, \r and \r\n, the same line ends the csv module knows
    # (str.splitlines would also break on \x0b, \x1c, U+2028, ... inside sentences).
    for i, raw in enumerate(data.splitlines(keepends=True), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            undecodable.add(i)
            lines.append(raw.decode("utf-8", errors="replace"))
    return lines, undecodable


@dataclass(frozen=True)
class _Columns:
    """Where a file keeps what `task` needs, found by name in its header."""
    names: list[str]
    n_fields: int
    id_idx: int
    text_idx: list[int]
    label_idx: int | None  # None: labels not read


def _read_header(reader, path: Path, undecodable: set[int], task: str, labelled: bool | None,
                 hint: str | None) -> _Columns:
    """Consume the header row (blank lines before it skipped) and locate the task's columns."""
    header: list[str] = []
    try:
        while not header:
            header = next(reader)
    except StopIteration:
        raise DataError(f"{path}: empty file (no header row){f'; {hint}' if hint else ''}") from None
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: unreadable header: {e}") from None
    if any(i in undecodable for i in range(1, reader.line_num + 1)):
        raise DataError(f"{path}:{reader.line_num}: header is not valid UTF-8")

    names = [c.strip() for c in header]
    label_col = LABEL_COLUMN[task]
    if labelled is None:
        labelled = label_col in names
    required = (ID_COLUMN, *TEXT_COLUMNS[task]) + ((label_col,) if labelled else ())
    missing = [c for c in required if c not in names]
    if missing:
        what = ", ".join(repr(c) for c in missing)
        raise DataError(f"{path}: header lacks column(s) {what} needed for task {task!r} "
                        f"(found {names}); is this the right file?{f' Otherwise {hint}' if hint else ''}")
    twice = [c for c in required if names.count(c) > 1]
    if twice:
        raise DataError(f"{path}: column(s) {twice} appear more than once in the header")
    return _Columns(names, len(header), names.index(ID_COLUMN), [names.index(c) for c in TEXT_COLUMNS[task]],
                    names.index(label_col) if labelled else None)


def _parse_row(row: list[str], start: int, end: int, cols: _Columns, task: str,
               undecodable: set[int]) -> Example | str:
    """The Example in one record (physical lines start..end), or why the record is bad."""
    bad_line = next((i for i in range(start, end + 1) if i in undecodable), None) if undecodable else None
    if bad_line is not None:
        return f"invalid UTF-8 on line {bad_line}"
    if len(row) != cols.n_fields:
        span = (f" (a stray quote may have joined lines {start}-{end})" if end > start else "")
        return f"expected {cols.n_fields} tab-separated fields, got {len(row)}{span}"
    joined = next((cols.names[i] for i, f in enumerate(row) if _tab_and_break(f)), None)
    if joined is not None:  # the right field count by chance: the swallowed record would be lost quietly
        return f"{joined or 'a field'} holds a tab and a line break: a stray quote may have joined lines {start}-{end}"
    ex_id = row[cols.id_idx].strip()
    if not ex_id:
        return "empty id"
    if "," in ex_id or len(ex_id.splitlines()) > 1:  # str.splitlines: every line end read_predictions knows
        return (f"id {ex_id!r} holds a comma or a line break: a prediction file ('id , prediction' per line) "
                "cannot hold it")
    texts = [row[i].strip() for i in cols.text_idx]
    empty = [c for c, t in zip(TEXT_COLUMNS[task], texts) if not t]
    if empty:
        return "empty " + " and ".join(empty)
    label = None
    if cols.label_idx is not None:
        label, why = _parse_label(task, row[cols.label_idx])
        if why is not None:
            return why
    return Example(ex_id, texts[0], texts[1] if len(texts) > 1 else None, label)


def _swallowed(row: list[str] | None, cols: _Columns) -> bool:
    """Whether a record of several lines bears a stray quote's marks: unreadable, the wrong field count, or a
    field holding a tab and a line break (a record well formed over several lines, bad for another reason,
    keeps its lines)."""
    return row is None or len(row) != cols.n_fields or any(map(_tab_and_break, row))


def _tab_and_break(field: str) -> bool:
    """A field holding a tab and a line break: a quote that opened in one record and closed in a later one."""
    return "\t" in field and ("\n" in field or "\r" in field)


def load_task_file(path: str | os.PathLike[str], task: str, *, labelled: bool | None = None,
                   strict: bool = False, max_report: int = 5, log: bool = True,
                   hint: str | None = FETCH_HINT) -> LoadResult:
    """Load one course file of `task`.

    labelled: None reads labels when the header has the task's label column; True demands it;
    False ignores labels. Bad rows are skipped and returned in `bad_rows` (strict: the first one
    raises DataError). Any problem with the file itself raises DataError naming the path.
    log=False leaves the reporting to the caller. hint: what the line of a file that is not a usable
    course file suggests (default: fetching the course's files, which is also said of a missing one;
    a command's own hint is not: a missing file of the user's is only missing).
    """
    _check_task(task)
    path = Path(path)
    lines, undecodable = _read_lines(path, hint if hint == FETCH_HINT else None)
    # strict: a stray character after a closing quote is an error, not glued onto the field
    # (which would return text that appears nowhere in the file). The course files parse the
    # same either way.
    reader = csv.reader(lines, delimiter="\t", strict=True)
    cols = _read_header(reader, path, undecodable, task, labelled, hint)

    examples: list[Example] = []
    bad_rows: list[BadRow] = []
    first_line_of: dict[str, int] = {}

    def reject(line: int, reason: str) -> None:
        bad = BadRow(str(path), line, reason)
        if strict:
            raise DataError(str(bad))
        bad_rows.append(bad)

    end = reader.line_num  # last physical line consumed so far
    offset = 0  # physical lines before the reader's first (it starts again after a stray quote)
    while True:
        start = end + 1  # the csv module may read several physical lines for one record
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            row, why = None, f"malformed CSV: {e}"
        if offset + reader.line_num <= end:  # no progress; cannot happen with csv's reader, but never spin
            break
        end = offset + reader.line_num
        if row == []:  # a blank line holds no record
            continue
        example = _parse_row(row, start, end, cols, task, undecodable) if row is not None else why
        if isinstance(example, str) and end > start and _swallowed(row, cols):
            # A quote that opened on the record's first line and swallowed the lines after it (to a closing
            # quote, or to the end of the file): they are read again on their own, so that the stray quote
            # costs its own record, not the file's rest.
            again = f"line {end}" if end == start + 1 else f"lines {start + 1}-{end}"
            reject(start, f"{example}; {again} read again on {'its' if end == start + 1 else 'their'} own")
            reader, offset, end = csv.reader(lines[start:], delimiter="\t", strict=True), start, start
        elif isinstance(example, str):
            reject(start, example)
        elif example.id in first_line_of:
            reject(start, f"duplicate id {example.id!r} (first on line {first_line_of[example.id]}; kept that one)")
        else:
            first_line_of[example.id] = start
            examples.append(example)

    if not examples:
        first = f", the first: {bad_rows[0]}" if bad_rows else ""
        raise DataError(f"{path}: no usable rows after the header ({len(bad_rows)} bad row(s) skipped{first})")
    if log:
        _log_load(path, task, cols.label_idx is not None, examples, bad_rows, max_report)
    return LoadResult(examples, bad_rows, str(path))


def _log_load(path: Path, task: str, labelled: bool, examples: list[Example], bad_rows: list[BadRow],
              max_report: int) -> None:
    """One warning naming the first `max_report` bad rows, then the count kept."""
    if bad_rows:
        shown = "; ".join(str(b) for b in bad_rows[:max(max_report, 0)])
        more = f" (and {len(bad_rows) - max_report} more)" if len(bad_rows) > max_report else ""
        logger.warning("%s: skipped %d bad row(s), kept %d: %s%s", path, len(bad_rows), len(examples),
                       shown, more)
    logger.info("%s: %d %s examples (%s)", path, len(examples), task, "labelled" if labelled else "unlabelled")


def load_task_split(data_dir: str | os.PathLike[str], task: str, split: str,
                    strict: bool = False) -> LoadResult:
    """Load the course file for (task, split) from data_dir; train and dev must carry labels,
    test files are read without them."""
    _check_task(task)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    path = Path(data_dir) / COURSE_FILES[task][split]
    return load_task_file(path, task, labelled=split != "test", strict=strict)
