"""Where a command writes what it makes of a run, by one rule for every command: the folder a flag names,
else NAME inside the run's folder -- never the working directory, which changes from shell to shell.

    train     OUT_DIR/predictions   (--predictions-dir)
    evaluate  RUN/predictions       (--predictions-dir)
    analyze   RUN/analysis          (--out)
    export    RUN/export            (OUT_DIR)

The data folder a command reads has its own one rule: data.folder.
"""
from __future__ import annotations

import os
from pathlib import Path


def run_folder(source: str | os.PathLike) -> Path:
    """The run a model comes from: a run directory (or an export folder) itself, best.pt's folder, one up
    from checkpoints/step-N.pt. A path not there yet (a run about to start) is a folder."""
    source = Path(source)
    if not source.is_file():
        return source
    return source.parent.parent if source.parent.name == "checkpoints" else source.parent


def output_folder(given: str | os.PathLike | None, source: str | os.PathLike, name: str) -> Path:
    """`given` (a flag's value) if set, else `name` inside the run's folder."""
    return Path(given) if given else run_folder(source) / name


def current_umask() -> int:
    """The process's umask (read by setting it and setting it back): what a file written through a
    private temporary one (mkstemp, mkdtemp) is given back, so a shared run's files stay shared."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
