"""Does recipe B beat recipe A? Statistics over seeds and over dev examples.

    python -m training.stats runs/plain-s1 runs/plain-s2 runs/plain-s3 \\
        --vs runs/smart-s1 runs/smart-s2 runs/smart-s3 --names plain smart --data-dir data

Each argument is a run directory of run_multitask.py: its metrics.jsonl gives the dev metrics of
its best evaluation (the one best.pt holds), its config.json its seed, and its dev prediction files
({task}-dev-output.csv, in RUN/predictions or else the run's --predictions-dir) the per-example
predictions the bootstrap needs. The runs of the two groups are paired by seed. An argument may also
be a prediction set with its manifest.json (an ensemble's --predictions-dir from training.ensemble):
its dev metrics are the manifest's, it has no seed, so it is paired by order (--pair-by-order), e.g.
`python -m training.stats runs/s5 --vs ens --pair-by-order --data-dir data` for an ensemble against
its best member (one pair: no t-test, the bootstrap alone).

For each dev metric (sst_acc, para_acc, sts_pearson, overall):
- mean +- sd over the seeds of each group (sample sd, ddof 1);
- the paired differences B - A: their mean, the paired t-test (scipy.stats.ttest_rel) and the
  Wilcoxon signed-rank test (scipy.stats.wilcoxon; exact for few seeds, so its smallest two-sided
  p is 0.25 with 3 seeds and 0.0625 with 5: it can only ever agree with the t-test from 6 seeds on);
- with --data-dir, a paired bootstrap over the dev examples: --bootstrap resamples of each dev set,
  each scored for every run on the same resampled examples, giving the difference of the groups'
  mean metrics on each resample and the 2.5 and 97.5 percentiles of those differences (overall:
  the course's mean of the three tasks, each task's dev set resampled on its own). The t-test asks
  whether the difference could be the seeds' doing, the bootstrap whether it could be the dev
  set's (which examples it happens to hold).

The verdict claims "B > A" (or "A > B") only when the paired t-test gives p < --alpha and, where
the bootstrap ran, its 95% interval excludes 0; otherwise "no claim".
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats as sps

from data.loaders import COURSE_FILES, DataError, load_task_file

from .evaluate import METRIC, read_predictions, score
from .predictions import MANIFEST, read_manifest
from .progress import setup_logging
from .rundir import read_metrics

log = logging.getLogger(__name__)

METRICS = ("sst_acc", "para_acc", "sts_pearson", "overall")
TASK_OF = {m: t for t, m in METRIC.items()}  # "sst_acc" -> "sst"
CI_LEVEL = 0.95
MAX_CHUNK_CELLS = 2_000_000  # resampled indices held at once: rows x dev-set size
SAME = 1e-12  # paired differences this close count as equal (metrics are fractions of 1)


class StatsError(ValueError):
    """Bad input: the message is the one line the command prints."""


# --------------------------------------------------------------------------- runs


@dataclass
class Run:
    path: Path
    seed: int | None
    dev: dict[str, float]  # the best evaluation's dev metrics, without the "dev_" prefix
    config: dict = field(default_factory=dict)


def best_record(records: list[dict]) -> dict:
    """The evaluation best.pt holds: the first with the highest dev_overall (the trainer keeps a new
    best only when it is strictly higher)."""
    evals = [r for r in records if r.get("dev_overall") is not None]
    if not evals:
        raise ValueError("no dev evaluation")
    top = max(r["dev_overall"] for r in evals)
    return next(r for r in evals if r["dev_overall"] == top)


def read_run(path: str | Path) -> Run:
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
    return Run(path, config.get("seed"), dev, config)


def read_prediction_set(path: Path) -> Run:
    """A folder of dev prediction files with their manifest (an ensemble's, from training.ensemble) as a
    run of no seed: its dev metrics are the manifest's, its predictions the folder's files."""
    manifest = read_manifest(path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("dev_metrics"), dict):
        raise StatsError(f"{path / MANIFEST}: no dev_metrics (not a prediction set's manifest?)")
    return Run(path, None, {k: float(v) for k, v in manifest["dev_metrics"].items()}, {"predictions_dir": str(path)})


def pair_runs(a: list[Run], b: list[Run], by_order: bool = False) -> list[tuple[Run, Run]]:
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


# --------------------------------------------------------------------------- over seeds


def mean_sd(values) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; nan for one value)."""
    xs = np.asarray(values, dtype=np.float64)
    return float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else math.nan


def paired_tests(a, b) -> dict:
    """B - A over pairs: mean and sd of the differences, paired t (statistic, two-sided p), Wilcoxon p."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = b - a
    out = {"n": len(d), "diff": float(d.mean()), "diff_sd": float(d.std(ddof=1)) if len(d) > 1 else math.nan,
           "t": math.nan, "t_p": math.nan, "wilcoxon_p": math.nan}
    if len(d) < 2:
        return out
    # no spread beyond rounding (the same gain on every seed): t is 0/0 or +-inf, where scipy would
    # divide rounding noise by rounding noise
    if np.ptp(d) <= SAME * max(1.0, float(np.abs(d).max())):
        mean = float(d.mean())
        out["t"], out["t_p"] = (math.nan, math.nan) if abs(mean) <= SAME else (math.copysign(math.inf, mean), 0.0)
    else:
        res = sps.ttest_rel(b, a)
        out["t"], out["t_p"] = float(res.statistic), float(res.pvalue)
    if np.any(d != 0):
        with warnings.catch_warnings():  # few pairs, ties: scipy's notes about its method
            warnings.simplefilter("ignore")
            out["wilcoxon_p"] = float(sps.wilcoxon(b, a).pvalue)
    return out


# --------------------------------------------------------------------------- over dev examples


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


def dev_predictions(run: Run, task: str, ids: list[str]) -> np.ndarray:
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


def check_predictions(run: Run, task: str, preds: np.ndarray, labels: np.ndarray, path_hint: str) -> None:
    """The files must score what the run recorded for best.pt: a run's --predictions-dir may be shared."""
    recorded = run.dev.get(METRIC[task])
    got = score(task, preds, labels)
    tol = 5e-4 if task == "sts" else 1e-9  # the files keep 4 decimals of a similarity
    if recorded is None or abs(got - recorded) > tol:
        raise StatsError(f"{run.path}: its {path_hint} score {METRIC[task]} {got:.4f}, its best evaluation "
                         f"{recorded}: prediction files of another run?")


def bootstrap(pairs: list[tuple[Run, Run]], data_dir: Path, tasks: list[str], reps: int, seed: int) -> dict:
    """{metric: (reps,) differences B - A} for every task's metric and overall."""
    diffs = {}
    for k, task in enumerate(tasks):
        examples = load_task_file(data_dir / COURSE_FILES[task]["dev"], task, labelled=True).examples
        ids, labels = [e.id for e in examples], np.array([e.label for e in examples], dtype=np.float64)
        groups = ([], [])
        for pair in pairs:
            for g, run in enumerate(pair):
                preds = dev_predictions(run, task, ids)
                check_predictions(run, task, preds, labels, f"{task} dev predictions")
                groups[g].append(preds)
        # one stream per task: adding a task does not change the others' resamples
        diffs[task] = bootstrap_diffs(task, groups[0], groups[1], labels, reps, np.random.default_rng([seed, k]))
    out = {METRIC[t]: d for t, d in diffs.items()}
    if len(tasks) > 1:
        out["overall"] = overall_diffs(diffs)
    return out


# --------------------------------------------------------------------------- the comparison


def verdict(row: dict, alpha: float) -> str:
    if row["pairs"] < 2 or math.isnan(row["t_p"]):
        return "no claim (needs 2+ seeds)" if row["pairs"] < 2 else "no claim"
    boot = "boot_lo" in row
    if row["diff"] > 0 and row["t_p"] < alpha and (not boot or row["boot_lo"] > 0):
        return "B > A"
    if row["diff"] < 0 and row["t_p"] < alpha and (not boot or row["boot_hi"] < 0):
        return "A > B"
    return "no claim"


def compare(a: list[Run], b: list[Run], data_dir: str | Path | None = None, reps: int = 10_000, seed: int = 0,
            alpha: float = 0.05, by_order: bool = False) -> list[dict]:
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


def _num(x: float, digits: int = 4, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def markdown(rows: list[dict], names: tuple[str, str]) -> str:
    n = rows[0]["pairs"] if rows else 0
    lines = [f"| dev metric | A: {names[0]} ({n} seeds) | B: {names[1]} | B - A | paired t (p) | Wilcoxon p "
             f"| bootstrap B - A, {CI_LEVEL:.0%} CI | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = "-" if math.isnan(r["t"]) else f"{r['t']:.2f} ({_num(r['t_p'], 3)})"
        ci = f"[{_num(r['boot_lo'], sign=True)}, {_num(r['boot_hi'], sign=True)}]" if "boot_lo" in r else "-"
        lines.append(f"| {r['metric']} | {_num(r['mean_a'])} ± {_num(r['sd_a'])} | {_num(r['mean_b'])} ± "
                     f"{_num(r['sd_b'])} | {_num(r['diff'], sign=True)} | {t} | {_num(r['wilcoxon_p'], 3)} | {ci} "
                     f"| {r['verdict']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.stats", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", nargs="+", metavar="A_RUN", help="run directories of recipe A, one per seed")
    p.add_argument("--vs", nargs="+", required=True, metavar="B_RUN", help="run directories of recipe B")
    p.add_argument("--names", nargs=2, default=["A", "B"], metavar=("A", "B"), help="the recipes' names in the table")
    p.add_argument("--data-dir", default=None,
                   help="the course's dev files: with it, the paired bootstrap over dev examples runs")
    p.add_argument("--bootstrap", type=int, default=10_000, metavar="N", help="resamples (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's random seed (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=0.05, help="the t-test's level for a verdict (default: %(default)s)")
    p.add_argument("--pair-by-order", action="store_true",
                   help="pair the i-th run of A with the i-th of B instead of by seed")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows to FILE as JSON")
    args = p.parse_args(argv)
    setup_logging()
    if args.bootstrap < 1:
        p.error(f"--bootstrap must be >= 1, not {args.bootstrap}")
    if not 0 < args.alpha < 1:
        p.error(f"--alpha must be in (0, 1), not {args.alpha}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        p.error(f"--data-dir {args.data_dir}: no such directory")
    try:
        a, b = [read_run(r) for r in args.a], [read_run(r) for r in args.vs]
        rows = compare(a, b, args.data_dir, args.bootstrap, args.seed, args.alpha, args.pair_by_order)
    except (StatsError, DataError) as e:
        p.error(str(e))
    print(markdown(rows, tuple(args.names)))
    if args.json:
        plain = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]
        Path(args.json).write_text(json.dumps(plain, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
