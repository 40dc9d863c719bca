"""Whether a process that left a claim, a lock or a temporary file behind is still running."""
from __future__ import annotations

import os
import socket


def process_alive(pid, host: str | None = None) -> bool:
    """Whether process `pid` runs (on `host`, when given: another machine's process cannot be seen from
    here, so it counts as alive and its claim is left alone). A pid that is no number counts as gone."""
    if host is not None and host != socket.gethostname():
        return True
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except PermissionError:  # another user's process
        return True
    except (OSError, OverflowError):  # ProcessLookupError, or a number no pid can be
        return False
    return True
