"""The training package's errors, at the bottom of its import graph: no torch, so the command line
can name them before any heavy import."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot work with the flags, model, data or run directory it names: one line
    for the user, found before any training."""


class LoadError(ValueError):
    """A path that holds no model we can load; the message is one line naming it (training.api raises it)."""


class NonFiniteLossError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient (--max-bad-steps)."""


class TrainingInterrupted(Exception):
    """SIGINT/SIGTERM: the current step finished and a checkpoint was written."""

    def __init__(self, signal_name: str, epoch: int, global_step: int, step_in_epoch: int, path):
        self.signal_name, self.path = signal_name, path
        super().__init__(f"{signal_name} received: stopped after step {global_step} (epoch {epoch}, step "
                         f"{step_in_epoch} of the epoch) and wrote {path}. Resume with the same command "
                         f"plus --resume auto (or --resume {path})")


class WriteError(RuntimeError):
    """A file of the run could not be written (a full disk, a read-only file system); the message is one
    line naming the file. What was there before is intact: every file is written to a temp name first."""


def write_error(e: BaseException, path) -> WriteError | None:
    """The OSError behind `e` as a WriteError naming `path`, else None. torch.save reports a full disk as
    a RuntimeError from inline_container.cc, the OSError ("No space left on device") chained behind it."""
    cause, seen = e, set()
    while cause is not None and not isinstance(cause, OSError) and id(cause) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, OSError):
        return WriteError(f"{path}: {cause.strerror or cause} (the file is unchanged)")
    if isinstance(e, RuntimeError) and "inline_container" in str(e):  # torch's writer, without an OSError
        return WriteError(f"{path}: cannot write the checkpoint ({str(e).splitlines()[0]}); is the disk full?")
    return None
