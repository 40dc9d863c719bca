"""A study's recipe: one JSON file naming the grid (tasks, depths, sizes, seeds, arms), the training
options every run gets, and the extras a study adds on top of the sweep's grid (a learning-rate grid
per depth, cost arms, a table's rows). recipes/ holds the freezing study's (training/experiments/study/cli.py
lists them).

    {"title": ..., "about": ..., "kind": "depth" | "size" | "table",
     "results": "docs/freezing-study",        folder of results.jsonl (studies with one settings share it)
     "report": "docs/freezing-study/depth",   folder of this study's tables and figures
     "tasks": [...], "depths": ["none", -1, 3, "75%"], "sizes": [1000], "seeds": [1, 2, 3],
     "train": {TrainConfig field: value},      the options every run gets (over TrainConfig's defaults)
     "arms": {"": {}, "siamese": {"pair_encoding": "siamese"}},   optional: every point once per arm
     "lr_grid": {"lrs": [...], "tuning_seeds": [1]},              optional (depth)
     "cost": {"seeds": [1], "overrides": {"frozen_cache": "off"}},  optional (depth)
     "rows": [{"label", "depth", "arm", "published"}], "compare": [[label, label]]}  (table)

An "arms" recipe (the clean protocol: a tuning split, tuning seeds apart from the reporting seeds, every
point's rate tuned) lists "points" instead of depths x arms, with "tuning_split" and "lr_grid":
training/experiments/study/protocol.py says how its runs are planned. Its "compare": [[point, against, the question]]
names the pairs a confound or a matched budget asks about, beyond each point against full fine-tuning
(reported as a family of their own). Its "fixed_budget": "why" says that every point trains a set number
of updates, which takes them outside the convergence rule (no longer twins: the question is the budget).

Where a study writes: `--out DIR` (results.jsonl there, shared by recipes of the same settings, and the
report in DIR/<report>, "report" being a folder name, by default the recipe file's name); a recipe's
"results" is the default of --out.

Depths are numbers of layers or shares of them (P%, rounded as --freeze-upto rounds it), resolved on
the model's depth when the study starts, so one recipe means the same on 6 and 12 layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from data.loaders import TASKS
from training.common.errors import ConfigError
from training.config.freeze_spec import freeze_depth, freeze_error
from training.config.train_config import TrainConfig, read_json_object, seed_error
from training.config.train_config import options_problem as config_options_problem
from training.experiments.study.protocol import BORROWS, borrows, lr_name, split_run_arm
from training.experiments.sweep.records import PER_RUN, RunKey

RECIPES = Path(__file__).with_name("recipes")
KINDS = ("depth", "size", "table", "arms")
KEYS = {"title", "about", "kind", "results", "report", "tasks", "depths", "sizes", "seeds", "train", "arms",
        "lr_grid", "cost", "rows", "compare", "points", "tuning_split", "fixed_budget"}
REQUIRED = {"title", "kind", "tasks", "depths", "sizes", "seeds", "train"}
COST_ARM = "nocache"
# an arms study's point: its label, depth and arm; its rates (lrs) or another point's (lr_of); its size and
# the point it is measured against (vs); what its paper reported, quoted beside its result (published); or
# the rate another point's tuning ranked second (runner_up_of: does a near tie decide that point's result?)
POINT_KEYS = {"label", "depth", "arm", "lrs", "lr_of", "runner_up_of", "size", "vs", "published"}


@dataclass
class Recipe:
    path: Path
    title: str
    about: str
    kind: str
    tasks: list[str]
    depths: list  # as written: int, "none" or "P%"
    sizes: list
    seeds: list[int]  # the reporting seeds (an arms study tunes on lr_grid's tuning_seeds, apart from these)
    train: dict
    results: str | None = None  # the default --out
    report: str | None = None   # the report's folder inside --out (default: the recipe file's name)
    arms: dict[str, dict] = field(default_factory=lambda: {"": {}})
    lr_grid: dict | None = None
    cost: dict | None = None
    rows: list[dict] = field(default_factory=list)
    compare: list[list[str]] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)
    tuning_split: dict | None = None
    # why every point trains a set number of updates, which takes them outside the convergence rule (an
    # arms recipe whose question is what that budget buys, e.g. sizes at an equal number of updates)
    fixed_budget: str | None = None
    layers: int | None = None  # the model's depth, once resolve() has read it

    # ------------------------------------------------------------------ the grid

    @property
    def base_lr(self) -> float:
        """The rate every run gets unless its arm says otherwise: the recipe's, else --lr's default."""
        return self.train.get("lr", TrainConfig.lr)

    def options(self, point: dict) -> dict:
        """The settings a point's runs train with beside the recipe's defaults: its arm's over the train ones."""
        return {**self.train, **self.arms.get(point["arm"], {})}

    def depth(self, d) -> int | None:
        """A recipe depth as a number of frozen layers (None: full fine-tuning)."""
        return None if d == "none" else freeze_depth(d, self.layers)

    def resolved_depths(self) -> list[int | None]:
        return list(dict.fromkeys(self.depth(d) for d in self.depths))

    def all_arms(self) -> dict[str, dict]:
        """Every arm's overrides: the recipe's, the learning-rate grid's, the cost arm's (an arms study's
        runs add their rate to their point's arm: protocol.ArmOverrides)."""
        arms = dict(self.arms)
        if self.lr_grid and self.kind != "arms":
            arms.update({lr_name(lr): {"lr": lr} for lr in self.lr_grid["lrs"]})
        if self.cost:
            arms[COST_ARM] = dict(self.cost["overrides"])
        return arms

    def base_keys(self) -> list[RunKey]:
        """The grid: seeds outermost (a study stopped early holds whole seeds), then sizes, depths, arms;
        a table's grid is its rows alone (each a depth and an arm), not every depth with every arm."""
        name = "+".join(self.tasks)
        points = ([(self.depth(r["depth"]), r["arm"]) for r in self.rows] if self.kind == "table" else
                  [(d, a) for d in self.resolved_depths() for a in self.arms])
        return [RunKey(name, d, n, s, a) for s in self.seeds for n in self.sizes for d, a in points]

    def plan(self, records: list[dict]) -> list[RunKey]:
        """Every run the study needs, given the results so far: the grid, then the learning-rate grid on
        its tuning seeds, then each depth's best rate on the other seeds (known once its tuning runs
        are in), then the cost arm. An arms study: protocol.Protocol's plan."""
        if self.kind == "arms":
            from training.experiments.study.protocol import Protocol
            return Protocol(self, records).plan()
        keys = self.base_keys()
        if self.lr_grid:
            keys += self.tuning_keys() + self.tuned_keys(records)
        if self.cost:
            name = "+".join(self.tasks)
            keys += [RunKey(name, d, n, s, COST_ARM) for s in self.cost["seeds"] for n in self.sizes
                     for d in self.resolved_depths() if d is not None and d >= 1]
        return list(dict.fromkeys(keys))

    def grid_depths(self) -> list[int]:
        """The depths the learning-rate grid tunes: every frozen one (full fine-tuning keeps --lr, the
        rate the protocol takes from the full model)."""
        return [d for d in self.resolved_depths() if d is not None]

    def tuning_keys(self) -> list[RunKey]:
        name = "+".join(self.tasks)
        return [RunKey(name, d, n, s, lr_name(lr)) for s in self.lr_grid["tuning_seeds"] for n in self.sizes
                for d in self.grid_depths() for lr in self.lr_grid["lrs"]]

    def best_lrs(self, records: list[dict]) -> dict[tuple, float]:
        """(depth, size) -> the rate with the best mean dev overall over the tuning seeds, among --lr and
        the grid; only for points whose tuning runs are all in."""
        by_key = {RunKey.of(r): r for r in records}
        base_lr = self.base_lr
        name, out = "+".join(self.tasks), {}
        for n in self.sizes:
            for d in self.grid_depths():
                candidates = {base_lr: ""} | {lr: lr_name(lr) for lr in self.lr_grid["lrs"]}
                scores = {}
                for lr, arm in candidates.items():
                    runs = [by_key.get(RunKey(name, d, n, s, arm)) for s in self.lr_grid["tuning_seeds"]]
                    if any(r is None for r in runs):
                        break
                    scores[lr] = sum(r["dev"]["overall"] for r in runs) / len(runs)
                else:
                    out[d, n] = max(scores, key=lambda lr: (scores[lr], lr == base_lr))  # a tie keeps --lr
        return out

    def tuned_keys(self, records: list[dict]) -> list[RunKey]:
        name, base_lr = "+".join(self.tasks), self.base_lr
        others = [s for s in self.seeds if s not in self.lr_grid["tuning_seeds"]]
        return [RunKey(name, d, n, s, lr_name(lr)) for (d, n), lr in self.best_lrs(records).items()
                if lr != base_lr for s in others]

    # ------------------------------------------------------------------ loading

    def resolve(self, layers: int) -> "Recipe":
        """Fix the depths on a model of `layers` layers; a depth past it is a ConfigError."""
        self.layers = layers
        for d in self.depths + [r["depth"] for r in self.rows + self.points]:
            if d != "none" and not -1 <= freeze_depth(d, layers) <= layers:
                raise ConfigError(f"{self.path}: depth {d} is out of range for a model of {layers} layers "
                                  f"(-1 to {layers}, or a share P%)")
        return self


