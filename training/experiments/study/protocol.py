"""The clean protocol of an "arms" study: every point (a depth with an arm's options: full fine-tuning,
a frozen depth, LoRA, BitFit, ...) gets its learning rate chosen on tuning seeds by the score on a
tuning split held out of the training files; the reporting seeds then train each point at its chosen
rate, and only their dev scores are reported. The dev sets choose nothing.

    "kind": "arms",
    "tuning_split": {"share": 0.1, "seed": 0},       held out of each training file, stratified
    "lr_grid": {"lrs": [1e-4, 3e-4, 1e-3], "tuning_seeds": [101], "max_extensions": 2},
    "points": [{"label": "full", "depth": "none", "arm": "", "lrs": [3e-5, 1e-4, 3e-4]},
               {"label": "full at heads-only's rate", "depth": "none", "arm": "", "lr_of": "heads only"},
               {"label": "1000 per task, full", "depth": "none", "arm": "e12", "size": 1000}, ...]

A point's "size" (one of the recipe's sizes; default its first) trains on that many examples per task; a
size study gives smaller sizes more epochs through their arm, so that every size gets the same updates.
A point's "vs" names the point it is reported against (default: the first, full fine-tuning); its
"published" quotes what its paper reported, which the report sets beside the point's own result.

A point's grid is its "lrs" (else lr_grid's). When the best rate of a point sits on the edge of the rates
tried, the next rate beyond it on the 1-3-10 ladder is tried too (at most max_extensions times each
way), so that no chosen rate is an edge of its grid unless the ladder ran out. A point with "lr_of"
is not tuned: it trains at another point's chosen rate (a confound arm: the rate without the freezing).
A point with "runner_up_of" is not tuned either: it trains at the rate another point's tuning ranked
second (a choice by a margin smaller than the seeds' noise is a coin toss; its twin at the other rate
says whether the toss decided the point's result).
Run keys name the rate in their arm ("lora4-lr0.001"), so every tuning run is a run of its own.
"""
from __future__ import annotations

import math

from training.experiments.sweep.records import RunKey

SEED_ROLES = ("tuning", "reporting")
BORROWS = ("lr_of", "runner_up_of")  # the point keys that take a rate from another point's tuning


def borrows(point: dict) -> str | None:
    """The label of the point whose tuning gives this one its rate (lr_of, runner_up_of), else None."""
    return next((point[k] for k in BORROWS if k in point), None)


def lr_name(lr: float) -> str:
    return f"lr{lr:g}"


def run_arm(arm: str, lr: float) -> str:
    """The arm of a run key: the point's arm and its rate, "lr0.0001" or "lora4-lr0.0001"."""
    return f"{arm}-{lr_name(lr)}" if arm else lr_name(lr)


def split_run_arm(name: str) -> tuple[str, float]:
    """run_arm's inverse: ("lora4", 0.001) of "lora4-lr0.001"."""
    arm, _, lr = name.rpartition("lr")
    return arm.rstrip("-"), float(lr)


def ladder(lr: float, up: bool) -> float:
    """The next rate on the 1-3-10 ladder (1e-4, 3e-4, 1e-3, ...), up or down; a rate off the ladder
    moves by sqrt(10)."""
    exponent = math.floor(math.log10(lr) + 1e-9)
    mantissa = lr / 10 ** exponent
    if math.isclose(mantissa, 1, rel_tol=1e-6):
        factor = 3 if up else 1 / (10 / 3)
    elif math.isclose(mantissa, 3, rel_tol=1e-6):
        factor = 10 / 3 if up else 1 / 3
    else:
        factor = math.sqrt(10) if up else 1 / math.sqrt(10)
    return float(f"{lr * factor:.3g}")


def tune_score(record: dict) -> float:
    """What chooses a rate: the tuning split's overall score of the run's kept evaluation."""
    return record["tune"]["overall"]


