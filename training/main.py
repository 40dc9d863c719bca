"""The `minbert` command: one entry point whose subcommands are the project's commands.

    minbert train --freeze-upto 3 --smart        # = python run_multitask.py --freeze-upto 3 --smart
    minbert evaluate runs/default --data-dir data
    minbert COMMAND --help
    minbert --version                            # this package's, torch's and Python's versions, for a bug report

Each subcommand is a module's main(argv, prog) (training/<command>.py; the experiment drivers'
training/experiments/<command>.py or training/experiments/<package>/cli.py), so `python -m training.<command>`
(`python -m training.experiments.<command>`) runs the same code; the module is imported only when its command
runs.
"""
from __future__ import annotations

import difflib
import importlib
import platform
import sys
from importlib import metadata
from typing import NamedTuple


class Command(NamedTuple):
    module: str
    summary: str


COMMANDS = {
    "train": Command("training.train", "train one model on the three tasks (python run_multitask.py)"),
    "evaluate": Command("training.evaluate", "dev metrics and the course's prediction files of a trained model"),
    "predict": Command("training.predict", "predictions for a file of sentences or pairs"),
    "analyze": Command("training.analyze", "where a trained model is right and wrong on the dev sets"),
    "export": Command("training.export", "a trained model in the Hugging Face layout, heads and model card beside"),
    "ensemble": Command("training.ensemble", "average several trained models; dev metrics and prediction files"),
    "submit": Command("training.submit", "zip a run's prediction files for the course's submission"),
    "report": Command("training.experiments.report",
                      "summarise a sweep, draw a run's training curves, or compare runs"),
    "stats": Command("training.experiments.stats", "does recipe B beat recipe A? tests over seeds and dev examples"),
    "sweep": Command("training.experiments.sweep.cli",
                     "freezing depth x training-set size x seed, resumable, several workers"),
    "study": Command("training.experiments.study.cli", "the freezing study's recipes (docs/freezing-study.md)"),
    "search": Command("training.experiments.search.cli", "hyperparameter search over a space of options (Optuna)"),
}
PROG = "minbert"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [options]   ({PROG} COMMAND --help for a command's options; {PROG} --version)",
             "",
             "A multi-task BERT trainer (SST-5, Quora, STS-B) in plain PyTorch. Commands:", ""]
    lines += [f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items()]
    return "\n".join(lines) + "\n"


def installed_version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def version() -> str:
    """What a bug report needs, from the installed packages' metadata (torch is not imported: no seconds)."""
    return (f"{PROG}: minbert-mt {installed_version('minbert-mt')}, torch {installed_version('torch')}, "
            f"Python {platform.python_version()} ({sys.executable})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(version())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"{PROG}: error: unknown command {name!r}{hint} (see --help)", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name].module)
    return module.main(rest, prog=f"{PROG} {name}")


if __name__ == "__main__":
    sys.exit(main())
