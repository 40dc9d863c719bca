"""Every statistic the project reports, checked against an independent reference: scipy.stats, sklearn.metrics,
numpy, or the textbook formula written out here (exact enumeration of Wilcoxon's sign patterns, Holm's step-down
rule, the Pitman-Morgan statistic in its classical form with its interval found by root finding, the type-7
quantile, per-resample scores recomputed from the very indices the bootstrap drew). Never the project's own output.

Tests whose docstring begins "Was a bug" failed on the code this file was written against; each says why."""
import itertools
import math
import statistics as pystats
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import optimize, stats
from sklearn import metrics as skm
from sklearn.dummy import DummyClassifier

from training import analyze as A
from training.experiments.study import arms
from training.experiments.study.baselines import best_threshold, trivial_scores
from training.inference import metrics as M
from training.methods.freezing import percentile as freeze_percentile
from training.results import statistics as S
from training.results.summary import summarize

RNG = np.random.default_rng(20240611)


def _pearson_ref(x, y) -> float:
    """scipy's Pearson r; the project's convention (metrics.score's comment) where it is undefined: 0."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or (x == x[0]).all() or (y == y[0]).all():
        return 0.0
    return float(stats.pearsonr(x, y).statistic)


def _course_overall(sst=None, para=None, sts=None) -> float:
    parts = [v for v in (sst, para) if v is not None] + ([(sts + 1) / 2] if sts is not None else [])
    return sum(parts) / len(parts)


def _type7_quantile(values, q: float) -> float:
    """Hyndman & Fan's type 7 (linear between closest ranks), from its definition."""
    xs = sorted(float(v) for v in values)
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def _holm_ref(ps):
    """Holm (1979): sorted p_(1) <= ... <= p_(m), adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)); nan
    entries are not hypotheses."""
    real = [i for i, p in enumerate(ps) if not math.isnan(p)]
    m, order = len(real), sorted(real, key=lambda i: ps[i])
    out = [math.nan] * len(ps)
    for pos, i in enumerate(order):
        out[i] = max(min(1.0, (m - j) * ps[order[j]]) for j in range(pos + 1))
    return out


def _wilcoxon_exact(d) -> float:
    """Two-sided exact signed-rank p by counting all 2^n sign patterns of the non-zero |d| ranks (average ranks
    for ties; zeros dropped, Wilcoxon's own rule)."""
    d = np.asarray(d, float)
    d = d[d != 0]
    r = stats.rankdata(np.abs(d))
    w = r[d > 0].sum()
    ws = np.array([sum(r[i] for i in range(len(d)) if s[i]) for s in itertools.product((0, 1), repeat=len(d))])
    return min(1.0, 2 * min(np.mean(ws <= w + 1e-9), np.mean(ws >= w - 1e-9)))


class RecordingRng:
    """A numpy Generator that keeps every index array the bootstrap draws, so that the per-resample scores can be
    recomputed here from the same examples."""

    def __init__(self, seed):
        self.g, self.drawn = np.random.default_rng(seed), []

    def integers(self, low, high, size):
        x = self.g.integers(low, high, size=size)
        self.drawn.append(np.array(x))
        return x


# ----------------------------------------------------------------------------- per-example dev metrics


@pytest.mark.parametrize("n", [1, 2, 7, 200])
def test_accuracy_matches_sklearn(n):
    labels = RNG.integers(0, 5, n).astype(float)
    for preds in (RNG.integers(0, 5, n), labels.copy(), (labels + 1) % 5, np.zeros(n)):
        assert M.score("sst", preds, labels) == pytest.approx(skm.accuracy_score(labels, preds), abs=1e-15)
        assert M.score("para", preds, list(labels)) == pytest.approx(skm.accuracy_score(labels, preds), abs=1e-15)


def test_sts_pearson_matches_scipy():
    for n in (2, 3, 10, 500):
        labels = RNG.uniform(0, 5, n)
        for preds in (RNG.uniform(0, 5, n), -labels + 0.1 * RNG.normal(size=n), np.round(labels)):
            assert M.score("sts", preds, labels) == pytest.approx(stats.pearsonr(preds, labels).statistic, abs=1e-12)


def test_sts_undefined_pearson_counts_as_zero_exactly_constant_inputs():
    labels = np.array([0.0, 1, 2, 3, 4, 5, 1, 2, 3, 4])
    assert M.score("sts", np.full(10, 2.5), labels) == 0.0
    assert M.score("sts", labels, np.full(10, 3.0)) == 0.0
    assert M.score("sts", np.array([1.0]), np.array([2.0])) == 0.0  # n = 1


