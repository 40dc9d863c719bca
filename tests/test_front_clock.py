"""bench/front_clock.py: a study's reporting runs trained again end to end, set beside their modelled cost."""
import json
import shutil

import pytest
import tiny_runs
from bench_scripts import bench_script
from test_study_protocol import arms_recipe

from training.experiments.study import cli as C
from training.experiments.sweep.records import read_results

front_clock = bench_script("front_clock")
S_PER_EPOCH, CACHE_S = {"full": 10.0, "one": 4.0}, {"full": 0.0, "one": 3.0}


@pytest.fixture(scope="module")
def built_study(tmp_path_factory):
    """A two-point arms study on the tiny model (tuning seed 7, reporting seed 1), and a cost measurement
    written by hand beside its results: full fine-tuning 10 s an epoch, the frozen layer 4 s and 3 s to
    build its cache. Built once: the tests read it and write elsewhere."""
    base = tmp_path_factory.mktemp("front")
    data, enc = tiny_runs.inputs(base)
    recipe = arms_recipe(base, seeds=[1], points=[{"label": "full", "depth": "none", "arm": ""},
                                                  {"label": "one", "depth": 1, "arm": "b"}])
    out = base / "study"
    assert C.main([str(recipe), "--model", str(enc), "--data-dir", str(data), "--in-process", "--threads", "1",
                   "--runs-dir", str(base / "runs"), "--out", str(out)]) == 0
    points = {label: {"s_per_epoch": [s, s, s], "cache_s": CACHE_S[label], "run_s": 1.0, "peak_rss_mib": 1.0}
              for label, s in S_PER_EPOCH.items()}
    (out / "cost").mkdir()
    (out / "cost" / "cost.json").write_text(json.dumps({"machine": "by hand", "date": "2026-11-27", "threads": 1,
                                                        "examples_per_task": 6, "epochs": 2, "points": points}))
    return recipe, out, data, enc


@pytest.fixture
def tiny_study(built_study, tmp_path):
    """The built study with the test's own copy of its recipe (some tests change it): recipe, results, args."""
    recipe, out, data, enc = built_study
    own = tmp_path / recipe.name
    shutil.copyfile(recipe, own)
    return own, out, ["--recipe", str(own), "--model", str(enc), "--data-dir", str(data), "--results", str(out)]


def seed_1_runs(out) -> dict[str, dict]:
    """The study's reporting runs of seed 1 by point label."""
    return {("full" if r["depth"] is None else "one"): r for r in read_results(out / "results.jsonl") if r["seed"] == 1}


def cost_by_hand(runs: dict[str, dict]) -> dict[str, float]:
    """The model written out: the cache's building plus the epochs trained, in seconds of the measurement."""
    return {label: CACHE_S[label] + S_PER_EPOCH[label] * len(r["tune_curve"]) for label, r in runs.items()}


def test_each_run_trains_again_to_its_recorded_scores_beside_its_modelled_speedup(tiny_study, tmp_path, capsys):
    _, out, args = tiny_study
    reporting = seed_1_runs(out)
    clock = tmp_path / "clock"
    assert front_clock.main(args + ["--points", "one", "--out", str(clock), "--json", str(clock / "rows.json")]) == 0
    rows = json.loads((clock / "rows.json").read_text())["rows"]
    assert [r["label"] for r in rows] == ["full", "one"]  # the reference first
    cost = cost_by_hand(reporting)
    assert rows[1]["modelled"] == cost["full"] / cost["one"] and rows[0]["modelled"] == 1.0
    again = {r["depth"]: r for r in read_results(clock / "results.jsonl")}
    for row, old in ((rows[0], reporting["full"]), (rows[1], reporting["one"])):
        new = again[old["depth"]]
        assert row["same_scores"] and new["dev"] == old["dev"] and new["epochs_run"] == old["epochs_run"]
        # training: the epochs and the cache's building as recorded (a tiny epoch may round to 0.0 s)
        assert row["train"] == new["train_seconds"] + (new["frozen_cache_seconds"] or 0) >= 0
        assert row["wall"] == new["wall_seconds"] > row["train"] and new["commit"]
    table = capsys.readouterr().out
    by_wall = rows[0]["wall"] / rows[1]["wall"]
    assert f"| {by_wall:.2f}x |" in table and f"| {rows[1]['modelled']:.2f}x |" in table


def test_the_front_is_the_points_no_cheaper_point_matches(tiny_study, tmp_path):
    recipe_path, out, _ = tiny_study
    from training.experiments.study.arms_cost import read_cost
    from training.experiments.study.recipe import load_recipe
    recipe = load_recipe(str(recipe_path)).resolve(2)
    reporting = seed_1_runs(out)
    cost = cost_by_hand(reporting)
    mean = {label: r["dev"]["overall"] for label, r in reporting.items()}  # one reporting seed: its mean
    cheap, dear = sorted(cost, key=cost.get)
    want = [cheap, dear] if mean[dear] > mean[cheap] else [cheap]
    assert front_clock.front_labels(recipe, read_results(out / "results.jsonl"), read_cost(out), "full") == want


def test_a_point_without_the_seed_is_one_line_before_any_run(tiny_study, tmp_path, capsys):
    _, _, args = tiny_study
    capsys.readouterr()
    assert front_clock.main(args + ["--points", "one", "--seed", "9", "--out", str(tmp_path / "clock")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--points 'full': no reporting run of seed 9" in err
    assert not (tmp_path / "clock").exists()


def test_a_stopped_clock_goes_on_where_its_records_stop(tiny_study, tmp_path, capsys):
    _, _, args = tiny_study
    clock = tmp_path / "clock"
    assert front_clock.main(args + ["--points", "one", "--out", str(clock)]) == 0
    first = read_results(clock / "results.jsonl")
    capsys.readouterr()
    assert front_clock.main(args + ["--points", "one", "--out", str(clock)]) == 0
    assert read_results(clock / "results.jsonl") == first  # nothing trained twice
    assert f"| {first[0]['wall_seconds']:.0f} |" in capsys.readouterr().out


def test_the_recipes_own_model_trains_again_without_model(tiny_study, tmp_path, capsys):
    """A recipe naming its model in "train" (as mpnet-depth.json does) is timed on that model without
    --model: the dry run lists the runs with no setting changed (minilm-l6 would change the model)."""
    recipe, out, args = tiny_study
    model = args[args.index("--model") + 1]
    raw = json.loads(recipe.read_text())
    recipe.write_text(json.dumps({**raw, "train": {**raw["train"], "model": model}}))
    without_model = args[:2] + args[4:]
    capsys.readouterr()
    assert front_clock.main(without_model + ["--points", "one", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "one: seed 1" in printed and "settings differ" not in printed


def test_results_of_another_recipe_are_one_line_naming_it(tiny_study, tmp_path, capsys):
    recipe, out, args = tiny_study
    raw = json.loads(recipe.read_text())
    other = tmp_path / "other.json"  # the same points under other arms: none of the results is its run
    other.write_text(json.dumps({**raw, "arms": {"c": {}, "b": {"head_dropout": 0.2}},
                                 "points": [{**p, "arm": "c" if p["arm"] == "" else p["arm"]} for p in raw["points"]]}))
    capsys.readouterr()
    assert front_clock.main(["--recipe", str(other)] + args[2:] + ["--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no reporting run of 'full'" in err and f"--recipe {other}" in err
