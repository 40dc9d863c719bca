"""What an arms study (training/experiments/study/protocol.py) reports, from its records: each point's dev scores on
the reporting seeds with a 95% interval, its quality as Lee et al.'s ratio and normalised between the
trivial predictor and full fine-tuning, its spread over seeds, and each point against full fine-tuning
(paired by seed, and by a bootstrap over dev examples) with Holm's correction over the points. Tuning
runs never enter: they chose the rates. Plain functions of records, each checked by hand in the tests.
"""
from __future__ import annotations

import gzip
import json
import logging
import math
from pathlib import Path

import numpy as np
from scipy import stats as sps

from training.experiments.study.arms_cost import epoch_kind
from training.experiments.study.protocol import Protocol, borrows
from training.inference.metrics import METRIC, score
from training.results.statistics import bootstrap_diffs, constant, interval, mean_sd, overall_diffs, paired_tests

log = logging.getLogger(__name__)

LEVEL = 0.95
METRICS = ("sst_acc", "para_acc", "sts_pearson", "overall")


# --------------------------------------------------------------------------- statistics


def t_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """The mean's t interval over seeds: mean -+ t(n-1) * sd / sqrt(n); nan with fewer than two."""
    xs = np.asarray(values, dtype=np.float64)
    if len(xs) < 2:
        return math.nan, math.nan
    half = sps.t.ppf((1 + level) / 2, len(xs) - 1) * xs.std(ddof=1) / math.sqrt(len(xs))
    return float(xs.mean() - half), float(xs.mean() + half)


def sd_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """The sample sd's chi-square interval: sd * sqrt((n-1) / chi2 quantiles), for normal scores."""
    xs = np.asarray(values, dtype=np.float64)
    n = len(xs)
    if n < 2:
        return math.nan, math.nan
    sd = xs.std(ddof=1)
    lo = sd * math.sqrt((n - 1) / sps.chi2.ppf((1 + level) / 2, n - 1))
    hi = sd * math.sqrt((n - 1) / sps.chi2.ppf((1 - level) / 2, n - 1))
    return float(lo), float(hi)


