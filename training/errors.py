"""The training package's errors, at the bottom of its import graph: no torch, so the command line
can name them before any heavy import."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot work with the flags, model, data or run directory it names: one line
    for the user, found before any training."""


class NonFiniteLossError(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient (--max-bad-steps)."""


class TrainingInterrupted(Exception):
    """SIGINT/SIGTERM: the current step finished and a checkpoint was written."""

    def __init__(self, signal_name: str, epoch: int, global_step: int, step_in_epoch: int, path):
        self.signal_name, self.path = signal_name, path
        super().__init__(f"{signal_name} received: stopped after step {global_step} (epoch {epoch}, step "
                         f"{step_in_epoch} of the epoch) and wrote {path}. Resume with the same command "
                         f"plus --resume auto (or --resume {path})")
