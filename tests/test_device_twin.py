"""bench/device_twin.py: the same study runs from two machines, paired by run name, against figures worked
out here by hand (the paired t interval written out; the bootstrap on predictions whose scores are known)."""
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from bench_scripts import bench_script


@pytest.fixture(scope="module")
def twin():
    return bench_script("device_twin")


def record(seed: int, overall: float, role: str = "reporting", arm: str = "lr3e-05", preds: str | None = None) -> dict:
    dev = {"sst_acc": overall, "para_acc": overall, "sts_pearson": overall, "overall": overall}
    return {"tasks": "sst+para+sts", "depth": None, "size": "all", "seed": seed, "arm": arm, "seed_role": role,
            "dev": dev, "cpu": "test CPU", "cuda_peak_mib": None, "dev_predictions": preds}


def write(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_runs_pair_by_name_reporting_runs_only(twin):
    a = [record(1, 0.70), record(2, 0.71), record(3, 0.72), record(101, 0.9, role="tuning")]
    b = [record(2, 0.75), record(1, 0.74), record(101, 0.1, role="tuning"), record(1, 0.5, arm="smart-lr0.0001")]
    pairs = twin.pair_runs(a, b)
    assert [(x["seed"], y["seed"], y["dev"]["overall"]) for x, y in pairs] == [(1, 1, 0.74), (2, 2, 0.75)]
    both = twin.pair_runs(a, b, roles=("reporting", "tuning"))
    assert [(x["seed"], y["dev"]["overall"]) for x, y in both] == [(1, 0.74), (101, 0.1), (2, 0.75)]


def test_the_paired_difference_and_its_t_interval_by_hand(twin, tmp_path):
    a_scores, b_scores = [0.70, 0.71, 0.72], [0.72, 0.72, 0.75]
    pairs = [(record(s, x), record(s, y)) for s, (x, y) in enumerate(zip(a_scores, b_scores), 1)]
    row = next(r for r in twin.compare_pairs(pairs, (tmp_path, tmp_path), None) if r["metric"] == "overall")
    d = [0.02, 0.01, 0.03]  # B - A
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert row["diff"] == pytest.approx(mean)
    assert row["ci"] == pytest.approx((mean - half, mean + half))
    t = mean / (sd / math.sqrt(3))
    assert row["t"] == pytest.approx(t)
    assert row["a"] == pytest.approx((0.71, 0.01)) and row["boot_ci"] is None


def test_the_bootstrap_nil_for_the_same_predictions_and_exact_for_all_wrong_against_all_right(twin, tmp_path):
    labels = {"sst": np.array([0, 1, 2, 3, 4, 0.0]), "para": np.array([0, 1, 1, 0, 1, 0.0]),
              "sts": np.array([0.5, 1.0, 2.0, 3.0, 4.0, 5.0])}
    same = {"sst": [0, 1, 2, 3, 4, 0], "para": [0, 1, 1, 0, 1, 0], "sts": [0.5, 1.0, 2.0, 3.0, 4.0, 5.0]}
    wrong = {**same, "sst": [1, 2, 3, 4, 0, 1], "para": [1, 0, 0, 1, 0, 1]}  # every class wrong, STS the same
    for name, preds in (("same", same), ("wrong", wrong)):
        (tmp_path / name / "p").mkdir(parents=True)
        for seed in (1, 2):
            with gzip.open(tmp_path / name / "p" / f"{seed}.json.gz", "wt") as f:
                json.dump(preds, f)
    pairs = [(record(s, 0.7, preds=f"p/{s}.json.gz"), record(s, 0.7, preds=f"p/{s}.json.gz")) for s in (1, 2)]
    rows = twin.compare_pairs(pairs, (tmp_path / "same", tmp_path / "same"), labels, reps=50)
    assert all(r["boot_ci"] == (0.0, 0.0) for r in rows)
    rows = {r["metric"]: r["boot_ci"] for r in twin.compare_pairs(pairs, (tmp_path / "wrong", tmp_path / "same"),
                                                                  labels, reps=50)}
    # accuracy 1 against 0 on every resample; STS the same; overall the mean of 1, 1 and 0 / 2
    assert rows == {"sst_acc": (1.0, 1.0), "para_acc": (1.0, 1.0), "sts_pearson": (0.0, 0.0),
                    "overall": pytest.approx((2 / 3, 2 / 3))}


def test_too_few_shared_runs_is_a_one_line_error(twin, tmp_path, capsys):
    a = write(tmp_path / "a", [record(1, 0.7)])
    b = write(tmp_path / "b", [record(1, 0.71), record(2, 0.72)])
    assert twin.main([str(a), str(b), "--no-bootstrap"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"device_twin: {a} and {b} share 1 reporting run(s); the paired tests need 2"]


def test_the_table_names_both_machines(twin, tmp_path, capsys):
    a = write(tmp_path / "a", [record(1, 0.70), record(2, 0.71)])
    b = write(tmp_path / "b", [{**record(1, 0.72), "cuda_peak_mib": 900.0, "gpu": "NVIDIA H100"},
                               {**record(2, 0.72), "cuda_peak_mib": 900.0, "gpu": "NVIDIA H100"}])
    assert twin.main([str(a), str(b), "--no-bootstrap", "--names", "CPU", "H100"]) == 0
    out = capsys.readouterr().out
    assert "A: CPU test CPU (2 runs); B: GPU NVIDIA H100 (2 runs)" in out
    assert "| overall | 0.7050 (0.0071) | 0.7200 (0.0000) | +0.0150 [-0.0485, +0.0785] | 0.205 | - |" in out
