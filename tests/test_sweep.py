"""The freezing sweep (training/experiments/sweep/engine.py) and its report (training/experiments/report.py):
stratified nested subsets, a resume that reruns exactly the unfinished runs, the report's statistics against
numpy, the PNGs, and one real tiny sweep through the child processes."""
import csv
import json
import logging
import math
import re
import struct
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_training import make_checkpoint, write_data

from data.loaders import Example, load_task_file
from training.config.train_config import TrainConfig
from training.experiments import report as R
from training.experiments.sweep import cli as sweep_cli
from training.experiments.sweep import engine
from training.experiments.sweep import records as sweep_records
from training.experiments.sweep import subsets as sweep_subsets


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep-inputs")
    return write_data(root / "data"), make_checkpoint(root / "ckpt")


# ----------------------------------------------------------------------------- stratified nested subsets

def check_subsets(labels, subsets):
    full = Counter(labels)
    previous = set()
    for n in sorted(subsets):
        idx = subsets[n]
        assert len(idx) == n == len(set(idx)) and idx == sorted(idx)
        got = Counter(labels[i] for i in idx)
        for k, c in full.items():  # within 1 of the exact share n * c / N, for every class
            assert abs(Fraction(got[k]) - Fraction(n * c, len(labels))) < 1, (n, k, got[k], n * c / len(labels))
        assert previous <= set(idx)  # nested
        previous = set(idx)


def test_subsets_are_stratified_nested_and_seeded():
    rng = np.random.default_rng(0)
    labels = list(rng.permutation([0] * 50 + [1] * 30 + [2] * 13 + [3] * 5 + [4] * 2))
    sizes = [10, 25, 60, 100]
    a = sweep_subsets.stratified_nested_subsets(labels, sizes, seed=1)
    check_subsets(labels, a)
    assert a[100] == list(range(100))
    assert Counter(labels[i] for i in a[10]) == {0: 5, 1: 3, 2: 1, 3: 1}  # 5, 3, 1.3, .5, .2 -> LR
    assert sweep_subsets.stratified_nested_subsets(labels, sizes, seed=1) == a
    assert sweep_subsets.stratified_nested_subsets(labels, list(reversed(sizes)), seed=1) == a
    b = sweep_subsets.stratified_nested_subsets(labels, sizes, seed=2)
    assert b[10] != a[10] and b[60] != a[60]
    with pytest.raises(ValueError, match="101"):
        sweep_subsets.stratified_nested_subsets(labels, [101], seed=1)


def test_largest_remainder_and_the_alabama_paradox():
    assert sweep_subsets.largest_remainder({0: 5, 1: 3, 2: 2}, 5) == {0: 3, 1: 1, 2: 1}  # tie .5/.5: the larger class
    # largest remainder alone takes a seat from class 0 when n goes 3 -> 4; the nested counts do not
    sizes = {0: 1, 1: 3, 2: 3}
    assert sweep_subsets.largest_remainder(sizes, 3) == {0: 1, 1: 1, 2: 1}
    assert sweep_subsets.largest_remainder(sizes, 4) == {0: 0, 1: 2, 2: 2}
    assert sweep_subsets.nested_counts(sizes, [3, 4]) == {3: {0: 1, 1: 1, 2: 1}, 4: {0: 1, 1: 2, 2: 1}}
    labels = [0] + [1] * 3 + [2] * 3
    check_subsets(labels, sweep_subsets.stratified_nested_subsets(labels, [3, 4, 5, 6, 7], seed=0))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 25), min_size=1, max_size=6), st.data())
def test_subsets_property(class_sizes, data):
    labels = [k for k, c in enumerate(class_sizes) for _ in range(c)]
    sizes = data.draw(st.lists(st.integers(0, len(labels)), min_size=1, max_size=6, unique=True))
    seed = data.draw(st.integers(0, 2**31))
    check_subsets(labels, sweep_subsets.stratified_nested_subsets(labels, sizes, seed))