def spread_ratio(a, b, level: float = LEVEL) -> dict:
    """Does B's spread over seeds differ from A's, the runs paired by seed? The Pitman-Morgan test: with
    s = a + b and d = b - a, cov(s, d) = var(b) - var(a), so the variances are equal exactly when s and d
    are uncorrelated, which Pearson's t test with n - 2 degrees of freedom asks (pairing matters: two arms
    trained from one seed share its data order and head initialisation). Its interval for the variance
    ratio lambda = var(b) / var(a) holds the lambdas for which b / sqrt(lambda) passes the same test:
    F * (K -+ sqrt(K^2 - 1)), F the sample ratio, K = 1 + 2 (1 - r^2) t^2 / (n - 2), r = corr(a, b).
    Returns the sd ratio sd(b) / sd(a) with that interval's square roots, and the test's two-sided p."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = len(a)
    out = {"ratio": math.nan, "ratio_ci": (math.nan, math.nan), "p": math.nan}
    if n < 3 or constant(a) or constant(b):  # no degrees of freedom left, or nothing to divide
        return out
    f = b.var(ddof=1) / a.var(ddof=1)
    if constant(b - a):  # b is a shifted by a constant: the same spread, and no test to run
        return out | {"ratio": math.sqrt(f)}
    r_ab = float(np.corrcoef(a, b)[0, 1])
    r = float(np.corrcoef(a + b, b - a)[0, 1])
    t = r * math.sqrt((n - 2) / max(1 - r * r, np.finfo(float).tiny))
    t_crit = sps.t.ppf((1 + level) / 2, n - 2)
    k = 1 + 2 * (1 - r_ab * r_ab) * t_crit ** 2 / (n - 2)
    root = math.sqrt(k * k - 1)
    return {"ratio": math.sqrt(f), "ratio_ci": (math.sqrt(f * (k - root)), math.sqrt(f * (k + root))),
            "p": float(2 * sps.t.sf(abs(t), n - 2))}


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (nan stays nan, and is not counted)."""
    real = [(p, i) for i, p in enumerate(pvalues) if not math.isnan(p)]
    m, out, running = len(real), [math.nan] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(sorted(real)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def bootstrap_p(diffs: np.ndarray) -> float:
    """Two-sided bootstrap p of a difference: twice the smaller share of resamples on either side of 0."""
    diffs = np.asarray(diffs)
    return float(min(1.0, 2 * min(np.mean(diffs <= 0), np.mean(diffs >= 0))))


def normalised(score: float, trivial: float, full: float) -> float:
    """Where a score sits between the trivial predictor (0) and full fine-tuning (1)."""
    return (score - trivial) / (full - trivial) if full != trivial else math.nan


# --------------------------------------------------------------------------- per point


def point_rows(recipe, records: list[dict], baselines: dict | None, reference: str | None = None) -> list[dict]:
    """One row per (point, metric) with reporting runs: per-seed values, mean, t interval, sd and its
    interval, the mean of the per-seed ratios to the reference (full fine-tuning) of the same seed (Lee
    et al.), and the mean normalised quality."""
    protocol = Protocol(recipe, records)
    reference = reference or recipe.points[0]["label"]
    trivial = (baselines or {}).get("trivial", {})
    rows = []
    for point in recipe.points:
        runs = protocol.reporting(point["label"])
        full = protocol.reporting(point.get("vs", reference))  # what the point is measured against
        if not runs or protocol.same_runs(point["label"], reference):
            continue  # no runs yet, or the reference's own (arms_report.one_point_lines says so)
        for metric in METRICS:
            values = {s: r["dev"][metric] for s, r in runs.items() if metric in r["dev"]}
            if not values:
                continue
            paired = [s for s in values if s in full]
            ratio = [values[s] / full[s]["dev"][metric] for s in paired if full[s]["dev"][metric]]
            norm = ([normalised(values[s], trivial[metric], full[s]["dev"][metric]) for s in paired]
                    if metric in trivial else [])
            mean, sd = mean_sd(list(values.values()))
            rows.append({"label": point["label"], "depth": recipe.depth(point["depth"]), "arm": point["arm"],
                         "lr": protocol.chosen(point["label"]), "metric": metric, "values": values, "mean": mean,
                         "ci": t_interval(list(values.values())), "sd": sd, "sd_ci": sd_interval(list(values.values())),
                         "lee": float(np.mean(ratio)) if ratio else math.nan,
                         "normalised": float(np.mean(norm)) if norm else math.nan,
                         "best_epochs": [r.get("best_epoch") for r in runs.values()],
                         "at_last": sum(map(_kept_last, runs.values())),
                         "trainable_params": next(iter(runs.values())).get("trainable_params"),
                         "total_params": next(iter(runs.values())).get("total_params")})
    return rows


def _kept_last(record: dict) -> bool:
    """The run kept its last evaluation: it may still have been learning when it stopped."""
    return record.get("best_epoch") is not None and record["best_epoch"] == record.get("epochs_run", 0) - 1


def twins_due(recipe, rows: list[dict]) -> list[str]:
    """The points the convergence rule gives a longer twin that the recipe lacks: most of their reporting
    runs kept their last evaluation (still learning when the epoch limit stopped them), and no point of the
    same depth and options (epochs and early stopping aside) trains for more epochs. Points that take
    another's rate (lr_of, runner_up_of) are confound arms at a fixed rate, outside the rule; so is every
    point of a recipe that trains a set budget (fixed_budget: its question is what the budget buys)."""
    return [label for label, verdict in twin_verdicts(recipe, rows) if verdict is True]


def twins_undecided(recipe, rows: list[dict]) -> list[str]:
    """The points the rule cannot judge yet: the reporting runs still missing could make most, or fewer
    than most, of the planned ones keep their last evaluation."""
    return [label for label, verdict in twin_verdicts(recipe, rows) if verdict is None]


def twin_verdicts(recipe, rows: list[dict]) -> list[tuple[str, bool | None]]:
    """(label, whether most of its planned reporting runs kept their last evaluation, or None while the
    missing runs could tip it) for each point the rule covers and the recipe gives no longer twin."""
    if recipe.fixed_budget:
        return []
    def epochs_and_kind(point: dict) -> tuple[int, list]:
        options = recipe.options(point)
        return options.get("epochs", 1), [epoch_kind(recipe.depth(point["depth"]), options), point.get("size")]

    shape, verdicts = {p["label"]: epochs_and_kind(p) for p in recipe.points}, []
    for row in (r for r in rows if r["metric"] == "overall"):
        if borrows(next(p for p in recipe.points if p["label"] == row["label"])):
            continue
        epochs, kind = shape[row["label"]]
        if any(k == kind and e > epochs for e, k in shape.values()):
            continue
        # against the planned seeds, not the runs in so far: one run of three that kept its last evaluation
        # is not yet "most"
        planned = max(len(row["best_epochs"]), len(recipe.seeds))
        missing = planned - len(row["best_epochs"])
        verdicts.append((row["label"], True if 2 * row["at_last"] > planned
                         else False if 2 * (row["at_last"] + missing) <= planned else None))
    return verdicts


# --------------------------------------------------------------------------- against full fine-tuning


def stored_predictions(results: Path, record: dict) -> bool:
    """Whether the run's dev predictions are at hand. A record copied without its file (a study's record
    carried elsewhere without dev-predictions/) has none there: the comparisons with that run go without
    the bootstrap over dev examples, and the report says which file is missing, rather than stop."""
    name = record.get("dev_predictions")
    if not name:
        return False
    path = Path(results) / name
    if path.is_file():
        return True
    if path not in _MISSING:
        _MISSING.add(path)
        log.warning("%s: missing; its run's comparisons go without the bootstrap over dev examples", path)
    return False


_MISSING: set[Path] = set()  # the missing prediction files already warned of


def read_predictions(results: Path, record: dict) -> dict[str, np.ndarray]:
    with gzip.open(Path(results) / record["dev_predictions"], "rt", encoding="utf-8") as f:
        return {task: np.asarray(p, dtype=np.float64) for task, p in json.load(f).items()}


def versus(recipe, records: list[dict], results: Path, dev_labels: dict[str, np.ndarray], reference: str | None = None,
           reps: int = 2000, seed: int = 0, pairs: list[tuple[str, str]] | None = None) -> list[dict]:
    """Each pair (point, against) per metric, by default every point against the reference (or the point
    its "vs" names): the paired difference over the seeds both have (mean, t interval, paired t p), the
    bootstrap over dev examples (each resample scores every run of both on the same examples; the
    difference of their means over seeds: its 95% interval and p), the ratio of their spreads over the
    seeds (`spread_ratio`), and Holm's adjustment of each p over the pairs (the pairs are one family, per
    metric and test)."""
    protocol = Protocol(recipe, records)
    reference = reference or recipe.points[0]["label"]
    if pairs is None:
        pairs = [(p["label"], p.get("vs", reference)) for p in recipe.points]
    out = []
    for label, against in pairs:
        ref_runs, runs = protocol.reporting(against), protocol.reporting(label)
        seeds = sorted(s for s in runs if s in ref_runs)
        if not seeds or label == against or protocol.same_runs(label, against):  # itself, or its very runs
            continue
        boot = _bootstrap(results, [ref_runs[s] for s in seeds], [runs[s] for s in seeds], dev_labels, reps, seed)
        for metric in METRICS:
            a = [ref_runs[s]["dev"][metric] for s in seeds]
            b = [runs[s]["dev"][metric] for s in seeds]
            diffs = [y - x for x, y in zip(a, b)]
            row = {"label": label, "vs": against, "metric": metric, "seeds": seeds, **paired_tests(a, b),
                   "ci": t_interval(diffs)}
            if metric in boot:
                row |= {"boot_ci": interval(boot[metric], LEVEL), "boot_p": bootstrap_p(boot[metric])}
            spread = spread_ratio(a, b)
            row |= {"sd_ratio": spread["ratio"], "sd_ratio_ci": spread["ratio_ci"], "spread_p": spread["p"]}
            out.append(row)
    return holm_per_metric(out, ("t_p", "boot_p", "spread_p"))


def holm_per_metric(rows: list[dict], tests: tuple[str, ...]) -> list[dict]:
    """rows with each test's p Holm-adjusted over the rows of the same metric (one family per metric and test),
    as `{test}_holm`; a row without a test's p counts as nan."""
    for metric in METRICS:
        mine = [r for r in rows if r["metric"] == metric]
        for test in tests:
            for r, p in zip(mine, holm([r.get(test, math.nan) for r in mine])):
                r[f"{test}_holm"] = p
    return rows


# --------------------------------------------------------------------------- the gap against size


def size_column(recipe, point: dict) -> tuple:
    """What makes points of different sizes the same point: what its epochs cost (arms_cost.epoch_kind: its
    depth and its arm's options but the epochs, early stopping and rate a size sets), so that heads-only with
    cross-encoding heads and with siamese ones are two columns of the size x depth map."""
    depth, options = epoch_kind(recipe.depth(point["depth"]), recipe.arms.get(point["arm"], {}))
    return depth, tuple(tuple(option) for option in options)


def welch(a, b, level: float = LEVEL) -> tuple[float, tuple[float, float], float]:
    """mean(a) - mean(b) of two independent samples: the difference, Welch's t interval and two-sided p."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    diff, se = float(a.mean() - b.mean()), math.sqrt(va + vb)
    if se == 0:
        return diff, (diff, diff), (math.nan if diff == 0 else 0.0)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(sps.t.ppf((1 + level) / 2, df)) * se
    return diff, (diff - half, diff + half), float(2 * sps.t.sf(abs(diff) / se, df))


def gap_pairs(recipe) -> list[tuple[dict, dict, dict, dict]]:
    """(point, its reference, the same column's point at a smaller size, that one's reference) for every point
    measured against a point of its own size (not full fine-tuning against the whole files'), the larger size
    the largest its column has (the whole files where they are in)."""
    by_label = {p["label"]: p for p in recipe.points}
    gapped = []
    for p in recipe.points:
        ref = by_label[p.get("vs", recipe.points[0]["label"])]
        if "size" in p and ref is not p and ref.get("size") == p["size"]:
            gapped.append((p, ref))
    order = sorted({p["size"] for p, _ in gapped}, key=lambda n: (n == "all", 0 if n == "all" else n))
    out = []
    for column in dict.fromkeys(size_column(recipe, p) for p, _ in gapped):
        mine = sorted((pr for pr in gapped if size_column(recipe, pr[0]) == column),
                      key=lambda pr: order.index(pr[0]["size"]))
        out += [(*mine[-1], *smaller) for smaller in mine[:-1]]
    return out


def gap_changes(recipe, records: list[dict], results: Path, dev_labels: dict[str, np.ndarray], reps: int = 2000,
                seed: int = 0) -> list[dict]:
    """Does a point's gap to its reference change with the training-set size? For each of gap_pairs, per
    metric: the gap at either size (the mean over the seeds of the point minus its reference, paired by seed),
    the larger size's gap minus the smaller's with Welch's t interval and p (the sizes' seeds draw different
    subsets: two independent samples of gaps), and the bootstrap over dev examples (every run of the four
    points scored on the same resampled examples); Holm over the comparisons, per metric and test."""
    protocol, out, booted = Protocol(recipe, records), [], {}

    def paired_runs(point: dict, ref: dict) -> tuple[list[dict], list[dict]]:
        mine, theirs = protocol.reporting(point["label"]), protocol.reporting(ref["label"])
        seeds = sorted(s for s in mine if s in theirs)
        return [theirs[s] for s in seeds], [mine[s] for s in seeds]

    def bootstrap_of(point: dict, ref: dict, runs) -> dict[str, np.ndarray]:
        """A gap's replicates, once per pair of points (the largest size's gap meets every smaller size);
        the same seed resamples the same examples, so two gaps' replicates pair up."""
        key = point["label"], ref["label"]
        if key not in booted:
            booted[key] = _bootstrap(results, *runs, dev_labels, reps, seed)
        return booted[key]

    for big, big_ref, small, small_ref in gap_pairs(recipe):
        runs = {"big": paired_runs(big, big_ref), "small": paired_runs(small, small_ref)}
        if min(len(runs["big"][0]), len(runs["small"][0])) < 2:
            continue
        boot = {"big": bootstrap_of(big, big_ref, runs["big"]), "small": bootstrap_of(small, small_ref, runs["small"])}
        for metric in METRICS:
            gaps = {name: [b["dev"][metric] - a["dev"][metric] for a, b in zip(*runs[name])] for name in runs}
            diff, ci, p = welch(gaps["big"], gaps["small"])
            row = {"label": big["label"], "smaller": small["label"], "metric": metric, "diff": diff, "ci": ci,
                   "t_p": p, "gap": float(np.mean(gaps["big"])), "gap_smaller": float(np.mean(gaps["small"])),
                   "seeds": (len(gaps["big"]), len(gaps["small"]))}
            if all(metric in b for b in boot.values()):
                change = boot["big"][metric] - boot["small"][metric]
                row |= {"boot_ci": interval(change, LEVEL), "boot_p": bootstrap_p(change)}
            out.append(row)
    return holm_per_metric(out, ("t_p", "boot_p"))