class Protocol:
    """The runs of an arms study, given its results so far. recipe: a resolved training.experiments.study Recipe."""

    def __init__(self, recipe, records: list[dict]):
        self.recipe, self.tasks = recipe, "+".join(recipe.tasks)
        self.size = recipe.sizes[0]
        self.grid = recipe.lr_grid
        self.runs = {RunKey.of(r): r for r in records}
        self.points = {p["label"]: p for p in recipe.points}

    def key(self, point: dict, seed: int, lr: float) -> RunKey:
        return RunKey(self.tasks, self.recipe.depth(point["depth"]), point.get("size", self.size), seed,
                      run_arm(point["arm"], lr))

    def tried(self, point: dict) -> tuple[list[float], float | None]:
        """(the rates the point's tuning needs so far, its chosen rate or None while runs are missing)."""
        lrs = sorted(point.get("lrs") or self.grid["lrs"])
        limit = self.grid.get("max_extensions", 2)
        up = down = 0
        while True:
            scores = self.scores(point, lrs)
            if scores is None:
                return lrs, None
            best = max(lrs, key=lambda lr: (scores[lr], -lr))  # a tie: the smaller rate
            if best == lrs[-1] and up < limit:
                lrs, up = lrs + [ladder(best, True)], up + 1
            elif best == lrs[0] and down < limit:
                lrs, down = [ladder(best, False)] + lrs, down + 1
            else:
                return lrs, best

    def score(self, point: dict, lr: float) -> float | None:
        """The point's mean tuning-split score at a rate over the tuning seeds; None while a run is missing."""
        runs = [self.runs.get(self.key(point, s, lr)) for s in self.grid["tuning_seeds"]]
        if any(r is None for r in runs):
            return None
        return sum(tune_score(r) for r in runs) / len(runs)

    def scores(self, point: dict, lrs: list[float]) -> dict[float, float] | None:
        """lr -> the mean tuning-split score over the tuning seeds; None while a run is missing."""
        out = {lr: self.score(point, lr) for lr in lrs}
        return None if None in out.values() else out

    def chosen(self, label: str) -> float | None:
        """The point's rate for the reporting seeds: its own tuning's choice, its lr_of point's, or the rate
        its runner_up_of point's tuning ranked second."""
        point = self.points[label]
        if "lr_of" in point:
            return self.chosen(point["lr_of"])
        if "runner_up_of" in point:
            ranked = self.ranked(self.points[point["runner_up_of"]])
            return ranked[1] if len(ranked) > 1 else None
        return self.tried(point)[1]

    def ranked(self, point: dict) -> list[float]:
        """A tuned point's rates tried, best first on the tuning split (a tie: the smaller rate first, as the
        choice breaks it); [] while its tuning is incomplete."""
        lrs, best = self.tried(point)
        if best is None:
            return []
        scores = self.scores(point, lrs)
        return sorted(lrs, key=lambda lr: (-scores[lr], lr))

    def plan(self) -> list[RunKey]:
        """Point by point, in the recipe's order: its tuning runs, then (once its rate is chosen) its
        reporting runs. A study stopped early holds whole points, the first ones complete; a second
        worker goes on to the next point's tuning while the first point's last tuning run trains."""
        keys = []
        for point in self.recipe.points:
            if not borrows(point):
                keys += [self.key(point, s, lr) for s in self.grid["tuning_seeds"] for lr in self.tried(point)[0]]
            lr = self.chosen(point["label"])
            if lr is not None:
                keys += [self.key(point, s, lr) for s in self.recipe.seeds]
        return list(dict.fromkeys(keys))

    def reporting(self, label: str) -> dict[int, dict]:
        """seed -> the record of the point's reporting run at its chosen rate (the seeds that have one)."""
        lr = self.chosen(label)
        if lr is None:
            return {}
        point = self.points[label]
        return {s: self.runs[k] for s in self.recipe.seeds for k in [self.key(point, s, lr)] if k in self.runs}

    def same_runs(self, label: str, other: str) -> bool:
        """Whether point `label`, another than `other`, reports the very runs of `other` (a rate borrowed with
        lr_of that is the other's own: the two are one point, with nothing to compare)."""
        if label == other:
            return False
        runs, theirs = self.reporting(label), self.reporting(other)
        seeds = [s for s in runs if s in theirs]
        return bool(seeds) and all(runs[s] is theirs[s] for s in seeds)


def role_of(recipe, key: RunKey) -> str:
    """A run's seed role: "tuning" (chooses rates; never reported) or "reporting"."""
    return "tuning" if key.seed in recipe.lr_grid["tuning_seeds"] else "reporting"


class ArmOverrides:
    """The arms of a protocol study as training.experiments.sweep.engine.work reads them (.get(arm, default)):
    computed from the run's arm name, since edge extensions add rates while the study runs."""

    def __init__(self, recipe):
        self.recipe = recipe

    def get(self, name: str, default=None) -> dict:
        arm, lr = split_run_arm(name)
        return {**self.recipe.arms.get(arm, {}), "lr": lr}


def foreign_run(recipe, records: list[dict]) -> str | None:
    """Why the first record that this arms recipe would take for one of its runs (its tasks, and a point's
    depth, size and arm, at any seed and rate) is another recipe's, else None: a run key does not name the
    tuning split nor an arm's options, so two recipes given one --out would take each other's runs. A
    record of another split (or of none: a sweep's, whose kept epoch the dev sets chose) or of other arm
    options is such a run."""
    tasks, arms = "+".join(recipe.tasks), ArmOverrides(recipe)
    points = {(recipe.depth(p["depth"]), p.get("size", recipe.sizes[0]), p["arm"]) for p in recipe.points}
    split = (recipe.tuning_split["share"], recipe.tuning_split["seed"])
    for r in records:
        key = RunKey.of(r)
        try:
            arm, _ = split_run_arm(key.arm)
        except ValueError:  # no rate in its arm: not a key this recipe makes
            continue
        if key.tasks != tasks or (key.depth, key.size, arm) not in points:
            continue
        theirs = r.get("split", {"share": split[0], "seed": split[1]})  # a tuned record names its split
        if "tune" not in r or (theirs.get("share"), theirs.get("seed")) != split:
            held = (f"a tuning split of share {theirs.get('share')}, seed {theirs.get('seed')}" if "tune" in r
                    else "no tuning split (its kept epoch chosen on the dev sets)")
            return (f"run {key.name} was recorded with {held}, where this recipe holds out share {split[0]}, "
                    f"seed {split[1]}")
        if "overrides" in r and r["overrides"] != arms.get(key.arm):
            return (f"run {key.name} was trained with {r['overrides']}, where this recipe's arm {arm!r} at its "
                    f"rate is {arms.get(key.arm)}")
    return None
