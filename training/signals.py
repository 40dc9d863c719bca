"""SIGINT/SIGTERM ask the training loop to stop after the current step, so that it can write a
checkpoint first; and the sweep's process pair stops together."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

log = logging.getLogger(__name__)


class _StopFlag:
    requested = False
    signal_name = ""


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT/SIGTERM ask the loop to stop after the current step (a second SIGINT stops at once)."""
    flag = _StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        flag.requested, flag.signal_name = True, signal.Signals(signum).name
        log.warning("%s received: finishing the current step, then writing a checkpoint (Ctrl-C again to "
                    "stop at once)", flag.signal_name)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit in the main thread, so that `finally` blocks run: a sweep killed while
    it waits for a training process stops that process too instead of leaving it orphaned."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def exit_with_parent(poll_seconds: float = 2.0) -> None:
    """In a child process: a daemon thread that sends this process SIGTERM (the trainer's clean stop)
    once its parent is gone, for a parent killed with SIGKILL, which runs no `finally`."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        log.warning("the sweep that started this run is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