@pytest.mark.parametrize("c", [0.3, 1 / 3, 0.1 + 0.2])
def test_sts_constant_prediction_counts_as_zero_whatever_the_constant(c):
    """Was a bug (training/inference/metrics.py:18): np.std of ten copies of 0.3 is 5.6e-17, not 0 (the mean rounds), so
    the guard misses and scipy's pearsonr, which tests x == x[0], returns nan with a ConstantInputWarning. The
    docstring's convention (and pearson_rows, the bootstrap's) is 0. A nan also slips through check_predictions
    (abs(nan - x) > tol is False) and makes overall nan. Fixed: np.ptp(...) == 0."""
    labels = np.array([0.0, 1, 2, 3, 4, 5, 1, 2, 3, 4])
    preds = np.full(10, c)
    assert (preds == preds[0]).all()  # constant: Pearson undefined (scipy says so too)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(stats.pearsonr(preds, labels).statistic)
        got = M.score("sts", preds, labels)
    assert got == _pearson_ref(preds, labels) == 0.0
    assert got == S.pearson_rows(preds[None], labels[None])[0]  # the bootstrap's own scorer agrees with the docs


def test_overall_is_the_course_formula():
    for _ in range(20):
        sst, para, sts = RNG.uniform(0, 1), RNG.uniform(0, 1), RNG.uniform(-1, 1)
        assert M.overall({"sst_acc": sst, "para_acc": para, "sts_pearson": sts}) == pytest.approx(
            (sst + para + (sts + 1) / 2) / 3, abs=1e-15)
        assert M.overall({"sst_acc": sst, "sts_pearson": sts}) == pytest.approx(_course_overall(sst, None, sts))
        assert M.overall({"sts_pearson": sts}) == pytest.approx((sts + 1) / 2)
        assert M.overall({"para_acc": para}) == pytest.approx(para)
    assert M.overall({"sst_acc": 1.0, "para_acc": 1.0, "sts_pearson": 1.0}) == 1.0
    assert M.overall({"sst_acc": 0.0, "para_acc": 0.0, "sts_pearson": -1.0}) == 0.0


# ----------------------------------------------------------------------------- over seeds


@pytest.mark.parametrize("values", [[0.7], [0.7, 0.72], [0.5, 0.5, 0.5], [0.1, 0.9, 0.3, 0.35, 0.6],
                                    [1e-9, 2e-9, 4e-9]])