def test_sts_strata():
    assert sweep_subsets.strata("sts", [0.0, 0.99, 1.0, 2.5, 4.2, 5.0]) == [0, 0, 1, 2, 4, 4]
    assert sweep_subsets.strata("sst", [3, 0]) == [3, 0]


def test_course_file_round_trip(tmp_path):
    tricky = [Example("a1", 'he said "no"', "tab\there", 0.4), Example("b2", "x, y; 'z'", "multi\nline", 5.0),
              Example("c3", "plain", "text", 3.25)]
    sweep_subsets.write_course_file(tmp_path / "sts.csv", "sts", tricky)
    assert load_task_file(tmp_path / "sts.csv", "sts", strict=True).examples == tricky
    sst = [Example("s1", 'a "quoted" word', None, 4), Example("s2", "b", None, 0)]
    sweep_subsets.write_course_file(tmp_path / "sst.csv", "sst", sst)
    assert (tmp_path / "sst.csv").read_text().splitlines()[0] == "\tid\tsentence\tsentiment"
    assert load_task_file(tmp_path / "sst.csv", "sst", strict=True).examples == sst


# ----------------------------------------------------------------------------- resume

def sweep_args(data, ckpt, out, *extra):
    return ["--tasks", "sst", "--depths", "none", "1", "--sizes", "3", "8", "--seeds", "1", "--data-dir", str(data),
            "--model", str(ckpt), "--out", str(out / "sweep"), "--runs-dir", str(out / "runs"), "--epochs", "2",
            "--batch-size", "4", *extra]


def fake_training(calls, crash_on=None):
    def fake(cfg, threads=None):
        calls.append((cfg.freeze_upto, len(load_task_file(cfg.files["sst_train"], "sst").examples), cfg.seed))
        if len(calls) == crash_on:
            raise KeyboardInterrupt  # the sweep killed in the middle of a run
        acc = 0.1 * len(calls)
        rec = {"epoch": 0, "step": 1, "train_seconds": 0.5, "dev_sst_acc": acc, "dev_overall": acc}
        Path(cfg.out_dir, "metrics.jsonl").write_text(json.dumps(rec) + "\n")
        return {"metrics": {"sst_acc": acc, "overall": acc}, "wall_seconds": 1.0, "peak_rss_mib": 0.0,
                "base_rss_mib": 0.0, "cuda_peak_mib": None, "trainable_params": 10, "total_params": 20, "threads": 1}
    return fake


def test_resume_runs_exactly_the_unfinished_runs(inputs, tmp_path, monkeypatch, caplog):
    data, ckpt = inputs
    calls = []
    monkeypatch.setattr(engine, "measure", fake_training(calls, crash_on=3))
    with pytest.raises(KeyboardInterrupt):
        sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process"))
    results = tmp_path / "sweep" / "results.jsonl"
    assert len(results.read_text().splitlines()) == 2
    with open(results, "a") as f:
        f.write('{"tasks": "sst", "depth": 1, "si')  # killed while writing a line
    plan = [(None, 3, 1), (1, 3, 1), (None, 8, 1), (1, 8, 1)]
    assert calls == plan[:3]

    calls.clear()
    monkeypatch.setattr(engine, "measure", fake_training(calls))
    with caplog.at_level(logging.WARNING):
        assert sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process")) == 0
    assert "partial last line" in caplog.text
    assert calls == plan[2:]
    records = [json.loads(x) for x in results.read_text().splitlines()]
    assert [(r["depth"], r["size"], r["seed"]) for r in records] == plan
    assert all(r["n_train"] == {"sst": r["size"]} and r["best_epoch"] == 0 for r in records)
    run_dirs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert run_dirs == sorted(sweep_records.RunKey(*(("sst",) + k)).name for k in plan)

    calls.clear()  # all done: nothing runs
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process")) == 0 and calls == []
    # other settings into the same results are refused
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process", "--lr", "0.5")) == 2 and calls == []


