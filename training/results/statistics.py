"""Does recipe B beat recipe A? Statistics over seeds (paired t-test, Wilcoxon, intervals) and over dev examples
(the paired bootstrap), on finished runs read from their directories or prediction sets.
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from data.loaders import COURSE_FILES, load_task_file
from training.inference.formats import read_predictions
from training.inference.metrics import METRIC, score
from training.inference.predictions import MANIFEST, read_manifest
from training.run.metrics_file import kept_evaluation, read_metrics

METRICS = ("sst_acc", "para_acc", "sts_pearson", "overall")

TASK_OF = {m: t for t, m in METRIC.items()}  # "sst_acc" -> "sst"

CI_LEVEL = 0.95

MAX_CHUNK_CELLS = 2_000_000  # resampled indices held at once: rows x dev-set size

SAME = 1e-12  # paired differences this close count as equal (metrics are fractions of 1)


class StatsError(ValueError):
    """Bad input: the message is the one line the command prints."""


@dataclass
class FinishedRun:
    """A finished run (or a prediction set) as the statistics see it: its dev metrics and seed."""
    path: Path
    seed: int | None
    dev: dict[str, float]  # the best evaluation's dev metrics, without the "dev_" prefix
    config: dict = field(default_factory=dict)


def best_record(records: list[dict]) -> dict:
    """The evaluation best.pt holds (metrics_file.kept_evaluation); ValueError when there is none."""
    kept = kept_evaluation(records)
    if kept is None:
        raise ValueError("no dev evaluation")
    return kept


def read_run(path: str | Path) -> FinishedRun:
    path = Path(path)
    src = path / "metrics.jsonl"
    if not src.is_file() and (path / MANIFEST).is_file():
        return read_prediction_set(path)
    if not src.is_file():
        raise StatsError(f"{path}: no metrics.jsonl (not a run directory of run_multitask.py?)")
    try:
        records = read_metrics(src)
        best = best_record(records)
    except ValueError as e:  # bad JSON, or no evaluation yet
        raise StatsError(f"{src}: {str(e).splitlines()[0]}") from e
    config = {}
    if (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text())
        except ValueError as e:
            raise StatsError(f"{path / 'config.json'}: not JSON ({e})") from e
    dev = {k[len("dev_"):]: float(v) for k, v in best.items() if k.startswith("dev_") and not k.startswith("dev_raw_")}
    return FinishedRun(path, config.get("seed"), dev, config)


def read_prediction_set(path: Path) -> FinishedRun:
    """A folder of dev prediction files with their manifest (an ensemble's, from training.ensemble) as a
    run of no seed: its dev metrics are the manifest's, its predictions the folder's files."""
    manifest = read_manifest(path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("dev_metrics"), dict):
        raise StatsError(f"{path / MANIFEST}: no dev_metrics (not a prediction set's manifest?)")
    dev = {k: float(v) for k, v in manifest["dev_metrics"].items()}
    return FinishedRun(path, None, dev, {"predictions_dir": str(path)})


def pair_runs(a: list[FinishedRun], b: list[FinishedRun],
              by_order: bool = False) -> list[tuple[FinishedRun, FinishedRun]]:
    """Runs of the two groups with the same seed, in A's order (by_order: as given)."""
    if by_order:
        if len(a) != len(b):
            raise StatsError(f"--pair-by-order needs as many runs in each group, not {len(a)} and {len(b)}")
        return list(zip(a, b))
    for group in (a, b):
        seeds = [r.seed for r in group]
        if None in seeds:
            missing = next(r for r in group if r.seed is None)
            raise StatsError(f"{missing.path}: no seed in config.json to pair it by (--pair-by-order pairs as given)")
        if len(set(seeds)) != len(seeds):
            raise StatsError(f"two runs of one group share a seed ({sorted(seeds)}): pass each seed once")
    seeds_a, seeds_b = [r.seed for r in a], {r.seed: r for r in b}
    if set(seeds_a) != set(seeds_b):
        raise StatsError(f"the groups' seeds differ ({sorted(seeds_a)} and {sorted(seeds_b)}): a paired "
                         f"comparison needs the same seeds (--pair-by-order pairs as given)")
    return [(r, seeds_b[r.seed]) for r in a]


def mean_sd(values) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; nan for one value)."""
    xs = np.asarray(values, dtype=np.float64)
    return float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else math.nan


def constant(x: np.ndarray) -> bool:
    """x's values equal up to rounding (SAME, relative to their size): ten copies of 0.3 have a std of 5.6e-17,
    and a + 0.1 - a is not 0.1 everywhere."""
    return len(x) == 0 or float(np.ptp(x)) <= SAME * max(1.0, float(np.abs(x).max()))


def paired_tests(a, b) -> dict:
    """B - A over pairs: mean and sd of the differences, paired t (statistic, two-sided p), Wilcoxon p."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = b - a
    out = {"n": len(d), "diff": float(d.mean()), "diff_sd": float(d.std(ddof=1)) if len(d) > 1 else math.nan,
           "t": math.nan, "t_p": math.nan, "wilcoxon_p": math.nan}
    if len(d) < 2:
        return out
    from scipy import stats as sps  # a second of import: only where a test runs, not for `minbert stats --help`

    # no spread beyond rounding (the same gain on every seed): t is 0/0 or +-inf, where scipy would
    # divide rounding noise by rounding noise
    if constant(d):
        mean = float(d.mean())
        out["t"], out["t_p"] = (math.nan, math.nan) if abs(mean) <= SAME else (math.copysign(math.inf, mean), 0.0)
    else:
        res = sps.ttest_rel(b, a)
        out["t"], out["t_p"] = float(res.statistic), float(res.pvalue)
    d = np.where(np.abs(d) <= SAME, 0.0, d)  # rounding is no difference here either (as for t)
    if np.any(d != 0):
        with warnings.catch_warnings():  # few pairs, ties: scipy's notes about its method
            warnings.simplefilter("ignore")
            out["wilcoxon_p"] = float(sps.wilcoxon(d).pvalue)
    return out