def test_mean_sd_is_the_sample_sd(values):
    mean, sd = S.mean_sd(values)
    assert mean == pytest.approx(pystats.fmean(values), rel=1e-14)
    if len(values) == 1:
        assert math.isnan(sd)
    else:
        assert sd == pytest.approx(pystats.stdev(values), rel=1e-12, abs=1e-18)
        assert sd == pytest.approx(float(np.std(values, ddof=1)), rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_paired_t_matches_the_formula_and_scipy(n):
    for _ in range(5):
        a = RNG.uniform(0.6, 0.8, n)
        b = a + RNG.normal(0.005, 0.01, n)
        d = b - a
        t_ref = d.mean() / (d.std(ddof=1) / math.sqrt(n))
        p_ref = 2 * stats.t.sf(abs(t_ref), n - 1)
        r = S.paired_tests(a, b)
        assert r["n"] == n
        assert r["diff"] == pytest.approx(d.mean(), rel=1e-12)
        assert r["diff_sd"] == pytest.approx(pystats.stdev(d), rel=1e-9)
        assert r["t"] == pytest.approx(t_ref, rel=1e-9)
        assert r["t_p"] == pytest.approx(p_ref, rel=1e-9)
        assert r["t_p"] == pytest.approx(stats.ttest_rel(b, a).pvalue, rel=1e-9)
        assert r["wilcoxon_p"] == pytest.approx(_wilcoxon_exact(d), rel=1e-12)


def test_paired_t_edge_cases():
    one = S.paired_tests([0.5], [0.6])  # n = 1: no test
    assert one["diff"] == pytest.approx(0.1) and math.isnan(one["diff_sd"])
    assert all(math.isnan(one[k]) for k in ("t", "t_p", "wilcoxon_p"))
    same = S.paired_tests([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])  # every difference 0: t = 0/0
    assert same["diff"] == 0 and all(math.isnan(same[k]) for k in ("t", "t_p", "wilcoxon_p"))
    # the same gain on every seed: sd 0, t -> +inf as sd -> 0, so p -> 0 (the formula's limit)
    shift = S.paired_tests([0.5, 0.6, 0.7], [0.52, 0.62, 0.72])
    assert shift["t"] == math.inf and shift["t_p"] == 0.0
    drop = S.paired_tests([0.5, 0.6, 0.7], [0.48, 0.58, 0.68])
    assert drop["t"] == -math.inf and drop["t_p"] == 0.0
    nan = S.paired_tests([0.5, float("nan"), 0.7], [0.5, 0.6, 0.8])
    assert math.isnan(nan["diff"]) and math.isnan(nan["t_p"])


@pytest.mark.parametrize("d", [[0.01, -0.01, 0.02, 0.03, 0.025], [0.01, 0.01, -0.02, 0.03, 0.04, 0.05, 0.05],
                               [0.0, 0.01, -0.02, 0.03], [1, -2, 3, 3, 4, -4, 5, 6]])
def test_wilcoxon_is_exact_with_ties_and_zeros(d):
    d = np.asarray(d, float)
    assert S.paired_tests(np.zeros(len(d)), d)["wilcoxon_p"] == pytest.approx(_wilcoxon_exact(d), rel=1e-12)


def test_wilcoxon_counts_rounding_as_no_difference_as_t_does():
    """0.1 + 0.2 - 0.3 is 5.6e-17, not 0: six such pairs are no difference (t says nan), not a p of 0.031; a
    rounding difference among real ones is dropped as Wilcoxon drops a zero."""
    same = S.paired_tests([0.1 + 0.2] * 6, [0.3] * 6)
    assert math.isnan(same["t_p"]) and math.isnan(same["wilcoxon_p"])
    a = np.array([0.1 + 0.2, 0.5, 0.5, 0.5, 0.5, 0.5])
    b = np.array([0.3, 0.52, 0.49, 0.53, 0.56, 0.54])
    assert b[0] - a[0] != 0
    assert S.paired_tests(a, b)["wilcoxon_p"] == pytest.approx(_wilcoxon_exact([0, .02, -.01, .03, .06, .04]),
                                                               rel=1e-12)


@pytest.mark.parametrize("n,smallest", [(3, 0.25), (5, 0.0625), (6, 0.03125)])
def test_wilcoxon_smallest_p_as_documented(n, smallest):
    """stats.py's docstring and docs/training.md: 0.25 with 3 seeds, 0.0625 with 5; below 0.05 from 6."""
    d = np.arange(1, n + 1) * 0.01
    assert smallest == pytest.approx(2 / 2 ** n)
    assert S.paired_tests(np.zeros(n), d)["wilcoxon_p"] == pytest.approx(smallest)
    assert S.paired_tests(np.zeros(n), -d)["wilcoxon_p"] == pytest.approx(smallest)


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_tost_is_two_one_sided_t_tests(n):
    for margin in (0.001, 0.005, 0.02):
        a = RNG.uniform(0.6, 0.8, n)
        b = a + RNG.normal(0.001, 0.004, n)
        d = b - a
        lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
        upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
        p = S.tost(a, b, margin)["tost_p"]
        assert p == pytest.approx(max(lower, upper), rel=1e-9)
        # duality with the (1 - 2 alpha) t interval, alpha = 0.05
        lo, hi = stats.t.interval(0.90, n - 1, loc=d.mean(), scale=stats.sem(d))
        inside = -margin < lo and hi < margin
        assert (p < 0.05) == inside
    assert math.isnan(S.tost([0.5], [0.6], 0.01)["tost_p"])
    assert S.tost([0.5, 0.6], [0.501, 0.601], 0.005)["tost_p"] == 0.0   # constant difference inside
    assert S.tost([0.5, 0.6], [0.51, 0.61], 0.005)["tost_p"] == 1.0     # constant difference outside


def test_verdict_needs_t_below_alpha_and_an_interval_without_zero():
    row = {"pairs": 3, "diff": 0.01, "t_p": 0.01, "boot_lo": 0.001, "boot_hi": 0.02}
    assert S.verdict(row, 0.05) == "B > A"
    assert S.verdict(row | {"t_p": 0.05}, 0.05) == "no claim"          # p < alpha, strictly
    assert S.verdict(row | {"boot_lo": 0.0}, 0.05) == "no claim"       # the interval must exclude 0
    assert S.verdict({k: -v for k, v in row.items() if k != "pairs"} | {"pairs": 3, "t_p": 0.01,
                                                                       "boot_lo": -0.02, "boot_hi": -0.001},
                     0.05) == "A > B"
    assert S.verdict({"pairs": 3, "diff": 0.01, "t_p": 0.01}, 0.05) == "B > A"  # no bootstrap ran
    assert S.verdict({"pairs": 1, "diff": 0.01, "t_p": math.nan}, 0.05).startswith("no claim")


# ----------------------------------------------------------------------------- the bootstrap over dev examples


def _per_resample_ref(task, a_preds, b_preds, labels, idx):
    out = []
    for row in idx:
        if task == "sts":
            mb = np.mean([_pearson_ref(p[row], labels[row]) for p in b_preds])
            ma = np.mean([_pearson_ref(p[row], labels[row]) for p in a_preds])
        else:
            mb = np.mean([skm.accuracy_score(labels[row], p[row]) for p in b_preds])
            ma = np.mean([skm.accuracy_score(labels[row], p[row]) for p in a_preds])
        out.append(mb - ma)
    return np.array(out)


def _fake_task(task, n, runs):
    if task == "sts":
        labels = np.round(RNG.uniform(0, 5, n), 1)
        preds = [labels + RNG.normal(0, s, n) for s in np.linspace(0.5, 2.0, runs)]
    else:
        k = 5 if task == "sst" else 2
        labels = RNG.integers(0, k, n).astype(float)
        preds = [np.where(RNG.uniform(size=n) < q, labels, RNG.integers(0, k, n)).astype(float)
                 for q in np.linspace(0.3, 0.8, runs)]
    return labels, preds


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
@pytest.mark.parametrize("chunk_cells", [S.MAX_CHUNK_CELLS, 100])
def test_bootstrap_diffs_are_paired_resamples_scored_per_run(task, chunk_cells, monkeypatch):
    """Each replicate: every run of both groups scored on one and the same resample; recomputed here with sklearn
    / scipy from the indices drawn (also when the resamples come in several chunks)."""
    monkeypatch.setattr(S, "MAX_CHUNK_CELLS", chunk_cells)
    n, reps = 40, 57
    labels, preds = _fake_task(task, n, 5)
    a, b = preds[:2], preds[2:]
    rng = RecordingRng(7)
    got = S.bootstrap_diffs(task, a, b, labels, reps, rng)
    idx = np.concatenate(rng.drawn)
    assert idx.shape == (reps, n) and idx.min() >= 0 and idx.max() < n
    assert got.shape == (reps,)
    np.testing.assert_allclose(got, _per_resample_ref(task, a, b, labels, idx), atol=1e-12)


def test_bootstrap_pairs_runs_and_is_seeded():
    labels, preds = _fake_task("sst", 60, 3)
    same = S.bootstrap_diffs("sst", preds, [p.copy() for p in preds], labels, 200, np.random.default_rng(0))
    assert np.all(same == 0)  # paired: identical groups differ on no resample
    one = S.bootstrap_diffs("sst", preds[:1], preds[1:], labels, 300, np.random.default_rng([3, 1]))
    two = S.bootstrap_diffs("sst", preds[:1], preds[1:], labels, 300, np.random.default_rng([3, 1]))
    other = S.bootstrap_diffs("sst", preds[:1], preds[1:], labels, 300, np.random.default_rng([4, 1]))
    np.testing.assert_array_equal(one, two)
    assert not np.array_equal(one, other)


def test_pearson_rows_matches_scipy_and_zero_for_constant_rows():
    x = RNG.normal(size=(6, 9))
    y = RNG.normal(size=(6, 9))
    x[2] = 0.3  # constant prediction
    y[4] = 1 / 3  # constant labels
    x[5, :2] = x[5, 0]  # ties
    got = S.pearson_rows(x, y)
    np.testing.assert_allclose(got, [_pearson_ref(a, b) for a, b in zip(x, y)], atol=1e-12)


def test_overall_diffs_is_the_difference_of_course_scores_per_resample():
    n, reps, tasks = 30, 40, ("sst", "para", "sts")
    data = {t: _fake_task(t, n, 4) for t in tasks}
    drawn, diffs = {}, {}
    for t in tasks:
        labels, preds = data[t]
        rng = RecordingRng([1, len(drawn)])
        diffs[t] = S.bootstrap_diffs(t, preds[:2], preds[2:], labels, reps, rng)
        drawn[t] = np.concatenate(rng.drawn)
    ref = []
    for k in range(reps):
        score = {}
        for t in tasks:
            labels, preds = data[t]
            row = drawn[t][k]
            f = (lambda p: _pearson_ref(p[row], labels[row])) if t == "sts" else (
                lambda p: skm.accuracy_score(labels[row], p[row]))
            score[t] = [f(p) for p in preds]
        overall = [_course_overall(score["sst"][j], score["para"][j], score["sts"][j]) for j in range(4)]
        ref.append(np.mean(overall[2:]) - np.mean(overall[:2]))
    np.testing.assert_allclose(S.overall_diffs(diffs), ref, atol=1e-12)
    two = {t: diffs[t] for t in ("sst", "sts")}  # two tasks: mean of acc and (r + 1) / 2
    np.testing.assert_allclose(S.overall_diffs(two), (diffs["sst"] + diffs["sts"] / 2) / 2, atol=1e-15)


@pytest.mark.parametrize("level", [0.95, 0.9, 0.5])
def test_percentile_interval_is_type7_at_the_tails(level):
    for diffs in (RNG.normal(size=10_000), RNG.normal(size=37), np.array([0.25]), np.array([-1.0, 2.0]),
                  np.repeat([0.0, 0.01, 0.02], [5, 90, 5]), np.zeros(20)):
        lo, hi = S.interval(diffs, level)
        tail = (1 - level) / 2
        assert lo == pytest.approx(_type7_quantile(diffs, tail), abs=1e-15)
        assert hi == pytest.approx(_type7_quantile(diffs, 1 - tail), abs=1e-15)
    # the 2.5th and 97.5th percentiles of 0..1000: 25 and 975 ((1 - 0.95) / 2 rounds to 0.025000000000000022)
    assert S.interval(np.arange(1001.0)) == pytest.approx((25.0, 975.0), rel=1e-12)


def test_each_tasks_resamples_do_not_depend_on_the_other_tasks(monkeypatch):
    """Was a bug (training/results/statistics.py:241,251): the comment says 'one stream per task: adding a task does not
    change the others' resamples', but the stream is default_rng([seed, k]) with k the task's position in the list
    of tasks the runs share: para's resamples (and so its interval) differ between runs with sst and runs without.
    Fixed: the stream keyed by the task itself (k = list(METRIC).index(task))."""
    n = 50
    data = {t: _fake_task(t, n, 2) for t in ("sst", "para", "sts")}
    monkeypatch.setattr(S, "load_task_file", lambda path, task, labelled=True: SimpleNamespace(
        examples=[SimpleNamespace(id=str(i), label=y) for i, y in enumerate(data[task][0])]))
    monkeypatch.setattr(S, "dev_predictions", lambda run, task, ids: data[task][1][run.k])
    monkeypatch.setattr(S, "check_predictions", lambda *args: None)
    pairs = [(SimpleNamespace(k=0), SimpleNamespace(k=1))]
    alone = S.bootstrap(pairs, S.Path("."), ["para", "sts"], 200, 0)
    with_sst = S.bootstrap(pairs, S.Path("."), ["sst", "para", "sts"], 200, 0)
    np.testing.assert_array_equal(alone["para_acc"], with_sst["para_acc"])
    np.testing.assert_array_equal(alone["sts_pearson"], with_sst["sts_pearson"])


# ----------------------------------------------------------------------------- the arms study's statistics


@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_t_interval_matches_scipy(n):
    for level in (0.95, 0.9):
        x = RNG.normal(0.7, 0.02, n)
        lo, hi = arms.t_interval(x, level)
        ref = stats.t.interval(level, n - 1, loc=x.mean(), scale=stats.sem(x))
        assert (lo, hi) == pytest.approx(ref, rel=1e-12)
    assert all(map(math.isnan, arms.t_interval([0.5])))
    assert arms.t_interval([0.5, 0.5, 0.5]) == pytest.approx((0.5, 0.5))


@pytest.mark.parametrize("n", [2, 3, 5, 20])
def test_sd_interval_is_the_chi_square_interval(n):
    x = RNG.normal(0, 3, n)
    s2 = pystats.variance(x)
    lo, hi = arms.sd_interval(x)
    assert lo == pytest.approx(math.sqrt((n - 1) * s2 / stats.chi2.isf(0.025, n - 1)), rel=1e-10)
    assert hi == pytest.approx(math.sqrt((n - 1) * s2 / stats.chi2.isf(0.975, n - 1)), rel=1e-10)
    assert lo < math.sqrt(s2) < hi
    assert all(map(math.isnan, arms.sd_interval([1.0])))


def _pitman_morgan_t(f, r, n):
    """Pitman (1939) / Morgan (1939): t = (F - 1) sqrt(n - 2) / (2 sqrt(F (1 - r^2))), n - 2 df."""
    return (f - 1) * math.sqrt(n - 2) / (2 * math.sqrt(f * (1 - r * r)))


@pytest.mark.parametrize("n", [3, 5, 8, 30])
def test_spread_ratio_is_pitman_morgan(n):
    for scale in (0.5, 1.0, 3.0):
        a = RNG.normal(0, 1, n)
        b = 0.4 * a + RNG.normal(0, scale, n)
        f, r = pystats.variance(b) / pystats.variance(a), float(stats.pearsonr(a, b).statistic)
        got = arms.spread_ratio(a, b)
        assert got["ratio"] == pytest.approx(pystats.stdev(b) / pystats.stdev(a), rel=1e-12)
        t = _pitman_morgan_t(f, r, n)
        assert got["p"] == pytest.approx(2 * stats.t.sf(abs(t), n - 2), rel=1e-8)
        # the interval: the lambdas whose test of b / sqrt(lambda) against a is not rejected at 5%
        crit = stats.t.isf(0.025, n - 2)
        g = lambda lam: abs(_pitman_morgan_t(f / lam, r, n)) - crit
        lo, hi = optimize.brentq(g, f * 1e-12, f, xtol=1e-15), optimize.brentq(g, f, f * 1e12, xtol=1e-15)
        assert got["ratio_ci"] == pytest.approx((math.sqrt(lo), math.sqrt(hi)), rel=1e-8)


def test_spread_ratio_edge_cases():
    nan = arms.spread_ratio([0.1, 0.2], [0.3, 0.5])  # n < 3
    assert math.isnan(nan["ratio"]) and math.isnan(nan["p"])
    const = arms.spread_ratio([0.5, 0.5, 0.5], [0.1, 0.2, 0.3])
    assert math.isnan(const["ratio"]) and math.isnan(const["p"])
    # b = a + 1/8, exact in binary: the same spread, no test (arms.py's convention)
    shifted = arms.spread_ratio([0.125, 0.375, 0.25, 0.75], [0.25, 0.5, 0.375, 0.875])
    assert shifted["ratio"] == 1.0 and math.isnan(shifted["p"])


def test_spread_ratio_of_a_shift_or_a_constant_up_to_rounding():
    """Was a bug (minor; training/experiments/study/arms.py:64,67): the guards compare floats exactly. b = a + 0.1 is a
    shift (equal variances: the classical Pitman-Morgan t is (F - 1) / sqrt(1 - r^2) = 0/0), but b - a carries
    1e-17 rounding, so ptp(b - a) != 0 and the test runs on corr(a + b, rounding noise): p 0.69 here, any value
    in general, against the nan of an exact shift. Ten copies of 0.3 have std 5.6e-17, not 0, so a
    constant reference gives an sd ratio of 2.3e15 and p 0 instead of nan. Fixed: the SAME tolerance that
    statistics.paired_tests uses (np.ptp(x) <= SAME * max(1, max|x|)) for both guards."""
    a = [0.1, 0.3, 0.2, 0.6]
    b = [0.2, 0.4, 0.3, 0.7]
    assert pystats.stdev(b) / pystats.stdev(a) == pytest.approx(1.0, abs=1e-15)
    shifted = arms.spread_ratio(a, b)
    assert shifted["ratio"] == pytest.approx(1.0) and math.isnan(shifted["p"])
    const = arms.spread_ratio(np.full(10, 0.3), np.linspace(0.1, 0.5, 10))
    assert math.isnan(const["ratio"]) and math.isnan(const["p"])


@pytest.mark.parametrize("ps", [[0.01, 0.04, 0.03, 0.005], [0.5, 0.5, 0.5], [0.01, 0.01, 0.2, 0.9],
                                [0.3, math.nan, 0.01, 0.04], [0.0, 1.0], [0.049], [], [math.nan],
                                [0.02, 0.021, 0.022, 0.023, 0.6]])
def test_holm_is_the_step_down_rule(ps):
    got = arms.holm(ps)
    ref = _holm_ref(ps)
    assert len(got) == len(ps)
    for g, r, p in zip(got, ref, ps):
        if math.isnan(p):
            assert math.isnan(g)
            continue
        assert g == pytest.approx(r, rel=1e-14)
        m = sum(not math.isnan(q) for q in ps)
        assert p <= g <= min(1.0, m * p) + 1e-15  # between the raw p and Bonferroni's, capped at 1
    real = sorted((p, g) for p, g in zip(ps, got) if not math.isnan(p))
    assert all(x[1] <= y[1] for x, y in zip(real, real[1:]))  # monotone in the raw p's order


def test_holm_random_families():
    for m in (1, 2, 5, 20):
        for _ in range(20):
            ps = list(RNG.uniform(0, 0.2, m) ** 2)
            assert arms.holm(ps) == pytest.approx(_holm_ref(ps), rel=1e-14)


def test_bootstrap_p_counts_each_side():
    for diffs in (RNG.normal(0.01, 0.01, 2000), RNG.normal(0, 1, 999), np.zeros(50), np.ones(10), -np.ones(10),
                  np.array([-1.0, 0.0, 1.0, 2.0]), np.array([0.0, 1.0, 2.0])):
        below = sum(1 for x in diffs if x <= 0) / len(diffs)
        above = sum(1 for x in diffs if x >= 0) / len(diffs)
        assert arms.bootstrap_p(diffs) == pytest.approx(min(1.0, 2 * min(below, above)), abs=1e-15)


@pytest.mark.parametrize("na,nb", [(2, 2), (3, 5), (5, 5), (10, 4)])
def test_welch_matches_scipy(na, nb):
    a, b = RNG.normal(0.01, 0.01, na), RNG.normal(0.0, 0.03, nb)
    diff, ci, p = arms.welch(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert diff == pytest.approx(a.mean() - b.mean(), rel=1e-12)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)
    assert ci == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-9)
    d2, ci2, p2 = arms.welch([0.1, 0.1], [0.2, 0.2])  # no spread on either side
    assert d2 == pytest.approx(-0.1) and ci2 == pytest.approx((-0.1, -0.1)) and p2 == 0.0