def recipe_path(name: str) -> Path:
    """A recipe named by its file, or one of recipes/ by its name (depth, size, seed-report)."""
    path = Path(name)
    if path.suffix == ".json" or path.exists():
        return path
    return RECIPES / f"{name}.json"


def available() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.json"))


def load_recipe(name: str) -> Recipe:
    """Read and check a recipe; every mistake is a ConfigError of one line naming the file and key."""
    path = recipe_path(name)
    raw = read_json_object(path, str(path) if path.exists() else name,
                           f"no such recipe file (the built-in ones: {', '.join(available())})")
    problem = recipe_problem(raw)
    if problem:
        raise ConfigError(f"{path}: {problem}")
    return Recipe(path=path, **raw)


def recipe_problem(raw: dict) -> str | None:
    """The first thing wrong with a recipe's contents, as '<key>: why', else None."""
    unknown = sorted(set(raw) - KEYS)
    if raw.get("kind") == "arms" and "depths" not in raw and isinstance(raw.get("points"), list):
        raw["depths"] = list(dict.fromkeys(p.get("depth") for p in raw["points"] if isinstance(p, dict)))
    missing = sorted(REQUIRED - set(raw))
    if unknown or missing:
        return f"unknown key(s) {', '.join(unknown)}" if unknown else f"missing key(s) {', '.join(missing)}"
    raw.setdefault("about", "")
    checks = [
        ("kind", raw["kind"] in KINDS, f"one of {', '.join(KINDS)}"),
        ("tasks", _list_of(raw["tasks"], str) and set(raw["tasks"]) <= set(TASKS) and raw["tasks"],
         "some of sst, para, sts"),
        ("depths", _list_of(raw["depths"], (int, str)) and raw["depths"] and all(_depth_ok(d) for d in raw["depths"]),
         'a list of depths: "none", integers >= -1, or shares "P%"'),
        ("sizes", _list_of(raw["sizes"], (int, str)) and raw["sizes"]
         and all(n == "all" or (isinstance(n, int) and n >= 1) for n in raw["sizes"]), 'positive integers or "all"'),
        ("seeds", _list_of(raw["seeds"], int) and raw["seeds"] and len(set(raw["seeds"])) == len(raw["seeds"]),
         "distinct integers"),
        ("train", isinstance(raw["train"], dict), "an object of training options"),
    ]
    for key, ok, want in checks:
        if not ok:
            return f"{key} must be {want}, not {raw[key]!r}"
    bad_seed = next((e for e in (seed_error(s, "seeds") for s in raw["seeds"]) if e), None)
    if bad_seed:  # the sweep checks its --seeds the same way
        return bad_seed
    for where, options in [("train", raw["train"])] + [(f"arms.{a!r}", o) for a, o in raw.get("arms", {}).items()]:
        problem = options_problem(options)
        if problem:
            return f"{where}: {problem}"
    return _extras_problem(raw)


