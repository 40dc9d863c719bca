"""The freezing study (training/experiments/study): recipes and their one-line errors, the plan with its learning-rate
grid, the aggregates against values computed by hand, a tiny study killed and resumed, workers sharing
runs, the frozen-prefix cache shared between runs and serving the dev evaluations, and --freeze-upto's
shares."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tiny_runs
import torch

from data.batching import EvalBatching
from training.config.freeze_spec import depth_error, freeze_depth
from training.config.train_config import TrainConfig, validate
from training.experiments.study import aggregate as A
from training.experiments.study import cli as C
from training.experiments.study import tables as T
from training.experiments.study.protocol import lr_name
from training.experiments.study.recipe import COST_ARM, Recipe, load_recipe
from training.experiments.sweep import engine
from training.experiments.sweep import measure as measure_mod
from training.experiments.sweep import records as sweep_records

TASKS = "sst+para+sts"


def write_recipe(path: Path, **over) -> Path:
    raw = {"title": "t", "kind": "depth", "results": str(path.parent / "results"),
           "report": str(path.parent / "report"), "tasks": ["sst", "para", "sts"], "depths": ["none", 1, 2],
           "sizes": [6], "seeds": [1, 2], "train": {"epochs": 1, "batch_size": 4, "lr": 1e-3}, **over}
    path.write_text(json.dumps(raw))
    return path


def recipe(tmp_path, layers=2, **over) -> Recipe:
    return load_recipe(str(write_recipe(tmp_path / "r.json", **over))).resolve(layers)


def record(depth, seed, dev, arm="", size=6, **extra):
    dev = {**dev, "overall": (dev["sst_acc"] + dev["para_acc"] + (dev["sts_pearson"] + 1) / 2) / 3}
    return {"tasks": TASKS, "depth": depth, "size": size, "seed": seed, "dev": dev, **({"arm": arm} if arm else {}),
            "epochs": 2, "train_seconds": 10.0, "trainable_params": 100, "total_params": 200, **extra}


def dev(sst, para, sts):
    return {"sst_acc": sst, "para_acc": para, "sts_pearson": sts}


# ----------------------------------------------------------------------------- --freeze-upto as a share


@pytest.mark.parametrize("share, six, twelve", [("75%", 4, 9), ("50%", 3, 6), ("0%", 0, 0), ("100%", 6, 12),
                                                ("12.5%", 1, 1), ("62.5%", 4, 7), ("25%", 1, 3), ("58.4%", 4, 7)])
def test_shares_round_to_the_nearest_layer_halves_down(share, six, twelve):
    # P% of L is P * L / 100 layers; nearest integer, and an exact half goes down (4.5 -> 4, 1.5 -> 1)
    assert freeze_depth(share, 6) == six and freeze_depth(share, 12) == twelve
    assert freeze_depth(3, 6) == 3 and freeze_depth(None, 6) is None


def test_a_share_freezes_exactly_the_layers_of_its_depth(tmp_path):
    from training.run.build import build_model
    data, enc = tiny_runs.inputs(tmp_path)  # 2 layers: 75% -> 1.5 -> 1
    by_share, _, _ = build_model(TrainConfig(model=str(enc), freeze_upto="75%"))
    by_depth, _, _ = build_model(TrainConfig(model=str(enc), freeze_upto=1))
    grads = {n: p.requires_grad for n, p in by_share.named_parameters()}
    assert grads == {n: p.requires_grad for n, p in by_depth.named_parameters()}
    assert by_share.frozen_upto == 1
    assert not any(v for n, v in grads.items() if n.startswith(("encoder.embeddings.", "encoder.layers.0.")))
    assert all(v for n, v in grads.items() if n.startswith("encoder.layers.1."))


@pytest.mark.parametrize("value", ["x%", "150%", "-5%", "-2", "1.5"])
def test_a_bad_share_is_one_line_naming_the_flag(value, capsys):
    from training.train import build_parser
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([f"--freeze-upto={value}"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "--freeze-upto" in err
    assert value in err or "must be >= -1" in err


def test_the_mission_command_on_six_layers_names_what_to_run_instead():
    line = depth_error(9, 6, "minilm-l6")
    assert "--model mpnet-base (or bert-base-uncased)" in line and "--freeze-upto 75% (4 of 6 layers)" in line
    assert depth_error("75%", 6, "minilm-l6") is None and depth_error(6, 6, "m") is None
    assert depth_error(7, 6, "m").startswith("--freeze-upto 7 is out of range")


def test_run_multitask_refuses_it_before_any_work(tmp_path):
    data, enc = tiny_runs.inputs(tmp_path)
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "run_multitask.py", "--model", str(enc), "--data-dir", str(data),
                        "--freeze-upto", "9", "--out-dir", str(out)], capture_output=True, text=True,
                       cwd=Path(__file__).parents[1])
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("run_multitask.py: error: --freeze-upto 9 is out of range")
    assert "--freeze-upto 75%" not in p.stderr or "of 2 layers" in p.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- recipes


@pytest.mark.parametrize("over, says", [
    ({"colour": 1}, "unknown key(s) colour"),
    ({"depths": ["none", "150%"]}, "depths must be"),
    ({"kind": "pie"}, "kind must be one of"),
    ({"train": {"lr": -1}}, "train: --lr must be"),
    ({"train": {"seed": 3}}, "train: seed: set per run"),
    ({"arms": {"x": {"wings": 2}}}, "arms.'x': unknown training option(s) wings"),
    ({"lr_grid": {"lrs": [1e-3], "tuning_seeds": [9]}}, "lr_grid must be"),
    ({"rows": [{"label": "a", "depth": 5, "arm": ""}]}, "rows:"),
])
def test_a_bad_recipe_is_one_line_naming_file_and_key(tmp_path, capsys, over, says):
    path = write_recipe(tmp_path / "bad.json", **over)
    assert C.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and says in err


def test_a_depth_past_the_model_is_refused(tmp_path, capsys):
    data, enc = tiny_runs.inputs(tmp_path)
    path = write_recipe(tmp_path / "deep.json", depths=["none", 3])
    assert C.main([str(path), "--model", str(enc), "--data-dir", str(data), "--dry-run"]) == 2
    assert "depth 3 is out of range for a model of 2 layers" in capsys.readouterr().err


def test_a_recipe_may_name_its_model_and_model_overrides_it(tmp_path, capsys):
    """A recipe's "train" may name the model (mpnet-depth.json: mpnet-base), so that a worker started without
    --model (bench/gpu_study.sh's) trains it: its depths resolve on that model's layers, and its runs get it;
    --model, where given, wins over it."""
    from argparse import Namespace

    data, enc = tiny_runs.inputs(tmp_path)
    named = write_recipe(tmp_path / "named.json", depths=["none", "100%"], train={"epochs": 1, "model": str(enc)})
    assert C.main([str(named), "--data-dir", str(data), "--dry-run"]) == 0
    planned = capsys.readouterr().out
    assert "freeze2-" in planned and "freeze6-" not in planned  # 100% of the tiny model's 2 layers, not MiniLM's 6
    r = load_recipe(str(named))
    assert C.base_config(r, Namespace(model=None, data_dir=str(data))).model == str(enc)
    assert C.base_config(r, Namespace(model="other", data_dir=str(data))).model == "other"
    assert C.base_config(load_recipe(str(write_recipe(tmp_path / "plain.json"))),
                         Namespace(model=None, data_dir=str(data))).model == TrainConfig.model
    # a recipe naming a model this machine lacks: --model stands in for it, and without it the error names it
    missing = write_recipe(tmp_path / "missing.json", train={"epochs": 1, "model": str(tmp_path / "nowhere")})
    assert C.main([str(missing), "--model", str(enc), "--data-dir", str(data), "--dry-run"]) == 0
    capsys.readouterr()
    assert C.main([str(missing), "--data-dir", str(data), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nowhere'}: cannot read its config.json" in err and "with --model" in err, err


def test_the_12_layer_study_recipes_load_plan_and_name_their_models():
    for name, model, layers, depths in [("mpnet-depth", "mpnet-base", 12, [None, -1, 3, 6, 9, 11, 12]),
                                        ("mpnet-scale-minilm", "minilm-l6", 6, [None, 3, 4])]:
        r = load_recipe(name).resolve(layers)
        assert r.train["model"] == model and r.sizes == [1000] and len(r.seeds) >= 5
        assert r.resolved_depths() == depths
        assert len(r.plan([])) == 3 * len(r.points)  # three rates a point on the tuning seed, before any run
    shared = ("epochs", "early_stop_patience", "pooling", "precision", "frozen_cache")
    mpnet, minilm = load_recipe("mpnet-depth"), load_recipe("mpnet-scale-minilm")
    assert {k: mpnet.train[k] for k in shared} == {k: minilm.train[k] for k in shared}  # one scale, one protocol
    assert (mpnet.tuning_split, mpnet.seeds, mpnet.lr_grid["tuning_seeds"]) == \
        (minilm.tuning_split, minilm.seeds, minilm.lr_grid["tuning_seeds"])


def test_the_minilm_scale_twins_train_each_point_at_its_runner_up_rate_with_the_same_settings():
    base, twins = load_recipe("mpnet-scale-minilm"), load_recipe("mpnet-scale-minilm-rates")
    same = ("train", "tuning_split", "seeds", "sizes", "lr_grid", "tasks", "arms")
    assert {k: getattr(twins, k) for k in same} == {k: getattr(base, k) for k in same}
    folder = Path(__file__).parents[1] / "docs/freezing-study/mpnet-scale-minilm"
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    ours = set(base.resolve(6).plan(records))
    records = [r for r in records if sweep_records.RunKey.of(r) in ours]  # the base recipe's runs, not the twins'
    # the runner-up written out: the second-best mean tuning-split score among each depth's tuning runs
    runner_up = {}
    for depth in (None, 3, 4):
        scores = {}
        for r in records:
            if r["depth"] == depth and r["seed"] == 101:
                scores.setdefault(r["lr"], []).append(r["tune"]["overall"])
        ranked = sorted(scores, key=lambda lr: -np.mean(scores[lr]))
        runner_up[depth] = ranked[1]
    done = {sweep_records.RunKey.of(r) for r in records}
    todo = [k for k in twins.resolve(6).plan(records) if k not in done]
    assert len(todo) == 15 and {k.seed for k in todo} == {1, 2, 3, 4, 5}
    assert {(k.depth, k.arm) for k in todo} == {(d, lr_name(runner_up[d])) for d in runner_up}


def test_the_12_layer_post_hoc_pair_reads_the_studies_own_points_and_trains_nothing():
    base, twins, posthoc = (load_recipe(n) for n in ("mpnet-depth", "mpnet-depth-rates", "mpnet-depth-posthoc"))
    same = ("train", "tuning_split", "seeds", "sizes", "lr_grid", "tasks")
    assert {k: getattr(posthoc, k) for k in same} == {k: getattr(twins, k) for k in same}
    theirs = {p["label"]: p for p in base.points + twins.points}
    assert all(theirs[p["label"]] == p for p in posthoc.points)  # each point verbatim, arms too
    assert all(posthoc.arms[p["arm"]] == {**base.arms, **twins.arms}[p["arm"]] for p in posthoc.points)
    assert len(posthoc.compare) == 1 and {*posthoc.compare[0][:2]} <= set(theirs)
    folder = Path(__file__).parents[1] / "docs/freezing-study/mpnet-depth"
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    done = {sweep_records.RunKey.of(r) for r in records}
    plan = posthoc.resolve(12).plan(records)
    assert plan and all(k in done for k in plan)  # every run it reports is already in the record


def test_the_built_in_recipes_load_and_plan_on_6_and_12_layers():
    for name in ("depth", "size", "seed-report"):
        for layers in (6, 12):
            r = load_recipe(name).resolve(layers)
            assert r.plan([])
    assert load_recipe("size").resolve(12).resolved_depths() == [None, -1, 6, 12]
    assert load_recipe("seed-report").resolve(12).resolved_depths() == [None, 9]
    assert load_recipe("seed-report").resolve(6).resolved_depths() == [None, 4]


# ----------------------------------------------------------------------------- the plan and the lr grid


def test_the_grid_then_tuning_then_each_depths_best_rate(tmp_path):
    r = recipe(tmp_path, lr_grid={"lrs": [1e-2, 1e-1], "tuning_seeds": [1]}, cost={"seeds": [1], "overrides":
                                                                                      {"frozen_cache": "off"}})
    grid = [sweep_records.RunKey(TASKS, d, 6, s) for s in (1, 2) for d in (None, 1, 2)]
    tuning = [sweep_records.RunKey(TASKS, d, 6, 1, lr_name(lr)) for d in (1, 2) for lr in (1e-2, 1e-1)]
    cost = [sweep_records.RunKey(TASKS, d, 6, 1, COST_ARM) for d in (1, 2)]
    assert r.plan([]) == grid + tuning + cost
    # depth 1: 1e-2 wins on the tuning seed; depth 2: a tie with --lr (1e-3) keeps --lr; so seed 2 runs depth 1 at 1e-2
    done = [record(1, 1, dev(0.3, 0.6, 0.2)), record(1, 1, dev(0.4, 0.6, 0.2), lr_name(1e-2)),
            record(1, 1, dev(0.1, 0.6, 0.2), lr_name(1e-1)),
            record(2, 1, dev(0.3, 0.6, 0.2)), record(2, 1, dev(0.3, 0.6, 0.2), lr_name(1e-2)),
            record(2, 1, dev(0.2, 0.6, 0.2), lr_name(1e-1))]
    assert r.best_lrs(done) == {(1, 6): 1e-2, (2, 6): 1e-3}
    assert r.plan(done) == grid + tuning + [sweep_records.RunKey(TASKS, 1, 6, 2, lr_name(1e-2))] + cost
    assert r.best_lrs(done[:-1]) == {(1, 6): 1e-2}  # depth 2's tuning not all in: no decision yet
    assert r.all_arms() == {"": {}, "lr0.01": {"lr": 1e-2}, "lr0.1": {"lr": 1e-1}, COST_ARM: {"frozen_cache": "off"}}


# ----------------------------------------------------------------------------- aggregates, by hand


FULL = {1: dev(0.40, 0.80, 0.80), 2: dev(0.50, 0.70, 0.60)}
D1 = {1: dev(0.38, 0.76, 0.40), 2: dev(0.45, 0.63, 0.54)}
D2 = {1: dev(0.20, 0.40, 0.08), 2: dev(0.25, 0.35, 0.06)}


def hand_records():
    return ([record(None, s, v) for s, v in FULL.items()] + [record(1, s, v) for s, v in D1.items()]
            + [record(2, s, v) for s, v in D2.items()])


def test_relative_quality_and_its_spread_by_hand(tmp_path):
    cells = {(c.depth, c.metric): c for c in A.relative_cells(recipe(tmp_path), hand_records(), 6)}
    # sst at depth 1: 0.38 / 0.40 = 0.95 and 0.45 / 0.50 = 0.90 -> mean 0.925, sd |0.95 - 0.90| / sqrt(2)
    c = cells[1, "sst_acc"]
    assert c.relative == pytest.approx([0.95, 0.90])
    assert c.rel_mean == pytest.approx(0.925) and c.rel_std == pytest.approx(0.05 / math.sqrt(2))
    assert c.mean == pytest.approx(0.415) and c.std == pytest.approx(0.07 / math.sqrt(2))
    # sts at depth 1: 0.40 / 0.80 = 0.5 and 0.54 / 0.60 = 0.9
    assert cells[1, "sts_pearson"].rel_mean == pytest.approx(0.7)
    assert cells[None, "para_acc"].rel_mean == pytest.approx(1.0) and cells[None, "para_acc"].rel_std == 0
    overall_full_1 = (0.40 + 0.80 + 1.80 / 2) / 3
    overall_d2_1 = (0.20 + 0.40 + 1.08 / 2) / 3
    assert cells[2, "overall"].relative[0] == pytest.approx(overall_d2_1 / overall_full_1)


def test_the_ninety_percent_depth_by_hand(tmp_path):
    cells = A.relative_cells(recipe(tmp_path), hand_records(), 6)
    # sst: depth 1 keeps 92.5%, depth 2 keeps 50% -> 1; para: depth 1 keeps (0.95 + 0.9) / 2 = 92.5% -> 1;
    # sts: depth 1 keeps 70% -> none
    assert A.ninety_depth(cells, "sst_acc") == 1
    assert A.ninety_depth(cells, "para_acc") == 1
    assert A.ninety_depth(cells, "sts_pearson") is None
    assert A.ninety_depth(cells, "sst_acc", threshold=0.5) == 2
    assert A.ninety_depth(cells, "sst_acc", threshold=0.93) is None


def test_cost_rows_by_hand(tmp_path):
    r = recipe(tmp_path, cost={"seeds": [1], "overrides": {"frozen_cache": "off"}})
    recs = [record(None, 1, FULL[1], epoch_seconds=[30.0, 34.0], peak_rss_mib=900.0, base_rss_mib=300.0),
            record(None, 2, FULL[2], epoch_seconds=[28.0, 28.0], peak_rss_mib=1000.0, base_rss_mib=300.0),
            record(2, 1, D2[1], epoch_seconds=[4.0, 6.0], frozen_cache_seconds=3.0, peak_rss_mib=500.0,
                   base_rss_mib=300.0),
            record(2, 2, D2[2], epoch_seconds=[5.0, 5.0], frozen_cache_seconds=0.1),
            record(2, 1, D2[1], COST_ARM, epoch_seconds=[20.0], train_seconds=20.0)]
    rows = {row["depth"]: row for row in A.cost_rows(r, recs, 6)}
    assert rows[None]["epoch_seconds"] == pytest.approx((32 + 28) / 2)
    assert rows[None]["peak_rss_mib"] == 950 and rows[None]["added_rss_mib"] == 650
    assert rows[2]["epoch_seconds"] == 5 and rows[2]["epoch_seconds_nocache"] == 20
    assert rows[2]["cache_seconds"] == 3.0 and rows[2]["peak_rss_mib"] == 500  # the other seed has no figure
    assert math.isnan(rows[None]["epoch_seconds_nocache"])
    assert A.per_epoch({"train_seconds": 12.0, "epochs": 3}) == 4  # records from before epoch_seconds


def test_size_gaps_and_table_tests_by_hand(tmp_path):
    r = recipe(tmp_path, kind="size", sizes=[6, 12])
    recs = hand_records() + [record(None, s, v, size=12) for s, v in D1.items()]
    rows = {(x["size"], x["depth"], x["metric"]): x for x in A.size_rows(r, recs)}
    gap = rows[6, 1, "sst_acc"]  # 0.38 - 0.40 and 0.45 - 0.50
    assert gap["gap"] == pytest.approx(-0.035) and gap["gap_std"] == pytest.approx(0.03 / math.sqrt(2))
    assert (12, 1, "sst_acc") not in rows and rows[12, None, "sst_acc"]["mean"] == pytest.approx(0.415)
    t = recipe(tmp_path, kind="table", depths=["none", "50%"], seeds=[1, 2, 3],
               rows=[{"label": "a", "depth": "none", "arm": ""}, {"label": "b", "depth": "50%", "arm": ""}],
               compare=[["a", "b"]])
    third = {None: dev(0.45, 0.75, 0.7), 1: dev(0.30, 0.70, 0.6)}
    recs = hand_records() + [record(d, 3, v) for d, v in third.items()]
    tests = {x["metric"]: x for x in A.comparisons(t, A.table_rows(t, recs))}
    d = np.array([0.38 - 0.40, 0.45 - 0.50, 0.30 - 0.45])  # b - a on sst, per seed
    t_stat = d.mean() / (d.std(ddof=1) / math.sqrt(3))
    assert tests["sst_acc"]["diff"] == pytest.approx(d.mean()) and tests["sst_acc"]["t"] == pytest.approx(t_stat)


# ----------------------------------------------------------------------------- a tiny study, for real


def tiny_recipe(tmp_path, data, enc, **over):
    path = write_recipe(tmp_path / "tiny.json", depths=["none", 1], sizes=[6], seeds=[1],
                        train={"epochs": 1, "batch_size": 4, "lr": 1e-3, "frozen_cache": "disk", "device": "cpu",
                               "precision": "fp32"},
                        arms={"": {}, "b": {"head_dropout": 0.2}}, **over)
    return [str(path), "--model", str(enc), "--data-dir", str(data), "--in-process", "--threads", "1",
            "--runs-dir", str(tmp_path / "runs")]


def test_a_killed_study_redoes_only_the_run_in_progress(tmp_path, monkeypatch):
    data, enc = tiny_runs.inputs(tmp_path)
    args = tiny_recipe(tmp_path, data, enc)
    trained, real = [], measure_mod.measure

    def crash_third(cfg, threads=None):
        trained.append(Path(cfg.out_dir).name)
        if len(trained) == 3:
            raise KeyboardInterrupt  # killed in the middle of the third run
        return real(cfg, threads)
    monkeypatch.setattr(engine, "measure", crash_third)
    with pytest.raises(KeyboardInterrupt):
        C.main(args)
    names = [k.name for k in load_recipe(args[0]).resolve(2).plan([])]
    assert trained == names[:3]
    assert not list((tmp_path / "runs").glob(".*.lock"))  # the killed run's claim is released
    trained.clear()
    assert C.main(args) == 0
    assert trained == names[2:]  # the third again, then the last; nothing finished is redone
    records = sweep_records.read_results(tmp_path / "results" / "results.jsonl")
    assert [sweep_records.RunKey.of(r).name for r in records] == names
    assert records[3]["overrides"] == {"head_dropout": 0.2} and "overrides" not in records[2]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| none (full) | 1 |" in report and (tmp_path / "report" / "report.csv").is_file()
    assert (tmp_path / "report" / "relative_quality.png").is_file()


def test_runs_sharing_a_frozen_prefix_build_it_once_and_score_as_if_alone(tmp_path, caplog):
    data, enc = tiny_runs.inputs(tmp_path)
    with caplog.at_level("INFO"):
        assert C.main(tiny_recipe(tmp_path, data, enc)) == 0
    assert caplog.text.count("frozen-prefix cache: wrote") == 2  # training and dev states, depth 1, once
    assert caplog.text.count("frozen-prefix cache: reusing") == 2  # arm b found both
    shared = {sweep_records.RunKey.of(r).arm: r
              for r in sweep_records.read_results(tmp_path / "results" / "results.jsonl") if r["depth"] == 1}
    # arm b again, alone: its own cache folder, built from scratch
    from training.run.trainer import train
    cfg = C.base_config(load_recipe(tiny_recipe(tmp_path, data, enc)[0]), C.build_parser().parse_args(
        tiny_recipe(tmp_path, data, enc)))
    alone = TrainConfig(**{**cfg.to_dict(), "head_dropout": 0.2, "freeze_upto": 1, "seed": 1,
                           "files": {f"{t}_train": str(tmp_path / "runs"
                                                       / sweep_records.RunKey(TASKS, 1, 6, 1, "b").name
                                                       / f"{t}-train-subset.csv") for t in ("sst", "para", "sts")},
                           "cache_dir": str(tmp_path / "own-cache"), "out_dir": str(tmp_path / "alone")})
    assert train(alone) == shared["b"]["dev"]


def test_two_workers_never_train_one_run(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    key = sweep_records.RunKey(TASKS, 1, 6, 1)
    lock = engine.claim(runs, key)
    assert lock is not None and engine.claim(runs, key) is None  # held by this (live) process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    assert engine.claim(runs, key) == lock  # its worker is gone: taken over
    lock.write_text(json.dumps({"pid": dead.pid, "host": "another-machine"}))
    assert engine.claim(runs, key) is None  # another machine's worker: left alone


def test_a_killed_sweep_stops_its_training_process(tmp_path):
    """SIGTERM to the parent runs its `finally` (exit_on_sigterm); a parent gone without one stops the
    child too (exit_with_parent)."""
    code = ("import sys, time, pathlib; from training.run.signals import exit_on_sigterm; exit_on_sigterm()\n"
            "try:\n    print('ready', flush=True); time.sleep(60)\n"
            f"finally:\n    pathlib.Path({str(tmp_path / 'cleaned')!r}).write_text('yes')\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 128 + signal.SIGTERM and (tmp_path / "cleaned").read_text() == "yes"
    script, flag = tmp_path / "pair.py", tmp_path / "stopped"
    script.write_text(
        "import os, sys, time, signal, subprocess, pathlib\n"
        "from training.run.signals import exit_with_parent\n"
        "if sys.argv[1] == 'parent':\n"
        "    subprocess.Popen([sys.executable, __file__, 'child', sys.argv[2], str(os.getpid())])\n"
        "    time.sleep(float(sys.argv[3]))\n"
        "    os._exit(0)  # gone without a finally, as by SIGKILL\n"
        "signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path(sys.argv[2]).write_text('stopped'), os._exit(0)))\n"
        "exit_with_parent(int(sys.argv[3]), poll_seconds=0.1)\n"
        "time.sleep(30)\n")
    # the parent gone after its child is watching (1 s), and gone before the child has even started (0 s)
    for parent_lives in ("1", "0"):
        flag.unlink(missing_ok=True)
        subprocess.run([sys.executable, str(script), "parent", str(flag), parent_lives], timeout=30,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
        deadline = time.time() + 20
        while not flag.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert flag.read_text() == "stopped", parent_lives


# ----------------------------------------------------------------------------- the dev sets' cache


def test_cached_dev_outputs_equal_uncached_ones(tmp_path):
    from training.inference.outputs import raw_outputs, task_outputs
    from training.methods.frozen_cache import build_frozen_cache
    from training.run.build import build_model, load_data
    data, enc = tiny_runs.inputs(tmp_path)
    cfg = TrainConfig(model=str(enc), data_dir=str(data), freeze_upto=1, predict_both_orders=True)
    model, tok, _ = build_model(cfg)
    dev = load_data(cfg, tok).dev
    cache = build_frozen_cache(model, dev, tok, torch.device("cpu"), "memory", dtype="float32")
    for task, d in dev.items():
        ref = raw_outputs(model, d, tok, EvalBatching(5), torch.device("cpu"))
        got = raw_outputs(model, d, tok, EvalBatching(5), torch.device("cpu"), cache=cache)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
        padded = raw_outputs(model, d, tok, EvalBatching(5, multiple=8), torch.device("cpu"), cache=cache)
        torch.testing.assert_close(padded, ref, rtol=0, atol=1e-5)  # the cache's batches padded as the tokens
        assert not torch.equal(ref, torch.zeros_like(ref))
        if d.swapped is not None:  # the other order is not what the cache holds: it runs uncached
            assert not cache.covers(d.swapped)
            five = EvalBatching(5)
            torch.testing.assert_close(task_outputs(model, d, tok, five, torch.device("cpu"), cache=cache),
                                       task_outputs(model, d, tok, five, torch.device("cpu")), rtol=0, atol=1e-5)


def test_without_matplotlib_the_tables_are_still_written(tmp_path, monkeypatch, caplog):
    from training.experiments.study import figures
    monkeypatch.setattr(figures, "pyplot", lambda: None)
    r = recipe(tmp_path)
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in hand_records()))
    C.write_report(r, results, tmp_path / "report")
    assert "| 1 | 2 | 0.4150 ± 0.0495 | 0.925 ± 0.035 |" in (tmp_path / "report" / "report.md").read_text()
    assert (tmp_path / "report" / "report.csv").is_file() and not list((tmp_path / "report").glob("*.png"))


def test_a_table_plans_its_rows_alone_and_the_schedules_recipe_checks():
    recipe = load_recipe("schedules").resolve(6)
    keys = recipe.plan([])
    rows = [(recipe.depth(r["depth"]), r["arm"]) for r in recipe.rows]
    assert [(k.depth, k.arm) for k in keys] == rows * 3 and [k.seed for k in keys] == [1] * 7 + [2] * 7 + [3] * 7
    for arm, options in recipe.arms.items():  # every schedule it names is one the trainer takes
        cfg = TrainConfig(**{**recipe.train, **options})
        assert not [e for e in validate(cfg) if "unfreeze" in e], (arm, validate(cfg))
    records = [{"tasks": "sst+para+sts", "depth": d, "size": 1000, "seed": s, "arm": a, "train_seconds": 10.0 * s,
                "dev": {"sst_acc": 0.4, "para_acc": 0.7, "sts_pearson": 0.8, "overall": 0.7 + 0.001 * s}}
               for s in (1, 2, 3) for d, a in rows]
    text = T.table_markdown(recipe, records)
    assert "| full fine-tuning | 0 | 3 | 0.4000 ± 0.0000 |" in text and "| 20 |" in text  # train s: mean of 10, 20, 30
    assert "published" not in text
