"""The freezing study's clean protocol (training/experiments/study/protocol.py, arms.py, baselines.py): the tuning
split, the rate ladder and its edge extension, what is tuned and what reports, the statistics against values
computed by hand, and a tiny arms study run for real whose records and prediction files are checked
against an independent scoring of the dev files."""
import gzip
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import tiny_runs
import torch
from scipy import stats as sps

from data.loaders import load_task_file
from training.common.errors import ConfigError
from training.config.train_config import TrainConfig
from training.experiments.study import arms as A
from training.experiments.study import arms_report as R
from training.experiments.study import baselines as B
from training.experiments.study import cli as C
from training.experiments.study.protocol import Protocol, borrows, ladder, run_arm, split_run_arm
from training.experiments.study.recipe import load_recipe
from training.experiments.sweep import records as sweep_records
from training.experiments.sweep import subsets as sweep_subsets

TASKS = "sst+para+sts"


def arms_recipe(tmp_path, **over) -> dict:
    raw = {"title": "t", "kind": "arms", "tasks": ["sst", "para", "sts"], "sizes": ["all"], "seeds": [1, 2],
           "train": {"epochs": 2, "batch_size": 4, "device": "cpu", "precision": "fp32", "frozen_cache": "disk"},
           "tuning_split": {"share": 0.25, "seed": 0},
           "lr_grid": {"lrs": [0.001, 0.003], "tuning_seeds": [7], "max_extensions": 1},
           "arms": {"": {}, "b": {"head_dropout": 0.2}},
           "points": [{"label": "full", "depth": "none", "arm": ""}, {"label": "one", "depth": 1, "arm": "b"},
                      {"label": "full at one's", "depth": "none", "arm": "", "lr_of": "one"}], **over}
    path = tmp_path / "arms.json"
    path.write_text(json.dumps(raw))
    return path


def loaded(tmp_path, **over):
    return load_recipe(str(arms_recipe(tmp_path, **over))).resolve(2)


def tuning_record(depth, arm, lr, score, seed=7):
    return {"tasks": TASKS, "depth": depth, "size": "all", "seed": seed, "arm": run_arm(arm, lr),
            "tune": {"overall": score}, "dev": {"overall": 0.5}}


# ----------------------------------------------------------------------------- the tuning split


def test_the_tuning_split_is_stratified_disjoint_and_fixed_by_its_own_seed():
    labels = [0] * 60 + [1] * 30 + [2] * 10
    tune, rest = sweep_subsets.tuning_split(labels, 0.1, seed=0)
    assert sorted(tune + rest) == list(range(100)) and not set(tune) & set(rest)
    assert [sum(labels[i] == c for i in tune) for c in (0, 1, 2)] == [6, 3, 1]  # 10% of each class
    assert sweep_subsets.tuning_split(labels, 0.1, seed=0) == (tune, rest)
    assert sweep_subsets.tuning_split(labels, 0.1, seed=1)[0] != tune


def test_training_subsets_never_hold_a_tuning_example(tmp_path):
    data, _ = tiny_runs.inputs(tmp_path)
    from training.config.train_config import TrainConfig
    grid = sweep_subsets.Grid(["sst", "para", "sts"], ["all"], [1, 2], tuning_split={"share": 0.25, "seed": 0})
    drawn = sweep_subsets.training_subsets(grid, TrainConfig(data_dir=str(data)))
    for task in grid.tasks:
        tune = {e.id for e in drawn[task, sweep_subsets.TUNE]}
        train = {e.id for e in drawn[task, 1]["all"]}
        assert len(tune) == 3 and len(train) == tiny_runs.N - 3 and not tune & train
        assert train == {e.id for e in drawn[task, 2]["all"]}  # "all" is the whole rest, whatever the seed


# ----------------------------------------------------------------------------- rates and the plan


@pytest.mark.parametrize("lr, up, down", [(1e-4, 3e-4, 3e-5), (3e-4, 1e-3, 1e-4), (0.001, 0.003, 0.0003),
                                          (3e-5, 1e-4, 1e-5)])
def test_the_ladder_goes_one_three_ten(lr, up, down):
    assert ladder(lr, True) == pytest.approx(up) and ladder(lr, False) == pytest.approx(down)


def test_a_rate_off_the_ladder_moves_by_root_ten():
    assert ladder(2e-4, True) == pytest.approx(float(f"{2e-4 * math.sqrt(10):.3g}"))


def test_run_arms_name_the_rate_and_read_back():
    assert run_arm("", 1e-4) == "lr0.0001" and run_arm("lora4", 3e-5) == "lora4-lr3e-05"
    assert split_run_arm("lora4-lr3e-05") == ("lora4", 3e-5) and split_run_arm("lr0.001") == ("", 0.001)


def test_tuning_comes_first_and_reporting_waits_for_the_choice(tmp_path):
    recipe = loaded(tmp_path)
    keys = [k.name for k in recipe.plan([])]
    assert keys == [f"{TASKS}-freezenone-nall-seed7-lr0.001", f"{TASKS}-freezenone-nall-seed7-lr0.003",
                    f"{TASKS}-freeze1-nall-seed7-b-lr0.001", f"{TASKS}-freeze1-nall-seed7-b-lr0.003"]


def test_an_edge_choice_extends_the_grid_then_the_interior_choice_reports(tmp_path):
    recipe = loaded(tmp_path)
    records = [tuning_record(None, "", 0.001, 0.60), tuning_record(None, "", 0.003, 0.62)]  # best on the top edge
    assert Protocol(recipe, records).tried(recipe.points[0]) == ([0.001, 0.003, 0.01], None)
    records.append(tuning_record(None, "", 0.01, 0.55))  # 0.003 is now inside
    protocol = Protocol(recipe, records)
    assert protocol.tried(recipe.points[0]) == ([0.001, 0.003, 0.01], 0.003)
    names = [k.name for k in recipe.plan(records)]
    assert names[3:5] == [f"{TASKS}-freezenone-nall-seed1-lr0.003", f"{TASKS}-freezenone-nall-seed2-lr0.003"]
    assert names[5:] == [f"{TASKS}-freeze1-nall-seed7-b-lr{lr}" for lr in ("0.001", "0.003")]  # then the next point
    assert not any("seed1" in n and "freeze1" in n for n in names)  # point "one" is still tuning
    assert protocol.chosen("full at one's") is None  # and so is the point that takes its rate


def test_the_extension_stops_at_max_extensions_and_a_tie_takes_the_smaller_rate(tmp_path):
    recipe = loaded(tmp_path)
    records = [tuning_record(1, "b", lr, s) for lr, s in [(0.001, 0.5), (0.003, 0.6), (0.01, 0.7)]]
    assert Protocol(recipe, records).tried(recipe.points[1]) == ([0.001, 0.003, 0.01], 0.01)  # 1 extension only
    tie = [tuning_record(None, "", lr, 0.6) for lr in (0.0003, 0.001, 0.003)]
    assert Protocol(recipe, tie).tried(recipe.points[0])[1] == 0.0003


def test_lr_of_trains_at_the_other_points_rate(tmp_path):
    recipe = loaded(tmp_path)
    records = [tuning_record(1, "b", lr, s) for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    protocol = Protocol(recipe, records)
    assert protocol.chosen("one") == 0.001 and protocol.chosen("full at one's") == 0.001
    assert sweep_records.RunKey(TASKS, None, "all", 1, "lr0.001") in recipe.plan(records)


RUNNER_UP = {"label": "one, at the runner-up rate", "depth": 1, "arm": "b", "runner_up_of": "one"}


def test_runner_up_of_trains_at_the_rate_the_other_points_tuning_ranked_second(tmp_path):
    recipe = loaded(tmp_path, points=[*json.loads(arms_recipe(tmp_path).read_text())["points"], RUNNER_UP])
    scores = [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]  # ranked 0.001, 0.003, 0.0003
    records = [tuning_record(1, "b", lr, s) for lr, s in scores[:2]]
    assert Protocol(recipe, records).chosen(RUNNER_UP["label"]) is None  # one's tuning is not done
    records.append(tuning_record(1, "b", 0.003, 0.45))
    protocol = Protocol(recipe, records)
    assert protocol.chosen("one") == 0.001 and protocol.chosen(RUNNER_UP["label"]) == 0.003
    names = [k.name for k in recipe.plan(records)]
    assert [n for n in names if "freeze1" in n and "lr0.003" in n] == [
        f"{TASKS}-freeze1-nall-seed7-b-lr0.003", f"{TASKS}-freeze1-nall-seed1-b-lr0.003",
        # one's tuning run, then the twin's reporting runs; no tuning of its own
        f"{TASKS}-freeze1-nall-seed2-b-lr0.003"]
    tie = [tuning_record(1, "b", lr, s) for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.5)]]
    assert Protocol(recipe, tie).chosen("one") == 0.001 and Protocol(recipe, tie).chosen(RUNNER_UP["label"]) == 0.003


def test_the_tuning_table_gives_each_choices_margin_and_one_runs_spread(tmp_path):
    recipe = loaded(tmp_path, points=[*json.loads(arms_recipe(tmp_path).read_text())["points"], RUNNER_UP])
    records = [tuning_record(1, "b", lr, s) for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.47)]]
    tunes = {1: 0.61, 2: 0.64}  # the reporting runs' tuning-split scores at one's rate, 0.001
    records += [{**_reporting(1, "b", 0.001, seed, 0.6), "tune": {"overall": t}} for seed, t in tunes.items()]
    rows = {line.split(" | ")[0].lstrip("| "): line
            for line in R.tuning_lines(recipe, records) if line.startswith("| ")}
    sd = abs(0.61 - 0.64) / math.sqrt(2)  # two values: |a - b| / sqrt(2)
    assert rows["one"].endswith(f"| 0.001 | {0.5 - 0.47:.4f} | {sd:.4f} |")
    assert rows[RUNNER_UP["label"]] == f"| {RUNNER_UP['label']} | (the runner-up rate of one) | 0.003 | | |"
    assert rows["full"].endswith("| - | - |")  # nothing tuned yet