def test_normalised_between_trivial_and_full():
    assert arms.normalised(0.7, 0.4, 0.8) == pytest.approx((0.7 - 0.4) / (0.8 - 0.4))
    assert arms.normalised(0.4, 0.4, 0.8) == 0.0 and arms.normalised(0.8, 0.4, 0.8) == 1.0
    assert math.isnan(arms.normalised(0.5, 0.5, 0.5))


def _twin_ref(at_last, have, planned):
    """Enumerate every outcome of the missing runs: due when every outcome gives a majority, not due when none
    does, undecided otherwise ("most": more than half of the planned runs)."""
    missing = planned - have
    outcomes = {2 * (at_last + extra) > planned for extra in range(missing + 1)}
    return outcomes.pop() if len(outcomes) == 1 else None


def test_convergence_rule_majority_and_undecided():
    for planned in range(1, 7):
        for have in range(0, planned + 1):
            for at_last in range(0, have + 1):
                recipe = SimpleNamespace(fixed_budget=False, points=[{"label": "p", "depth": 1, "arm": ""}],
                                         seeds=list(range(planned)), options=lambda point: {"epochs": 6},
                                         depth=lambda d: d)
                rows = [{"label": "p", "metric": "overall", "best_epochs": [5] * have, "at_last": at_last}]
                want = _twin_ref(at_last, have, planned)
                assert arms.twin_verdicts(recipe, rows) == [("p", want)], (planned, have, at_last)