def _extras_problem(raw: dict) -> str | None:
    if "fixed_budget" in raw and not (raw["kind"] == "arms" and isinstance(raw["fixed_budget"], str)
                                      and raw["fixed_budget"].strip()):
        return "fixed_budget must be a sentence saying why (an arms recipe whose points train a set budget)"
    if raw["kind"] == "arms":
        return _arms_problem(raw)
    grid = raw.get("lr_grid")
    if grid is not None and not (isinstance(grid, dict) and set(grid) == {"lrs", "tuning_seeds"}
                                 and _rates_ok(grid["lrs"])
                                 and _list_of(grid["tuning_seeds"], int)
                                 and set(grid["tuning_seeds"]) <= set(raw["seeds"])):
        return ("lr_grid must be {\"lrs\": [rates > 0, of 6 significant digits at most], "
                "\"tuning_seeds\": [some of seeds]}")
    cost = raw.get("cost")
    if cost is not None and not (isinstance(cost, dict) and set(cost) == {"seeds", "overrides"}
                                 and _list_of(cost["seeds"], int) and set(cost["seeds"]) <= set(raw["seeds"])
                                 and isinstance(cost["overrides"], dict)):
        return "cost must be {\"seeds\": [some of seeds], \"overrides\": {options}}"
    if cost is not None and options_problem(cost["overrides"]):
        return f"cost.overrides: {options_problem(cost['overrides'])}"
    arms = raw.get("arms", {"": {}})
    if not isinstance(arms, dict) or not arms or not all(isinstance(o, dict) for o in arms.values()):
        return "arms must be an object of {name: {options}}"
    for row in raw.get("rows", []):
        if not (isinstance(row, dict) and {"label", "depth", "arm"} <= set(row) and row["arm"] in arms
                and _depth_ok(row["depth"]) and row["depth"] in raw["depths"]):
            return f"rows: {row!r} needs a label, one of depths and one of arms"
    labels = [row["label"] for row in raw.get("rows", [])]
    for pair in raw.get("compare", []):
        if not (isinstance(pair, list) and len(pair) == 2 and set(pair) <= set(labels)):
            return f"compare: {pair!r} must be two of the rows' labels"
    return None


