"""What each point of an arms study costs end to end, modelled from the cost measured apart.

The study's runs share the machine (two workers, pauses while tests run), so their seconds are not cost
figures; what is theirs is how many steps each trained, at which frozen depth, and when it reached a
score. The cost benchmark (bench/study_cost.py --json, kept as cost/*.json beside the results) measured
each point's seconds per epoch and its cache's building on an otherwise idle machine, full fine-tuning
among them. Together, in units of one epoch of full fine-tuning of the same measurement (so that the
scale of the benchmark's data drops out: an epoch and the cache's building both grow with the examples):

    a run's cost          = (cache building + epochs it trained x the point's seconds per epoch) / full's
    its cost to a share   = the same, up to its first evaluation at or above that share of full
                            fine-tuning's mean kept tuning-split score (its reporting seeds)

The cache's building passes over the training examples and the evaluation set's (the tuning split), an epoch
over the training examples alone, and a run's tuning split does not grow with its training files: the
building is scaled apart by the examples it passes over in the run and in the measurement (each example
taken to cost the same), where both say their evaluation examples (the measurement's n_eval, the run's
split), so that at the whole files it is a smaller share of an epoch than in a 1000-example measurement.

A run whose freezing schedule moved the frozen depth (its record's depth_changes) costs each stretch of
steps, from the schedule's start (the heads alone for lp-ft and gradual), at that depth's seconds per
epoch (the plain point measured at that depth), plus the building of each deeper prefix it reached (as the
fixed depth builds it: an upper bound, the schedule's cache may be deepened from the last); a stretch the
trainer did not cache (under --frozen-cache auto, one too short to repay its cache) at that depth's figures
with the cache off, nothing built. A point the benchmark did not measure takes the figures of a measured
point whose epochs cost the same (the same depth and arm options, the rate, the epochs and early stopping
aside); else it has none. Evaluations are left out (the same tuning split for every point).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from training.config.freeze_spec import parse_schedule
from training.config.train_config import TrainConfig
from training.experiments.study.protocol import Protocol, borrows, tune_score
from training.experiments.sweep.records import RunKey
from training.methods.freezing import depth_rank, start_depth

COST = Path("cost")
SHARES = (0.95, 0.99)
COST_FREE = ("lr", "epochs", "early_stop_patience")  # options that do not change what an epoch costs


def read_cost(results: Path) -> list[dict]:
    """The benchmark's measurements kept beside the study's results (cost/*.json, in name order)."""
    return [json.loads(p.read_text()) for p in sorted((Path(results) / COST).glob("*.json"))]


def epoch_kind(depth, options: dict) -> list:
    """What an epoch costs depends on: the frozen depth and the training options but the COST_FREE ones
    ([depth, [[option, value as text], ...]], as a measurement's JSON keeps it)."""
    return [depth, sorted([k, str(v)] for k, v in options.items() if k not in COST_FREE + ("freeze_upto",))]


def _point_kind(recipe, point: dict) -> list:
    return epoch_kind(recipe.depth(point["depth"]), recipe.arms.get(point["arm"], {}))


def measured(recipe, measurement: dict, point: dict) -> dict | None:
    """A point's figures in one measurement: its own, else those of a measured point whose epochs cost the
    same (the same depth and options, but for the rate, the epochs and early stopping), found by the kind
    the measurement recorded for it or, for a point of this recipe, by that point's."""
    if point["label"] in measurement["points"]:
        return measurement["points"][point["label"]]
    return _of_kind(recipe, measurement, _point_kind(recipe, point))


def _of_kind(recipe, measurement: dict, kind: list) -> dict | None:
    points = {p["label"]: p for p in recipe.points}
    for label, got in measurement["points"].items():
        if got.get("kind", _point_kind(recipe, points[label]) if label in points else None) == kind:
            return got
    return None


def bound_for_schedule(recipe, measurement: dict, point: dict) -> dict | None:
    """For a freezing schedule's point, whose epochs no measurement can name: the figures of training every
    layer with its other options, which no stretch of a schedule costs more than (a planning bound)."""
    options = dict(recipe.arms.get(point["arm"], {}))
    if options.pop("unfreeze_schedule", None) is None:
        return None
    options.pop("frozen_cache", None)  # nothing frozen, nothing cached
    return _of_kind(recipe, measurement, epoch_kind(None, options))


def at_depth(recipe, measurement: dict, depth, cache: bool = True) -> dict | None:
    """The figures of the plain point (no arm) that freezes `depth` layers, in one measurement (-1 and 0
    both freeze the embeddings alone: a schedule's records may say either); cache=False: its run with the
    cache off (the benchmark's "(cache off)" twin, no building), where the depth has one."""
    for p in recipe.points:
        if p["arm"] == "" and depth_rank(recipe.depth(p["depth"])) == depth_rank(depth) and not borrows(p):
            got = measured(recipe, measurement, p)
            if got is not None:
                return got if cache else measurement["points"].get(f"{p['label']} (cache off)", got)
    return None


def stretches(recipe, measurement: dict, point: dict, record: dict) -> list[tuple[int, dict]] | None:
    """[(first step, figures)]: the figures each stretch of the run's steps is costed at; None if one is
    missing from the measurement."""
    if not record.get("depth_changes"):
        figures = measured(recipe, measurement, point)
        return None if figures is None else [(0, figures)]
    moves = [(0, first_depth(recipe, point))] + [(step, depth) for step, depth in record["depth_changes"]]
    ends = [step for step, _ in moves[1:]] + [None]  # the last stretch runs to the end, as a fixed depth would
    out = [(step, at_depth(recipe, measurement, depth, cached(recipe, point, record, end and end - step)))
           for (step, depth), end in zip(moves, ends)]
    return None if any(f is None for _, f in out) else out


def cached(recipe, point: dict, record: dict, steps: int | None) -> bool:
    """Whether the trainer cached a stretch of `steps` updates of a scheduled run (CacheKeeper.worth_caching):
    always, but under --frozen-cache auto, where only a stretch whose steps visit at least as many training
    examples as the cache holds (gradual unfreezing's thirds of an epoch are not: they run the frozen prefix
    on each batch, and build nothing)."""
    if steps is None or recipe.options(point).get("frozen_cache") != "auto":
        return True
    settings, n_train = record.get("settings", {}), record.get("n_train")
    if not n_train:  # a record that does not say how many examples the cache would hold
        return True
    batch = settings.get("batch_size", TrainConfig.batch_size) * settings.get("grad_accum_steps", 1)
    return batch * steps >= sum(n_train.values())


def first_depth(recipe, point: dict) -> int | None:
    """The depth a point's runs start at: a schedule's start (lp-ft and gradual begin with the heads alone,
    which the runs' depth_changes do not record), else the point's own."""
    depth = recipe.depth(point["depth"])
    schedule = recipe.arms.get(point["arm"], {}).get("unfreeze_schedule")
    return depth if schedule is None else start_depth(parse_schedule(schedule), depth, recipe.layers)


def cache_scale(measurement: dict, record: dict) -> float:
    """run_cost's factor on the measured building: the examples the cache holds (training and evaluation) per
    training example, in the run over in the measurement (an epoch grows with the training examples, the
    building with both). 1 (the building grows as an epoch does) where either does not say its evaluation
    examples."""
    n_eval, n_train = (record.get("split") or {}).get("n_tune"), record.get("n_train")
    if not n_eval or not n_train or not measurement.get("n_eval") or not measurement.get("examples_per_task"):
        return 1.0
    run_train, bench_train = sum(n_train.values()), measurement["examples_per_task"] * len(n_train)
    run = (run_train + sum(n_eval.values())) / run_train
    return run / ((bench_train + sum(measurement["n_eval"].values())) / bench_train)


def run_cost(record: dict, stretch: list[tuple[int, dict]], full: dict, target: float | None = None,
             cache_factor: float = 1.0) -> float | None:
    """A run's end-to-end cost in full fine-tuning epochs; with target, its cost up to the first evaluation
    whose tuning-split overall reaches it (None if none does). An evaluation follows each epoch. cache_factor:
    the cache's building in the run over the measurement's, an epoch's being 1 (cache_scale())."""
    curve = record["tune_curve"]
    reached = [step for step, _, score in curve if target is None or score >= target]
    if not reached:
        return None
    end, per_epoch = (curve[-1][0] if target is None else reached[0]), curve[0][0]
    seconds = cache_factor * sum(figures["cache_s"] for start, figures in stretch if start < end)
    for (start, figures), nxt in zip(stretch, [s for s, _ in stretch[1:]] + [end]):
        seconds += max(0, min(nxt, end) - start) / per_epoch * figures["s_per_epoch"][0]
    return seconds / full["s_per_epoch"][0]


def cost_rows(recipe, records: list[dict], measurements: list[dict], reference: str) -> list[dict]:
    """Per point with reporting runs that a measurement (holding the reference) covers: its per-epoch
    speed-up (fixed depths), epochs trained, end-to-end cost (mean, min, max over the reporting seeds) and
    speed-up against the reference's mean cost, and for each share its median cost to reach it over the
    seeds that did (and how many did)."""
    protocol, points = Protocol(recipe, records), {p["label"]: p for p in recipe.points}
    reference_runs = list(protocol.reporting(reference).values())
    usable = [m for m in measurements if measured(recipe, m, points[reference]) is not None]
    if not usable or not reference_runs:
        return []
    base = statistics.mean(tune_score(r) for r in reference_runs)
    full = measured(recipe, usable[0], points[reference])
    reference_cost = statistics.mean(run_cost(r, [(0, full)], full) for r in reference_runs)
    rows = []
    for point in recipe.points:
        runs = list(protocol.reporting(point["label"]).values())
        if protocol.same_runs(point["label"], reference):
            continue  # the reference's own runs
        for m in usable if runs else []:
            plans = [stretches(recipe, m, point, r) for r in runs]
            if all(plans):
                scales = [cache_scale(m, r) for r in runs]
                rows.append(_row(point["label"], runs, plans, scales, measured(recipe, m, points[reference]), base))
                rows[-1]["speedup"] = reference_cost / rows[-1]["cost"]
                break
    return rows


def _row(label: str, runs: list[dict], plans: list, scales: list[float], full: dict, base: float) -> dict:
    costs = [run_cost(r, plan, full, cache_factor=k) for r, plan, k in zip(runs, plans, scales)]
    fixed = all(len(plan) == 1 for plan in plans)
    row = {"label": label, "epochs": statistics.mean(r["epochs_run"] for r in runs), "cost": statistics.mean(costs),
           "cost_range": (min(costs), max(costs)), "seeds": len(runs),
           "epoch_speedup": full["s_per_epoch"][0] / plans[0][0][1]["s_per_epoch"][0] if fixed else None, "to": {}}
    for share in SHARES:
        got = [c for c in (run_cost(r, plan, full, share * base, k) for r, plan, k in zip(runs, plans, scales))
               if c is not None]
        row["to"][share] = (statistics.median(got) if got else None, len(got))
    return row


def _scale(measurement: dict, examples: int, tasks: int) -> float:
    """From the measurement's data to `examples` training examples of `tasks` tasks: an epoch's steps (and
    the cache's building) grow with the examples."""
    return examples / (measurement["examples_per_task"] * tasks)


def scale_line(recipe, measurements: list[dict], reference: str, n_train: dict[str, int]) -> str:
    """What one epoch of the reference costs in seconds on n_train examples ({task: n}), on the first
    measurement's machine that holds it and says its scale: its measured epoch scaled by the examples (an
    epoch's steps grow with them); "" where none does."""
    point = next(p for p in recipe.points if p["label"] == reference)
    for m in measurements:
        full = measured(recipe, m, point)
        if full is not None and m.get("examples_per_task"):
            seconds = full["s_per_epoch"][0] * _scale(m, sum(n_train.values()), len(n_train))
            return (f" One epoch of {reference} on these training files ({sum(n_train.values())} examples) is about "
                    f"{seconds:.0f} s there: the measured {full['s_per_epoch'][0]:g} s on {m['examples_per_task']} "
                    "examples per task, scaled by the examples.")
    return ""


def measured_where(measurements: list[dict]) -> str:
    """Where and when the cost was measured, each machine once: what the modelled hours are hours of."""
    return "; ".join(dict.fromkeys(f"{m.get('machine', '?')}, {m.get('date', '?')}, {m.get('threads')} thread(s)"
                                   for m in measurements))


def cost_lines(rows: list[dict], measurements: list[dict], reference: str, scale: str = "",
               quality: dict[str, dict] | None = None, link: str = f"{COST}/") -> list[str]:
    """The cost table; quality ({label: its paired test against the reference, overall}) adds the dev
    overall difference beside each cost, so that a speed-up is read with what it gives up; link: the
    measurements' folder as the report's page reaches it."""
    shares = " | ".join(f"to {s:.0%} of {reference}" for s in SHARES)
    where = measured_where(measurements)
    lines = [f"Modelled from the cost measured apart ({where}; [cost/]({link})): in epochs of {reference}, the "
             f"cache's building included; a freezing schedule's steps costed at the depth they ran at; to a share: "
             f"up to the first evaluation at that share of {reference}'s mean kept tuning-split score (median over "
             f"the seeds that reached it, and how many did).{scale}", "",
             f"| point | per-epoch speed-up | epochs trained (mean) | end-to-end cost [min, max] | end-to-end "
             f"speed-up | {shares} | dev overall against {reference} [95% t CI] (Holm p) |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(SHARES) + "---:|"]
    for r in rows:
        reach = " | ".join("not reached" if c is None else f"{c:.2f} ({n}/{r['seeds']})"
                           for c, n in (r["to"][s] for s in SHARES))
        lo, hi = r["cost_range"]
        per_epoch = "(scheduled)" if r["epoch_speedup"] is None else f"{r['epoch_speedup']:.2f}x"
        t = (quality or {}).get(r["label"])
        diff = (f"{t['diff']:+.4f} [{t['ci'][0]:+.4f}, {t['ci'][1]:+.4f}] ({t['t_p_holm']:.2g})" if t else "-")
        lines.append(f"| {r['label']} | {per_epoch} | {r['epochs']:.1f} | {r['cost']:.2f} [{lo:.2f}, {hi:.2f}] | "
                     f"{r['speedup']:.2f}x | {reach} | {diff} |")
    return lines


def remaining_work(recipe, records: list[dict], measurements: list[dict], files_examples: int | None = None
                   ) -> list[dict]:
    """Per point with work left: its runs planned and not done, its reporting runs still waiting for its
    rate, and what they should cost in seconds of one idle core of the first measurement that says its
    scale (None where nothing measured the point's epochs): each run the point's mean epochs so far (else
    its most) at its measured seconds per epoch, plus its cache's building, scaled to the training files;
    a freezing schedule at full fine-tuning's figures, a bound ("at_most"). A planning figure, not a result:
    a rate grid's extensions are not foreseen. files_examples: the whole files' training examples, for
    their points before any of their runs says it."""
    protocol, done = Protocol(recipe, records), {RunKey.of(r) for r in records}
    owner = _owners(recipe, protocol)
    planned = [k for k in protocol.plan() if k not in done]
    out = []
    for point in recipe.points:
        todo = sum(owner.get(k) == point["label"] for k in planned)
        n_train = _examples(recipe, records, point, files_examples)
        waiting = 0 if protocol.chosen(point["label"]) is not None else len(recipe.seeds)
        if not todo and not waiting:
            continue
        found = [(m, f) for m in measurements if m.get("examples_per_task") for f in [measured(recipe, m, point)] if f]
        bound = not found
        if bound:
            found = [(m, f) for m in measurements if m.get("examples_per_task")
                     for f in [bound_for_schedule(recipe, m, point)] if f]
        seconds = None
        if found and n_train:
            (m, figures), runs = found[0], [r for k, r in protocol.runs.items() if owner.get(k) == point["label"]]
            epochs = (statistics.mean(r["epochs_run"] for r in runs) if runs
                      else recipe.options(point).get("epochs", 1))
            sample = _a_run_of_size(recipe, records, point)
            building = figures["cache_s"] * (cache_scale(m, sample) if sample else 1.0)
            seconds = ((todo + waiting) * (building + epochs * figures["s_per_epoch"][0])
                       * _scale(m, n_train, len(recipe.tasks)))
        out.append({"label": point["label"], "todo": todo, "waiting": waiting, "seconds": seconds,
                    "at_most": bound and seconds is not None})
    return out


def _examples(recipe, records: list[dict], point: dict, files_examples: int | None = None) -> int | None:
    """How many training examples a run of the point trains on: a finished run of its size says it, else a
    size in examples per task; for the whole files before any of their runs, files_examples (None: unknown)."""
    size = point.get("size", recipe.sizes[0])
    done = _a_run_of_size(recipe, records, point)
    if done:
        return sum(done["n_train"].values())
    return files_examples if size == "all" else size * len(recipe.tasks)


def _a_run_of_size(recipe, records: list[dict], point: dict) -> dict | None:
    """A finished run of the point's size that says its training examples (its tuning split with them)."""
    size = point.get("size", recipe.sizes[0])
    return next((r for r in records if r.get("n_train") and r["size"] == size), None)


def _owners(recipe, protocol) -> dict:
    """run key -> the label of the first point whose run it is: a point's tuning runs at the rates it tries and
    its reporting runs at the rate it trains (its choice, or the rate it takes from another point's tuning; a
    run two points would train is trained once)."""
    owners = {}
    for point in recipe.points:
        tuning = [] if borrows(point) else protocol.tried(point)[0]
        chosen = protocol.chosen(point["label"])
        keys = [protocol.key(point, seed, lr) for seed in recipe.lr_grid["tuning_seeds"] for lr in tuning]
        keys += [protocol.key(point, seed, chosen) for seed in recipe.seeds if chosen is not None]
        for key in keys:
            owners.setdefault(key, point["label"])
    return owners
