"""python -m training.analyze on a tiny run: the figures are drawn, and every number equals sklearn's or
scipy's computed here from the prediction files the command wrote (which are training.evaluate's)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support
from tiny_runs import tiny_run, write_data

from training.analyze import FIGURES, main
from training.inference.formats import read_predictions, read_tsv_predictions

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg, _ = tiny_run(tmp_path_factory.mktemp("analyze"), epochs=2)
    return cfg


@pytest.fixture(scope="module")
def analysis(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "analysis"
    assert main([run.out_dir, "--data-dir", run.data_dir, "--out", str(out), "--device", "cpu",
                 "--eval-batch-size", "5"]) == 0
    return out, json.loads((out / "analysis.json").read_text())["tasks"]


def columns(out: Path, task: str) -> tuple[np.ndarray, np.ndarray]:
    _, rows = read_tsv_predictions(out / f"{task}-dev.tsv")
    pred = "score" if task == "sts" else "label"
    return np.array([float(r["gold"]) for r in rows]), np.array([float(r[pred]) for r in rows])


def test_the_figures_are_drawn(analysis):
    out, _ = analysis
    import matplotlib.image
    for name in FIGURES.values():
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 200 and image.shape[1] > 200, name
        assert image[..., :3].std() > 0.05, name  # not a blank canvas
        assert f"]({name})" in (out / "analysis.md").read_text()


def test_the_predictions_are_training_evaluates(run, analysis):
    out, _ = analysis
    for task in ("sst", "para", "sts"):
        gold, pred = columns(out, task)
        _, course = read_predictions(Path(run.out_dir) / "predictions" / f"{task}-dev-output.csv")
        np.testing.assert_allclose(pred, [v for _, v in course], atol=5e-5 if task == "sts" else 0)
        assert len(gold) == len(pred) == 12


def test_sst_numbers_equal_sklearns(analysis):
    out, tasks = analysis
    gold, pred = columns(out, "sst")
    r = tasks["sst"]
    assert r["confusion"] == confusion_matrix(gold, pred, labels=range(5)).tolist()
    assert r["accuracy"] == pytest.approx(accuracy_score(gold, pred), abs=1e-12)
    p, rec, f1, support = precision_recall_fscore_support(gold, pred, labels=range(5), zero_division=0)
    assert [c["precision"] for c in r["classes"]] == pytest.approx(p.tolist(), abs=1e-12)
    assert [c["recall"] for c in r["classes"]] == pytest.approx(rec.tolist(), abs=1e-12)
    assert [c["f1"] for c in r["classes"]] == pytest.approx(f1.tolist(), abs=1e-12)
    assert [c["support"] for c in r["classes"]] == support.tolist()
    macro = precision_recall_fscore_support(gold, pred, labels=range(5), average="macro", zero_division=0)
    assert (r["macro_precision"], r["macro_recall"], r["macro_f1"]) == pytest.approx(macro[:3], abs=1e-12)
    assert len(set(pred)) < 5  # some class is never predicted: the zero-division case is exercised
    md = (out / "analysis.md").read_text()
    assert f"accuracy {r['accuracy']:.4f}, macro F1 {r['macro_f1']:.4f}" in md


def test_quora_numbers_equal_sklearns(analysis):
    out, tasks = analysis
    gold, pred = columns(out, "para")
    r = tasks["para"]
    p, rec, f1, _ = precision_recall_fscore_support(gold, pred, average="binary", pos_label=1, zero_division=0)
    assert (r["precision"], r["recall"], r["f1"]) == pytest.approx((p, rec, f1), abs=1e-12)
    assert r["accuracy"] == pytest.approx(accuracy_score(gold, pred), abs=1e-12)
    assert r["confusion"] == confusion_matrix(gold, pred, labels=[0, 1]).tolist()
    assert f"| {r['accuracy']:.4f} | {r['precision']:.4f} | {r['recall']:.4f} | {r['f1']:.4f} |" in \
        (out / "analysis.md").read_text()


def test_sts_numbers_equal_scipys(analysis):
    out, tasks = analysis
    gold, pred = columns(out, "sts")
    r = tasks["sts"]
    assert len(set(gold)) < len(gold)  # tied gold scores: Spearman needs average ranks
    # the TSV holds 6 decimals of the scores the numbers were computed from
    assert r["pearson"] == pytest.approx(pearsonr(pred, gold)[0], abs=1e-5)
    assert r["spearman"] == pytest.approx(spearmanr(pred, gold)[0], abs=1e-9)
    assert r["mean_absolute_error"] == pytest.approx(np.mean(np.abs(pred - gold)), abs=1e-5)


def test_without_matplotlib_the_markdown_is_written_and_the_command_says_why(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "bare"
    with pytest.raises(SystemExit) as e:
        main([run.out_dir, "--data-dir", run.data_dir, "--out", str(out), "--device", "cpu"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m training.analyze: error: the figures need matplotlib: pip install matplotlib")
    assert "(No figures: matplotlib is not installed.)" in (out / "analysis.md").read_text()
    assert not any(out.glob("*.png"))
    assert json.loads((out / "analysis.json").read_text())["tasks"].keys() == {"sst", "para", "sts"}


def test_a_bad_source_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "nope"), "--data-dir", str(write_data(tmp_path / "d")), "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"python -m training.analyze: error: argument RUN: {tmp_path / 'nope'} does not exist (see --help)"]


def test_both_orders_follow_the_run_unless_told(run, analysis, tmp_path, capsys):
    """The inference flags are training.evaluate's: --predict-both-orders averages each pair in both orders, as
    `training.evaluate --predict-both-orders` scores it (the tiny run predicted one order)."""
    from training import evaluate as evaluate_mod
    out = tmp_path / "both"
    assert main([run.out_dir, "--data-dir", run.data_dir, "--out", str(out), "--device", "cpu",
                 "--predict-both-orders"]) == 0
    sts = json.loads((out / "analysis.json").read_text())["tasks"]["sts"]
    dev = Path(run.data_dir) / "sts-dev.csv"
    assert evaluate_mod.main([run.out_dir, "--score", "sts", str(dev), "--device", "cpu",
                              "--predict-both-orders"]) == 0
    printed = capsys.readouterr().out
    assert f"sts_pearson {sts['pearson']:.4f}" in printed
    assert abs(sts["pearson"] - analysis[1]["sts"]["pearson"]) > 1e-4  # one order, as the run predicted
