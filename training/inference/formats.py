"""The prediction file formats: the course's, plain-text input, and our TSV format.

Course format (what the course grades): a header `id \t Predicted_Sentiment` (`Predicted_Is_Paraphrase`,
`Predicted_Similiary` -- the course's spelling), then one `id , prediction` row per example.

Plain text (`python -m training.evaluate --predict-text TASK FILE OUT`), UTF-8:
    sst        one sentence per line
    para, sts  one pair per line: sentence1 <TAB> sentence2
Blank lines are skipped; an example's id is its line number (1-based), so predictions point back at
their lines.

TSV predictions (--predict-text, and --predict with --probabilities): tab-separated, a header row,
one row per example, fields quoted csv-style only where they hold a tab, a quote or a line break
(pandas.read_csv(path, sep="\\t") reads it):
    sst   id  sentence               label  [prob_0 .. prob_4]     label 0 negative .. 4 positive
    para  id  sentence1  sentence2   label  [prob_paraphrase]      label 1 = paraphrase
    sts   id  sentence1  sentence2   score                         score in [0, 5]
The bracketed columns come with --probabilities; `gold` (the file's label) follows the sentences where
the input was labelled (training.analyze). Probabilities and scores have 6 decimals.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from data.loaders import TEXT_COLUMNS, DataError, Example

DECIMALS = 6
HEADERS = {"sst": "Predicted_Sentiment", "para": "Predicted_Is_Paraphrase", "sts": "Predicted_Similiary"}


def _format(task: str, value: float) -> str:
    return f"{value:.4f}" if task == "sts" else str(int(value))


def write_predictions(path: str | os.PathLike, task: str, ids: list[str], preds: np.ndarray) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a temp name per process: two runs sharing --predictions-dir never write into each other's file
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(f"id \t {HEADERS[task]} \n")
            for i, p in zip(ids, preds):
                f.write(f"{i} , {_format(task, p)} \n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_predictions(path: str | os.PathLike) -> tuple[str, list[tuple[str, float]]]:
    """Parse a file in the course's submission format -> (task, [(id, prediction)])."""
    lines = Path(path).read_text().splitlines()
    header = [h.strip() for h in lines[0].split("\t")]
    task = {v: k for k, v in HEADERS.items()}.get(header[1] if len(header) == 2 else "")
    if header[0] != "id" or task is None:
        raise ValueError(f"{path}:1: not a course prediction header: {lines[0]!r}")
    rows = []
    for n, line in enumerate(lines[1:], 2):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            raise ValueError(f"{path}:{n}: expected 'id , prediction', got {line!r}")
        rows.append((parts[0], float(parts[1])))
    return task, rows


def read_text_examples(path: str | os.PathLike, task: str) -> list[Example]:
    """One sentence (sst) or one tab-separated pair (para, sts) per line -> unlabelled Examples."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text") from None
    examples = []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split("\t")]
        if task == "sst" and len(parts) > 1:
            raise DataError(f"{path}:{n}: a tab in the line: sst takes one sentence per line "
                            f"(para and sts take sentence1<TAB>sentence2)")
        if task != "sst" and len(parts) != 2:
            raise DataError(f"{path}:{n}: expected two tab-separated sentences for {task}, got {len(parts)} field(s)")
        if not all(parts):
            raise DataError(f"{path}:{n}: an empty sentence")
        examples.append(Example(str(n), parts[0], parts[1] if task != "sst" else None, None))
    if not examples:
        raise DataError(f"{path}: no sentences (an empty file, or blank lines only)")
    return examples


def tsv_columns(task: str, with_probabilities: bool, with_gold: bool = False) -> list[str]:
    cols = ["id", *TEXT_COLUMNS[task]] + (["gold"] if with_gold else [])
    if task == "sts":
        return cols + ["score"]
    extra = [f"prob_{i}" for i in range(5)] if task == "sst" else ["prob_paraphrase"]
    return cols + ["label"] + (extra if with_probabilities else [])


def _number(x: float) -> str:
    return f"{x:.{DECIMALS}f}"


def tsv_rows(task: str, examples: list[Example], preds: np.ndarray, probs: np.ndarray | None,
             with_gold: bool = False) -> list[list[str]]:
    """preds: labels (sst, para) or scores (sts), (N,); probs: (N, 5) for sst, (N,) for para, or None."""
    rows = []
    for i, e in enumerate(examples):
        row = [e.id, e.text_a] + ([e.text_b] if task != "sst" else [])
        if with_gold:
            row.append(str(e.label))
        if task == "sts":
            row.append(_number(preds[i]))
            rows.append(row)
            continue
        row.append(str(int(preds[i])))
        if probs is not None:
            row += [_number(p) for p in np.atleast_1d(probs[i])]
        rows.append(row)
    return rows


def write_tsv_predictions(path: str | os.PathLike, task: str, examples: list[Example], preds: np.ndarray,
                          probs: np.ndarray | None = None, with_gold: bool = False) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f, delimiter="\t", lineterminator="\n")
            w.writerow(tsv_columns(task, probs is not None, with_gold))
            w.writerows(tsv_rows(task, examples, preds, probs, with_gold))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_tsv_predictions(path: str | os.PathLike) -> tuple[str, list[dict[str, str]]]:
    """A TSV prediction file -> (task, rows as {column: text}); the task is told by the header."""
    path = Path(path)
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    if not rows:
        raise ValueError(f"{path}: empty file")
    header = rows[0]
    if "sentence" in header:
        task = "sst"
    else:
        task = "sts" if "score" in header else "para"
    known = [tsv_columns(task, p, g) for p in (False, True) for g in (False, True)]
    if header not in known:
        raise ValueError(f"{path}:1: not a TSV prediction header: {header}")
    for n, row in enumerate(rows[1:], 2):
        if len(row) != len(header):
            raise ValueError(f"{path}:{n}: expected {len(header)} fields, got {len(row)}")
    return task, [dict(zip(header, row)) for row in rows[1:]]
