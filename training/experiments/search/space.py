"""A search space: one JSON file of the options to search, the options every trial gets, and what to
optimise. Read and checked here, before any trial starts; each mistake is one line naming the file
and the option.

    {"objective": "overall",                 a dev metric (sst_acc, para_acc, sts_pearson, overall),
                                             or ["overall", "train_seconds"]: the accuracy-versus-cost front
     "trials": 16,                           trials in all (counted over every worker of the study)
     "sampler": "tpe" | "random" | "grid",   grid: every combination of the choices, each run once
     "pruner": "median" | "none" | {"threshold": 0.5},   stop a trial whose evaluations fall behind
     "fixed": {"epochs": 2, "pooling": "mean"},          options every trial gets
     "params": {
        "lr": {"low": 1e-5, "high": 1e-3, "log": true},  a float range (log-uniform with "log")
        "freeze_upto": {"choices": [null, 2, "50%", 6]}, choices (null: the option's "none")
        "batch_size": {"choices": [16, 32]},
        "ema_decay": {"low": 0.99, "high": 0.999}}}
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from training.common.errors import ConfigError
from training.config.train_config import TrainConfig, options_problem, read_json_object
from training.experiments.sweep.records import PER_RUN
from training.inference.metrics import METRIC

METRICS = (*METRIC.values(), "overall")
COST = "train_seconds"
SAMPLERS = ("tpe", "random", "grid")
KEYS = {"objective", "trials", "sampler", "pruner", "fixed", "params", "seed"}
# Options a trial's run directory and the search itself set (the training seed is the user's: `fixed` may set it)
NOT_SEARCHABLE = set(PER_RUN) - {"freeze_upto", "max_train_examples", "seed"} | {"overwrite"}


@dataclass
class Param:
    name: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: list | None = None

    @property
    def integer(self) -> bool:
        """A range of an integer option with whole bounds: its settings are the integers in it."""
        kind = TrainConfig.__dataclass_fields__[self.name].type
        return (self.choices is None and str(kind).startswith("int") and float(self.low).is_integer()
                and float(self.high).is_integer())

    @property
    def size(self) -> float:
        """How many settings it has (infinite for a float range)."""
        if self.choices is not None:
            return len(self.choices)
        return int(self.high) - int(self.low) + 1 if self.integer else math.inf

    def suggest(self, trial):
        if self.choices is not None:
            return trial.suggest_categorical(self.name, self.choices)
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)


@dataclass
class Space:
    path: Path
    objective: list[str]
    trials: int
    sampler: str
    pruner: str | dict
    fixed: dict
    params: dict[str, Param]
    seed: int = 0
    directions: list[str] = field(default_factory=list)

    @property
    def multi(self) -> bool:
        return len(self.objective) > 1

    def grid(self) -> dict[str, list]:
        return {name: p.choices for name, p in self.params.items()}

    @property
    def size(self) -> float:
        """How many distinct settings the space holds (infinite where a float range is searched)."""
        return math.prod(p.size for p in self.params.values())


def load_space(path: str | Path) -> Space:
    path = Path(path)
    raw = read_json_object(path, str(path), "no such search-space file")
    try:
        return _space(path, raw)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None


def _space(path: Path, raw: dict) -> Space:
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(KEYS))})")
    objective = raw.get("objective", "overall")
    objective = [objective] if isinstance(objective, str) else objective
    if not (isinstance(objective, list) and objective and objective[0] in METRICS
            and (len(objective) == 1 or objective[1:] == [COST])):
        raise ValueError(f"objective must be one of {', '.join(METRICS)}, or [that, \"{COST}\"], not "
                         f"{raw.get('objective')!r}")
    trials = raw.get("trials", 16)
    if not (isinstance(trials, int) and not isinstance(trials, bool) and trials >= 1):
        raise ValueError(f"trials must be an integer >= 1, not {trials!r}")
    sampler = raw.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, not {sampler!r}")
    pruner = raw.get("pruner", "median")
    if not (pruner in ("median", "none") or (isinstance(pruner, dict) and set(pruner) == {"threshold"}
                                             and _finite_number(pruner["threshold"]))):
        raise ValueError(f"pruner must be \"median\", \"none\" or {{\"threshold\": X}}, not {pruner!r}")
    fixed, params = raw.get("fixed", {}), raw.get("params") or {}
    for key, value in (("fixed", fixed), ("params", params)):
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be an object of options, {{\"option\": ...}}, not {value!r}")
    seed = raw.get("seed", 0)
    if not (isinstance(seed, int) and not isinstance(seed, bool)):
        raise ValueError(f"seed must be an integer, not {seed!r}")
    problem = _options_problem(fixed)
    if problem:
        raise ValueError(f"fixed: {problem}")
    params = {name: _param(name, spec) for name, spec in params.items()}
    if not params:
        raise ValueError("params: nothing to search (give at least one option)")
    clash = sorted(set(params) & set(fixed))
    if clash:
        raise ValueError(f"{clash[0]}: both searched and fixed")
    if sampler == "grid" and any(p.choices is None for p in params.values()):
        ranged = next(n for n, p in params.items() if p.choices is None)
        raise ValueError(f"sampler grid needs choices for every option, not a range ({ranged})")
    directions = ["maximize"] + ["minimize"] * (len(objective) - 1)
    return Space(path, objective, trials, sampler, pruner, fixed, params, seed, directions)


def _param(name: str, spec) -> Param:
    if name not in TrainConfig.__dataclass_fields__:
        raise ValueError(f"params: {name} is not a training option")
    if name in NOT_SEARCHABLE:
        raise ValueError(f"params: {name} is set by the search for each trial, not searched")
    if name == "seed":  # the best of several seeds is the luckiest draw, not a better setting
        raise ValueError("params: seed is not searched (a setting chosen over seeds is chosen for its luck); "
                         "fix it in \"fixed\" if another than the default is wanted")
    if not isinstance(spec, dict):
        raise ValueError(f"params.{name}: expected {{\"low\", \"high\"[, \"log\"]}} or {{\"choices\": [...]}}")
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) != {"choices"} or not isinstance(choices, list) or not choices:
            raise ValueError(f"params.{name}: choices must be a non-empty list (and alone)")
        for c in choices:
            problem = _options_problem({name: c})
            if problem:
                raise ValueError(f"params.{name}: the choice {c!r} is not accepted ({problem})")
        return Param(name, choices=choices)
    if not ({"low", "high"} <= set(spec) <= {"low", "high", "log"}):
        raise ValueError(f"params.{name}: a range needs low and high (and optionally log)")
    low, high, log = spec["low"], spec["high"], spec.get("log", False)
    if not all(_finite_number(v) for v in (low, high)):
        raise ValueError(f"params.{name}: low and high must be finite numbers")
    if not isinstance(log, bool):
        raise ValueError(f"params.{name}: log must be true or false, not {log!r}")
    if not low < high:
        raise ValueError(f"params.{name}: empty range [{low}, {high}] (low must be below high)")
    if log and low <= 0:
        raise ValueError(f"params.{name}: a log range must be above zero, not [{low}, {high}]")
    for v in (low, high):
        problem = _options_problem({name: v})
        if problem:
            raise ValueError(f"params.{name}: {v} is outside what the option accepts ({problem})")
    return Param(name, low, high, log)


def _options_problem(options: dict) -> str | None:
    return options_problem(options, NOT_SEARCHABLE, "set by the search for each trial")


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