def _arms_problem(raw: dict) -> str | None:
    """An arms study's own keys: tuning_split, lr_grid (tuning seeds apart from the reporting seeds), points."""
    split, grid, points = raw.get("tuning_split"), raw.get("lr_grid"), raw.get("points")
    if not (isinstance(split, dict) and set(split) == {"share", "seed"} and isinstance(split["share"], float)
            and 0 < split["share"] <= 0.5 and isinstance(split["seed"], int)):
        return 'tuning_split must be {"share": a fraction in (0, 0.5], "seed": an integer}'
    if not (isinstance(grid, dict) and {"lrs", "tuning_seeds"} <= set(grid) <= {"lrs", "tuning_seeds", "max_extensions"}
            and _rates_ok(grid["lrs"]) and _list_of(grid["tuning_seeds"], int) and grid["tuning_seeds"]
            and not set(grid["tuning_seeds"]) & set(raw["seeds"])
            and isinstance(grid.get("max_extensions", 0), int) and grid.get("max_extensions", 0) >= 0):
        return ('lr_grid must be {"lrs": [rates > 0, of 6 significant digits at most], "tuning_seeds": [seeds apart '
                'from the reporting seeds], "max_extensions": N >= 0 (optional)}')
    bad_seed = next((e for e in [*(seed_error(s, "lr_grid.tuning_seeds") for s in grid["tuning_seeds"]),
                                 seed_error(split["seed"], "tuning_split.seed")] if e), None)
    if bad_seed:
        return bad_seed
    arms = raw.get("arms", {"": {}})
    if not (isinstance(points, list) and points):
        return "points must be a list of {label, depth, arm[, lrs | lr_of]}"
    labels = [p.get("label") for p in points if isinstance(p, dict)]
    for p in points:
        if not (isinstance(p, dict) and {"label", "depth", "arm"} <= set(p) <= POINT_KEYS
                and p.get("size", raw["sizes"][0]) in raw["sizes"] and p.get("vs", labels[0]) in labels
                and isinstance(p["label"], str) and labels.count(p["label"]) == 1 and _depth_ok(p["depth"])
                and p["arm"] in arms and ("lrs" not in p or _rates_ok(p["lrs"]))
                and len({"lrs", *BORROWS} & set(p)) <= 1 and all(p[k] in labels for k in BORROWS if k in p)
                and isinstance(p.get("published", ""), str)):
            return (f"points: {p!r} needs a unique label, a depth, one of the arms, at most one of lrs "
                    f"(rates > 0, of 6 significant digits at most), lr_of or runner_up_of (another point's label), "
                    f"and a size among sizes, a vs among "
                    f"the labels and a published (text: the paper's figure the report quotes), if any")
    chained = [p["label"] for p in points if borrows(p) and borrows(points[labels.index(borrows(p))])]
    if chained:
        return (f"points: {chained[0]!r} takes its rate from a point that takes its own from another "
                f"({' or '.join(BORROWS)}): name the point that tunes")
    for pair in raw.get("compare", []):
        if not (isinstance(pair, list) and len(pair) == 3 and _list_of(pair, str) and pair[0] != pair[1]
                and set(pair[:2]) <= set(labels)):
            return f"compare: {pair!r} must be [a point's label, another point's label, the question it asks]"
    return None


def _rates_ok(lrs) -> bool:
    """Rates > 0, each as its run's name writes it (6 significant digits: a run trains at its name's rate)."""
    return (_list_of(lrs, (int, float)) and bool(lrs) and all(0 < x < math.inf for x in lrs)  # JSON has Infinity
            and all(split_run_arm(lr_name(x))[1] == x for x in lrs))


def options_problem(options: dict) -> str | None:
    """Training options a recipe may set: TrainConfig's fields but the per-run ones, each valid."""
    return config_options_problem(options, PER_RUN, "set per run by the study, not by a recipe")


def _list_of(value, kind) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)


def _depth_ok(d) -> bool:
    return d == "none" or freeze_error(d) is None
