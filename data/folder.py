"""Where the course's CSV files are, by one rule for every command that reads or fetches them (train,
evaluate, analyze, ensemble, the sweep, data.download): the --data-dir flag (--dest for the download),
else $MINBERT_DATA_DIR, else data in the working directory. And the one line that says such a folder
is wrong, naming where its path came from and what to do.
"""
from __future__ import annotations

import os

ENV = "MINBERT_DATA_DIR"
DEFAULT = "data"
HELP = f"folder with the course's CSV files: ${ENV} if set, else {DEFAULT}"  # a flag's help

# where a folder's path came from, as the line of a wrong folder says it
GIVEN, FROM_ENV, FROM_DEFAULT = "", f"from ${ENV}", f"the default; {ENV} is unset"


def data_folder(given: str | os.PathLike | None = None) -> str:
    """The data folder: `given` (a flag's value), else $MINBERT_DATA_DIR, else data. Read when called, so
    that a caller who sets the environment after importing us is heard."""
    return os.fspath(given) if given else (os.environ.get(ENV) or DEFAULT)


def origin(folder: str, given: bool = False, config_file: str | None = None) -> str:
    """Where a folder's path came from: a flag, a --config file, $MINBERT_DATA_DIR or the default. Without
    `given` (a Python caller's value) a value equal to the environment's is taken to be it."""
    if given:
        return GIVEN
    if config_file:
        return f"from data_dir in --config {config_file}"
    env = os.environ.get(ENV)
    if env and folder == env:
        return FROM_ENV
    return FROM_DEFAULT if folder == DEFAULT and not env else GIVEN


def folder_error(folder: str, where: str, names: list[str]) -> str:
    """The one line for a data folder that is missing, not a folder, or holds none of `names`."""
    what = ("no such folder" if not os.path.exists(folder) else "not a folder" if not os.path.isdir(folder)
            else f"holds none of the files the run reads ({', '.join(names)})")
    fix = {FROM_ENV: f"set {ENV} to the folder that holds the course's CSV files, or pass --data-dir",
           FROM_DEFAULT: f"fetch the course's CSV files there with `python -m data.download`, or pass --data-dir "
                         f"(or set {ENV}) to the folder that holds them"}.get(
        where, "pass --data-dir the folder that holds the course's CSV files (`python -m data.download --dest "
               "DIR` fetches them)")
    return f"--data-dir {folder}{f' ({where})' if where else ''}: {what}; {fix}"


def folder_problem(folder: str, where: str, names: list[str]) -> str | None:
    """folder_error's line when `folder` holds none of `names`, else None (a file missing among others is
    the loader's to name)."""
    if any(os.path.isfile(os.path.join(folder, n)) for n in names):
        return None
    return folder_error(folder, where, names)