# --------------------------------------------------------------------------- the embeddings question


def split_scores(recipe, records: list[dict], results: Path, dev_labels: dict[str, np.ndarray],
                 unseen: dict[str, list[int]], reference: str | None = None, reps: int = 2000,
                 seed: int = 0) -> list[dict]:
    """Per point and task: its dev metric on the examples holding a word piece no training example holds
    ("unseen") and on the others ("seen"), mean over the reporting seeds; its paired difference from the
    reference on each part (mean over the seeds both have) with a bootstrap interval over that part's
    examples; and the gap (unseen difference - seen difference), the question itself: does the point
    differ from the reference more where training left embedding rows untouched? The gap's bootstrap
    resamples each part on its own (stratified), its p is Holm-adjusted over the points, per task."""
    protocol = Protocol(recipe, records)
    reference = reference or recipe.points[0]["label"]
    masks = {task: _unseen_mask(len(labels), unseen.get(task, [])) for task, labels in dev_labels.items()}
    ref_preds = _predictions(results, protocol.reporting(reference))
    rows = []
    for point in recipe.points:
        preds = _predictions(results, protocol.reporting(point["label"]))
        if not preds or protocol.same_runs(point["label"], reference):
            continue
        seeds = sorted(s for s in preds if s in ref_preds)
        compare = point["label"] != reference and bool(seeds)
        for k, (task, labels) in enumerate(dev_labels.items()):
            mask = masks[task]
            row = {"label": point["label"], "task": task, "n_unseen": int(mask.sum()), "n_seen": int((~mask).sum())}
            boot = {}
            for part, where in (("unseen", mask), ("seen", ~mask)):
                row[part] = float(np.mean([_score(task, p[task], labels, where) for p in preds.values()]))
                paired = [_score(task, preds[s][task], labels, where) - _score(task, ref_preds[s][task], labels, where)
                          for s in seeds]
                row[f"{part}_diff"] = float(np.mean(paired)) if paired else math.nan
                if compare and where.any():
                    boot[part] = bootstrap_diffs(task, [ref_preds[s][task][where] for s in seeds],
                                                 [preds[s][task][where] for s in seeds], labels[where], reps,
                                                 np.random.default_rng([seed, k, part == "seen"]))
                    row[f"{part}_ci"] = interval(boot[part], LEVEL)
            row["gap_diff"] = row["unseen_diff"] - row["seen_diff"]
            if len(boot) == 2:
                gap = boot["unseen"] - boot["seen"]
                row |= {"gap_ci": interval(gap, LEVEL), "gap_p": bootstrap_p(gap)}
            rows.append(row)
    for task in dev_labels:
        mine = [r for r in rows if r["task"] == task and "gap_p" in r]
        for r, p in zip(mine, holm([r["gap_p"] for r in mine])):
            r["gap_p_holm"] = p
    return rows