def test_a_restarted_sweep_takes_its_interrupted_run_before_fresh_ones(inputs, tmp_path, monkeypatch):
    """A run an earlier worker began and left a checkpoint for is claimed before runs planned ahead of it
    that nobody began; a run folder without a checkpoint (killed before its first) keeps its plan place."""
    data, ckpt = inputs
    plan = [(None, 3, 1), (1, 3, 1), (None, 8, 1), (1, 8, 1)]
    for k, checkpoint in ((plan[2], True), (plan[3], False)):
        key = sweep_records.RunKey(*(("sst",) + k))
        run_dir = tmp_path / "runs" / key.name
        (run_dir / "checkpoints").mkdir(parents=True)
        (run_dir / engine.MARKER).write_text(json.dumps({**key.to_dict(), "out": str((tmp_path / "sweep").resolve())}))
        if checkpoint:
            (run_dir / "checkpoints" / "step-0000001.pt").write_bytes(b"torn")  # not readable: begins again
    calls = []
    monkeypatch.setattr(engine, "measure", fake_training(calls))
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process")) == 0
    assert calls == [plan[2], plan[0], plan[1], plan[3]]


def test_two_sweeps_never_share_or_delete_each_others_runs(inputs, tmp_path, monkeypatch, capsys):
    data, ckpt = inputs
    a, b = tmp_path / "expA" / "sweep", tmp_path / "expB" / "sweep"
    assert engine.default_runs_dir(a) != engine.default_runs_dir(b)  # the same folder name, other paths
    monkeypatch.setattr(engine, "measure", fake_training([]))
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path / "expA", "--in-process")) == 0
    shared = ["--runs-dir", str(tmp_path / "expA" / "runs")]  # B pointed at A's run directories
    kept = {p: p.read_bytes() for p in (tmp_path / "expA" / "runs").rglob("*") if p.is_file()}
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path / "expB", "--in-process", *shared)) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and re.fullmatch(r"training\.experiments\.sweep: error: .* belongs to the sweep in .*expA.*",
                                          err[0])
    assert {p: p.read_bytes() for p in kept} == kept


def test_pooling_ema_and_both_orders_reach_every_run(inputs, tmp_path, monkeypatch):
    data, ckpt = inputs
    seen = []
    fake = fake_training([])
    monkeypatch.setattr(engine, "measure", lambda cfg, threads=None: seen.append(cfg) or fake(cfg, threads))
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process", "--pooling", "mean", "--ema-decay", "0.99",
                             "--predict-both-orders")) == 0
    assert len(seen) == 4
    assert all(c.pooling == "mean" and c.ema_decay == 0.99 and c.predict_both_orders for c in seen)


def test_bad_arguments_fail_before_training(inputs, tmp_path, capsys):
    data, ckpt = inputs
    with pytest.raises(SystemExit):
        sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--depths", "3"))  # the tiny model has 2 layers
    assert "--depths 3 is out of range: " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--depths", "150%"))
    assert "'150%' is not a depth" in capsys.readouterr().err
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--sizes", "9")) == 2
    assert "only 8 training examples" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--depths", "-2"))
    with pytest.raises(SystemExit):
        sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--ema-decay", "1"))
    assert "--ema-decay must be in [0, 1)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--pair-encoding", "siamese", "--predict-both-orders"))
    assert "--predict-both-orders is for --pair-encoding cross" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--seeds", "1", "-3"))
    assert "--seeds must be in [0, 2**32), as numpy's seeds are, not -3" in capsys.readouterr().err


# ----------------------------------------------------------------------------- report

def hand_written_results(path, data):
    values = {(None, 100): [0.30, 0.35, 0.33], (3, 100): [0.25, 0.28, 0.20, 0.29], (None, "all"): [0.5]}
    lines = []
    for (depth, size), accs in values.items():
        for seed, acc in enumerate(accs, 1):
            lines.append(json.dumps({"tasks": "sst", "depth": depth, "size": size, "seed": seed,
                                     "dev": {"sst_acc": acc, "overall": acc}, "wall_seconds": 10.0 * seed,
                                     "train_seconds": 5.0, "peak_rss_mib": 500.0 + seed, "trainable_params": 1000,
                                     "settings": {"data_dir": str(data), "model": "m", "epochs": 3}}))
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.jsonl").write_text("\n".join(lines) + "\n")
    return values


