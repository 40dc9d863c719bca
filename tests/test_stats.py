"""training.experiments.stats against formulas written out: the paired t statistic and its p (closed form for 2
degrees of freedom, the incomplete beta function otherwise), exact Wilcoxon p-values by counting
sign patterns, the bootstrap against a binomial law and against exact enumeration of every
resample, and the command on constructed run directories."""
import itertools
import json
import math

import numpy as np
import pytest
from scipy import special, stats

from training.experiments.stats import main as stats_main
from training.inference.formats import write_predictions
from training.results import statistics as S

# ----------------------------------------------------------------------------- over seeds


def test_mean_sd_by_hand():
    m, sd = S.mean_sd([0.50, 0.52, 0.51])
    assert m == pytest.approx(0.51, rel=1e-14)
    assert sd == pytest.approx(0.01, rel=1e-12)  # sqrt((0.01^2 + 0.01^2 + 0) / (3 - 1))
    assert math.isnan(S.mean_sd([0.5])[1])


def test_paired_t_three_seeds_by_hand():
    a, b = [0.50, 0.52, 0.49], [0.53, 0.54, 0.50]
    r = S.paired_tests(a, b)
    # d = (0.03, 0.02, 0.01): mean 0.02, sd 0.01, t = 0.02 / (0.01 / sqrt 3) = 2 sqrt 3
    assert r["diff"] == pytest.approx(0.02, rel=1e-12)
    assert r["diff_sd"] == pytest.approx(0.01, rel=1e-9)
    assert r["t"] == pytest.approx(2 * math.sqrt(3), rel=1e-9)
    # Student's t with 2 degrees of freedom: two-sided p = 1 - |t| / sqrt(t^2 + 2)
    assert r["t_p"] == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14), rel=1e-9)
    # Wilcoxon, exact: all 3 differences positive, 1 of the 2^3 sign patterns as extreme each side
    assert r["wilcoxon_p"] == pytest.approx(2 / 8)


def test_paired_t_five_seeds_by_hand():
    a = np.array([0.50, 0.51, 0.49, 0.52, 0.50])
    d = np.array([0.01, 0.02, -0.005, 0.03, 0.04])
    r = S.paired_tests(a, a + d)
    n, mean = 5, d.sum() / 5
    sd = math.sqrt(((d - mean) ** 2).sum() / (n - 1))
    t = mean / (sd / math.sqrt(n))
    assert r["t"] == pytest.approx(t, rel=1e-9)
    # two-sided p = I_{df / (df + t^2)}(df / 2, 1 / 2), the regularised incomplete beta function
    assert r["t_p"] == pytest.approx(special.betainc(2.0, 0.5, 4 / (4 + t * t)), rel=1e-9)
    # |d| ranks: 0.005 -> 1 (the negative one), 0.01 -> 2, ... so W- = 1. Sign patterns of 5 ranks
    # with a negative-rank sum <= 1: none negative, or rank 1 alone: 2 of 32, doubled for two sides.
    assert r["wilcoxon_p"] == pytest.approx(2 * 2 / 32)


def test_paired_degenerate_cases():
    r = S.paired_tests([0.5, 0.6], [0.5, 0.6])
    assert r["diff"] == 0 and math.isnan(r["t"]) and math.isnan(r["wilcoxon_p"])
    r = S.paired_tests([0.5, 0.6], [0.6, 0.7])  # 0.1 and 0.09999999999999998: the same gain
    assert r["t"] == math.inf and r["t_p"] == 0.0
    r = S.paired_tests([0.6, 0.7, 0.5], [0.5, 0.6, 0.4])
    assert r["t"] == -math.inf and r["t_p"] == 0.0
    assert math.isnan(S.paired_tests([0.5], [0.6])["t_p"])


# ----------------------------------------------------------------------------- over dev examples


