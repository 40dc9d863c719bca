"""A run's options that differ from the defaults, as the flags that would set them: what a model card and a
comparison of runs show instead of the whole config, and the command that would train the run again."""
from __future__ import annotations

import shlex

from training.config.train_config import TrainConfig, default_of, flag_of, locations, options

# Where a run read and wrote, not what it trained: never part of a recipe (data is shown apart).
LOCATIONS = locations()


def defaults(config: dict) -> dict:
    """TrainConfig's defaults, with task_sampling's resolved as __post_init__ does for this config's
    --pcgrad (mixed with PCGrad, else mtdnn): a run that left it alone did not choose it."""
    out = {f.name: default_of(f) for f in options()}
    out["tasks"] = list(out["tasks"])
    out["task_sampling"] = "mixed" if config.get("pcgrad") else "mtdnn"
    return out


def changed_options(config: dict) -> dict:
    """{field: value} of the options set away from their defaults, locations left out, in field order."""
    base = defaults(config)
    return {f.name: config[f.name] for f in options()
            if f.name in config and f.name not in LOCATIONS and _norm(config[f.name]) != _norm(base[f.name])}


def _norm(value):
    return list(value) if isinstance(value, tuple) else value


def option_flags(name: str, value) -> list[str]:
    """One option as command-line words: --flag, --no-flag, --flag on|off, --tasks a b, --flag value."""
    f = TrainConfig.__dataclass_fields__[name]
    flag = flag_of(name)
    if f.metadata["onoff"]:
        return [flag, "on" if value else "off"]
    if isinstance(value, bool):
        return [flag] if value else [f"--no-{flag[2:]}"]
    if name == "tasks":
        return [flag, *value]
    return [flag, "none" if value is None else str(value)]


def changed_flags(config: dict) -> list[str]:
    """The run's changed options as flags, e.g. ['--epochs', '1', '--smart']."""
    return [word for name, value in changed_options(config).items() for word in option_flags(name, value)]


def command_line(config: dict) -> str:
    return shlex.join(["python", "run_multitask.py", *changed_flags(config)])