def test_report_statistics_match_numpy(inputs, tmp_path, capsys):
    data, _ = inputs
    out = tmp_path / "sweep"
    values = hand_written_results(out, data)
    assert R.main([str(out)]) == 0
    rows = list(csv.DictReader(open(out / "report.csv")))
    assert [(r["depth"], r["size"]) for r in rows] == [("none", "100"), ("3", "100"), ("none", "all")]
    for r in rows:
        v = np.array(values[None if r["depth"] == "none" else int(r["depth"]),
                            "all" if r["size"] == "all" else int(r["size"])])
        assert r["metric"] == "sst_acc" and int(r["seeds"]) == len(v)
        for name, want in (("mean", v.mean()), ("median", np.median(v)), ("min", v.min()), ("max", v.max())):
            assert math.isclose(float(r[name]), want, rel_tol=1e-12), name
        if len(v) > 1:
            assert math.isclose(float(r["std"]), np.std(v, ddof=1), rel_tol=1e-12)
        else:
            assert r["std"] == ""
        assert float(r["baseline"]) == 2 / 8  # tiny dev labels i % 5 for i < 8: the majority has 2
        assert math.isclose(float(r["wall_seconds"]), np.mean([10.0 * s for s in range(1, len(v) + 1)]))
    md = (out / "report.md").read_text()
    assert "ddof=1" in md and "| sst | 3 | 100 | sst_acc | 4 | 0.2550 | 0.2650 |" in md
    assert md in capsys.readouterr().out