def test_pearson_rows_against_corrcoef():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 9)), rng.normal(size=(6, 9))
    x[2] = 1.5  # a constant row: 0, as evaluate.score scores it
    y[4] = 0.1
    got = S.pearson_rows(x, y)
    want = [0.0 if k in (2, 4) else np.corrcoef(x[k], y[k])[0, 1] for k in range(6)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_bootstrap_accuracy_is_binomial():
    """B is right on 40 more of 400 examples than A and agrees with it everywhere else: on a resample
    the difference is (resampled draws among those 40) / 400 ~ Binomial(400, 0.1) / 400."""
    n, reps = 400, 20_000
    labels = np.arange(n) % 5.0
    a = np.where(np.arange(n) < 200, labels, (labels + 1) % 5)
    b = np.where(np.arange(n) < 240, labels, (labels + 1) % 5)
    d = S.bootstrap_diffs("sst", [a], [b], labels, reps, np.random.default_rng(1))
    assert d.shape == (reps,)
    sd = math.sqrt(0.1 * 0.9 / n)
    assert d.mean() == pytest.approx(0.1, abs=4 * sd / math.sqrt(reps))
    assert d.std() == pytest.approx(sd, rel=0.03)
    lo, hi = S.interval(d)
    assert lo == pytest.approx(stats.binom.ppf(0.025, n, 0.1) / n, abs=1.01 / n)
    assert hi == pytest.approx(stats.binom.ppf(0.975, n, 0.1) / n, abs=1.01 / n)
    same = S.bootstrap_diffs("sst", [a], [a.copy()], labels, 500, np.random.default_rng(2))
    assert (same == 0).all() and S.interval(same) == (0.0, 0.0)


def _exact(metric, n):
    """Every one of the n^n equally likely resamples."""
    idx = np.array(list(itertools.product(range(n), repeat=n)))
    return metric(idx)


def _pearson_or_zero(x, y):
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return np.corrcoef(x, y)[0, 1]


def test_bootstrap_pearson_against_exact_enumeration():
    labels = np.array([0.5, 1.8, 2.2, 3.9, 4.6])
    a = np.array([1.0, 1.2, 3.0, 3.1, 4.0])
    b = np.array([0.7, 2.0, 2.1, 4.2, 4.4])
    exact = _exact(lambda idx: np.array([_pearson_or_zero(b[i], labels[i]) - _pearson_or_zero(a[i], labels[i])
                                         for i in idx]), 5)
    reps = 40_000
    d = S.bootstrap_diffs("sts", [a], [b], labels, reps, np.random.default_rng(3))
    assert d.mean() == pytest.approx(exact.mean(), abs=4 * exact.std() / math.sqrt(reps))
    assert d.std() == pytest.approx(exact.std(), rel=0.03)
    assert np.mean(d <= 0) == pytest.approx(np.mean(exact <= 0), abs=4 * math.sqrt(0.25 / reps))


def test_bootstrap_group_means_against_exact_enumeration():
    """Two runs per group: the difference of the groups' mean accuracies, each run scored on the
    same resampled examples."""
    labels = np.array([0, 1, 1, 0, 1, 0], dtype=float)
    a = [np.array([0, 1, 0, 0, 0, 1.0]), np.array([1, 1, 1, 0, 0, 0.0])]
    b = [np.array([0, 1, 1, 0, 1, 1.0]), np.array([0, 0, 1, 0, 1, 0.0])]

    def diff(idx):
        acc = lambda p: (p[idx] == labels[idx]).mean(axis=1)
        return (acc(b[0]) + acc(b[1])) / 2 - (acc(a[0]) + acc(a[1])) / 2

    exact = _exact(diff, 6)
    reps = 40_000
    d = S.bootstrap_diffs("para", a, b, labels, reps, np.random.default_rng(4))
    assert d.mean() == pytest.approx(exact.mean(), abs=4 * exact.std() / math.sqrt(reps))
    assert d.std() == pytest.approx(exact.std(), rel=0.03)


def test_overall_difference_is_the_course_formula():
    d = {"sst": np.array([0.01, 0.02]), "para": np.array([0.03, -0.01]), "sts": np.array([0.04, 0.10])}
    # overall = (sst + para + (r + 1) / 2) / 3, so its difference is (d_sst + d_para + d_r / 2) / 3
    np.testing.assert_allclose(S.overall_diffs(d), [(0.01 + 0.03 + 0.02) / 3, (0.02 - 0.01 + 0.05) / 3], rtol=1e-12)


def test_resamples_come_in_chunks_that_add_up(monkeypatch):
    monkeypatch.setattr(S, "MAX_CHUNK_CELLS", 50)
    chunks = list(S.resamples(7, 23, np.random.default_rng(0)))
    assert [c.shape for c in chunks] == [(7, 7), (7, 7), (7, 7), (2, 7)]
    assert all(c.min() >= 0 and c.max() < 7 for c in chunks)


# ----------------------------------------------------------------------------- the command


N = {"sst": 60, "para": 80, "sts": 40}


def write_dev(data):
    data.mkdir()
    rng = np.random.default_rng(11)
    labels = {"sst": rng.integers(0, 5, N["sst"]).astype(float), "para": rng.integers(0, 2, N["para"]).astype(float),
              "sts": np.round(rng.uniform(0, 5, N["sts"]), 2)}
    ids = {t: [f"{t}{i:03d}" for i in range(N[t])] for t in N}
    (data / "ids-sst-dev.csv").write_text("\tid\tsentence\tsentiment\n" + "".join(
        f"{i}\t{ids['sst'][i]}\tthe cat {i}\t{int(v)}\n" for i, v in enumerate(labels["sst"])))
    (data / "quora-dev.csv").write_text("\tid\tsentence1\tsentence2\tis_duplicate\n" + "".join(
        f"{i}\t{ids['para'][i]}\ta {i}\tb {i}\t{v}\n" for i, v in enumerate(labels["para"])))
    (data / "sts-dev.csv").write_text("\tid\tsentence1\tsentence2\tsimilarity\n" + "".join(
        f"{i}\t{ids['sts'][i]}\ta {i}\tb {i}\t{v}\n" for i, v in enumerate(labels["sts"])))
    return labels, ids


def fake_predictions(labels, seed, wrong, noise):
    """Predictions with `wrong` (a fraction) of the sst and para labels wrong and the similarities off
    by `noise` * N(0, 1), rounded to the 4 decimals of the course's files."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in ("sst", "para"):
        bad = rng.permutation(N[t])[: round(wrong * N[t])]
        p = labels[t].copy()
        p[bad] = (p[bad] + 1) % (5 if t == "sst" else 2)
        out[t] = p
    out["sts"] = np.round(np.clip(labels["sts"] + noise * rng.normal(size=N["sts"]), 0, 5), 4)
    return out


def hand_metrics(preds, labels):
    m = {"sst_acc": float(np.mean(preds["sst"] == labels["sst"])),
         "para_acc": float(np.mean(preds["para"] == labels["para"])),
         "sts_pearson": float(np.corrcoef(preds["sts"], labels["sts"])[0, 1])}
    m["overall"] = (m["sst_acc"] + m["para_acc"] + (m["sts_pearson"] + 1) / 2) / 3
    return m


def make_run(path, seed, preds, labels, ids):
    (path / "predictions").mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"seed": seed, "predictions_dir": "predictions"}))
    best = hand_metrics(preds, labels)
    worse = {k: v - 0.05 for k, v in best.items()}  # an earlier and a later evaluation, both worse
    records = [{"epoch": 0, "step": 3, "loss_sst": 1.0},
               {"epoch": 0, "step": 5, **{f"dev_{k}": v for k, v in worse.items()}},
               {"epoch": 1, "step": 10, **{f"dev_{k}": v for k, v in best.items()}},
               {"epoch": 2, "step": 15, **{f"dev_{k}": v for k, v in worse.items()}}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for t in N:
        write_predictions(path / "predictions" / f"{t}-dev-output.csv", t, ids[t], preds[t])
    return best


@pytest.fixture
def recipes(tmp_path):
    labels, ids = write_dev(tmp_path / "data")
    groups = {"a": {}, "b": {}, "c": {}}
    for seed in (1, 2, 3):
        # a: 40% wrong; b: 20% wrong, better similarities; c: like a, other errors
        for g, (wrong, step, noise, shift) in {"a": (0.4, 0.02, 1.0, 0), "b": (0.2, 0.03, 0.5, 100),
                                               "c": (0.4, 0.02, 1.0, 200)}.items():
            preds = fake_predictions(labels, seed + shift, wrong + step * seed, noise)
            groups[g][seed] = (tmp_path / f"{g}-s{seed}", make_run(tmp_path / f"{g}-s{seed}", seed, preds, labels, ids))
    return tmp_path, groups


def _run_stats(capsys, *argv):
    assert stats_main([*map(str, argv)]) == 0
    return capsys.readouterr().out


def test_command_on_constructed_runs(recipes, capsys):
    root, groups = recipes
    a = [groups["a"][s][0] for s in (1, 2, 3)]
    b = [groups["b"][s][0] for s in (3, 1, 2)]  # given in another order: paired by seed
    out = _run_stats(capsys, *a, "--vs", *b, "--names", "plain", "better", "--data-dir", root / "data",
                     "--bootstrap", "4000", "--json", root / "rows.json")
    rows = {r["metric"]: r for r in json.loads((root / "rows.json").read_text())}
    assert "| dev metric | A: plain (3 seeds) | B: better |" in out
    for m in S.METRICS:
        va = np.array([groups["a"][s][1][m] for s in (1, 2, 3)])
        vb = np.array([groups["b"][s][1][m] for s in (1, 2, 3)])
        d = vb - va
        assert rows[m]["mean_a"] == pytest.approx(va.mean(), rel=1e-12)
        assert rows[m]["sd_b"] == pytest.approx(vb.std(ddof=1), rel=1e-9)
        t = d.mean() / (d.std(ddof=1) / math.sqrt(3))
        assert rows[m]["t"] == pytest.approx(t, rel=1e-9)
        assert rows[m]["t_p"] == pytest.approx(1 - abs(t) / math.sqrt(t * t + 2), rel=1e-9)
        assert rows[m]["boot_lo"] < d.mean() < rows[m]["boot_hi"]
        assert rows[m]["verdict"] == ("B > A" if rows[m]["t_p"] < 0.05 and rows[m]["boot_lo"] > 0 else "no claim")
    assert rows["sst_acc"]["verdict"] == "B > A"  # 20 points better on every seed
    assert f"| sst_acc | {rows['sst_acc']['mean_a']:.4f} ± " in out


def test_command_null_comparison_claims_nothing(recipes, capsys):
    root, groups = recipes
    out = _run_stats(capsys, *[groups["a"][s][0] for s in (1, 2, 3)], "--vs", *[groups["c"][s][0] for s in (1, 2, 3)],
                     "--data-dir", root / "data", "--bootstrap", "2000", "--json", root / "null.json")
    rows = json.loads((root / "null.json").read_text())
    assert [r["verdict"] for r in rows if r["metric"] != "sts_pearson"] == ["no claim"] * 3
    assert all(r["boot_lo"] < 0 < r["boot_hi"] for r in rows if r["metric"] != "sts_pearson")
    assert "no claim" in out


def test_command_without_data_dir_has_no_bootstrap(recipes, capsys):
    root, groups = recipes
    out = _run_stats(capsys, groups["a"][1][0], groups["a"][2][0], "--vs", groups["b"][1][0], groups["b"][2][0],
                     "--json", root / "nob.json")
    rows = json.loads((root / "nob.json").read_text())
    assert all("boot_lo" not in r for r in rows) and "| - |" in out


def _error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        stats_main([*map(str, argv)])
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_input_is_one_line_exit_2(recipes, capsys):
    root, groups = recipes
    a = [groups["a"][s][0] for s in (1, 2, 3)]
    b = [groups["b"][s][0] for s in (1, 2, 3)]
    assert "the groups' seeds differ ([1, 2, 3] and [1, 2])" in _error(capsys, *a, "--vs", *b[:2])
    assert f"{root / 'nowhere'}: no metrics.jsonl" in _error(capsys, *a, "--vs", *b[:2], root / "nowhere")
    assert "--bootstrap must be >= 1" in _error(capsys, *a, "--vs", *b, "--bootstrap", "0")
    assert "--data-dir" in _error(capsys, *a, "--vs", *b, "--data-dir", root / "missing")
    # prediction files that are not the ones behind the run's best record
    f = b[1] / "predictions" / "sst-dev-output.csv"
    lines = f.read_text().splitlines()
    i, pred = lines[1].split(" , ")
    lines[1] = f"{i} , {(int(pred) + 1) % 5}"
    f.write_text("\n".join(lines) + "\n")
    assert "prediction files of another run?" in _error(capsys, *a, "--vs", *b, "--data-dir", root / "data")
    (b[2] / "predictions" / "sts-dev-output.csv").unlink()
    assert "no sts-dev-output.csv in" in _error(capsys, *a, "--vs", b[0], b[2], groups["b"][2][0].parent / "c-s2",
                                                "--pair-by-order", "--data-dir", root / "data")


def test_an_ensembles_prediction_set_is_compared_by_its_files(recipes, capsys):
    """A folder of dev prediction files with a manifest (training.ensemble's) stands for a run of no seed:
    paired by order, its metrics the manifest's, checked against its files."""
    from training.inference.predictions import write_prediction_set
    root, groups = recipes
    labels, ids = write_dev(root / "data2")  # the same seeded labels and ids as the fixture's data/
    preds = fake_predictions(labels, 7, 0.1, 0.3)
    folder = root / "ens"
    write_prediction_set(folder, {(t, "dev"): (ids[t], preds[t]) for t in N},
                         {"ensemble": ["x", "y"], "dev_metrics": hand_metrics(preds, labels)})
    member = groups["a"][1]
    _run_stats(capsys, member[0], "--vs", folder, "--pair-by-order", "--data-dir", root / "data",
               "--json", root / "ens.json")
    rows = {r["metric"]: r for r in json.loads((root / "ens.json").read_text())}
    for m, v in hand_metrics(preds, labels).items():
        assert rows[m]["mean_b"] == pytest.approx(v, rel=1e-12)
        assert rows[m]["boot_lo"] < v - member[1][m] < rows[m]["boot_hi"]
    assert rows["sst_acc"]["boot_lo"] > 0  # 10% wrong against 42%: the interval says so
    bad = root / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{}")
    assert f"{bad / 'manifest.json'}: no dev_metrics" in _error(capsys, member[0], "--vs", bad, "--pair-by-order")


# ----------------------------------------------------------------------------- equivalence (TOST)

@pytest.mark.parametrize("shift, margin", [(0.001, 0.005), (0.004, 0.005), (-0.006, 0.005), (0.0, 0.002)])
def test_tost_is_the_larger_of_scipys_two_one_sided_paired_tests(shift, margin):
    """The reference: scipy's one-sample t test of the differences against -margin (greater) and +margin
    (less), written out here; TOST's p is the larger of the two."""
    rng = np.random.default_rng(7)
    a = rng.normal(0.7, 0.01, size=6)
    b = a + shift + rng.normal(0, 0.003, size=6)
    d = b - a
    want = max(stats.ttest_1samp(d, -margin, alternative="greater").pvalue,
               stats.ttest_1samp(d, margin, alternative="less").pvalue)
    got = S.tost(a, b, margin)
    assert got["n"] == 6 and got["diff"] == pytest.approx(d.mean())
    assert got["tost_p"] == pytest.approx(want, rel=1e-10)


def test_tost_of_identical_differences_is_certain_either_way():
    a = np.array([0.5, 0.6, 0.7])
    assert S.tost(a, a + 0.001, 0.005)["tost_p"] == 0.0 and S.tost(a, a + 0.01, 0.005)["tost_p"] == 1.0
