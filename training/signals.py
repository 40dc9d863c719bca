"""SIGINT/SIGTERM ask the training loop to stop after the current step, so that it can write a
checkpoint first."""
from __future__ import annotations

import contextlib
import logging
import signal
import threading

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