def test_paired_bootstrap_pairs_and_gives_the_course_overall():
    n, reps = 40, 300
    data = {t: _fake_task(t, n, 3) for t in ("sst", "sts")}
    labels = {t: d[0] for t, d in data.items()}
    runs = [{t: d[1][j] for t, d in data.items()} for j in range(3)]
    same = arms.paired_bootstrap(runs, [dict(r) for r in runs], labels, reps, 5)
    assert all(np.all(v == 0) for v in same.values())
    one = arms.paired_bootstrap(runs[:1], runs[1:], labels, reps, 5)
    two = arms.paired_bootstrap(runs[:1], runs[1:], labels, reps, 5)
    assert set(one) == {"sst_acc", "sts_pearson", "overall"}
    for k in one:
        np.testing.assert_array_equal(one[k], two[k])  # seeded: gap_changes pairs two gaps' replicates by this
    np.testing.assert_allclose(one["overall"], (one["sst_acc"] + one["sts_pearson"] / 2) / 2, atol=1e-15)


# ----------------------------------------------------------------------------- summaries and baselines


@pytest.mark.parametrize("values", [[0.7], [0.7, 0.72], [3, 1, 2], [0.5, 0.5, 0.5, 0.5], list(RNG.uniform(size=9)),
                                    [1, 2, 3, 10]])
