"""The benchmark scripts start as the README runs them: `python bench/X.py` from any folder."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
HELPERS = {"common.py", "gpu_summary.py"}  # shared code, and gpu_check.sh's report writer: no --threads
# read and write study records, train nothing: no --threads
RECORD_TOOLS = {"device_twin.py", "equivalence.py", "import_runs.py", "size_gaps.py"}
RECORD_TOOLS |= {"depth_by_share.py"}  # reads study records, trains nothing: no --threads
RECORD_TOOLS |= {"gpu_mpnet_assemble.py"}  # joins files, computes nothing: no --threads
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS)


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 6, SCRIPTS


# Each script's --help as `python bench/SCRIPT --help` from another folder would run it, all in one child
# process (a process each cost 3 s of torch's import, 31 times): before each, sys.path is the child's own
# with the script's folder first, and every module of the project (and bench's) is forgotten, so that a
# script finds its imports by its own means or fails as it would alone.
HELPS = """
import contextlib, io, json, runpy, sys
bench, names = sys.argv[1], sys.argv[2:]
path, ours = list(sys.path[1:]), ("minbert", "heads", "data", "training", "bench", "common")
out = {}
for name in names:
    sys.path[:] = [bench, *path]
    for m in [m for m in sys.modules if m.split(".")[0] in ours or m.startswith("bench")]:
        del sys.modules[m]
    sys.argv = [f"{bench}/{name}", "--help"]
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # what `python SCRIPT` would die of, as its last line of stderr
            code = 1
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
    out[name] = [code, stdout.getvalue(), stderr.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict:
    r = subprocess.run([sys.executable, "-c", HELPS, str(BENCH), *SCRIPTS], cwd=tmp_path_factory.mktemp("elsewhere"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs_from_another_folder(script, helps):
    code, stdout, stderr = helps[script]
    assert code == 0, stderr
    assert "usage:" in stdout and ("--threads" in stdout or script in RECORD_TOOLS), stdout


def test_step_ops_counts_the_step_and_names_where_it_waits_for_the_device(tmp_path):
    """bench/step_ops.py on a tiny run: every phase it names computes something, and the host syncs it
    lists are the two a step has, read from the code: the loss's terms fetched together
    (Stepper.task_loss) and the gradient norm's finiteness test (Stepper._update). It also keeps the
    loop from gaining a sync unnoticed."""
    sys.path.insert(0, str(BENCH.parent / "tests"))
    from tiny_runs import inputs
    data, enc = inputs(tmp_path)
    r = subprocess.run([sys.executable, str(BENCH / "step_ops.py"), "--examples", "12", "--skip", "1", "--steps", "2",
                        "--profile", "3", "--", "--model", str(enc), "--data-dir", str(data), "--batch-size", "4",
                        "--precision", "fp32"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    counts = r.stdout.split("\n\n# profiled")[0]
    rows = dict(line.rsplit(None, 1) for line in counts.splitlines()
                if line and not line.startswith(("#", " ", "phase", "host")))
    assert float(rows["forward: encoder, pooling, head"]) > 0 and float(rows["backward"]) > 0
    assert float(rows["all"]) == pytest.approx(sum(float(v) for k, v in rows.items() if k != "all"), abs=0.2)
    assert "host syncs per step: 2.0;" in r.stdout, r.stdout
    assert "(task_loss)" in r.stdout and "(_update)" in r.stdout, r.stdout
    assert "tensors copied to the device per step: 4.0" in r.stdout  # ids, token types, mask, labels
    assert "# profiled 2 steps: " in r.stdout and "aten::" in r.stdout  # --profile: two more steps, their top ops


def test_shape_warmup_runs_each_arm_and_a_multiple_leaves_fewer_lengths(tmp_path):
    """bench/shape_warmup.py on the tiny model: one row per arm, each arm's process built its batches with
    --pad-multiple, so the multiple of 8 leaves fewer new lengths than padding to the longest (the tiny
    files' examples are 4 to 9 tokens long: their batches pad to 8 or 16, at most 2 lengths). fp32 gets no
    arm without cuDNN's attention (it never takes it); bf16 gets one per multiple, labelled. The paths are
    relative, as a user types them: the arms' processes once ran in the repository and did not find them."""
    sys.path.insert(0, str(BENCH.parent / "tests"))
    from tiny_runs import inputs
    data, enc = (p.relative_to(tmp_path) for p in inputs(tmp_path))
    r = subprocess.run([sys.executable, str(BENCH / "shape_warmup.py"), "--model", str(enc), "--data-dir", str(data),
                        "--batch-size", "4", "--batches", "8", "--precisions", "fp32", "bf16", "--multiples", "1", "8",
                        "--cudnn-attention", "off", "--threads", "1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line[:22].strip(): line[22:].split() for line in r.stdout.splitlines() if line[:4] in ("fp32", "bf16")}
    assert set(rows) == {"fp32 x1", "fp32 x8", "bf16 x1 no-cudnn", "bf16 x8 no-cudnn"}, r.stdout
    assert int(rows["fp32 x8"][0]) <= 2 < int(rows["fp32 x1"][0]), r.stdout
    assert all(float(v[1]) > 0 and float(v[2]) > 0 for v in rows.values())


def test_the_bert_base_stand_in_refuses_a_folder_in_use_in_one_line(tmp_path):
    kept = tmp_path / "model" / "notes.txt"
    kept.parent.mkdir()
    kept.write_text("mine")
    r = subprocess.run([sys.executable, str(BENCH / "bert_base_shape.py"), str(kept.parent)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(kept.parent) in r.stderr and "not an empty folder" in r.stderr
    assert [p.name for p in kept.parent.iterdir()] == ["notes.txt"] and kept.read_text() == "mine"


def test_zero_shot_sts_refuses_an_unlabelled_file_before_encoding(tmp_path):
    unlabelled = tmp_path / "sts-test.csv"
    unlabelled.write_text("\tid\tsentence1\tsentence2\n0\ta\tthe cat\tthe dog\n")
    r = subprocess.run([sys.executable, str(BENCH / "zero_shot_sts.py"), "--threads", "1",
                        "--sts-dev", str(unlabelled)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "DataError" in r.stderr and str(unlabelled) in r.stderr and "similarity" in r.stderr, r.stderr


def test_same_bits_ignores_timings_and_names_the_first_difference(tmp_path):
    """bench/same_bits.py's comparison: two runs differing only in their timings are the same bits; a
    changed loss, or a changed prediction file, is named."""
    sys.path.insert(0, str(BENCH))
    from same_bits import first_difference

    def run(name, loss, seconds, pred):
        d = tmp_path / name
        (d / "predictions").mkdir(parents=True)
        rows = [{"step": 1, "loss_sst": loss}, {"epoch": 0, "train_seconds": seconds, "dev_overall": 0.5}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "predictions" / "sst-dev-output.csv").write_text(pred)
        return d

    a = run("a", 1.25, 10.0, "id , Predicted_Sentiment\nx , 3\n")
    assert first_difference(a, run("b", 1.25, 99.0, "id , Predicted_Sentiment\nx , 3\n")) is None
    assert first_difference(a, run("c", 1.5, 10.0, "id , Predicted_Sentiment\nx , 3\n")) == \
        "metrics.jsonl record 1: loss_sst 1.25 vs 1.5"
    assert first_difference(a, run("d", 1.25, 10.0, "id , Predicted_Sentiment\nx , 2\n")) == \
        "predictions/sst-dev-output.csv differs"


def test_the_cost_benchmark_writes_what_it_prints_and_the_study_reads_it(tmp_path):
    """bench/study_cost.py on a tiny model: --json holds the printed medians and quartiles, per point, and
    the study's cost model reads the file where the report looks for it (one round: the quartiles are of the
    two epochs; `quartiles` over more runs is checked against numpy below)."""
    import re

    sys.path.insert(0, str(Path(__file__).parent))
    import tiny_runs

    from training.experiments.study.arms_cost import read_cost

    data, enc = tiny_runs.inputs(tmp_path)
    out = tmp_path / "study" / "cost" / "cost.json"
    r = subprocess.run([sys.executable, str(BENCH / "study_cost.py"), "--model", str(enc), "--data-dir", str(data),
                        "--threads", "1", "--examples", "12", "--eval-examples", "20", "--epochs", "2", "--rounds", "1",
                        "--points", "full fine-tuning", "half the layers frozen", "--json", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (cost,) = read_cost(tmp_path / "study")
    assert set(cost["points"]) == {"full fine-tuning", "half the layers frozen", "half the layers frozen (cache off)"}
    assert cost["epochs"] == 2 and cost["rounds"] == 1 and cost["threads"] == 1
    assert cost["n_eval"] == {t: tiny_runs.N for t in ("sst", "para", "sts")}  # the dev files' 12, under 20
    for name, got in cost["points"].items():
        row = re.search(rf"^{re.escape(name)}\s+([\d.]+) \[\s*([\d.]+)-\s*([\d.]+)\]\s+([\d.]+)\s+([\d.]+)",
                        r.stdout, re.M)
        assert row, r.stdout
        med, q1, q3 = got["s_per_epoch"]
        assert q1 <= med <= q3
        assert [float(x) for x in row.groups()] == pytest.approx([med, q1, q3, got["run_s"], got["cache_s"]], abs=0.051)
    assert cost["points"]["half the layers frozen"]["cache_s"] > 0 == cost["points"]["full fine-tuning"]["cache_s"]
    # what each point's epochs cost depends on, for a study's point of the same kind (2 layers: half is 1)
    assert cost["points"]["full fine-tuning"]["kind"] == [None, []]
    assert cost["points"]["half the layers frozen"]["kind"] == [1, []]
    assert cost["points"]["half the layers frozen (cache off)"]["kind"] == [1, [["frozen_cache", "off"]]]


@pytest.mark.parametrize("xs", [[3.0], [2.0, 5.0], [4.0, 1.0, 9.0], [1.5, 0.5, 7.0, 2.0, 2.0, 11.0, 3.25]])
def test_the_cost_benchmarks_quartiles_are_numpys_linear_percentiles(xs):
    """Median, first and third quartile of the epochs' seconds: numpy's percentiles 50, 25 and 75 with linear
    interpolation between the sorted values (a single value is all three)."""
    import numpy as np
    sys.path.insert(0, str(BENCH))
    from study_cost import quartiles
    assert quartiles(xs) == pytest.approx(tuple(np.percentile(xs, [50, 25, 75])), abs=1e-12)


def test_the_cost_benchmark_trains_every_point_for_its_own_epochs():
    """A point whose arm sets its epochs (the heads up to 40, with their own early stopping) is measured for
    the benchmark's --epochs like the rest: what an epoch costs is the figure, not how many it trains."""
    sys.path.insert(0, str(BENCH))
    from study_cost import arms

    from training.experiments.study.recipe import load_recipe
    recipe = load_recipe("mpnet-depth").resolve(12)
    label = next(p["label"] for p in recipe.points if p["arm"] == "siamese-identity")
    got = arms(recipe, [], [label], cache_off=False)
    assert recipe.arms["siamese-identity"]["epochs"] == 40
    assert got == {label: {"pair_encoding": "siamese", "siamese_init": "identity", "freeze_upto": 12, "lr": 1e-4}}


def _depth_study(folder: Path, layers_frozen: dict, full: list[float]) -> Path:
    """A finished arms study: full fine-tuning, plain depths and a LoRA point, one rate each (its tuning run at
    seed 7 chooses it), reporting seeds 1-3 with the given dev overall scores."""
    from training.experiments.study.protocol import run_arm
    points = [{"label": "full", "depth": "none", "arm": "", "lrs": [0.001]}]
    points += [{"label": f"d{d}", "depth": d, "arm": "", "lrs": [0.001]} for d in layers_frozen]
    points.append({"label": "lora", "depth": "none", "arm": "lora", "lrs": [0.001]})  # not a plain depth
    recipe = {"title": "t", "kind": "arms", "tasks": ["sst", "para", "sts"], "sizes": [100], "seeds": [1, 2, 3],
              "train": {"epochs": 1}, "tuning_split": {"share": 0.1, "seed": 0},
              "lr_grid": {"lrs": [0.001], "tuning_seeds": [7], "max_extensions": 0},
              "arms": {"": {}, "lora": {"peft": "lora:r=8"}}, "points": points}
    folder.mkdir(parents=True)
    (folder / "recipe.json").write_text(json.dumps(recipe))
    runs = [("none", "", 7, 0.5), ("none", "lora", 7, 0.5)] + [(d, "", 7, 0.5) for d in layers_frozen]
    runs += [("none", "", seed, x) for seed, x in zip((1, 2, 3), full)]
    runs += [(d, "", seed, x) for d, xs in layers_frozen.items() for seed, x in zip((1, 2, 3), xs)]
    runs += [("none", "lora", seed, 0.9) for seed in (1, 2, 3)]
    with open(folder / "results.jsonl", "w") as f:
        for depth, arm, seed, x in runs:
            f.write(json.dumps({"tasks": "sst+para+sts", "depth": None if depth == "none" else depth, "size": 100,
                                "seed": seed, "arm": run_arm(arm, 0.001), "tune": {"overall": x},
                                "dev": {"overall": x}}) + "\n")
    return folder / "recipe.json"


def test_depth_by_share_sets_two_studies_depths_side_by_side(tmp_path):
    """Each plain depth against its own study's full fine-tuning, paired by seed, with the t interval written
    out; the share and the layers left from the study's depth; a point without reporting runs, a point with
    an arm and a bad study spec."""
    from scipy import stats
    sys.path.insert(0, str(BENCH))
    import depth_by_share as D

    small = _depth_study(tmp_path / "small", {1: [0.69, 0.70, 0.71]}, full=[0.70, 0.72, 0.74])
    large = _depth_study(tmp_path / "large", {2: [0.70, 0.70, 0.70], 3: [0.60, 0.61, 0.62]}, full=[0.70, 0.71, 0.72])
    rows = D.study_rows(f"{tmp_path / 'small'}:{small}:2") + D.study_rows(f"{tmp_path / 'large'}:{large}:4")
    assert [(r["study"], r["frozen"], r["share"], r["left"]) for r in rows] == [
        ("small", 1, 0.5, 1), ("large", 2, 0.5, 2), ("large", 3, 0.75, 1)]
    diffs = [-0.01, -0.02, -0.03]  # 0.69 - 0.70, 0.70 - 0.72, 0.71 - 0.74
    half = stats.t.ppf(0.975, 2) * statistics.stdev(diffs) / 3 ** 0.5
    assert rows[0]["diff"] == pytest.approx(-0.02) and rows[0]["seeds"] == 3
    assert rows[0]["ci"] == pytest.approx((-0.02 - half, -0.02 + half))
    assert rows[1]["diff"] == pytest.approx(-0.01) and rows[2]["diff"] == pytest.approx(-0.10)
    assert "| small (minilm-l6) | d1 | 1 of 2 | 50% | 1 | 3 | -0.0200 [" in D.table(rows)
    assert D.main([f"{tmp_path / 'small'}:{small}:x"]) == 2  # LAYERS not a number: one line, exit 2
    assert D.main([str(tmp_path / "small")]) == 2


def test_depth_by_share_contrasts_two_studies_at_the_same_share_and_the_same_layers_trained(tmp_path, capsys):
    """--contrast: the small model's half (1 of 2) matches the large one's 2 of 4 by share and its 3 of 4 by
    layers trained; each contrast is one loss minus the other with Welch's interval written out here, and
    Holm over the two; a study's point without a match gets no contrast."""
    from scipy import stats
    sys.path.insert(0, str(BENCH))
    import depth_by_share as D

    small = _depth_study(tmp_path / "small", {1: [0.69, 0.70, 0.71]}, full=[0.70, 0.72, 0.74])
    large = _depth_study(tmp_path / "large", {2: [0.70, 0.69, 0.70], 3: [0.60, 0.61, 0.63], 4: [0.5, 0.5, 0.5]},
                         full=[0.70, 0.71, 0.72])
    specs = [f"{tmp_path / 'small'}:{small}:2", f"{tmp_path / 'large'}:{large}:4"]
    found = D.contrasts([r for spec in specs for r in D.study_rows(spec)])
    assert [(c["placing"], c["a"]["label"], c["b"]["label"]) for c in found] == [
        ("share frozen, chosen rates", "d1", "d2"), ("layers trained, chosen rates", "d1", "d3")]

    def welch(a, b):  # Welch's t written out: the two variances of the means, Satterthwaite's df
        va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        diff, se = statistics.mean(a) - statistics.mean(b), (va + vb) ** 0.5
        half = stats.t.ppf(0.975, df) * se
        return diff, (diff - half, diff + half), 2 * stats.t.sf(abs(diff) / se, df)

    small_diffs = [-0.01, -0.02, -0.03]
    for c, large_diffs in zip(found, ([0.0, -0.02, -0.02], [-0.10, -0.10, -0.09])):
        diff, ci, p = welch(small_diffs, large_diffs)
        assert c["diff"] == pytest.approx(diff) and c["ci"] == pytest.approx(ci) and c["p"] == pytest.approx(p)
    ps = sorted(c["p"] for c in found)
    assert sorted(c["holm"] for c in found) == pytest.approx([2 * ps[0], max(2 * ps[0], ps[1])])
    assert D.main(specs + ["--contrast"]) == 0
    out = capsys.readouterr().out
    assert "| layers trained, chosen rates | d1 (small) | -0.0200 | d3 (large) | -0.0967 | +0.0767 [" in out


def _twin_recipe(folder: Path, depth: int, scores: list[float]) -> Path:
    """A near-tie recipe beside _depth_study's: depth `depth` tuned at 0.003 too (0.49, the runner-up of
    0.001's 0.5), its twin there with reporting seeds 1-3 scoring `scores`."""
    from training.experiments.study.protocol import run_arm
    recipe = json.loads((folder / "recipe.json").read_text())
    point = {"label": f"d{depth}", "depth": depth, "arm": "", "lrs": [0.001, 0.003]}
    recipe["points"] = [recipe["points"][0], point, {"label": f"d{depth} twin", "depth": depth, "arm": "",
                                                     "runner_up_of": f"d{depth}"}]
    (folder / "rates.json").write_text(json.dumps(recipe))
    with open(folder / "results.jsonl", "a") as f:
        for seed, x in [(7, 0.49), (1, scores[0]), (2, scores[1]), (3, scores[2])]:
            f.write(json.dumps({"tasks": "sst+para+sts", "depth": depth, "size": 100, "seed": seed,
                                "arm": run_arm("", 0.003), "tune": {"overall": x}, "dev": {"overall": x}}) + "\n")
    return folder / "rates.json"


def test_depth_by_share_with_near_tie_recipes_contrasts_twins_with_twins(tmp_path, capsys):
    """A study given with its near-tie recipe too is one study whose rows add each plain depth's twin (the
    runner-up rate, against the same full fine-tuning); contrasts pair chosen with chosen and twin with
    twin, never one with the other, and Holm runs over all of them."""
    sys.path.insert(0, str(BENCH))
    import depth_by_share as D

    small = _depth_study(tmp_path / "small", {1: [0.69, 0.70, 0.71]}, full=[0.70, 0.72, 0.74])
    large = _depth_study(tmp_path / "large", {2: [0.70, 0.69, 0.70], 3: [0.60, 0.61, 0.63]}, full=[0.70, 0.71, 0.72])
    small_twin = _twin_recipe(tmp_path / "small", 1, [0.70, 0.70, 0.70])
    large_twin = _twin_recipe(tmp_path / "large", 2, [0.68, 0.66, 0.67])
    specs = [f"{tmp_path / 'small'}:{small}:2", f"{tmp_path / 'small'}:{small_twin}:2",
             f"{tmp_path / 'large'}:{large}:4", f"{tmp_path / 'large'}:{large_twin}:4"]
    assert D.main(specs + ["--contrast"]) == 0
    out = capsys.readouterr().out
    rows = [r for spec in specs for r in D.study_rows(spec)]
    twin = next(r for r in rows if r["label"] == "d1 twin")
    assert twin["rate"] == "runner-up" and twin["diffs"] == pytest.approx([0.0, -0.02, -0.04])
    assert out.count("| d1 | 1 of 2 |") == 1  # given twice, listed once
    found = D.contrasts(list({(r["study"], r["label"]): r for r in rows}.values()))
    assert [(c["placing"], c["a"]["label"], c["b"]["label"]) for c in found] == [
        ("share frozen, chosen rates", "d1", "d2"), ("share frozen, runner-up rates", "d1 twin", "d2 twin"),
        ("layers trained, chosen rates", "d1", "d3")]
    both_twins = found[1]
    assert both_twins["diff"] == pytest.approx(-0.02 - (-0.04))  # twins' mean losses -0.02 and -0.04
    assert "| share frozen, runner-up rates | d1 twin (small) | -0.0200 | d2 twin (large) | -0.0400 |" in out


def test_same_bits_runs_carry_the_flags_of_the_points_a_study_has_left():
    """--flags reaches the run both commits make (a study's SMART or schedule points are checked as they run)."""
    from same_bits import parse_args, run_command
    args = parse_args(["old", "new", "--depths", "4", "--flags=--smart --smart-lambda 0"])
    cmd = run_command(args, "4", Path("out"))
    assert cmd[-3:] == ["--smart", "--smart-lambda", "0"], cmd
    assert cmd[cmd.index("--freeze-upto") + 1] == "4" and cmd[cmd.index("--precision") + 1] == "bf16"
    assert "--smart" not in run_command(parse_args(["old", "new"]), "none", Path("out"))


@pytest.fixture(scope="module")
def tiny_mpnet(tmp_path_factory):
    """A random 2-layer, hidden-32 MPNet saved by transformers' MPNetModel, with a vocab.txt."""
    import torch
    from transformers import MPNetConfig, MPNetModel
    d = tmp_path_factory.mktemp("mpnet")
    torch.manual_seed(0)
    MPNetModel(MPNetConfig(vocab_size=1100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=514, layer_norm_eps=1e-5)).save_pretrained(d)
    (d / "vocab.txt").write_text("\n".join(["<s>", "<pad>", "</s>", "<unk>"] + [f"x{i}" for i in range(1096)]) + "\n")
    return d


def bench(script, *args, cwd):
    return subprocess.run([sys.executable, str(BENCH / script), *args, "--threads", "1"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_mpnet_folder_is_timed_against_mpnet_model(tiny_mpnet, tmp_path, precision):
    """--model DIR of an MPNet: the reference is transformers' MPNetModel (eager, its only attention), the
    same function before the steps; the grid's reference arm too. --ref-attn sdpa is refused, not ignored."""
    tiny = ["--batch-size", "2", "--seq-len", "16", "--steps", "2", "--warmup", "0", "--padded"]
    r = bench("encoder_vs_hf.py", "--model", str(tiny_mpnet), "--precision", precision, *tiny, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"({'bf16 autocast' if precision == 'bf16' else 'fp32'})" in r.stdout, r.stdout
    assert "(mpnet, 2 layers, hidden 32)" in r.stdout and "transformers   eager" in r.stdout, r.stdout
    assert float(r.stdout.split("max|diff| ")[1].split()[0]) < 1e-5, r.stdout
    assert "ratio minbert / transformers: " in r.stdout
    if precision == "bf16":  # once: the refusal comes before any precision matters
        r = bench("encoder_vs_hf.py", "--model", str(tiny_mpnet), "--ref-attn", "sdpa", *tiny, cwd=tmp_path)
        assert r.returncode != 0 and "MPNetModel has eager attention only" in r.stderr, r.stderr
    else:
        r = bench("encoder_grid.py", "--model", str(tiny_mpnet), "--batch-sizes", "2", "--lengths", "8",
                  "--repeats", "1", "--warmup", "0", "--padding", "padded", cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "| ours ms | ours-cls ms | hf-eager ms |" in r.stdout and "(mpnet, 2 layers" in r.stdout, r.stdout


def test_the_mpnet_base_shape_is_all_mpnet_base_v2s_and_its_step_runs(tmp_path):
    """--mpnet-base at a tiny batch (2 x 8, one step in fp32: 20 s and 4 GB on a Zen 3 core, the two
    110M-parameter models with their AdamW states; bf16, emulated on a CPU without AVX512-BF16, took 29 s): the
    folder transformers writes loads on both sides to the same function, and its config reads as the real
    all-mpnet-base-v2's where that is in the cache (`--model mpnet-base`)."""
    sys.path.insert(0, str(BENCH))
    from common import MPNET_BASE_SHAPE
    from transformers import MPNetConfig

    from minbert import BertConfig
    from minbert.parts import MPNET_BASE, cache_root
    MPNetConfig(**MPNET_BASE_SHAPE).save_pretrained(tmp_path / "shape")
    real = cache_root() / MPNET_BASE.folder / "config.json"
    if real.is_file():  # assembled on this machine
        assert BertConfig.from_json(tmp_path / "shape" / "config.json") == BertConfig.from_json(real)
    r = bench("encoder_vs_hf.py", "--mpnet-base", "--batch-size", "2", "--seq-len", "8", "--steps", "1",
              "--warmup", "0", "--precision", "fp32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "# model: mpnet-base shape, random (mpnet, 12 layers, hidden 768)" in r.stdout, r.stdout
    assert float(r.stdout.split("max|diff| ")[1].split()[0]) < 1e-5, r.stdout


def test_equivalence_resolves_a_recipe_on_the_model_it_names(tmp_path, capsys):
    """A recipe that names a 12-layer model has its depth 9 resolved there, not on MiniLM's 6 (which refuses it);
    the row's difference is the mean of the paired differences, written out here; a model whose depth cannot be
    read is one line and exit 2."""
    sys.path.insert(0, str(BENCH))
    import equivalence as E

    path = _depth_study(tmp_path / "s", {9: [0.69, 0.70, 0.72]}, full=[0.70, 0.72, 0.74])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 12}))
    for name in ("model.safetensors", "vocab.txt"):  # a checkpoint's layout; only the config is read
        (model / name).write_text("")
    recipe = json.loads(path.read_text())
    recipe["train"]["model"] = str(model)
    path.write_text(json.dumps(recipe))
    assert E.main(["--recipe", str(path), str(tmp_path / "s")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| d9 "))
    assert "| 1,2,3 | -0.0167 [" in line  # (-0.01 - 0.02 - 0.02) / 3
    recipe["train"]["model"] = str(tmp_path / "nowhere")
    path.write_text(json.dumps(recipe))
    assert E.main(["--recipe", str(path), str(tmp_path / "s")]) == 2
    assert "--layers" in capsys.readouterr().err
    import depth_by_share as D  # the same depth lookup there: its fix names the spec's LAYERS
    assert D.main([f"{tmp_path / 's'}:{path}"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nowhere'}: cannot read" in err and f"{tmp_path / 's'}:{path}:LAYERS" in err, err
    assert E.main(["--recipe", str(path), "--layers", "12", str(tmp_path / "s")]) == 0  # given: nothing read