def _predictions(results: Path, runs: dict[int, dict]) -> dict[int, dict[str, np.ndarray]]:
    """Each seed's dev predictions, for the runs that stored them."""
    return {s: read_predictions(results, r) for s, r in runs.items() if stored_predictions(results, r)}


def _unseen_mask(n: int, unseen: list[int]) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    mask[unseen] = True
    return mask


def _score(task: str, preds: np.ndarray, labels: np.ndarray, where: np.ndarray) -> float:
    """The task's metric on the examples `where` selects (nan when it selects none)."""
    return score(task, preds[where], labels[where]) if where.any() else math.nan


def _bootstrap(results: Path, a_runs: list[dict], b_runs: list[dict], dev_labels: dict[str, np.ndarray],
               reps: int, seed: int) -> dict[str, np.ndarray]:
    if not all([stored_predictions(results, r) for r in a_runs + b_runs]):  # a list: each missing one named
        return {}
    return paired_bootstrap([read_predictions(results, r) for r in a_runs],
                            [read_predictions(results, r) for r in b_runs], dev_labels, reps, seed)


def paired_bootstrap(a_preds: list[dict], b_preds: list[dict], dev_labels: dict[str, np.ndarray], reps: int,
                     seed: int) -> dict[str, np.ndarray]:
    """metric -> (reps,) differences of B's mean from A's over resamples of each task's dev examples (every
    run scored on the same resamples), and the overall score's where there are several tasks."""
    diffs = {task: bootstrap_diffs(task, [p[task] for p in a_preds], [p[task] for p in b_preds], labels, reps,
                                   np.random.default_rng([seed, k]))
             for k, (task, labels) in enumerate(dev_labels.items())}
    out = {METRIC[t]: d for t, d in diffs.items()}
    if len(diffs) > 1:
        out["overall"] = overall_diffs(diffs)
    return out
