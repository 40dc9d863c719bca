"""A run's metrics.jsonl read back: its records (a torn line skipped), which evaluation best.pt holds, the
training seconds; and the records a resumed run writes again, dropped. No torch here: the commands that only
read runs (report, stats, a study's report) need none."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from training.common.errors import write_error

log = logging.getLogger(__name__)


def read_records(text: str) -> tuple[list[str], list[int]]:
    """metrics.jsonl's lines that hold a JSON record (each ending in a line break), and the numbers of
    those that do not: the last one cut short by a crash or a power loss, or bytes the disk lost."""
    good, bad = [], []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            good.append(line + "\n")
        else:
            bad.append(n)
    return good, bad


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """A run's metrics.jsonl records. A torn or damaged line (a write cut short by a crash, a file still
    being written) is skipped with a warning naming the file and line, not an error: the rest is good."""
    lines, bad = read_records(Path(path).read_bytes().decode("utf-8", errors="replace"))
    if bad:
        log.warning("%s: skipped line(s) %s, not a whole JSON record (a write cut short by a crash?)", path,
                    ", ".join(map(str, bad)))
    return [json.loads(x) for x in lines]


def evaluations(rows: list[dict]) -> list[dict]:
    """The dev evaluations among a run's metrics.jsonl records."""
    return [r for r in rows if r.get("dev_overall") is not None]


def kept_evaluation(rows: list[dict]) -> dict | None:
    """The evaluation best.pt holds: the first with the highest dev_overall (the trainer keeps a new best
    only when it is strictly higher); None before the first evaluation."""
    evals = evaluations(rows)
    return max(evals, key=lambda r: r["dev_overall"]) if evals else None  # max: the first of equal maxima


def epoch_records(rows: list[dict]) -> list[dict]:
    """The records of finished epochs (each with its train_seconds: training steps only, no evaluation)."""
    return [r for r in rows if "train_seconds" in r]


def training_seconds(rows: list[dict]) -> float:
    """A run's training time: its finished epochs' train_seconds (0 before the first epoch ends)."""
    return round(sum(r["train_seconds"] for r in epoch_records(rows)), 2)


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the records after `step` from metrics.jsonl, and those written in a later update (a depth change
    recorded as its update begins: written_in_step): a resumed run writes those again. A torn or damaged
    line is dropped with a warning."""
    if not path.is_file():
        return
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines, bad = read_records(text)
    if bad:
        log.warning("%s: dropped line(s) %s, not a whole JSON record (a write cut short by a crash?)", path,
                    ", ".join(map(str, bad)))
    keep = "".join(x for x in lines if (r := json.loads(x)).get("step", 0) <= step
                   and r.get("written_in_step", 0) <= step)
    if keep == text:
        return
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(keep)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(e, path) from e
    dropped = len(lines) - keep.count("\n")
    if dropped:
        log.info("%s: dropped %d record(s) after step %d, written again by the resumed run", path, dropped, step)
