"""Whether a process that left a claim, a lock or a temporary file behind is still running, and the lock
that keeps a run folder to the one process training in it."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path


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


# A run folder's training process holds an exclusive flock on this file in the folder for as long as it
# trains. A sweep worker killed alone (SIGKILL, which runs no `finally`) leaves its training process
# alive for a moment: it sees its parent gone, finishes its step and writes a checkpoint. A worker that
# takes the run over must not judge or clean the folder before that process is gone (issue 62).
TRAINER_LOCK = ".trainer.lock"


def _try_flock(fd: int) -> bool:
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def hold_run_folder(run_dir: Path, parent: int, poll_seconds: float = 0.1) -> int | None:
    """In a run's training process: take run_dir's trainer lock (kept until this process exits) and
    return its descriptor; None when the process that started this one (pid `parent`) is gone before the
    lock is ours: a worker that took the run over now owns the folder, and this process must not train."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / TRAINER_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    while True:
        if _try_flock(fd):
            break
        if os.getppid() != parent:
            os.close(fd)
            return None
        time.sleep(poll_seconds)
    if os.getppid() != parent:  # gone while we took it: the folder may already be another's
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def wait_for_run_folder(run_dir: Path, log, poll_seconds: float = 0.2) -> None:
    """Before judging or cleaning run_dir: wait until no process trains in it (a killed worker's training
    process, which stops after its step with a checkpoint that the run then goes on from)."""
    lock = run_dir / TRAINER_LOCK
    if not lock.is_file():
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        said = False
        while not _try_flock(fd):
            if not said:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                log.info("%s: the training process (pid %s) of the worker that held this run is still "
                         "running; waiting for it to stop after its step", run_dir, holder)
                said = True
            time.sleep(poll_seconds)
    finally:
        os.close(fd)  # closing releases the lock