def png_size(path):
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_plots_are_pngs_of_the_expected_size(inputs, tmp_path):
    pytest.importorskip("matplotlib")
    data, _ = inputs
    out = tmp_path / "sweep"
    hand_written_results(out, data)
    assert R.main([str(out), "--plot"]) == 0
    assert png_size(out / R.PLOT) == (round(R.PANEL[0] * 2 * R.DPI), round(R.PANEL[1] * R.DPI))  # metric + time

    run = tmp_path / "run"
    run.mkdir()
    recs = [{"step": s, "epoch": s // 4, "loss_sst": 1.0 / s} for s in range(2, 13, 2)]
    recs += [{"epoch": e, "step": 4 * (e + 1), "train_seconds": 1.0, "train_loss_sst": 1.0 / (e + 1),
              "dev_sst_acc": 0.2 + 0.1 * e, "dev_overall": 0.2 + 0.1 * e} for e in range(3)]
    for r in recs[-3:]:  # --ema-decay: the raw weights scored at epoch ends
        r.update(dev_raw_sst_acc=r["dev_sst_acc"] - 0.01, dev_raw_overall=r["dev_overall"] - 0.01)
    recs = [{"epoch": e, "step": 4 * e + 2, "epoch_progress": 0.5, "dev_sst_acc": 0.25, "dev_overall": 0.25}
            for e in range(3)] + recs  # --evals-per-epoch 2: the average alone mid-epoch
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert R.main(["--curves", str(run), "-o", str(tmp_path / "c.png")]) == 0
    assert png_size(tmp_path / "c.png") == (round(R.CURVES_SIZE[0] * R.DPI), round(R.CURVES_SIZE[1] * R.DPI))


def test_dev_series_places_mid_epoch_evaluations_and_keeps_the_raw_scores():
    recs = [{"step": 1, "epoch": 0, "loss_sst": 1.0},
            {"epoch": 0, "step": 2, "epoch_progress": 0.5, "dev_sst_acc": 0.3, "dev_overall": 0.3},
            {"epoch": 0, "step": 4, "train_seconds": 1.0, "dev_raw_sst_acc": 0.35, "dev_raw_overall": 0.35,
             "dev_sst_acc": 0.4, "dev_overall": 0.4},
            {"epoch": 1, "step": 6, "epoch_progress": 0.5, "dev_sst_acc": 0.5, "dev_overall": 0.5}]
    # one task: overall repeats the task's metric and is left out
    assert R.dev_series(recs) == {"dev_sst_acc": [(0.5, 0.3), (1.0, 0.4), (1.5, 0.5)],
                                  "dev_raw_sst_acc": [(1.0, 0.35)]}


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as e:
        R.main(["--curves", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("python -m training.experiments.report: error: --plot and --curves need "
                                               "matplotlib: pip install matplotlib")


# ----------------------------------------------------------------------------- end to end

def test_tiny_sweep_end_to_end(inputs, tmp_path):
    """Two depths x one size x one seed, for real: child processes, the trainer, the record, the report."""
    data, ckpt = inputs
    args = ["--tasks", "sst", "--depths", "none", "2", "--sizes", "6", "--seeds", "5", "--data-dir", str(data),
            "--model", str(ckpt), "--out", str(tmp_path / "sweep"), "--runs-dir", str(tmp_path / "runs"),
            "--epochs", "2", "--batch-size", "4", "--lr", "1e-3", "--threads", "1", "--device", "cpu"]
    assert sweep_cli.main(args) == 0
    records = sweep_records.read_results(tmp_path / "sweep" / "results.jsonl")
    assert [(r["depth"], r["size"], r["seed"]) for r in records] == [(None, 6, 5), (2, 6, 5)]
    full, frozen = records
    for r in records:
        assert 0 <= r["dev"]["sst_acc"] <= 1 and r["dev"]["overall"] == r["dev"]["sst_acc"]
        assert r["n_train"] == {"sst": 6} and r["epochs"] == 2 and r["best_epoch"] in (0, 1)
        assert r["peak_rss_mib"] >= r["base_rss_mib"] > 0 and r["wall_seconds"] > 0 and r["threads"] == 1
        run = Path(r["run_dir"])
        assert (run / "metrics.jsonl").is_file() and not (run / "best.pt").exists()
        subset = load_task_file(run / "sst-train-subset.csv", "sst").examples
        assert Counter(e.label for e in subset) == {0: 2, 1: 1, 2: 1, 3: 1, 4: 1}  # 2,2,2,1,1 of 8 -> 6
        assert not (run / "predictions" / "sst-test-output.csv").exists()
    assert frozen["trainable_params"] < full["trainable_params"] == full["total_params"]
    assert R.main([str(tmp_path / "sweep")]) == 0
    assert "| sst | 2 | 6 | sst_acc | 1 |" in (tmp_path / "sweep" / "report.md").read_text()


def test_results_from_before_an_option_existed_still_match(tmp_path):
    """A record written before an option was added lacks it: its run had the option's default."""
    settings = sweep_records.settings_of(TrainConfig())
    older = {k: v for k, v in settings.items() if k != "grad_accum_steps"}
    assert sweep_records.settings_clash([{"settings": older}], settings, tmp_path / "results.jsonl") == ""
    assert "lr: 0.5 there, 0.0001 now" in sweep_records.settings_clash([{"settings": {**older, "lr": 0.5}}], settings,
                                                            tmp_path / "results.jsonl")
    accumulating = {**settings, "grad_accum_steps": 4}
    assert "grad_accum_steps: 1 there, 4 now" in sweep_records.settings_clash([{"settings": older}], accumulating,
                                                                   tmp_path / "results.jsonl")


@pytest.mark.parametrize("avx512_bf16", [False, True])
def test_results_record_the_resolved_precision(tmp_path, monkeypatch, avx512_bf16):
    """settings record what --precision auto resolves to here, so that a sweep resumed where auto now means
    another precision does not mix the two into one results file."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    now = sweep_records.settings_of(TrainConfig(device="cpu"))
    assert now["precision"] == ("bf16" if avx512_bf16 else "fp32")
    assert sweep_records.settings_of(TrainConfig(device="cpu", precision="fp16"))["precision"] == "fp16"
    fp32 = sweep_records.settings_of(TrainConfig(device="cpu", precision="fp32"))
    clash = sweep_records.settings_clash([{"settings": fp32}], now, tmp_path / "results.jsonl")
    assert clash == ("" if not avx512_bf16 else
                     f"{tmp_path / 'results.jsonl'} holds 1 result(s) made with other settings (precision: 'fp32' "
                     f"there, 'bf16' now); use another --out")


def test_shares_in_depths_resolve_on_the_model(inputs, tmp_path, monkeypatch):
    """The tiny model has 2 layers: 50% is 1 layer (the same run as 1, made once), 100% is 2."""
    data, ckpt = inputs
    calls = []
    monkeypatch.setattr(engine, "measure", fake_training(calls))
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process", "--depths", "none", "50%", "1", "100%",
                             "--sizes", "3")) == 0
    assert calls == [(None, 3, 1), (1, 3, 1), (2, 3, 1)]


def test_schedules_are_a_dimension_of_the_grid_and_of_the_report(inputs, tmp_path, monkeypatch):
    data, ckpt = inputs
    seen = []
    fake = fake_training([])
    monkeypatch.setattr(engine, "measure", lambda cfg, threads=None: seen.append(cfg) or fake(cfg, threads))
    args = sweep_args(data, ckpt, tmp_path, "--in-process", "--schedules", "fixed", "lp-ft:1epoch",
                      "gradual:2steps,floor=0")
    assert sweep_cli.main(args) == 0
    # each (seed, size, depth) point once per schedule, the fixed one under the plain name
    assert [(c.freeze_upto, c.unfreeze_schedule) for c in seen[:3]] == [
        (None, "fixed"), (None, "lp-ft:1epoch"), (None, "gradual:2steps,floor=0")]
    assert len(seen) == 12
    records = sweep_records.read_results(tmp_path / "sweep" / "results.jsonl")
    assert [r.get("arm", "") for r in records[:3]] == ["", "lp-ft-1epoch", "gradual-2steps-floor0"]
    assert Path(records[1]["run_dir"]).name == "sst-freezenone-n3-seed1-lp-ft-1epoch"
    assert R.main([str(tmp_path / "sweep")]) == 0
    report = (tmp_path / "sweep" / "report.md").read_text()
    for label in ("| sst | none | 3 |", "| sst | none, lp-ft-1epoch | 3 |", "| sst | 1, gradual-2steps-floor0 | 8 |"):
        assert label in report, report
    rows = R.summary_rows(records)
    assert len(rows) == 12 and all(r["seeds"] == 1 for r in rows)  # not the three schedules' seeds as one


@pytest.mark.parametrize("schedule, says", [("gradual:0steps", "interval must be a whole number"),
                                            ("gradual:1epoch,floor=3", "floor=3 is past the model's 2 layers")])
def test_a_bad_schedule_in_a_sweep_is_refused_before_training(inputs, tmp_path, capsys, schedule, says):
    data, ckpt = inputs
    with pytest.raises(SystemExit) as e:
        sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process", "--schedules", schedule))
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "sweep" / "results.jsonl").exists()


def test_an_interrupted_run_goes_on_from_its_checkpoint_to_the_same_numbers(inputs, tmp_path, monkeypatch, caplog):
    """A worker killed in the middle of a run (the machine went away) leaves the run's training checkpoints:
    the next start resumes from the newest one, and the record equals an uninterrupted sweep's; a
    checkpoint that cannot be read is not used (the run starts again, to the same numbers)."""
    from dataclasses import replace

    from training.run import trainer

    data, ckpt = inputs
    real_train, updates = trainer.train, []

    def train(cfg, on_evaluation=None, on_update=None, kill_at=None):
        def count(stepper):
            updates.append(cfg.out_dir)
            if len(updates) == kill_at:
                raise KeyboardInterrupt  # killed between two updates, after the checkpoint of update 4
        return real_train(replace(cfg, save_every=2), on_evaluation, count)

    def sweep(out, kill_at=None):
        monkeypatch.setattr(trainer, "train", lambda cfg, **kw: train(cfg, kill_at=kill_at, **kw))
        args = sweep_args(data, ckpt, out, "--in-process", "--depths", "none", "--sizes", "8", "--batch-size", "2",
                          "--lr", "1e-3", "--keep-checkpoints")
        return sweep_cli.main(args)

    def record(out):
        return json.loads((out / "sweep" / "results.jsonl").read_text())

    def last_weights(out):
        newest = max((out / "runs").glob("*/checkpoints/*.pt"), key=lambda p: p.stat().st_mtime)
        return torch.load(newest, weights_only=False)["model"]

    assert sweep(tmp_path / "whole") == 0
    whole, n, weights = record(tmp_path / "whole"), len(updates), last_weights(tmp_path / "whole")
    assert n == 8
    for name, damage in (("resumed", False), ("damaged", True)):
        out = tmp_path / name
        updates.clear()
        with pytest.raises(KeyboardInterrupt):
            sweep(out, kill_at=5)
        saved = sorted((out / "runs").glob("*/checkpoints/*.pt"))
        assert saved, "the killed run left no checkpoint"
        if damage:
            for path in saved:
                path.write_bytes(b"torn")
        updates.clear()
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert sweep(out) == 0
        again = record(out)
        assert again["dev"] == whole["dev"] and again["best_epoch"] == whole["best_epoch"]
        resumed_weights = last_weights(out)
        assert all(torch.equal(resumed_weights[k], v) for k, v in weights.items())
        if damage:
            assert "is not used" in caplog.text and len(updates) == n
        else:
            assert "going on from its last checkpoint" in caplog.text and len(updates) == n - 4
            assert again["resumed"] is True


def test_a_record_keeps_the_moves_of_a_freezing_schedule(inputs, tmp_path, monkeypatch):
    """The steps at which a schedule changed the frozen depth (metrics.jsonl's frozen_depth records) go into
    the run's record: the study models an adaptive run's cost from them."""
    data, ckpt = inputs
    fake = fake_training([])

    def schedule_moves(cfg, threads=None):
        m = fake(cfg, threads)
        with open(Path(cfg.out_dir, "metrics.jsonl"), "a") as f:
            for step, depth in ((3, 0), (7, 1), (9, None)):
                f.write(json.dumps({"step": step, "epoch": 0, "frozen_depth": depth}) + "\n")
        return m

    monkeypatch.setattr(engine, "measure", schedule_moves)
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path, "--in-process", "--depths", "none", "--sizes", "3")) == 0
    (record,) = [json.loads(x) for x in (tmp_path / "sweep" / "results.jsonl").read_text().splitlines()]
    assert record["depth_changes"] == [[3, 0], [7, 1], [9, None]]
    monkeypatch.setattr(engine, "measure", fake)  # a fixed depth: no field
    assert sweep_cli.main(sweep_args(data, ckpt, tmp_path / "fixed", "--in-process", "--depths", "none",
                                     "--sizes", "3")) == 0
    (record,) = [json.loads(x) for x in (tmp_path / "fixed" / "sweep" / "results.jsonl").read_text().splitlines()]
    assert "depth_changes" not in record


def test_a_record_names_the_epochs_its_arm_trained_for(tmp_path):
    """An arm that overrides --epochs (the study's longer heads-only arm, the size study's equal-update arms)
    is recorded with its own epochs, not the sweep's."""
    from training.experiments.sweep.subsets import Grid

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [{"epoch": e, "step": e + 1, "train_seconds": 0.5, "dev_sst_acc": 0.1, "dev_overall": 0.1} for e in range(3)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = {"metrics": {"overall": 0.1}, "wall_seconds": 1.0, "peak_rss_mib": 0.0, "base_rss_mib": 0.0,
         "cuda_peak_mib": None, "trainable_params": 1, "total_params": 2, "threads": 1}
    key = sweep_records.RunKey("sst", None, 3, 1, "long")
    base = TrainConfig(epochs=2)
    record = sweep_records.result_record(Grid(["sst"], [3], [1]), base, key, {("sst", 1): {3: [0, 1, 2]}}, run_dir, m,
                                         {}, {"epochs": 9}, in_process=True)
    assert record["epochs"] == 9 and record["epochs_run"] == 3
    assert sweep_records.result_record(Grid(["sst"], [3], [1]), base, key, {("sst", 1): {3: [0, 1, 2]}}, run_dir, m,
                                       {}, None, in_process=True)["epochs"] == 2
