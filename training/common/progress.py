"""Progress bars that stay readable in log files.

On a terminal: tqdm. Elsewhere (CI, cluster logs, `nohup ... > log`) carriage-return bars turn
into one endless line, so we log a plain progress line every `interval` seconds instead.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Iterable, Iterator

from tqdm import tqdm

log = logging.getLogger("progress")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: int = logging.INFO) -> None:
    """The console log of every training command line: time, level, logger, message."""
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt="%H:%M:%S")


class _LogProgress:
    def __init__(self, items: Iterable, desc: str, total: int, interval: float):
        self.items, self.desc, self.total, self.interval = items, desc, total, interval
        self.postfix: dict = {}

    def set_postfix(self, postfix: dict) -> None:
        self.postfix = postfix

    def __iter__(self) -> Iterator:
        start = last = time.time()
        for i, item in enumerate(self.items, 1):
            yield item
            now = time.time()
            if now - last >= self.interval or i == self.total:
                last = now
                rate = i / max(now - start, 1e-9)
                eta = (self.total - i) / rate if rate > 0 else float("nan")
                extra = " ".join(f"{k} {v}" for k, v in self.postfix.items())
                log.info("%s: %d/%d (%.0f%%), %.2f it/s, eta %.0f s %s", self.desc, i, self.total,
                         100 * i / self.total, rate, eta, extra)


def progress(items: Iterable, desc: str, total: int, interval: float = 30.0):
    if sys.stderr.isatty():
        return tqdm(items, desc=desc, total=total, dynamic_ncols=True)
    return _LogProgress(items, desc, total, interval)