def test_summarize_matches_numpy(values):
    s = summarize(values)
    x = np.asarray(values, float)
    assert s["seeds"] == len(x)
    assert s["mean"] == pytest.approx(np.mean(x), rel=1e-14)
    assert s["median"] == pytest.approx(np.median(x), rel=1e-14)
    assert s["min"] == np.min(x) and s["max"] == np.max(x)
    if len(x) == 1:
        assert math.isnan(s["std"])
    else:
        assert s["std"] == pytest.approx(np.std(x, ddof=1), rel=1e-12, abs=1e-18)


def test_summarize_with_a_nan_value():
    """Was a bug (minor; training/results/summary.py:25): sorted() does not order a nan, so with one nan among the
    values min, max and median are whatever sits at the ends / middle: summarize([1, nan, 0]) gives min 1.0 and
    max 0.0. numpy propagates the nan. (A nan score can reach a sweep record through metrics.score, above.)"""
    for values in ([1.0, math.nan, 0.0], [math.nan, 1.0, 2.0]):
        s = summarize(values)
        for key, ref in (("mean", np.mean), ("median", np.median), ("min", np.min), ("max", np.max)):
            assert math.isnan(s[key]) and math.isnan(ref(values)), key


def test_trivial_scores_are_the_majority_classifier():
    for _ in range(10):
        train = {"sst": list(RNG.integers(0, 5, 30).astype(float)), "para": list(RNG.integers(0, 2, 21).astype(float))}
        dev = {"sst": list(RNG.integers(0, 5, 25).astype(float)), "para": list(RNG.integers(0, 2, 17).astype(float)),
               "sts": list(RNG.uniform(0, 5, 9))}
        got = trivial_scores({**train, "sts": []}, dev)
        ref = {}
        for t in ("sst", "para"):
            clf = DummyClassifier(strategy="most_frequent").fit(np.zeros((len(train[t]), 1)), train[t])
            ref[t] = skm.accuracy_score(dev[t], clf.predict(np.zeros((len(dev[t]), 1))))
            assert got[M.METRIC[t]] == pytest.approx(ref[t], abs=1e-15)
        assert got["sts_pearson"] == 0.0
        assert got["overall"] == pytest.approx(_course_overall(ref["sst"], ref["para"], 0.0))
    # a tie takes the smallest label, as sklearn's DummyClassifier does
    assert trivial_scores({"para": [0.0, 1.0]}, {"para": [0.0, 0.0, 1.0]})["para_acc"] == pytest.approx(2 / 3)


