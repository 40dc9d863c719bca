"""SIGINT/SIGTERM ask the training loop to stop after the current step, so that it can write a
checkpoint first; the drivers (sweep, study, search) to stop after the current run or trial; and the
sweep's process pair stops together.

Every handler here only records the signal (in `_received`) and returns: an exception raised from a
handler can land in a weakref callback or a `__del__`, where Python prints it and drops it, and the
signal would be lost. The loops ask `received()` at their next boundary instead."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

log = logging.getLogger(__name__)


_received: list[int] = []  # the stop signals received inside a driver's stop_after(), in order
_driving: list[str] = []  # the units of the stop_after() blocks this process is in (the trainer's handler asks)
_on_stop: list = []  # callables(signum) run at the first signal: the sweep forwards it to its training process


def received() -> int | None:
    """The first SIGINT/SIGTERM received inside the current stop_after() block, else None."""
    return _received[0] if _received else None


def record(signum: int) -> None:
    """Take a signal as received by the driver (a child's, reported back; the trainer's, seen in its loop)."""
    if _driving and not _received:
        _received.append(signum)


def exit_status() -> int:
    """The shell's status for a process stopped by the received signal: 128 + its number."""
    return 128 + (received() or signal.SIGTERM)


@contextlib.contextmanager
def stop_after(unit: str):
    """In a driver (sweep, study, search) or a sweep's training process: SIGINT/SIGTERM ask it to stop
    once the current `unit` is done, which its loop asks with received(); one log line, and the
    callables of _on_stop run. A second signal stops it at once: SystemExit, so that `finally` blocks
    run (a third, should that exception be swallowed, takes the default action)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _received:
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_DFL)
            raise SystemExit(128 + signum)
        record(signum)
        log.warning("%s received: stopping after the current %s (send it again to stop at once)",
                    signal.Signals(signum).name, unit)
        for hook in list(_on_stop):
            hook(signum)

    _received.clear()
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    _driving.append(unit)
    try:
        yield
    finally:
        _driving.pop()
        _received.clear()
        for s, h in previous.items():
            signal.signal(s, h)


class _StopFlag:
    requested = False
    signal_name = ""


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT/SIGTERM ask the loop to stop after the current step (a second SIGINT stops at once)."""
    flag = _StopFlag()
    if received():  # asked already, before the loop began (a driver between two runs): stop at the first step
        flag.requested, flag.signal_name = True, signal.Signals(received()).name
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        record(signum)  # a driver around the loop stops after it, even if no step was left to stop after
        flag.requested, flag.signal_name = True, flag.signal_name or signal.Signals(signum).name
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


def exit_with_parent(parent: int, poll_seconds: float = 2.0) -> None:
    """In a child process: a daemon thread that sends this process SIGTERM (the trainer's clean stop)
    once its parent is gone, for a parent killed with SIGKILL, which runs no `finally`. `parent` is the
    pid the parent gave its child: a parent killed while the child was still starting up is then seen
    as gone at once (asking `os.getppid()` here would name whoever adopted the child)."""
    def watch():
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        log.warning("the sweep that started this run is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