def test_a_dry_run_lists_a_runner_up_twins_runs_under_the_twin(tmp_path, capsys):
    recipe = loaded(tmp_path, points=[*json.loads(arms_recipe(tmp_path).read_text())["points"], RUNNER_UP])
    records = [tuning_record(d, a, lr, s) for d, a in [(None, ""), (1, "b")]
               for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    records += [_reporting(1, "b", 0.001, seed, 0.6) for seed in (1, 2)]  # one's own reporting runs are in
    C.print_remaining(recipe, records, [])
    out = capsys.readouterr().out
    assert "  one, at the runner-up rate: 2 + 0 runs" in out and "  one:" not in out


def test_a_report_counts_its_own_runs_in_a_results_file_it_shares(tmp_path):
    recipe = loaded(tmp_path)
    written = {"settings": {}, "n_train": {"sst": 3}, "split": {"n_tune": {"sst": 1}}}
    records = [tuning_record(None, "", lr, s) | written for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    other = tuning_record(3, "", 0.001, 0.5) | written  # another recipe's run: a depth this one never trains
    runs = next(line for line in R.protocol_lines(recipe, records + [other]) if line.startswith("Runs:"))
    # planned: full's three rates and two reporting seeds, one's first two rates
    assert runs.startswith("Runs: 3 recorded of 7 planned so far (the results file holds 4, with other recipes' runs)")
    alone = next(line for line in R.protocol_lines(recipe, records) if line.startswith("Runs:"))
    assert alone.startswith("Runs: 3 recorded of 7 planned so far;")


@pytest.mark.parametrize("point, says", [
    ({**RUNNER_UP, "lrs": [0.001]}, "runner_up_of"),  # a grid of its own as well
    ({**RUNNER_UP, "runner_up_of": "nobody"}, "runner_up_of"),
    ({**RUNNER_UP, "runner_up_of": "full at one's"}, "name the point that tunes"),  # that point borrows its rate
])
def test_a_bad_runner_up_point_is_one_line(tmp_path, point, says, capsys):
    base = json.loads(arms_recipe(tmp_path).read_text())["points"]
    path = arms_recipe(tmp_path, points=[*base, point])
    assert C.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and str(path) in err


@pytest.mark.parametrize("study, rates, layers", [("whole", "whole-rates", 6), ("whole-size", "whole-size-rates", 6),
                                                  ("mpnet-depth", "mpnet-depth-rates", 12)])
def test_a_near_tie_recipe_repeats_its_studys_points_and_settings(study, rates, layers):
    """A near-tie recipe reads its study's results: its settings and the points it repeats must be the study's,
    or its runs would be other runs (or refused), and its twins must be exactly the near ties of the study's
    tuning, the rule recomputed from the study's record in docs/ (a run synced there that makes a new near tie
    fails this until the recipe twins it)."""
    recipes = Path("training/experiments/study/recipes")
    original, twins = (json.loads((recipes / f"{n}.json").read_text()) for n in (study, rates))
    for key in ("tasks", "sizes", "seeds", "train", "tuning_split", "lr_grid", "fixed_budget"):
        assert twins.get(key) == original.get(key), key
    assert all(original["arms"][a] == o for a, o in twins["arms"].items())
    points = {p["label"]: p for p in original["points"]}
    own = [p for p in twins["points"] if "runner_up_of" not in p]
    assert own and all(points[p["label"]] == p for p in own)
    twinned = {p["runner_up_of"] for p in twins["points"] if "runner_up_of" in p}
    assert twinned <= {p["label"] for p in own}
    recipe = load_recipe(study).resolve(layers)  # the rule, on the study's own record
    protocol = Protocol(recipe, sweep_records.read_results(Path(f"docs/freezing-study/{study}/results.jsonl")))
    near = {p["label"] for p in recipe.points if not borrows(p)
            and R.choice_margin(protocol, p) < R.tune_spread(protocol, p["label"])}
    assert twinned == near


def test_a_borrowed_rate_equal_to_the_references_own_is_the_reference(tmp_path):
    """"full at one's" borrows one's rate: the same as full's own, its runs are full's (one point, no pair)."""
    from training.experiments.study.arms_report import one_point_lines

    recipe = loaded(tmp_path)
    tuning = [tuning_record(d, a, lr, sc) for d, a in [(None, ""), (1, "b")]
              for lr, sc in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    reporting = [_reporting(None, "", 0.001, seed, 0.7) for seed in (1, 2)]
    protocol = Protocol(recipe, tuning + reporting)
    assert protocol.same_runs("full at one's", "full") and not protocol.same_runs("one", "full")
    assert one_point_lines(recipe, tuning + reporting, "full") == [
        "\nfull at one's: the rate it borrows is full's own, so its runs are full's (left out of the tables and "
        "figures, where its rows would be full's)."]
    from training.experiments.study.arms import point_rows
    from training.experiments.study.arms_figures import point_curves
    assert {r["label"] for r in point_rows(recipe, tuning + reporting, None)} == {"full"}
    curved = [{**r, "tune_curve": [[10, 0, 0.6], [20, 1, 0.7]]} for r in reporting]
    assert [(j, label) for j, label, _ in point_curves(recipe, tuning + curved)] == [(0, "full")]  # not full's twin
    other = [tuning_record(1, "b", 0.003, 0.6), tuning_record(1, "b", 0.01, 0.55)]  # one's choice: 0.003
    protocol = Protocol(recipe, tuning + other + reporting + [_reporting(None, "", 0.003, 1, 0.69)])
    assert protocol.chosen("full at one's") == 0.003 and protocol.reporting("full at one's")
    assert not protocol.same_runs("full at one's", "full")
    assert one_point_lines(recipe, tuning + other + reporting, "full") == []


def test_a_point_whose_runs_trained_on_two_machines_says_so(tmp_path):
    from training.experiments.study.arms_report import mixed_machine_lines

    recipe = loaded(tmp_path)
    tuning = [tuning_record(d, a, lr, sc) for d, a in [(None, ""), (1, "b")]
              for lr, sc in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    on_cpu = {"cpu": "EPYC", "cpu_bf16": None, "cuda_peak_mib": None}
    on_gpu = {"cpu": "Xeon", "cpu_bf16": "AMX tiles", "cuda_peak_mib": 900.0, "gpu": "H100"}
    full = [{**_reporting(None, "", 0.001, seed, 0.7), **on_cpu} for seed in (1, 2)]
    one = [{**_reporting(1, "b", 0.001, 1, 0.7), **on_cpu}, {**_reporting(1, "b", 0.001, 2, 0.7), **on_gpu}]
    assert mixed_machine_lines(recipe, tuning + full + one) == [
        "\none: its reporting runs trained on CPU EPYC (bf16 emulated) (1 run); GPU H100 (1 run)."]
    assert mixed_machine_lines(recipe, tuning + full) == []  # one machine: nothing to say


@pytest.mark.parametrize("over, says", [
    ({"lr_grid": {"lrs": [0.001], "tuning_seeds": [1]}}, "tuning_seeds"),  # a reporting seed
    ({"tuning_split": {"share": 0.7, "seed": 0}}, "tuning_split"),
    ({"points": [{"label": "a", "depth": "none", "arm": "x"}]}, "points"),
    ({"points": [{"label": "a", "depth": "none", "arm": "", "lr_of": "a"},
                 {"label": "b", "depth": "none", "arm": "", "lr_of": "a"}]}, "lr_of"),
    ({"points": [{"label": "a", "depth": "none", "arm": "", "published": 2.55}]}, "published"),  # not text
    ({"compare": [["one", "nobody", "why?"]]}, "compare"),  # not a point
    ({"compare": [["one", "full"]]}, "compare"),  # no question
    ({"compare": [["one", "one", "why?"]]}, "compare"),  # a point against itself
])
def test_a_bad_arms_recipe_is_one_line_naming_its_key(tmp_path, over, says, capsys):
    path = arms_recipe(tmp_path, **over)
    assert C.main([str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and str(path) in err


# ----------------------------------------------------------------------------- statistics, by hand


def test_holm_steps_down_and_keeps_the_order():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01, max(0.03, 2 * 0.03), max(0.06, 1 * 0.04)
    assert A.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert A.holm([0.5, math.nan, 0.4]) == pytest.approx([0.8, math.nan, 0.8], nan_ok=True)  # nan is not counted
    assert A.holm([0.9, 0.8]) == [1.0, 1.0]


def test_the_t_interval_is_the_textbook_one():
    xs = [0.70, 0.72, 0.71, 0.69, 0.73]
    mean, sd = 0.71, math.sqrt(sum((x - 0.71) ** 2 for x in xs) / 4)
    half = 2.7764451051977987 * sd / math.sqrt(5)  # t(0.975, 4 df), from a table
    assert A.t_interval(xs) == pytest.approx((mean - half, mean + half))
    assert all(math.isnan(v) for v in A.t_interval([0.7]))


def test_the_sd_interval_is_the_chi_square_one():
    xs = [0.70, 0.72, 0.71, 0.69, 0.73]
    sd = float(np.std(xs, ddof=1))
    # chi2(0.975, 4) = 11.1433, chi2(0.025, 4) = 0.4844 (tables)
    assert A.sd_interval(xs) == pytest.approx((sd * math.sqrt(4 / 11.143287), sd * math.sqrt(4 / 0.484419)), rel=1e-5)



def _pitman_morgan_p(a, b) -> float:
    """The textbook test, written out: equal variances of paired a, b iff corr(a + b, b - a) = 0."""
    a, b = np.asarray(a), np.asarray(b)
    return float(sps.pearsonr(a + b, b - a).pvalue)


def test_the_spread_ratio_is_pitman_morgans_with_the_interval_its_test_inverts():
    full = [0.740, 0.745, 0.738, 0.747, 0.742]
    deep = [0.700, 0.720, 0.690, 0.735, 0.705]  # more spread, partly following full's seeds
    got = A.spread_ratio(full, deep)
    assert got["ratio"] == pytest.approx(np.std(deep, ddof=1) / np.std(full, ddof=1))
    assert got["p"] == pytest.approx(_pitman_morgan_p(full, deep))
    lo, hi = got["ratio_ci"]
    assert lo < got["ratio"] < hi
    # the interval's ends are the sd ratios at which the scaled runs sit exactly on the 5% line
    for bound in (lo, hi):
        assert _pitman_morgan_p(full, np.asarray(deep) / bound) == pytest.approx(0.05, abs=1e-9)
    # the same runs: ratio 1, no evidence; two seeds: nothing to say
    same = A.spread_ratio(full, full)
    assert same["ratio"] == 1.0 and math.isnan(same["p"])
    two = A.spread_ratio(full[:2], deep[:2])
    assert math.isnan(two["p"]) and math.isnan(two["ratio"])


def test_normalised_quality_puts_trivial_at_zero_and_full_at_one():
    assert A.normalised(0.459, 0.459, 0.745) == 0 and A.normalised(0.745, 0.459, 0.745) == 1
    assert A.normalised(0.432, 0.459, 0.745) == pytest.approx((0.432 - 0.459) / (0.745 - 0.459))  # below trivial: < 0


def test_bootstrap_p_is_twice_the_smaller_tail():
    assert A.bootstrap_p(np.array([0.1] * 97 + [-0.1] * 3)) == pytest.approx(0.06)
    assert A.bootstrap_p(np.array([0.1] * 50 + [-0.1] * 50)) == 1.0


def _reporting(depth, arm, lr, seed, overall):
    dev = {"sst_acc": overall, "para_acc": overall, "sts_pearson": 2 * overall - 1, "overall": overall}
    return {"tasks": TASKS, "depth": depth, "size": "all", "seed": seed, "arm": run_arm(arm, lr), "dev": dev,
            "tune": {"overall": overall}, "best_epoch": 1, "trainable_params": 10, "total_params": 20}



def test_a_point_counts_the_runs_that_kept_their_last_evaluation(tmp_path):
    recipe = loaded(tmp_path, seeds=[1, 2, 3, 4])
    records = [tuning_record(None, "", lr, s) for lr, s in [(0.0003, 0.5), (0.001, 0.7), (0.003, 0.6)]]
    for seed, best, ran in [(1, 5, 6), (2, 3, 6), (3, 2, 3), (4, 1, 4)]:  # seeds 1 and 3 kept their last
        r = _reporting(None, "", 0.001, seed, 0.7)
        records.append(r | {"best_epoch": best, "epochs_run": ran})
    rows = {(r["label"], r["metric"]): r for r in A.point_rows(recipe, records, None)}
    full = next(v for (label, metric), v in rows.items() if metric == "overall")
    assert full["at_last"] == 2 and full["best_epochs"] == [5, 3, 2, 1]


def test_the_convergence_rule_waits_for_the_reporting_runs_that_could_tip_it(tmp_path):
    def row(at_last, runs):
        return {"label": "full", "metric": "overall", "at_last": at_last, "best_epochs": [1] * runs}

    recipe = loaded(tmp_path, seeds=[1, 2, 3], points=[{"label": "full", "depth": "none", "arm": ""}])
    # (kept their last, runs in so far of 3 planned) -> due, undecided
    for at_last, runs, due, undecided in [(1, 1, [], ["full"]),  # 1 of 3: not yet "most"; 2 missing could make it
                                          (2, 2, ["full"], []), (2, 3, ["full"], []),  # 2 of 3 planned: most
                                          (0, 2, [], []),  # at most 1 of 3, whatever the last run does
                                          (1, 2, [], ["full"]), (1, 3, [], [])]:
        rows = [row(at_last, runs)]
        assert (A.twins_due(recipe, rows), A.twins_undecided(recipe, rows)) == (due, undecided), (at_last, runs)
    assert R.convergence_line(recipe, [row(1, 1)]).endswith(
        "no twin is due so far; undecided until more reporting runs are in for full.")
    assert R.convergence_line(recipe, [row(1, 3)]).endswith("): no twin is due.")
    points = [{"label": "full", "depth": "none", "arm": ""}, {"label": "one", "depth": 1, "arm": ""}]
    both = loaded(tmp_path, seeds=[1, 2, 3], points=points)  # one point due, the other still open: both named
    line = R.convergence_line(both, [row(2, 2), row(1, 1) | {"label": "one"}])
    assert line.endswith("): due and not yet in the recipe for full; undecided until more reporting runs are in "
                         "for one.")


def test_the_convergence_rule_names_the_points_due_a_longer_twin(tmp_path):
    def row(label, at_last, seeds=5):
        return {"label": label, "metric": "overall", "at_last": at_last, "best_epochs": [1] * seeds}

    points = [{"label": "full", "depth": "none", "arm": ""}, {"label": "one", "depth": 1, "arm": "b"},
              {"label": "full at one's", "depth": "none", "arm": "", "lr_of": "one"}]
    recipe = loaded(tmp_path, points=points)  # epochs 2 in train
    rows = [row("full", 2), row("one", 3), row("full at one's", 5)]
    # one: 3 of 5 kept their last, no longer twin; full: 2 of 5 is not most; lr_of points are outside the rule
    assert A.twins_due(recipe, rows) == ["one"]
    # a twin of the same depth and options but epochs and early stopping settles it; a shorter one does not
    twin = {"label": "one, longer", "depth": 1, "arm": "b4"}
    arms = {"": {}, "b": {"head_dropout": 0.2}, "b4": {"head_dropout": 0.2, "epochs": 4, "early_stop_patience": 3}}
    assert A.twins_due(loaded(tmp_path, points=points + [twin], arms=arms), rows) == []
    arms["b4"] = {"head_dropout": 0.3, "epochs": 4}  # other options: not its twin
    assert A.twins_due(loaded(tmp_path, points=points + [twin], arms=arms), rows) == ["one"]
    arms["b4"] = {"head_dropout": 0.2, "epochs": 1}  # fewer epochs: not a longer twin
    assert A.twins_due(loaded(tmp_path, points=points + [twin], arms=arms), rows) == ["one"]
    assert R.convergence_line(recipe, rows).endswith("): due and not yet in the recipe for one.")
    # a recipe whose points train a set budget asks what it buys: no point is due a twin, the report says why
    budget = loaded(tmp_path, points=points, fixed_budget="every size trains 100 updates.")
    assert A.twins_due(budget, rows) == []
    assert R.convergence_line(budget, rows).endswith("): not applied: every size trains 100 updates.")


@pytest.mark.parametrize("over, why", [
    ({"fixed_budget": ""}, "fixed_budget must be a sentence saying why"),
    ({"fixed_budget": 3}, "fixed_budget must be a sentence saying why"),
    ({"fixed_budget": "why", "kind": "depth", "depths": [0]}, "fixed_budget must be a sentence saying why"),
])
def test_a_fixed_budget_must_say_why_in_an_arms_recipe(tmp_path, over, why):
    with pytest.raises(ConfigError, match=why):
        loaded(tmp_path, **over)


def test_a_dry_run_names_a_twin_that_is_due(tmp_path, capsys):
    recipe = loaded(tmp_path)  # seeds 1, 2; epochs 2
    records = [tuning_record(d, a, lr, s) for d, a in [(None, ""), (1, "b")]
               for lr, s in [(0.001, 0.7), (0.003, 0.6), (0.0003, 0.5)]]
    for seed in (1, 2):
        records.append(_reporting(None, "", 0.001, seed, 0.7) | {"best_epoch": 0, "epochs_run": 2})
        records.append(_reporting(1, "b", 0.001, seed, 0.6) | {"best_epoch": 1, "epochs_run": 2})  # its last
    C.print_remaining(recipe, records, [])
    assert "a longer twin is due (most reporting runs kept their last evaluation) for: one:" in capsys.readouterr().out

def test_reported_scores_leave_out_the_tuning_runs(tmp_path):
    recipe = loaded(tmp_path)
    records = ([tuning_record(None, "", lr, s) for lr, s in [(0.0003, 0.5), (0.001, 0.7), (0.003, 0.6)]]
               + [tuning_record(1, "b", lr, s) for lr, s in [(0.0003, 0.5), (0.001, 0.4), (0.003, 0.35)]]
               + [_reporting(None, "", 0.001, 1, 0.70), _reporting(None, "", 0.001, 2, 0.74),
                  _reporting(1, "b", 0.0003, 1, 0.63), _reporting(1, "b", 0.0003, 2, 0.69)])
    rows = {(r["label"], r["metric"]): r for r in A.point_rows(recipe, records, {"trivial": {"overall": 0.46}})}
    full, one = rows["full", "overall"], rows["one", "overall"]
    assert full["values"] == {1: 0.70, 2: 0.74} and full["mean"] == pytest.approx(0.72)  # not the 0.5 of seed 7
    assert one["lr"] == 0.0003 and one["lee"] == pytest.approx((0.63 / 0.70 + 0.69 / 0.74) / 2)
    assert one["normalised"] == pytest.approx(((0.63 - 0.46) / (0.70 - 0.46) + (0.69 - 0.46) / (0.74 - 0.46)) / 2)
    assert ("full at one's", "overall") not in rows  # at one's rate, 0.0003: runs of its own, none yet


# ----------------------------------------------------------------------------- baselines


def test_trivial_scores_by_hand():
    got = B.trivial_scores({"sst": [3, 3, 1, 2], "para": [0.0, 1.0, 0.0]},
                           {"sst": [3, 1, 1, 3, 0], "para": [1.0, 0.0, 0.0, 0.0], "sts": [1.0, 2.5, 4.0]})
    assert got["sst_acc"] == pytest.approx(2 / 5) and got["para_acc"] == pytest.approx(3 / 4)
    assert got["sts_pearson"] == 0.0 and got["overall"] == pytest.approx((2 / 5 + 3 / 4 + 0.5) / 3)


def test_the_threshold_is_the_best_midpoint():
    cos = np.array([0.1, 0.4, 0.5, 0.9])
    labels = np.array([0, 0, 1, 1])
    assert B.best_threshold(cos, labels) == pytest.approx(0.45)


# ----------------------------------------------------------------------------- a tiny arms study, for real


def cpu_flags() -> set[str]:
    """The CPU's instruction sets as the kernel lists them (Linux, where CI runs)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return set(next(x for x in lines if x.startswith("flags")).split(":", 1)[1].split())


def test_the_protocol_says_how_long_each_kind_of_point_trains(tmp_path):
    patience = {"epochs": 2, "batch_size": 4, "early_stop_patience": 1}
    assert R.epochs_phrase(loaded(tmp_path, train=patience), {}) == \
        "up to 2 epochs with early stopping after 1 evaluations without a gain"
    # arms that set their own length: each kind named, the most points' first, ties in the recipe's order
    arms = {"": {}, "b": {"epochs": 5, "early_stop_patience": None}}
    points = [{"label": "full", "depth": "none", "arm": ""}, {"label": "one", "depth": 1, "arm": "b"},
              {"label": "two", "depth": 2, "arm": "b"}]
    assert R.epochs_phrase(loaded(tmp_path, train=patience, arms=arms, points=points), {}) == \
        ("by point (5 epochs without early stopping; up to 2 epochs with early stopping after 1 evaluations "
         "without a gain)")
    # the records' settings stand in for what the recipe leaves at the trainer's defaults
    assert (R.epochs_phrase(loaded(tmp_path), {"epochs": 2, "early_stop_patience": None})
            == "2 epochs without early stopping")


@pytest.mark.parametrize("native", [False, True])
def test_a_study_warns_once_before_any_run_where_its_precision_is_emulated(tmp_path, monkeypatch, caplog, native):
    data, enc = tiny_runs.inputs(tmp_path)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    train = {"epochs": 2, "batch_size": 4, "device": "cpu", "precision": "bf16"}
    path = arms_recipe(tmp_path, train=train, arms={"": {}, "b": {"precision": "fp32"}})
    args = [str(path), "--model", str(enc), "--data-dir", str(data), "--out", str(tmp_path / "out")]
    with caplog.at_level(logging.WARNING, logger="training.experiments.study.cli"):
        assert C.main(args + ["--dry-run"]) == 0
        assert C.main(args + ["--report-only"]) == 0  # trains nothing: nothing to warn of
    warned = [r.getMessage() for r in caplog.records if "emulates" in r.getMessage()]
    assert warned == ([] if native else [f"{path} trains its runs so: --precision bf16 on a CPU without AMX or "
                                         f"AVX512-BF16: torch emulates bf16 there, many times slower than fp32 "
                                         f"(a training step 16x on MiniLM, 27x on MPNet, on an AVX2-only EPYC); "
                                         f"--precision auto picks fp32 here. Copy the recipe with \"precision\": "
                                         f"\"auto\" to train in what this machine computes fastest (with another "
                                         f"--out: results of other settings do not mix)"])


def test_a_report_names_each_cpu_with_its_bf16_instructions_where_recorded():
    assert R.cpu_label({"cpu": "AMD EPYC"}) == "AMD EPYC"  # a record from before the field
    assert R.cpu_label({"cpu": "AMD EPYC", "cpu_bf16": None}) == "AMD EPYC (bf16 emulated)"
    assert R.cpu_label({"cpu": "Xeon", "cpu_bf16": "AMX tiles"}) == "Xeon (AMX tiles)"


def test_a_report_says_which_runs_trained_on_a_gpu():
    on_cpu = {"cpu": "AMD EPYC", "cpu_bf16": "AVX512-BF16", "cuda_peak_mib": None, "gpu": None}
    on_gpu = {"cpu": "Intel Xeon", "cpu_bf16": "AMX tiles", "cuda_peak_mib": 1061.9, "gpu": "NVIDIA H100"}
    before_the_field = {"cpu": "Intel Xeon", "cuda_peak_mib": 900.0}  # on a GPU, unnamed
    records = [on_cpu, on_gpu, on_cpu, on_gpu, on_gpu, before_the_field]
    assert R.machines_phrase(records) == ("CPU AMD EPYC (AVX512-BF16) (2 runs); GPU (unnamed) (1 run); "
                                          "GPU NVIDIA H100 (3 runs)")
    assert R.machines_phrase([]) == "-"


def test_a_tiny_arms_study_reports_the_kept_models_dev_scores(tmp_path):
    from data.loaders import COURSE_FILES, load_task_file
    from training.inference.metrics import METRIC, score

    data, enc = tiny_runs.inputs(tmp_path)
    path = arms_recipe(tmp_path, points=[{"label": "full", "depth": "none", "arm": ""},
                                         {"label": "one", "depth": 1, "arm": "b"}])
    out = tmp_path / "out"
    args = [str(path), "--model", str(enc), "--data-dir", str(data), "--in-process", "--threads", "1",
            "--runs-dir", str(tmp_path / "runs"), "--out", str(out), "--keep-checkpoints"]
    assert C.main(args) == 0
    records = sweep_records.read_results(out / "results.jsonl")
    roles = {r["seed"]: r["seed_role"] for r in records}
    assert roles == {7: "tuning", 1: "reporting", 2: "reporting"}
    flags = cpu_flags()  # the machine's bf16 instructions, as the kernel lists them
    bf16 = "AMX tiles" if "amx_tile" in flags else "AVX512-BF16" if "avx512_bf16" in flags else None
    assert {r["cpu_bf16"] for r in records} == {bf16}
    assert {r["gpu"] for r in records} == {None}  # trained on the CPU
    said = f"trained on CPU {records[0]['cpu']} ({bf16 or 'bf16 emulated'}) ({len(records)} runs)."
    assert said in (out / "arms" / "report.md").read_text()
    for r in records:
        assert r["commit"] and r["cpu"] and r["split"]["n_tune"] == {"sst": 3, "para": 3, "sts": 3}
        assert r["lr"] == split_run_arm(r["arm"])[1]
        # the kept evaluation is the best on the tuning split, by its metrics.jsonl (the dev sets chose nothing)
        rows = [json.loads(x) for x in (Path(r["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        evals = [x for x in rows if x.get("dev_overall") is not None]
        assert r["tune"]["overall"] == max(x["dev_overall"] for x in evals)
        # the stored predictions score, on the real dev files, what the record says
        with gzip.open(out / r["dev_predictions"], "rt") as f:
            preds = json.load(f)
        for task in ("sst", "para", "sts"):
            labels = [e.label for e in load_task_file(data / COURSE_FILES[task]["dev"], task, labelled=True).examples]
            assert score(task, np.array(preds[task]), labels) == pytest.approx(r["dev"][METRIC[task]], abs=1e-5)
    assert (out / "baselines.json").is_file() and (out / "arms" / "report.md").is_file()
    report = (out / "arms" / "report.md").read_text()
    assert "## Against full" in report and "| one | full | overall | 2 |" in report
    assert "## Spread over seeds" in report and "| one | full | 2 |" in report  # two seeds: no spread test
    assert "Convergence rule" in report
    from training.experiments.study.figures import pyplot
    if pyplot() is not None:  # matplotlib is optional; with it, the report shows the figures it wrote
        embedded = [line[line.index("](") + 2:-1] for line in report.splitlines() if line.startswith("![")]
        # its plain points freeze one depth ("one" has an arm): a depth axis would show full fine-tuning alone
        assert "quality.png" in embedded and "tuning.png" in embedded and "depth.png" not in embedded
        assert all((out / "arms" / name).is_file() for name in embedded)
    # a report from dev files other than those the runs were scored on is refused, not computed
    import shutil
    other = tmp_path / "other-data"
    shutil.copytree(data, other)
    sst = other / COURSE_FILES["sst"]["dev"]
    rows = sst.read_text().splitlines()
    sst.write_text("\n".join(rows[:1] + [r.rsplit("\t", 1)[0] + "\t" + str((int(r.rsplit("\t", 1)[1]) + 1) % 5)
                                         for r in rows[1:]]) + "\n")
    assert C.main(args[:4] + [str(other)] + args[5:] + ["--report-only"]) == 2


# ----------------------------------------------------------------------------- the embeddings question


def test_unseen_examples_hold_a_piece_outside_training():
    assert B.unseen_examples({1, 2, 3}, [{1, 2}, {4}, {3, 5}, set()]) == [1, 2]


def test_pieces_are_both_sentences_without_the_special_tokens(tmp_path):
    from data.loaders import Example
    from minbert import Tokenizer
    _, enc = tiny_runs.inputs(tmp_path)
    tok = Tokenizer.from_checkpoint(enc)
    ids = {w: tok.backend.token_to_id(w) for w in ("apple", "river", "stone")}
    got = B.pieces(tok, [Example("a", "apple river", "stone", 1.0), Example("b", "river", None, 2)], 16)
    assert got == [{ids["apple"], ids["river"], ids["stone"]}, {ids["river"]}]


def _write_predictions(results: Path, name: str, preds: dict) -> str:
    folder = results / "p"
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / f"{name}.json.gz", "wt") as f:
        json.dump(preds, f)
    return f"p/{name}.json.gz"


def test_split_scores_by_hand(tmp_path):
    recipe = loaded(tmp_path, points=[{"label": "full", "depth": "none", "arm": ""},
                                      {"label": "emb", "depth": -1, "arm": ""}])
    labels = {"sst": np.array([0, 1, 2, 3, 4, 0])}
    unseen = {"sst": [0, 5]}  # examples 0 and 5 hold an unseen piece
    records = []
    for depth, lr, seed, preds in [(None, 0.001, 1, [0, 1, 2, 0, 0, 1]), (None, 0.001, 2, [1, 1, 2, 3, 0, 1]),
                                   (-1, 0.001, 1, [0, 1, 0, 0, 0, 0]), (-1, 0.001, 2, [0, 0, 2, 3, 4, 0])]:
        r = _reporting(depth, "", lr, seed, 0.5)
        r["dev_predictions"] = _write_predictions(tmp_path, f"{depth}-{seed}", {"sst": preds})
        records.append(r)
    for depth in (None, -1):  # tuning: 0.001 best of 0.0003, 0.001, 0.003
        records += [tuning_record(depth, "", lr, s) for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    rows = {r["label"]: r for r in A.split_scores(recipe, records, tmp_path, labels, unseen)}
    # full: unseen (0, 5) right 1 of 2 on seed 1, 0 of 2 on seed 2; seen (1-4) 2 of 4, then 3 of 4
    full_unseen, full_seen = (1 / 2 + 0 / 2) / 2, (2 / 4 + 3 / 4) / 2
    emb_unseen, emb_seen = (2 / 2 + 2 / 2) / 2, (1 / 4 + 3 / 4) / 2
    assert rows["full"]["unseen"] == pytest.approx(full_unseen) and rows["full"]["seen"] == pytest.approx(full_seen)
    assert rows["emb"]["unseen"] == pytest.approx(emb_unseen) and rows["emb"]["seen"] == pytest.approx(emb_seen)
    assert rows["emb"]["unseen_diff"] == pytest.approx(emb_unseen - full_unseen)
    assert rows["emb"]["n_unseen"] == 2 and rows["emb"]["n_seen"] == 4

    assert rows["emb"]["gap_diff"] == pytest.approx((emb_unseen - full_unseen) - (emb_seen - full_seen))
    assert rows["full"].get("gap_p") is None  # the reference is not compared with itself


def _split_study(tmp_path, preds_of: dict):
    """Two seeds of full, emb and deep on sst; preds_of[(label, seed)] gives each run's predictions."""
    depth_of = {"full": None, "emb": -1, "deep": 1}
    recipe = loaded(tmp_path, points=[{"label": label, "depth": "none" if d is None else d, "arm": ""}
                                      for label, d in depth_of.items()])
    records = []
    for (label, seed), preds in preds_of.items():
        r = _reporting(depth_of[label], "", 0.001, seed, 0.5)
        r["dev_predictions"] = _write_predictions(tmp_path, f"{label}-{seed}", {"sst": preds})
        records.append(r)
    for d in depth_of.values():
        records += [tuning_record(d, "", lr, s) for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    return recipe, records


def test_the_unseen_gap_is_certain_when_a_point_differs_on_unseen_examples_alone(tmp_path):
    labels = np.array([0, 1, 2, 3, 4, 0, 1, 2])
    unseen = {"sst": [0, 1, 2]}
    wrong_on_unseen = [4, 4, 4, 3, 4, 0, 1, 2]  # every seen example right, every unseen one wrong
    preds_of = {("full", s): wrong_on_unseen for s in (1, 2)}
    preds_of |= {("emb", s): labels.tolist() for s in (1, 2)}  # right everywhere: +1 on unseen, 0 on seen
    preds_of |= {("deep", s): wrong_on_unseen for s in (1, 2)}  # the reference's very predictions
    recipe, records = _split_study(tmp_path, preds_of)
    rows = {r["label"]: r for r in A.split_scores(recipe, records, tmp_path, {"sst": labels}, unseen, reps=200)}
    emb, deep = rows["emb"], rows["deep"]
    # every resample of the unseen part has emb right and full wrong on each example: +1 exactly; seen: 0
    assert emb["unseen_ci"] == (1.0, 1.0) and emb["seen_ci"] == (0.0, 0.0)
    assert emb["gap_diff"] == 1.0 and emb["gap_ci"] == (1.0, 1.0) and emb["gap_p"] == 0.0
    # the same predictions as the reference: no difference on any resample, so no evidence at all
    assert deep["gap_ci"] == (0.0, 0.0) and deep["gap_p"] == 1.0
    # Holm over the two points of the task: 2 * 0 and max(0, 1 * 1)
    assert emb["gap_p_holm"] == 0.0 and deep["gap_p_holm"] == 1.0


def test_the_unseen_gap_bootstrap_resamples_each_part_on_its_own(tmp_path):
    """emb is right on one unseen example of two where full is wrong on both: its unseen difference is the
    share of that example in the resample (0, 1/2 or 1 with chances 1/4, 1/2, 1/4), its seen one 0, so the
    gap's bootstrap p is twice P(gap <= 0) = 2 * 1/4."""
    labels = np.array([0, 1, 2, 3, 4, 0])
    unseen = {"sst": [0, 5]}
    full = [4, 1, 2, 3, 4, 4]
    emb = [0, 1, 2, 3, 4, 4]
    preds_of = {("full", s): full for s in (1, 2)} | {("emb", s): emb for s in (1, 2)}
    preds_of |= {("deep", s): full for s in (1, 2)}
    recipe, records = _split_study(tmp_path, preds_of)
    rows = {r["label"]: r for r in A.split_scores(recipe, records, tmp_path, {"sst": labels}, unseen, reps=4000)}
    assert rows["emb"]["gap_diff"] == pytest.approx(0.5)
    assert rows["emb"]["gap_p"] == pytest.approx(0.5, abs=0.05)
    assert rows["emb"]["gap_ci"] == (0.0, 1.0)


def test_a_study_with_out_writes_there_and_leaves_the_projects_record_alone(tmp_path):
    data, enc = tiny_runs.inputs(tmp_path)
    record = Path(__file__).resolve().parents[1] / "docs" / "freezing-study"
    before = {p: p.stat().st_mtime_ns for p in record.rglob("*") if p.is_file()}
    raw = json.loads((Path(C.__file__).parent / "recipes" / "depth.json").read_text())
    raw.update(depths=["none", 1], sizes=[6], seeds=[1], lr_grid={"lrs": [0.003], "tuning_seeds": [1]},
               cost={"seeds": [1], "overrides": {"frozen_cache": "off"}},
               train={"epochs": 1, "batch_size": 4, "device": "cpu", "precision": "fp32"})
    path = tmp_path / "depth.json"
    path.write_text(json.dumps(raw))
    out = tmp_path / "mine"
    assert C.main([str(path), "--model", str(enc), "--data-dir", str(data), "--in-process", "--threads", "1",
                   "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert len(sweep_records.read_results(out / "results.jsonl")) == 4 and (out / "depth" / "report.md").is_file()
    assert {p: p.stat().st_mtime_ns for p in record.rglob("*") if p.is_file()} == before


# ----------------------------------------------------------------------------- --frozen-dropout


def test_frozen_dropout_keeps_the_frozen_modules_training_and_drops_the_cache(tmp_path, caplog):
    import torch

    from training.config.train_config import TrainConfig, validate
    from training.methods.cache_keeper import maybe_frozen_cache
    from training.run.build import build_model
    data, enc = tiny_runs.inputs(tmp_path)
    for keep in (False, True):
        model, _, _ = build_model(TrainConfig(model=str(enc), freeze_upto=1, frozen_dropout=keep))
        model.train()
        assert [m.training for m in model.frozen_modules()] == [keep, keep]  # embeddings, layer 0
        assert model.encoder.layers[1].training  # the trainable layer trains either way
    cfg = TrainConfig(model=str(enc), freeze_upto=1, frozen_dropout=True, data_dir=str(data))
    with caplog.at_level("INFO"):
        assert maybe_frozen_cache(cfg, model, {}, None, torch.device("cpu")) is None
    assert "--frozen-dropout" in caplog.text
    errors = validate(TrainConfig(model=str(enc), freeze_upto=1, frozen_dropout=True, frozen_cache="disk",
                                  data_dir=str(data)))
    assert any("--frozen-dropout" in e and "--frozen-cache disk" in e for e in errors)


def test_a_point_is_measured_against_its_vs_point(tmp_path):
    recipe = loaded(tmp_path, points=[{"label": "full", "depth": "none", "arm": ""},
                                      {"label": "one", "depth": 1, "arm": "b"},
                                      {"label": "one again", "depth": 1, "arm": "", "vs": "one"}])
    records = []
    for depth, arm in ((None, ""), (1, "b"), (1, "")):  # each tunes to 0.001 (interior)
        records += [tuning_record(depth, arm, lr, s) for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    for depth, arm, scores in ((None, "", (0.70, 0.74)), (1, "b", (0.63, 0.69)), (1, "", (0.66, 0.66))):
        records += [_reporting(depth, arm, 0.001, seed, x) for seed, x in zip((1, 2), scores)]
    rows = {r["label"]: r for r in A.point_rows(recipe, records, None) if r["metric"] == "overall"}
    assert rows["one"]["lee"] == pytest.approx((0.63 / 0.70 + 0.69 / 0.74) / 2)  # against full, the first
    assert rows["one again"]["lee"] == pytest.approx((0.66 / 0.63 + 0.66 / 0.69) / 2)  # against "one"


def test_the_recipes_pairs_are_a_family_of_their_own(tmp_path):
    from training.experiments.study.arms_report import compare_lines

    recipe = loaded(tmp_path, seeds=[1, 2, 3], points=[
        {"label": "full", "depth": "none", "arm": ""}, {"label": "one", "depth": 1, "arm": "b"},
        {"label": "two", "depth": 2, "arm": ""}],
        compare=[["two", "one", "deeper?"], ["one", "two", "the other way"]])
    records = []
    for depth, arm in ((None, ""), (1, "b"), (2, "")):
        records += [tuning_record(depth, arm, lr, s) for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    for depth, arm, scores in ((None, "", (0.70, 0.74, 0.72)), (1, "b", (0.63, 0.69, 0.66)),
                               (2, "", (0.60, 0.70, 0.62))):
        records += [_reporting(depth, arm, 0.001, seed, x) for seed, x in zip((1, 2, 3), scores)]
    pairs = [(a, b) for a, b, _ in recipe.compare]
    tests = [t for t in A.versus(recipe, records, tmp_path, {}, pairs=pairs) if t["metric"] == "overall"]
    assert [(t["label"], t["vs"]) for t in tests] == pairs
    diffs = [0.60 - 0.63, 0.70 - 0.69, 0.62 - 0.66]  # two minus one, seed by seed
    assert tests[0]["diff"] == pytest.approx(np.mean(diffs)) and tests[1]["diff"] == pytest.approx(-np.mean(diffs))
    p = sps.ttest_1samp(diffs, 0).pvalue
    assert tests[0]["t_p"] == pytest.approx(p) and tests[0]["t_p_holm"] == pytest.approx(min(1, 2 * p))  # two pairs
    default = [t for t in A.versus(recipe, records, tmp_path, {}) if t["metric"] == "overall"]
    assert [(t["label"], t["vs"]) for t in default] == [("one", "full"), ("two", "full")]  # without pairs: vs full
    lines = compare_lines(recipe.compare, [t for t in A.versus(recipe, records, tmp_path, {}, pairs=pairs)])
    assert "1. deeper? (two against one)" in lines and "2. the other way (one against two)" in lines
    assert [line.split(" | ")[1] for line in lines if line.startswith("| 2 |")] == ["sst_acc", "para_acc",
                                                                                   "sts_pearson", "overall"]


def test_the_report_says_what_each_points_heads_are(tmp_path):
    from training.experiments.study.arms_report import heads_description, heads_lines

    cross = {"pooling": "mean", "pair_encoding": "cross", "siamese_init": "random"}
    siamese = {"pooling": "cls", "pair_encoding": "siamese", "siamese_init": "identity"}
    assert "mean of the last layer" in heads_description(cross) and "STS 5 sigmoid(linear)" in heads_description(cross)
    assert ("pooler on [CLS]" in heads_description(siamese) and "starting as the identity" in heads_description(siamese)
            and "5 max(0, cosine)" in heads_description(siamese))
    recipe = loaded(tmp_path, points=[{"label": "full", "depth": "none", "arm": ""},
                                      {"label": "one", "depth": 1, "arm": "b"}])
    records = []
    for depth, arm in ((None, ""), (1, "b")):
        records += [tuning_record(depth, arm, lr, s) for lr, s in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    records += [_reporting(None, "", 0.001, 1, 0.7) | {"settings": cross}]
    assert heads_lines(recipe, records) == [f"Heads of every point: {heads_description(cross)}."]
    records += [_reporting(1, "b", 0.001, 1, 0.6) | {"settings": siamese}]
    assert heads_lines(recipe, records) == [f"Heads: {heads_description(cross)} (full).",
                                            f"Heads: {heads_description(siamese)} (one)."]


def test_the_summary_table_by_hand():
    from training.experiments.study.arms_report import summary_lines

    rows = [{"label": "lora", "arm": "l", "depth": None, "metric": "overall", "mean": 0.74, "ci": (0.7, 0.8),
             "normalised": 1.0, "values": {1: 0.74}},  # an arm: after the plain depths, whatever its place
            {"label": "one", "arm": "", "depth": 1, "metric": "overall", "mean": 0.70, "ci": (0.69, 0.71),
             "normalised": 0.8, "trainable_params": 25, "total_params": 100, "values": {1: 0.7}},
            {"label": "full", "arm": "", "depth": None, "metric": "overall", "mean": 0.74, "ci": (0.73, 0.75),
             "normalised": 1.0, "trainable_params": 99, "total_params": 100, "values": {1: 0.73, 2: 0.75}},
            {"label": "one", "arm": "", "depth": 1, "metric": "sst_acc", "mean": 0.4, "ci": (0.3, 0.5),
             "normalised": 0.5}]
    tests = [{"label": "one", "vs": "full", "metric": "overall", "diff": -0.04, "ci": (-0.05, -0.03), "t_p_holm": 0.012,
              "boot_p_holm": 0.0004},
             {"label": "one", "vs": "other", "metric": "overall", "diff": 9.0, "ci": (0, 0), "t_p_holm": 0.5}]
    costs = [{"label": "full", "speedup": 1.0}, {"label": "one", "speedup": 2.5}]
    lines = summary_lines(rows, tests, costs, {"trivial": {"overall": 0.45}}, "full")
    assert lines[2] == "| full | 99.0% | 2 | 0.7400 [0.7300, 0.7500] | - | 1.000 | 1.00x |"
    assert lines[3] == ("| one | 25.0% | 1 | 0.7000 [0.6900, 0.7100] | -0.0400 [-0.0500, -0.0300] (0.012 / <0.001) "
                        "| 0.800 | 2.50x |")
    assert lines[4] == "| lora | - | 1 | 0.7400 [0.7000, 0.8000] | - | 1.000 | - |"
    assert lines[5].startswith("| trivial predictor") and "| 0.4500 |" in lines[5] and len(lines) == 6
    assert (summary_lines(rows[1:2], [], [], None, "full")[2]
            == "| one | 25.0% | 1 | 0.7000 [0.6900, 0.7100] | - | 0.800 | - |")


def test_a_table_recipe_gets_its_figure(tmp_path):
    from training.experiments.study.figures import table_figures
    raw = json.loads((Path(C.__file__).parent / "recipes" / "seed-report.json").read_text())
    path = tmp_path / "t.json"
    path.write_text(json.dumps(raw))
    recipe = load_recipe(str(path)).resolve(6)
    records = [{"tasks": TASKS, "depth": recipe.depth(row["depth"]), "size": 1000, "seed": s,
                **({"arm": row["arm"]} if row["arm"] else {}), "train_seconds": 1.0,
                "dev": {"sst_acc": 0.4, "para_acc": 0.7, "sts_pearson": 0.5, "overall": 0.6}}
               for row in recipe.rows for s in recipe.seeds]
    assert table_figures(recipe, records, tmp_path) == [tmp_path / "table.png"]
    assert (tmp_path / "table.png").stat().st_size > 10_000
    assert table_figures(recipe, [], tmp_path / "none") == []  # no run yet: no figure


# ----------------------------------------------------------------------------- cost, modelled


def _curved(depth, arm, lr, seed, curve):
    """A reporting run that trained len(curve) epochs, its tuning-split overall after each; kept: the best."""
    record = _reporting(depth, arm, lr, seed, max(curve))
    return {**record, "epochs_run": len(curve), "tune_curve": [[10 * (i + 1), i, s] for i, s in enumerate(curve)]}


def test_the_modelled_cost_by_hand(tmp_path):
    from training.experiments.study import arms_cost as K

    recipe = loaded(tmp_path)
    records = ([tuning_record(None, "", lr, s) for lr, s in [(0.0003, 0.5), (0.001, 0.7), (0.003, 0.6)]]
               + [tuning_record(1, "b", lr, s) for lr, s in [(0.0003, 0.5), (0.001, 0.4), (0.003, 0.35)]]
               + [_curved(None, "", 0.001, 1, [0.60, 0.70, 0.69]),
                  _curved(None, "", 0.001, 2, [0.65, 0.72, 0.74, 0.73]),
                  _curved(1, "b", 0.0003, 1, [0.50, 0.60, 0.68, 0.69, 0.685]), _curved(1, "b", 0.0003, 2, [0.69, 0.67]),
                  _curved(None, "", 0.0003, 1, [0.60, 0.70])])  # full at one's rate, 0.0003
    cost = {"machine": "m", "date": "d", "points": {"full": {"s_per_epoch": [10.0, 9.0, 11.0], "cache_s": 0.0},
                                                    "one": {"s_per_epoch": [4.0, 3.0, 5.0], "cache_s": 3.0}}}
    rows = {r["label"]: r for r in K.cost_rows(recipe, records, [cost], "full")}
    # full's mean kept tuning score: (0.70 + 0.74) / 2 = 0.72; 95% of it 0.684, 99% 0.7128
    full, one, twin = rows["full"], rows["one"], rows["full at one's"]
    assert full["cost"] == pytest.approx(3.5) and full["cost_range"] == pytest.approx((3.0, 4.0))
    assert full["to"][0.95] == (pytest.approx(2.0), 2) and full["to"][0.99] == (pytest.approx(2.0), 1)
    assert one["epoch_speedup"] == pytest.approx(2.5) and one["epochs"] == pytest.approx(3.5)
    assert one["cost"] == pytest.approx(((3 + 5 * 4) / 10 + (3 + 2 * 4) / 10) / 2)  # 2.3 and 1.1
    assert one["speedup"] == pytest.approx(3.5 / 1.7)
    assert one["to"][0.95] == (pytest.approx(((3 + 4 * 4) / 10 + (3 + 4) / 10) / 2), 2)  # 4th and 1st evaluation
    assert one["to"][0.99] == (None, 0)
    assert twin["cost"] == pytest.approx(2.0) and twin["epoch_speedup"] == pytest.approx(1.0)  # full's figures
    lines = K.cost_lines(list(rows.values()), [cost], "full")
    quality = {"one": {"diff": -0.05, "ci": (-0.1, 0.0), "t_p_holm": 0.04}}
    with_quality = K.cost_lines(list(rows.values()), [cost], "full", quality=quality)
    assert [x for x in with_quality if x.startswith("| one |")][0].endswith("| -0.0500 [-0.1000, +0.0000] (0.04) |")
    assert [x for x in with_quality if x.startswith("| full |")][0].endswith("| - |")
    assert K.scale_line(recipe, [cost], "full", {"sst": 30, "para": 60}) == ""  # the scale not said
    line = K.scale_line(recipe, [cost, {**cost, "examples_per_task": 15}], "full", {"sst": 30, "para": 60})
    assert "about 30 s there" in line  # 10 s per epoch on 2 x 15 examples, scaled to 90
    assert any(line.startswith("| one | 2.50x | 3.5 | 1.70 [1.10, 2.30] | 2.06x | 1.30 (2/2) | not reached |")
               for line in lines)


def test_the_cache_building_scales_with_the_examples_it_passes_over_not_with_an_epoch(tmp_path):
    """The cache holds the training examples and the tuning split's; an epoch trains on the first alone.
    A measurement on 15 training and 15 dev examples per task (3 tasks: 90 cached, 45 trained) and runs on
    90 training and 30 tuning examples (120 cached): there, the building is 3 s x 120/90 = 4 s, an epoch of
    the point 4 s x 90/45 = 8 s and of full 10 s x 2 = 20 s."""
    from training.experiments.study import arms_cost as K

    recipe, names = loaded(tmp_path), ("sst", "para", "sts")
    tuning = ([tuning_record(None, "", lr, s) for lr, s in [(0.0003, 0.5), (0.001, 0.7), (0.003, 0.6)]]
              + [tuning_record(1, "b", lr, s) for lr, s in [(0.0003, 0.5), (0.001, 0.4), (0.003, 0.35)]])
    split = {"n_train": {t: 30 for t in names}, "split": {"share": 0.25, "n_tune": {t: 10 for t in names}}}
    records = [{**r, **split} for r in [{**r, "epochs_run": 3} for r in tuning]
               + [_curved(None, "", 0.001, 1, [0.60, 0.70]), _curved(1, "b", 0.0003, 1, [0.50, 0.60, 0.68])]]
    cost = {"machine": "m", "date": "d", "examples_per_task": 15, "n_eval": {t: 15 for t in names},
            "points": {"full": {"s_per_epoch": [10.0, 9.0, 11.0], "cache_s": 0.0},
                       "one": {"s_per_epoch": [4.0, 3.0, 5.0], "cache_s": 3.0}}}
    run = records[-1]
    assert K.cache_scale(cost, run) == pytest.approx((120 / 90) / (90 / 45))
    (one,) = [r for r in K.cost_rows(recipe, records, [cost], "full") if r["label"] == "one"]
    assert one["cost"] == pytest.approx((4 + 3 * 8) / 20)  # the building and 3 epochs, in full's epochs
    assert one["speedup"] == pytest.approx(2 / one["cost"])  # full trained 2 epochs, nothing built
    assert K.cache_scale({**cost, "n_eval": {t: 5 for t in names}}, run) == pytest.approx(1.0)  # the same share
    assert K.cache_scale({**cost, "n_eval": None}, run) == 1.0  # a measurement that does not say its dev set
    assert K.cache_scale(cost, {k: v for k, v in run.items() if k != "split"}) == 1.0
    left = next(r for r in K.remaining_work(recipe, records[:-1], [cost]) if r["label"] == "one")
    assert left["todo"] + left["waiting"] == 2  # seeds 1 and 2, 3 epochs each (its tuning runs' mean)
    assert left["seconds"] == pytest.approx(2 * (4 + 3 * 8))


def test_a_schedule_is_costed_at_the_depth_each_stretch_ran_at(tmp_path):
    from training.experiments.study import arms_cost as K

    recipe = loaded(tmp_path, arms={"": {}, "s": {"unfreeze_schedule": "adaptive:2steps"}},
                    points=[{"label": "full", "depth": "none", "arm": ""}, {"label": "half", "depth": 1, "arm": ""},
                            {"label": "sched", "depth": "none", "arm": "s"}])
    cost = {"points": {"full": {"s_per_epoch": [10.0, 9.0, 11.0], "cache_s": 0.0},
                       "half": {"s_per_epoch": [4.0, 3.0, 5.0], "cache_s": 3.0}}}
    run = {"epochs_run": 3, "tune_curve": [[10, 0, 0.6], [20, 1, 0.7], [30, 2, 0.72]], "depth_changes": [[15, 1]]}
    sched = next(p for p in recipe.points if p["label"] == "sched")
    plan = K.stretches(recipe, cost, sched, run)
    full = cost["points"]["full"]
    assert plan == [(0, full), (15, cost["points"]["half"])]
    assert K.run_cost(run, plan, full) == pytest.approx((3 + 15 / 10 * 10 + 15 / 10 * 4) / 10)  # 2.4
    assert K.run_cost(run, plan, full, target=0.7) == pytest.approx((3 + 15 + 5 / 10 * 4) / 10)  # 2.0
    assert K.run_cost(run, plan, full, target=0.6) == pytest.approx(1.0)  # before the move: no cache yet
    assert K.run_cost(run, plan, full, target=0.8) is None
    assert K.stretches(recipe, cost, sched, {**run, "depth_changes": [[15, 2]]}) is None  # depth 2: not measured
    embeddings = loaded(tmp_path, arms={"": {}, "s": {"unfreeze_schedule": "adaptive:2steps"}}, points=[
        {"label": "full", "depth": "none", "arm": ""}, {"label": "emb", "depth": -1, "arm": ""},
        {"label": "sched", "depth": "none", "arm": "s"}])
    figures = {**cost["points"], "emb": cost["points"]["half"]}
    assert K.at_depth(embeddings, {"points": figures}, 0) == figures["emb"]  # 0 and -1: the embeddings alone
    assert K.at_depth(embeddings, {"points": figures}, None) == figures["full"]


def test_lp_ft_and_gradual_are_costed_from_the_heads_alone(tmp_path):
    """Their runs record the moves after step 0, not the start with the heads alone (every layer frozen):
    the first stretch is costed at the heads-only point's figures, and the planning bound (training every
    layer) does not hang on the cache option these schedules set. Under --frozen-cache auto a stretch is
    costed as the trainer ran it: cached (and built) only if its steps visit at least as many training
    examples as the cache holds, else at the depth's figures with the cache off, nothing built."""
    from training.experiments.study import arms_cost as K

    arms = {"": {}, "lp": {"unfreeze_schedule": "lp-ft:1epoch", "frozen_cache": "auto"},
            "gr": {"unfreeze_schedule": "gradual:5steps", "frozen_cache": "auto"}}
    recipe = loaded(tmp_path, arms=arms, points=[
        {"label": "full", "depth": "none", "arm": ""}, {"label": "one", "depth": 1, "arm": ""},
        {"label": "heads", "depth": "100%", "arm": ""}, {"label": "lp", "depth": "none", "arm": "lp"},
        {"label": "gr", "depth": "none", "arm": "gr"}])
    figures = {"full": {"s_per_epoch": [10.0, 9.0, 11.0], "cache_s": 0.0},
               "one": {"s_per_epoch": [4.0, 3.0, 5.0], "cache_s": 3.0},
               "heads": {"s_per_epoch": [1.0, 1.0, 1.0], "cache_s": 6.0},
               "one (cache off)": {"s_per_epoch": [6.0, 6.0, 6.0], "cache_s": 0.0},
               "heads (cache off)": {"s_per_epoch": [2.0, 2.0, 2.0], "cache_s": 0.0}}
    cost = {"points": figures}
    lp = next(p for p in recipe.points if p["label"] == "lp")
    data = {"n_train": {"sst": 100, "para": 100}, "settings": {"batch_size": 32}}  # 10 steps visit 320 >= 200
    run = {"tune_curve": [[10, 0, 0.6], [20, 1, 0.7]], "depth_changes": [[10, None]], **data}
    assert K.first_depth(recipe, lp) == 2  # the recipe resolved on 2 layers: the heads alone
    plan = K.stretches(recipe, cost, lp, run)
    assert plan == [(0, figures["heads"]), (10, figures["full"])]
    assert K.run_cost(run, plan, figures["full"]) == pytest.approx((6 + 1 + 10) / 10)  # a heads epoch, a full one
    gr = next(p for p in recipe.points if p["label"] == "gr")
    run = {"tune_curve": [[10, 0, 0.6], [20, 1, 0.7]], "depth_changes": [[5, 1], [10, None]], **data}
    plan = K.stretches(recipe, cost, gr, run)  # the heads alone, then one layer frozen, then nothing: 5 steps
    assert plan == [(0, figures["heads (cache off)"]), (5, figures["one (cache off)"]), (10, figures["full"])]
    assert K.run_cost(run, plan, figures["full"]) == pytest.approx((0.5 * 2 + 0.5 * 6 + 10) / 10)  # nothing built
    at_160 = {**run, "n_train": {"sst": 80, "para": 80}}  # 5 steps of 32 visit 160: as many as the cache holds
    assert K.stretches(recipe, cost, gr, at_160) == [(0, figures["heads"]), (5, figures["one"]), (10, figures["full"])]
    disk = loaded(tmp_path, arms={**arms, "gr": {"unfreeze_schedule": "gradual:5steps", "frozen_cache": "disk"}},
                  points=recipe.points)
    plan = K.stretches(disk, cost, gr, run)  # disk caches every stretch, however short
    assert plan == [(0, figures["heads"]), (5, figures["one"]), (10, figures["full"])]
    assert K.run_cost(run, plan, figures["full"]) == pytest.approx((6 + 3 + 0.5 * 1 + 0.5 * 4 + 10) / 10)
    assert K.bound_for_schedule(recipe, cost, lp) == figures["full"] == K.bound_for_schedule(recipe, cost, gr)
    assert K.first_depth(recipe, next(p for p in recipe.points if p["label"] == "one")) == 1


def test_the_schedules_section_by_hand(tmp_path):
    """A schedule against full fine-tuning end to end and at equal quality (to 99% of full fine-tuning's kept
    tuning-split score), with the depth each run ended at and the published figure the recipe quotes."""
    from training.experiments.study import arms_cost as K
    from training.experiments.study.arms_report import _depth_name, schedule_lines

    points = [{"label": "full", "depth": "none", "arm": ""}, {"label": "one", "depth": 1, "arm": ""},
              {"label": "sched", "depth": "none", "arm": "s", "published": "up to 2x (a paper)"}]
    recipe = loaded(tmp_path, arms={"": {}, "s": {"unfreeze_schedule": "adaptive:2steps"}}, points=points)
    tuning = [tuning_record(d, a, lr, s) for d, a in [(None, ""), (1, ""), (None, "s")]
              for lr, s in [(0.0003, 0.5), (0.001, 0.7), (0.003, 0.6)]]
    runs = [_curved(None, "", 0.001, 1, [0.60, 0.70, 0.69]), _curved(None, "", 0.001, 2, [0.65, 0.72, 0.74, 0.73]),
            {**_curved(None, "s", 0.001, 1, [0.72, 0.70, 0.71]), "depth_changes": [[15, 1]]},
            {**_curved(None, "s", 0.001, 2, [0.60, 0.65, 0.70]), "depth_changes": [[10, 1]]}]
    cost = {"machine": "m", "date": "d", "points": {"full": {"s_per_epoch": [10.0, 9.0, 11.0], "cache_s": 0.0},
                                                    "one": {"s_per_epoch": [4.0, 3.0, 5.0], "cache_s": 3.0}}}
    costs = K.cost_rows(recipe, tuning + runs, [cost], "full")
    # full: 3 and 4 epochs, 3.5 on average; 99% of its mean kept score (0.72) is 0.7128, which its seed 2
    # reaches at its second evaluation (2.0 epochs) and seed 1 never does.
    # sched, seed 1: 15 steps of full, the cache (3 s), 15 steps at depth 1: (15 + 3 + 6) / 10 = 2.4, and
    # 0.72 >= 0.7128 at its first evaluation (step 10, before the move): 1.0; seed 2: (10 + 3 + 8) / 10 =
    # 2.1, never at 0.7128. End to end 3.5 / 2.25; at 99% 2.0 / 1.0.
    quality = {"sched": {"diff": -0.01, "ci": (-0.02, 0.0), "t_p_holm": 0.2}}
    lines = schedule_lines(recipe, tuning + runs, costs, quality, "full")
    assert "(2.00 epochs of full;" in lines[0]
    assert lines[4] == ("| sched | 1.56x | -0.0100 [-0.0200, +0.0000] (0.200) | 1.00 (1/2) | 2.00x | 1/2, 1/2 "
                        "| up to 2x (a paper) |") and len(lines) == 5
    assert schedule_lines(recipe, tuning + runs, [c for c in costs if c["label"] != "sched"], quality, "full") == []
    assert [_depth_name(d, 6) for d in (None, -1, 0, 1, 6)] == ["none", "embeddings", "embeddings", "1/6", "6/6"]


def test_the_size_depth_map_by_hand(tmp_path):
    from training.experiments.study.arms_figures import column_name, size_depth_figure, size_depth_grid
    from training.experiments.study.figures import pyplot
    arms = {"": {}, "e2": {"epochs": 2}, "e2s": {"epochs": 2, "pair_encoding": "siamese"},
            "e8s": {"epochs": 8, "pair_encoding": "siamese"}}
    recipe = loaded(tmp_path, sizes=["all", 4], arms=arms, points=[
        {"label": "all full", "depth": "none", "arm": "e2", "size": "all"},
        {"label": "all one", "depth": 1, "arm": "e2", "size": "all"},
        {"label": "all one, siamese", "depth": 1, "arm": "e2s", "size": "all"},
        {"label": "4 full", "depth": "none", "arm": "", "size": 4, "vs": "all full"},
        {"label": "4 one", "depth": 1, "arm": "", "size": 4, "vs": "4 full"},
        {"label": "4 one, siamese", "depth": 1, "arm": "e8s", "size": 4, "vs": "4 full"}])
    rows = [{"label": "all one", "normalised": 0.8}, {"label": "4 full", "normalised": 0.5},
            {"label": "4 one", "normalised": 0.9}, {"label": "all full", "normalised": 1.0},
            {"label": "all one, siamese", "normalised": 0.7}, {"label": "4 one, siamese", "normalised": 0.6}]
    sizes, columns, grid = size_depth_grid(recipe, rows)
    # a size's epochs do not make a column of their own; the siamese heads do
    assert sizes == [4, "all"] and columns == [(None, ()), (1, ()), (1, (("pair_encoding", "siamese"),))]
    assert grid.tolist() == [[0.5, 0.9, 0.6], [1.0, 0.8, 0.7]]
    assert [column_name(c) for c in columns] == ["full", "1 frozen", "1 frozen\nsiamese"]
    plt = pyplot()
    if plt is not None:  # matplotlib is optional
        path = size_depth_figure(plt, sizes, columns, grid, tmp_path / "map.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sizes, columns, grid = size_depth_grid(recipe, rows[:1])
    assert np.isnan(grid[0]).all() and grid[1, 1] == 0.8


def _sized_study(tmp_path, overall_of: dict, preds_of: dict | None = None):
    """Full fine-tuning and one frozen layer on the whole files and on 4 examples per task, three seeds;
    overall_of[(label, seed)] is a run's dev overall, preds_of the same run's sst predictions."""
    recipe = loaded(tmp_path, sizes=["all", 4], seeds=[1, 2, 3], points=[
        {"label": "all full", "depth": "none", "arm": "", "size": "all"},
        {"label": "all one", "depth": 1, "arm": "", "size": "all"},
        {"label": "4 full", "depth": "none", "arm": "", "size": 4, "vs": "all full"},
        {"label": "4 one", "depth": 1, "arm": "", "size": 4, "vs": "4 full"}])
    points = {p["label"]: (recipe.depth(p["depth"]), p["size"]) for p in recipe.points}
    records = []
    for (label, seed), overall in overall_of.items():
        depth, size = points[label]
        r = _reporting(depth, "", 0.001, seed, overall) | {"size": size}
        if preds_of:
            r["dev_predictions"] = _write_predictions(tmp_path, f"{label}-{seed}", {"sst": preds_of[label, seed]})
        records.append(r)
    for depth, size in points.values():  # tuning: 0.001 inside the grid at every point
        records += [tuning_record(depth, "", lr, score) | {"size": size}
                    for lr, score in [(0.0003, 0.4), (0.001, 0.5), (0.003, 0.45)]]
    return recipe, records


def test_the_gap_against_size_by_hand(tmp_path):
    from scipy import stats as sps

    big = {"full": [0.70, 0.72, 0.71], "one": [0.68, 0.69, 0.69]}  # gaps -0.02, -0.03, -0.02
    small = {"full": [0.60, 0.62, 0.61], "one": [0.60, 0.615, 0.605]}  # gaps 0, -0.005, -0.005
    overall_of = {(f"{size} {kind}", seed + 1): v for size, runs in (("all", big), ("4", small))
                  for kind, values in runs.items() for seed, v in enumerate(values)}
    recipe, records = _sized_study(tmp_path, overall_of)
    # one comparison: one frozen layer's gap on the whole files against its gap on 4 examples (full
    # fine-tuning at 4 examples is measured against the whole files': no gap of its own)
    assert [(a["label"], b["label"], c["label"], d["label"]) for a, b, c, d in A.gap_pairs(recipe)] == [
        ("all one", "all full", "4 one", "4 full")]
    rows = {r["metric"]: r for r in A.gap_changes(recipe, records, tmp_path, {"sst": np.zeros(3)})}
    gaps_big, gaps_small = np.array([-0.02, -0.03, -0.02]), np.array([0.0, -0.005, -0.005])
    row = rows["overall"]
    assert row["gap"] == pytest.approx(gaps_big.mean()) and row["gap_smaller"] == pytest.approx(gaps_small.mean())
    assert row["diff"] == pytest.approx(-0.02)
    # Welch, written out: se from each size's own variance, Welch-Satterthwaite degrees of freedom
    va, vb = gaps_big.var(ddof=1) / 3, gaps_small.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    half = sps.t.ppf(0.975, df) * np.sqrt(va + vb)
    assert row["ci"] == (pytest.approx(-0.02 - half), pytest.approx(-0.02 + half))
    assert row["t_p"] == pytest.approx(sps.ttest_ind(gaps_big, gaps_small, equal_var=False).pvalue)
    assert row["t_p_holm"] == pytest.approx(row["t_p"]) and "boot_p" not in row  # one comparison; no predictions
    assert rows["sts_pearson"]["diff"] == pytest.approx(-0.04)  # 2 x overall - 1 in these records
    from training.experiments.study.arms_report import gap_lines
    line = next(x for x in gap_lines(list(rows.values())) if x.startswith("| all one | 4 one | overall |"))
    assert "| 3 + 3 | -0.0233 | -0.0033 | -0.0200 [" in line


def test_the_gap_against_size_resamples_the_same_examples_for_both_sizes(tmp_path):
    """At both sizes one frozen layer is right on example 0 where full fine-tuning is wrong, and alike
    elsewhere: each size's gap is the share of example 0 in a resample, random, but the same at both sizes
    when both are scored on the same resamples, so the change is 0 in every one of them."""
    labels = np.array([0, 1, 2, 3, 4, 0])
    full, one = [4, 1, 2, 3, 4, 4], [0, 1, 2, 3, 4, 4]
    runs = {(f"{size} {kind}", seed): 0.5 for size in ("all", "4") for kind in ("full", "one") for seed in (1, 2, 3)}
    preds_of = {(label, seed): (one if label.endswith("one") else full) for label, seed in runs}
    recipe, records = _sized_study(tmp_path, runs, preds_of)
    row = next(r for r in A.gap_changes(recipe, records, tmp_path, {"sst": labels}, reps=500)
               if r["metric"] == "sst_acc")
    assert row["boot_ci"] == (0.0, 0.0) and row["boot_p"] == 1.0
    # the whole files' one frozen layer right on example 5 too: its gap is the share of examples 0 and 5 in a
    # resample, the smaller size's that of example 0, so the change is the share of example 5: 0 exactly
    # when a resample draws it not once, (5/6)^6 of the time, so the bootstrap p is twice that
    preds_of |= {("all one", s): labels.tolist() for s in (1, 2, 3)}
    recipe, records = _sized_study(tmp_path, runs, preds_of)
    row = next(r for r in A.gap_changes(recipe, records, tmp_path, {"sst": labels}, reps=4000)
               if r["metric"] == "sst_acc")
    assert row["boot_ci"][0] == 0.0 and row["boot_p"] == pytest.approx(2 * (5 / 6) ** 6, abs=0.05)


def test_the_tuning_map_by_hand(tmp_path):
    from training.experiments.study.arms_figures import tuning_figure, tuning_grid
    from training.experiments.study.figures import pyplot

    recipe = loaded(tmp_path)  # grid 0.001, 0.003; one extension each way; "full at one's" borrows a rate
    records = [tuning_record(None, "", 0.001, 0.6), tuning_record(None, "", 0.003, 0.7),
               tuning_record(None, "", 0.01, 0.65),  # full: 0.003 wins, inside after one extension up
               tuning_record(1, "b", 0.001, 0.5)]  # one: 0.003 still missing, nothing chosen yet
    labels, rates, grid, chosen = tuning_grid(recipe, records)
    assert labels == ["full", "one"] and rates == [0.001, 0.003, 0.01]
    assert grid[0].tolist() == [0.6, 0.7, 0.65]
    assert grid[1, 0] == 0.5 and np.isnan(grid[1, 1:]).all()
    assert chosen == [0.003, None]
    labels, rates, grid, chosen = tuning_grid(recipe, [])  # nothing tuned yet: an empty map
    assert labels == rates == chosen == [] and grid.shape == (0, 0)
    plt = pyplot()
    if plt is not None:  # matplotlib is optional
        assert tuning_figure(plt, recipe, records, tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_the_tuning_map_keeps_long_point_names_and_its_title_on_the_page(tmp_path):
    from training.experiments.study.arms_figures import tuning_map
    from training.experiments.study.figures import pyplot

    plt = pyplot()
    if plt is None:
        pytest.skip("matplotlib is optional and not installed")
    recipe = loaded(tmp_path)
    recipe.points[0]["label"] = ("full fine-tuning with the best MiniLM recipe's flags "
                                 "(SMART's Bregman term, weight EMA)")
    records = [tuning_record(None, "", lr, score) for lr, score in ((0.0003, 0.5), (0.001, 0.6), (0.003, 0.55))]
    fig = tuning_map(plt, recipe, records)
    fig.canvas.draw()
    page, renderer = fig.bbox, fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = [fig._suptitle or ax.title, *ax.get_yticklabels(), *ax.get_xticklabels()]
    assert len(ax.get_xticklabels()) == 3 and all(t.get_text() for t in texts)
    for t in texts:  # every name, rate and the title drawn inside the figure
        box = t.get_window_extent(renderer)
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, \
            t.get_text()
    ticks = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels()), key=lambda b: b.x0)
    assert all(a.x1 <= b.x0 for a, b in zip(ticks, ticks[1:]))  # neighbouring rates do not run together
    plt.close(fig)


def test_the_depth_figure_places_the_plain_depth_points_by_layers_frozen(tmp_path):
    from training.experiments.study.arms_figures import depth_figure, depth_position, depth_rows
    from training.experiments.study.figures import pyplot

    recipe = loaded(tmp_path, points=[
        {"label": "full", "depth": "none", "arm": ""}, {"label": "heads", "depth": "100%", "arm": ""},
        {"label": "emb", "depth": -1, "arm": ""}, {"label": "one", "depth": 1, "arm": ""},
        {"label": "one b", "depth": 1, "arm": "b"},  # an arm: a point of its own, not on the depth axis
        {"label": "full at one's", "depth": "none", "arm": "", "lr_of": "one"}])
    assert [depth_position(d) for d in (None, -1, 1, 2)] == [-1, 0, 1, 2]

    def row(label, depth, metric="overall"):
        return {"label": label, "depth": recipe.depth(depth), "metric": metric, "values": {1: 0.5, 2: 0.7},
                "mean": 0.6, "ci": (0.4, 0.8)}
    rows = [row("heads", "100%"), row("one b", 1), row("full at one's", "none"), row("one", 1), row("full", "none"),
            row("emb", -1), row("one", 1, "sst_acc")]
    placed = depth_rows(recipe, rows, "overall")
    assert [(x, r["label"]) for x, r in placed] == [(-1, "full"), (0, "emb"), (1, "one"), (2, "heads")]
    assert [r["label"] for _, r in depth_rows(recipe, rows, "sst_acc")] == ["one"]
    plt = pyplot()
    if plt is not None:
        baselines = {"trivial": {"overall": 0.4, "sst_acc": 0.25}, "zero_shot": {"sts_pearson": 0.8}}
        assert depth_figure(plt, recipe, rows, baselines, tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"


def test_the_depth_figure_is_drawn_only_where_the_plain_points_freeze_several_depths(tmp_path):
    from training.experiments.study.arms_figures import arms_figures
    from training.experiments.study.figures import pyplot

    plt = pyplot()
    if plt is None:
        pytest.skip("matplotlib is optional and not installed")
    one_depth = loaded(tmp_path)  # full (none) is its only plain point: "one" has an arm, the third a borrowed rate
    two_depths = loaded(tmp_path, points=[{"label": "full", "depth": "none", "arm": ""},
                                          {"label": "one", "depth": 1, "arm": ""}])
    records = [tuning_record(d, "", lr, score - (lr != 0.003) * 0.1) for d, score in ((None, 0.7), (1, 0.6))
               for lr in (0.001, 0.003, 0.01)]  # 0.003 chosen for both, inside after one extension up
    records += [_reporting(d, "", 0.003, seed, score) | {"tune_curve": [[1, 0, score]], "train_seconds": 10.0}
                for d, score in ((None, 0.7), (1, 0.6)) for seed in (1, 2)]
    for recipe, depth_drawn in ((one_depth, False), (two_depths, True)):
        rows = A.point_rows(recipe, records, None)
        out = tmp_path / str(depth_drawn)
        out.mkdir()
        names = [path.name for path in arms_figures(recipe, records, rows, None, out)]
        assert "quality.png" in names and ("depth.png" in names) == depth_drawn, names


def test_the_report_embeds_the_figures_written_in_a_fixed_order():
    from training.experiments.study.arms_figures import figure_lines

    lines = figure_lines([Path("x/tuning.png"), Path("x/depth.png")]).splitlines()
    assert lines[1] == "## Figures" and lines[3].endswith("(depth.png)") and lines[5].endswith("(tuning.png)")
    assert figure_lines([]) == ""  # no matplotlib, no figure: no section


def test_the_front_keeps_the_points_no_cheaper_one_matches():
    from training.experiments.study.arms_figures import pareto_front

    points = [(5.0, 0.74), (0.5, 0.63), (2.0, 0.70), (3.0, 0.69), (2.0, 0.72), (6.0, 0.74), (1.0, 0.63)]
    assert pareto_front(points) == [(0.5, 0.63), (2.0, 0.72), (5.0, 0.74)]


def test_each_point_gets_its_familys_marker_and_the_crowded_top_its_panel(tmp_path):
    from training.experiments.study.arms_figures import point_family, zoom_limits

    recipe = loaded(tmp_path, arms={"": {}, "lora": {"peft": "lora:r=8"}, "ad": {"unfreeze_schedule": "adaptive"},
                                    "long": {"epochs": 9}}, points=[
        {"label": "full", "depth": "none", "arm": ""}, {"label": "one", "depth": 1, "arm": ""},
        {"label": "lora", "depth": "none", "arm": "lora"}, {"label": "adaptive", "depth": "none", "arm": "ad"},
        {"label": "one, longer", "depth": 1, "arm": "long"},
        {"label": "full at one's", "depth": "none", "arm": "", "lr_of": "one"}])
    assert [point_family(recipe, p) for p in recipe.points] == [
        "fixed depth", "fixed depth", "parameter-efficient", "freezing schedule", "confound or twin",
        "confound or twin"]  # a borrowed rate makes a plain arm a confound
    sized = loaded(tmp_path, sizes=["all", 4], arms={"": {}, "e2": {"epochs": 2}, "e2s": {"epochs": 2,
                                                                                       "pair_encoding": "siamese"}},
                   points=[{"label": "all full", "depth": "none", "arm": "e2", "size": "all"},
                           {"label": "all one, siamese", "depth": 1, "arm": "e2s", "size": "all"}])
    # a size study's arm that sets the epochs alone is still a fixed depth; other heads are a confound
    assert [point_family(sized, p) for p in sized.points] == ["fixed depth", "confound or twin"]

    def at(x, y, half=0.002):
        return {"x": x, "y": y, "yerr": [[half], [half]]}
    # within 0.02 of the best (0.74): four points, cost 2 to 5, means 0.725 to 0.74, intervals 0.004 at most
    points = [at(0.5, 0.63), at(2.0, 0.725), at(3.0, 0.73, 0.004), at(5.0, 0.74), at(4.0, 0.735), at(1.0, 0.70)]
    (x0, x1), (y0, y1) = zoom_limits(points)
    assert (x0, x1) == (pytest.approx(2.0 / 1.15), pytest.approx(5.0 * 1.15))
    assert (y0, y1) == (pytest.approx(0.725 - 0.0048), pytest.approx(0.74 + 0.0048))
    assert zoom_limits(points[:4]) is None  # three near the top: the main panel shows them well enough
    assert zoom_limits(points[1:5]) is None  # every point near the top: the main panel is the enlargement


def test_the_mean_curve_follows_the_runs_still_training():
    from training.experiments.study.arms_figures import mean_curve

    curves = [[[1, 0, 0.5], [2, 1, 0.7]], [[1, 0, 0.6], [2, 1, 0.8], [3, 2, 0.9]]]
    assert mean_curve(curves) == [(1, pytest.approx(0.55)), (2, pytest.approx(0.75)), (3, pytest.approx(0.9))]


def test_a_point_takes_the_cost_of_one_whose_epochs_cost_the_same(tmp_path):
    from training.experiments.study import arms_cost as K

    recipe = loaded(tmp_path, arms={"": {}, "b": {"head_dropout": 0.2},
                                    "long": {"epochs": 9, "early_stop_patience": 3}},
                    points=[{"label": "full", "depth": "none", "arm": ""},
                            {"label": "long", "depth": "none", "arm": "long"},
                            {"label": "other", "depth": "none", "arm": "b"},
                            {"label": "one", "depth": 1, "arm": "long"}])
    cost = {"points": {"full": {"s_per_epoch": [10.0, 9.0, 11.0], "cache_s": 0.0}}}
    points = {p["label"]: p for p in recipe.points}
    assert K.measured(recipe, cost, points["long"]) is cost["points"]["full"]  # more epochs: the same epoch
    assert K.measured(recipe, cost, points["other"]) is None  # another option: not measured
    assert K.measured(recipe, cost, points["one"]) is None  # another depth
    # another recipe's point: found by the kind the measurement recorded (its label is not this recipe's)
    kinded = {"points": {"plain, one frozen": {"kind": [1, []], "s_per_epoch": [4.0, 3.0, 5.0], "cache_s": 3.0}}}
    assert K.measured(recipe, kinded, points["one"]) is kinded["points"]["plain, one frozen"]  # "long": epochs only
    assert K.measured(recipe, kinded, points["full"]) is None


def test_the_work_left_by_hand(tmp_path):
    from training.experiments.study import arms_cost as K

    recipe = loaded(tmp_path)  # seeds 1, 2; tuning seed 7; grid 0.001, 0.003
    records = [{**tuning_record(None, "", lr, s), "epochs_run": e, "n_train": {"sst": 30, "para": 60, "sts": 45}}
               for lr, s, e in [(0.0003, 0.5, 2), (0.001, 0.7, 4), (0.003, 0.6, 3)]]  # full: 0.001, chosen
    cost = {"examples_per_task": 15, "points": {"full": {"s_per_epoch": [10.0, 9.0, 11.0], "cache_s": 0.0},
                                                "one": {"s_per_epoch": [4.0, 3.0, 5.0], "cache_s": 3.0}}}
    rows = {r["label"]: r for r in K.remaining_work(recipe, records, [cost])}
    # the files hold 135 examples, the measurement 3 x 15: x3. full: its 2 reporting runs, 3 epochs (mean) each
    assert rows["full"] == {"label": "full", "todo": 2, "waiting": 0, "seconds": pytest.approx(2 * 3 * 10.0 * 3),
                            "at_most": False}
    # one: 2 tuning runs planned, 2 reporting runs waiting; no run yet, so the recipe's 2 epochs each
    assert rows["one"] == {"label": "one", "todo": 2, "waiting": 2, "seconds": pytest.approx(4 * (3 + 2 * 4.0) * 3),
                           "at_most": False}
    # full at one's rate: waits for one's rate; full's figures (its epochs cost the same)
    assert rows["full at one's"]["waiting"] == 2 and rows["full at one's"]["todo"] == 0
    # a size study's point: its size per task, or its own runs' count; the whole files only once a run says
    assert K._examples(recipe, records, {"size": 4}) == 12 and K._examples(recipe, records, {"size": "all"}) == 135
    assert K._examples(recipe, [], {"size": "all"}) is None
    assert K._examples(recipe, [], {"size": "all"}, files_examples=99) == 99  # a dry run counts the files
    assert K._examples(recipe, records, {"size": "all"}, files_examples=99) == 135  # a run's own count first



def test_a_schedules_work_left_is_bounded_by_training_every_layer(tmp_path):
    from training.experiments.study import arms_cost as K

    recipe = loaded(tmp_path, arms={"": {}, "b": {"head_dropout": 0.2},
                                    "sched": {"unfreeze_schedule": "adaptive:2steps", "head_dropout": 0.2}},
                    points=[{"label": "full", "depth": "none", "arm": ""},
                            {"label": "plain b", "depth": "none", "arm": "b"},
                            {"label": "adaptive", "depth": "none", "arm": "sched"}])
    cost = {"examples_per_task": 15, "points": {"full": {"s_per_epoch": [10.0], "cache_s": 0.0},
                                                "plain b": {"s_per_epoch": [12.0], "cache_s": 0.0}}}
    rows = {r["label"]: r for r in K.remaining_work(recipe, [], [cost])}
    assert rows["adaptive"]["seconds"] is None  # no run yet says how large the whole files are
    # nothing measured the schedule; its bound is the point training every layer with its other options
    # (head dropout 0.2: "plain b", not "full"): 2 tuning + 2 reporting runs of the recipe's 2 epochs, x1 scale
    records = [{**tuning_record(None, "", 0.001, 0.7), "epochs_run": 2, "n_train": {"sst": 15, "para": 15, "sts": 15}}]
    rows = {r["label"]: r for r in K.remaining_work(recipe, records, [cost])}
    assert rows["adaptive"]["seconds"] == pytest.approx(4 * 2 * 12.0) and rows["adaptive"]["at_most"]
    assert not rows["full"]["at_most"]

def test_a_dry_runs_hours_name_the_machine_that_measured_them(tmp_path, capsys, monkeypatch):
    from training.common import device

    recipe = loaded(tmp_path)
    records = [{**tuning_record(None, "", 0.001, 0.7), "epochs_run": 2, "n_train": {"sst": 15, "para": 15, "sts": 15}}]
    cost = {"machine": "Some CPU (family 1, model 2)", "date": "2026-01-02", "threads": 1, "examples_per_task": 15,
            "points": {"full": {"s_per_epoch": [10.0], "cache_s": 0.0}}}
    monkeypatch.setattr(device, "gpu_name", lambda: None)
    monkeypatch.setattr(device, "cpu_model", lambda: "Other CPU (family 3, model 4)")
    C.print_remaining(recipe, records, [cost])
    out = capsys.readouterr().out
    assert ("  the hours are those of the machine that measured the cost: Some CPU (family 1, model 2), 2026-01-02, "
            "1 thread(s); this machine (Other CPU (family 3, model 4)) is another, whose hours differ\n") in out
    monkeypatch.setattr(device, "cpu_model", lambda: "Some CPU (family 1, model 2)")
    C.print_remaining(recipe, records, [cost, {**cost, "machine": "A GPU", "date": "2026-01-03"}])
    out = capsys.readouterr().out
    assert ("the cost: Some CPU (family 1, model 2), 2026-01-02, 1 thread(s); A GPU, 2026-01-03, 1 thread(s)\n"
            in out) and "is another" not in out
    C.print_remaining(recipe, records, [])  # nothing measured: no hours, so no machine
    assert "measured the cost" not in capsys.readouterr().out


def test_a_dry_run_says_what_is_left(tmp_path, capsys):
    data, enc = tiny_runs.inputs(tmp_path)
    path = arms_recipe(tmp_path)
    args = [str(path), "--model", str(enc), "--data-dir", str(data), "--out", str(tmp_path / "out"), "--dry-run"]
    assert C.main(args) == 0
    out = capsys.readouterr().out
    assert out.count("todo  ") == 4  # two rates for each of the two tuned points, on the tuning seed
    assert "  full: 2 + 2 runs, no estimate" in out and "  full at one's: 0 + 2 runs" in out
    # the whole files' training examples, counted from the files: each file's rows less its tuning split
    recipe = load_recipe(str(path))
    rows = {t: len(load_task_file(Path(data) / f, t, labelled=True).examples)
            for t, f in (("sst", "ids-sst-train.csv"), ("para", "quora-train.csv"), ("sts", "sts-train.csv"))
            if t in recipe.tasks}
    share = recipe.tuning_split["share"]
    want = sum(n - min(max(round(share * n), 1), n - 1) for n in rows.values())
    assert C.files_examples(recipe, TrainConfig(data_dir=str(data))) == want > 0
    # results made with other settings (here another spelling of the data folder): training refuses to mix
    # them in, but a dry run only reads them
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.jsonl").write_text(json.dumps({**tuning_record(None, "", 0.001, 0.7), "settings":
                                                                 {"data_dir": "elsewhere"}}) + "\n")
    assert C.main(args) == 0 and "done  " in capsys.readouterr().out
    assert C.main(args[:-1]) == 2 and "other settings" in capsys.readouterr().err


def test_a_missing_prediction_file_costs_the_bootstrap_not_the_report(tmp_path, caplog):
    """A record whose dev predictions did not travel with it (a record carried to a lent GPU without
    dev-predictions/): its pairs go without the bootstrap, the file named once; the rest stands."""
    import gzip

    from training.experiments.study import arms

    (tmp_path / "p").mkdir()
    with gzip.open(tmp_path / "p" / "a.json.gz", "wt") as f:
        json.dump({"sst": [0, 1, 2]}, f)
    here, gone = {"dev_predictions": "p/a.json.gz"}, {"dev_predictions": "p/b.json.gz"}
    labels = {"sst": np.array([0.0, 1.0, 1.0])}
    with caplog.at_level(logging.WARNING, logger="training.experiments.study.arms"):
        assert arms._bootstrap(tmp_path, [here], [gone], labels, 10, 0) == {}
        assert list(arms._predictions(tmp_path, {1: here, 2: gone})) == [1]
        assert set(arms._bootstrap(tmp_path, [here], [here], labels, 10, 0)) == {"sst_acc"}
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [f"{tmp_path / 'p' / 'b.json.gz'}: missing; its run's comparisons go without the bootstrap "
                      f"over dev examples"]