def test_best_threshold_reaches_the_best_accuracy_of_any_threshold():
    for n in (1, 2, 5, 40):
        for _ in range(10):
            cos = np.round(RNG.uniform(-1, 1, n), 1)  # ties among the cosines
            labels = RNG.integers(0, 2, n).astype(float)
            t = best_threshold(cos, labels)
            brute = max(np.mean((cos >= c) == labels) for c in np.concatenate([cos, [np.inf, -np.inf]]))
            assert np.mean((cos >= t) == labels) == pytest.approx(brute)


def test_freezing_percentile_is_numpys_linear_percentile():
    for values in ([3.0], [1.0, 2.0], [3.0, 1.0, 2.0], list(RNG.normal(size=11)), [2.0, 2.0, 9.0, 9.0]):
        for p in (0.0, 1.0, 25.0, 33.3, 50.0, 90.0, 99.9, 100.0):
            assert freeze_percentile(values, p) == pytest.approx(np.percentile(values, p), rel=1e-12, abs=1e-15)


# ----------------------------------------------------------------------------- training.analyze


def test_analyze_sst_numbers_match_sklearn():
    for gold, pred in ((RNG.integers(0, 5, 60), RNG.integers(0, 4, 60)),  # class 4 never predicted
                       (np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1]))):  # classes 2-4 absent altogether
        gold, pred = gold.astype(float), pred.astype(float)
        r = A.sst_numbers(gold, pred)
        labels = list(range(5))
        np.testing.assert_array_equal(r["confusion"], skm.confusion_matrix(gold, pred, labels=labels))
        p, rec, f, sup = skm.precision_recall_fscore_support(gold, pred, labels=labels, zero_division=0)
        np.testing.assert_allclose([c["precision"] for c in r["classes"]], p, atol=1e-15)
        np.testing.assert_allclose([c["recall"] for c in r["classes"]], rec, atol=1e-15)
        np.testing.assert_allclose([c["f1"] for c in r["classes"]], f, atol=1e-15)
        assert [c["support"] for c in r["classes"]] == list(sup)
        for key, avg in (("macro_precision", skm.precision_score), ("macro_recall", skm.recall_score),
                         ("macro_f1", skm.f1_score)):
            assert r[key] == pytest.approx(avg(gold, pred, labels=labels, average="macro", zero_division=0))
        assert r["accuracy"] == pytest.approx(skm.accuracy_score(gold, pred))