def tost(a, b, margin: float) -> dict:
    """Equivalence of B and A within +-margin over pairs (two one-sided paired t tests, TOST): p is the larger
    of the two one-sided p's (B - A <= -margin; B - A >= +margin), below alpha when the (1 - 2 alpha) t
    interval of the mean difference lies inside (-margin, +margin). The margin must be fixed before the test."""
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    n = len(d)
    out = {"n": n, "diff": float(d.mean()) if n else math.nan, "margin": margin, "tost_p": math.nan}
    if n < 2:
        return out
    se = float(d.std(ddof=1)) / math.sqrt(n)
    mean = float(d.mean())
    if se <= SAME:  # the same difference on every pair: inside the margin or not, without doubt
        out["tost_p"] = 0.0 if abs(mean) < margin else 1.0
        return out
    from scipy import stats as sps  # a second of import: only where a test runs, not for `minbert stats --help`
    lower = float(sps.t.sf((mean + margin) / se, n - 1))   # H0: diff <= -margin
    upper = float(sps.t.cdf((mean - margin) / se, n - 1))  # H0: diff >= +margin
    out["tost_p"] = max(lower, upper)
    return out


def resamples(n: int, reps: int, rng: np.random.Generator):
    """Bootstrap resamples of n examples, `reps` in all, as (rows, n) index arrays in chunks."""
    chunk = max(1, MAX_CHUNK_CELLS // max(n, 1))
    done = 0
    while done < reps:
        rows = min(chunk, reps - done)
        yield rng.integers(0, n, size=(rows, n))
        done += rows


def pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of each row pair of (rows, n) arrays; 0 where a row is constant (as evaluate.score)."""
    xm = x - x.mean(axis=1, keepdims=True)
    ym = y - y.mean(axis=1, keepdims=True)
    den = np.sqrt((xm * xm).sum(1) * (ym * ym).sum(1))
    constant = (x.max(1) == x.min(1)) | (y.max(1) == y.min(1))
    r = np.divide((xm * ym).sum(1), den, out=np.zeros(len(x)), where=~constant & (den > 0))
    return np.where(constant, 0.0, r)


def resampled_metric(task: str, preds: np.ndarray, labels: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The task's dev metric of one run on each resample (rows of idx)."""
    if task == "sts":
        return pearson_rows(preds[idx], labels[idx])
    return (preds == labels)[idx].mean(axis=1)


def bootstrap_diffs(task: str, a_preds: list[np.ndarray], b_preds: list[np.ndarray], labels: np.ndarray,
                    reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps,) differences mean_B(metric) - mean_A(metric), every run scored on the same resamples."""
    out = []
    for idx in resamples(len(labels), reps, rng):
        mean_b = np.mean([resampled_metric(task, p, labels, idx) for p in b_preds], axis=0)
        mean_a = np.mean([resampled_metric(task, p, labels, idx) for p in a_preds], axis=0)
        out.append(mean_b - mean_a)
    return np.concatenate(out)


def overall_diffs(task_diffs: dict[str, np.ndarray]) -> np.ndarray:
    """The course's overall score is the mean of sst_acc, para_acc and (pearson + 1) / 2, so its
    difference is the mean of the tasks' differences, the Pearson one halved."""
    parts = [d / 2 if task == "sts" else d for task, d in task_diffs.items()]
    return np.mean(parts, axis=0)


def interval(diffs: np.ndarray, level: float = CI_LEVEL) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(diffs, [tail, 100 - tail])
    return float(lo), float(hi)


def dev_predictions(run: FinishedRun, task: str, ids: list[str]) -> np.ndarray:
    """The run's dev predictions in the order of `ids`, from RUN/predictions or its --predictions-dir."""
    name = f"{task}-dev-output.csv"
    places = [run.path / "predictions" / name]
    if run.config.get("predictions_dir"):
        places.append(Path(run.config["predictions_dir"]) / name)
    path = next((p for p in places if p.is_file()), None)
    if path is None:
        raise StatsError(f"{run.path}: no {name} in {' or '.join(str(p.parent) for p in places)}")
    try:
        got_task, rows = read_predictions(path)
    except (ValueError, IndexError) as e:
        raise StatsError(f"{path}: {e}") from e
    by_id = dict(rows)
    if got_task != task or set(by_id) != set(ids):
        raise StatsError(f"{path}: not the {task} dev set's predictions ({len(rows)} rows, {len(ids)} dev examples)")
    return np.array([by_id[i] for i in ids])


def check_predictions(run: FinishedRun, task: str, preds: np.ndarray, labels: np.ndarray, path_hint: str) -> None:
    """The files must score what the run recorded for best.pt: a run's --predictions-dir may be shared."""
    recorded = run.dev.get(METRIC[task])
    got = score(task, preds, labels)
    tol = 5e-4 if task == "sts" else 1e-9  # the files keep 4 decimals of a similarity
    if recorded is None or abs(got - recorded) > tol:
        raise StatsError(f"{run.path}: its {path_hint} score {METRIC[task]} {got:.4f}, its best evaluation "
                         f"{recorded}: prediction files of another run?")


def bootstrap(pairs: list[tuple[FinishedRun, FinishedRun]], data_dir: Path, tasks: list[str], reps: int,
              seed: int) -> dict:
    """{metric: (reps,) differences B - A} for every task's metric and overall."""
    diffs = {}
    for task in tasks:
        examples = load_task_file(data_dir / COURSE_FILES[task]["dev"], task, labelled=True).examples
        ids, labels = [e.id for e in examples], np.array([e.label for e in examples], dtype=np.float64)
        groups = ([], [])
        for pair in pairs:
            for g, run in enumerate(pair):
                preds = dev_predictions(run, task, ids)
                check_predictions(run, task, preds, labels, f"{task} dev predictions")
                groups[g].append(preds)
        # one stream per task, keyed by the task (not its place among the runs' tasks): adding a task does not
        # change the others' resamples
        stream = np.random.default_rng([seed, list(METRIC).index(task)])
        diffs[task] = bootstrap_diffs(task, groups[0], groups[1], labels, reps, stream)
    out = {METRIC[t]: d for t, d in diffs.items()}
    if len(tasks) > 1:
        out["overall"] = overall_diffs(diffs)
    return out


def verdict(row: dict, alpha: float) -> str:
    if row["pairs"] < 2 or math.isnan(row["t_p"]):
        return "no claim (needs 2+ seeds)" if row["pairs"] < 2 else "no claim"
    boot = "boot_lo" in row
    if row["diff"] > 0 and row["t_p"] < alpha and (not boot or row["boot_lo"] > 0):
        return "B > A"
    if row["diff"] < 0 and row["t_p"] < alpha and (not boot or row["boot_hi"] < 0):
        return "A > B"
    return "no claim"


def compare(a: list[FinishedRun], b: list[FinishedRun], data_dir: str | Path | None = None, reps: int = 10_000,
            seed: int = 0, alpha: float = 0.05, by_order: bool = False) -> list[dict]:
    """One row per dev metric the runs share: the groups' mean +- sd, the paired tests, the bootstrap."""
    pairs = pair_runs(a, b, by_order)
    metrics = [m for m in METRICS if all(m in r.dev for r in a + b)]
    if not metrics:
        raise StatsError("the runs share no dev metric")
    boot = {}
    if data_dir is not None:
        boot = bootstrap(pairs, Path(data_dir), [TASK_OF[m] for m in metrics if m != "overall"], reps, seed)
    rows = []
    for m in metrics:
        va, vb = [p[0].dev[m] for p in pairs], [p[1].dev[m] for p in pairs]
        (mean_a, sd_a), (mean_b, sd_b) = mean_sd(va), mean_sd(vb)
        tests = paired_tests(va, vb)
        row = {"metric": m, "pairs": tests["n"], "mean_a": mean_a, "sd_a": sd_a, "mean_b": mean_b, "sd_b": sd_b,
               **{k: tests[k] for k in ("diff", "diff_sd", "t", "t_p", "wilcoxon_p")}}
        if m in boot:
            row["boot_lo"], row["boot_hi"] = interval(boot[m])
        row["verdict"] = verdict(row, alpha)
        rows.append(row)
    return rows