def test_analyze_para_numbers_match_sklearn():
    for gold, pred in ((RNG.integers(0, 2, 50), RNG.integers(0, 2, 50)), (RNG.integers(0, 2, 20), np.zeros(20)),
                       (np.zeros(6), np.zeros(6))):
        gold, pred = gold.astype(float), pred.astype(float)
        r = A.para_numbers(gold, pred)
        kw = {"pos_label": 1, "zero_division": 0, "labels": [0, 1]}
        assert r["precision"] == pytest.approx(skm.precision_score(gold, pred, **kw))
        assert r["recall"] == pytest.approx(skm.recall_score(gold, pred, **kw))
        assert r["f1"] == pytest.approx(skm.f1_score(gold, pred, **kw))
        assert r["accuracy"] == pytest.approx(skm.accuracy_score(gold, pred))
        np.testing.assert_array_equal(r["confusion"], skm.confusion_matrix(gold, pred, labels=[0, 1]))


def test_analyze_sts_numbers_match_scipy():
    for n in (2, 3, 30):
        gold, pred = RNG.uniform(0, 5, n), RNG.uniform(0, 5, n)
        pred[: n // 2] = np.round(pred[: n // 2])  # ties for the ranks
        r = A.sts_numbers(gold, pred)
        assert r["pearson"] == pytest.approx(stats.pearsonr(pred, gold).statistic, abs=1e-12)
        assert r["spearman"] == pytest.approx(stats.spearmanr(pred, gold).statistic, abs=1e-12)
        assert r["mean_absolute_error"] == pytest.approx(skm.mean_absolute_error(gold, pred))
    x = np.array([1, 2, 2, 3, 3, 3, 0.5, 7, 7])
    np.testing.assert_array_equal(A.average_ranks(x), stats.rankdata(x))
    assert A.pearson(np.array([1.0]), np.array([2.0])) is None
    assert A.pearson(np.full(5, 2.0), np.arange(5.0)) is None


@pytest.mark.parametrize("c", [0.3, 1 / 3])
def test_analyze_pearson_of_a_constant_side_is_none(c):
    """Was a bug (minor; training/analyze.py:89-91): the docstring says None for a constant side; ten copies of 0.3
    leave x - x.mean() at about 5e-17, so denom > 0 and a rounding-noise correlation (0.0 here) is reported where
    scipy says undefined. Fixed: np.ptp(x) == 0 or np.ptp(y) == 0 instead of denom > 0."""
    labels = np.array([0.0, 1, 2, 3, 4, 5, 1, 2, 3, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(stats.pearsonr(np.full(10, c), labels).statistic)
    assert A.pearson(np.full(10, c), labels) is None
    assert A.spearman(np.full(10, c), labels) is None
