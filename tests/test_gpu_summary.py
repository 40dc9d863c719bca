"""bench/gpu_summary.py: the GPU check's one-page summary, from a results folder written here by hand
(the logs as gpu_check.sh and the scripts it runs write them), with the figures worked out below."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import bench_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_summary.py"


@pytest.fixture(scope="module")
def summary():
    return bench_script("gpu_summary")


def _status(res: Path, rows):
    (res / "status.tsv").write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))


ENCODER_TABLE = """== bench-encoder-bert-base: python bench/encoder_vs_hf.py --device cuda --bert-base
# 2026-12-01 10:00  torch 2.11.0  threads 16  device cuda (bf16 autocast) NVIDIA H100 80GB HBM3
# model: bert-base shape, random (12 layers, hidden 768)  batch 32x128  steps 30 (+5 warm-up)  AdamW fused
implementation attn    median s/step      min  TFLOP/s    MFU  step peak MiB
minbert        sdpa           0.0300   0.0290   300.00  30.3%            500
transformers   sdpa           0.0353   0.0340   255.00  25.8%            600
ratio minbert / transformers: 0.85x (median of 30 paired steps, IQR 0.80-0.90)
== bench-encoder-bert-base: exit 0 after 20.0s
"""


@pytest.fixture
def results(tmp_path):
    res = tmp_path / "res"
    (res / "train").mkdir(parents=True)
    _status(res, [
        ("env", 0, 3.0, "2026-12-01T10:00:00"),
        ("cuda-tests", 0, 30.0, "2026-12-01T10:01:00"),
        ("tests", 1, 300.0, "2026-12-01T10:06:00"),
        ("tests", 1, 310.0, "2026-12-01T10:12:00"),  # run again: the later line counts
        ("train", 0, 150.4, "2026-12-01T10:15:00"),
        ("bert-base", "skipped", 0, "2026-12-01T10:15:00", "bert-base-uncased is not in this machine's cache"),
        ("bench-encoder-bert-base", 0, 20.0, "2026-12-01T10:16:00"),
        ("bench-encoder-minilm", 124, 240.0, "2026-12-01T10:20:00"),
    ])
    (res / "env.log").write_text("== env\n- GPU: NVIDIA H100 80GB HBM3, 79 GiB\n")
    (res / "cuda-tests.log").write_text("tests/test_cuda.py::test_a PASSED\n======= 15 passed in 30.10s =======\n")
    (res / "tests.log").write_text("..F.\nFAILED tests/test_x.py::test_y - AssertionError: 1 != 2\n"
                                   "SKIPPED [1] tests/test_z.py:3: no thing\n"
                                   "3 failed, 440 passed, 2 skipped in 300.00s (0:05:00)\n")
    records = [{"epoch": e, "step": 900 * (e + 1), "train_seconds": 10.0 + e, "dev_sst_acc": 0.45 + 0.025 * e,
                "dev_para_acc": 0.80 + 0.025 * e, "dev_sts_pearson": 0.85 + 0.01 * e,
                "dev_overall": 0.7 + 0.01 * e} for e in range(3)]
    records[2]["dev_overall"] = 0.6  # the best is epoch 1's
    (res / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (res / "train" / "train.log").write_text(
        "2026-12-01 10:00:00,000 INFO training.run.trainer: epoch 0: 900 steps, padding efficiency 0.96\n"
        "2026-12-01 10:00:05,500 INFO progress: epoch 0 450/900\n"
        "2026-12-01 10:00:11,000 INFO training.run.trainer: epoch 0: dev, raw weights sst_acc 0.4\n"
        "2026-12-01 10:00:12,000 INFO training.run.trainer: epoch 0: dev, weight EMA sst_acc 0.5\n")
    # epoch 0 trained for 10 s from 10:00:00: two samples inside (90, 80), three outside (0 before,
    # 20 and 10 while the dev sets were evaluated, the first of them before the first dev line)
    (res / "train-gpu-util.csv").write_text("2026/12/01 09:59:58.000, 0, 500\n2026/12/01 10:00:02.000, 90, 900\n"
                                            "2026/12/01 10:00:05.000, 80, 900\n2026/12/01 10:00:10.500, 20, 900\n"
                                            "2026/12/01 10:00:12.000, 10, 900\n")
    (res / "bench-encoder-bert-base.log").write_text(ENCODER_TABLE)
    (res / "bench-encoder-minilm.log").write_text("== bench-encoder-minilm: ...\n== exit 124\n")
    return res


def test_summary_states_each_part_and_the_targets(summary, results):
    text = summary.write_summary(results).read_text()
    assert "- GPU: NVIDIA H100 80GB HBM3, 79 GiB" in text
    assert "| cuda-tests | ok | 30 |" in text
    assert "| tests | **failed** (exit 1) | 310 |" in text  # the latest run
    assert "| bench-encoder-minilm | **timed out** (124) | 240 |" in text
    assert "| bench-throughput | not run | |" in text
    assert "- cuda-tests: 15 passed" in text and "**CUDA-marked tests were skipped" not in text
    assert "- tests: 3 failed, 440 passed, 2 skipped" in text
    assert "FAILED tests/test_x.py::test_y - AssertionError: 1 != 2" in text
    # training: best by overall is epoch 1; wall 150 s < 180 s
    assert "150 s (target < 180 s: met)" in text
    assert "best dev (epoch 1), SST / Quora / STS / overall: 0.4750 / 0.8250 / 0.8600 / 0.7100" in text
    assert "CPU run: 0.4923 / 0.8403 / 0.8603 / 0.7543" in text
    assert "training seconds per epoch: 10, 11, 12" in text
    # busy: whole command (0 + 90 + 80 + 20 + 10) / 5 = 40%; inside the training window (90 + 80) / 2 = 85%
    assert "whole command 40%; inside the epochs' training 85% (target >= 80%: met)" in text
    assert "step time ours / transformers 0.85x (target <= 0.9: met)" in text
    assert "MFU 30.3% (target >= 40%: **missed**)" in text
    assert "peak memory ours <= reference: met" in text
    assert "    minbert        sdpa           0.0300" in text  # the table itself is in the summary
    assert "- no result table in bench-encoder-minilm.log" in text
    assert "bert-base-uncased is not in this machine's cache" in text


def test_skipped_cuda_tests_are_flagged_unless_a_dry_run(summary, results):
    (results / "cuda-tests.log").write_text("SKIPPED [15] tests/test_cuda.py:70: needs a CUDA GPU\n"
                                            "15 skipped in 2.00s\n")
    assert "**CUDA-marked tests were skipped" in summary.write_summary(results).read_text()
    dry = summary.write_summary(results, dry_run=True).read_text()
    assert "**CUDA-marked tests were skipped" not in dry and "dry run" in dry.splitlines()[0]


def test_busy_fraction_without_samples_is_not_made_up(summary, results):
    (results / "train-gpu-util.csv").unlink()
    assert "GPU busy fraction: not measured (no nvidia-smi samples)" in summary.write_summary(results).read_text()
    assert summary.busy_fraction("", "", {}) is None


def test_command_line(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "missing: not a folder" in r.stderr
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and (tmp_path / "summary.md").read_text().startswith("# GPU check")


def test_the_encoder_rows_parse_what_the_benchmark_prints(summary):
    """The summary's parser against bench/encoder_vs_hf.py's own output (tiny, on the CPU), so the two
    cannot drift apart again (the GPU check of 2026-11-26 found the table's format had moved on)."""
    pytest.importorskip("transformers")
    out = subprocess.run([sys.executable, str(REPO / "bench" / "encoder_vs_hf.py"), "--device", "cpu",
                          "--batch-size", "2", "--seq-len", "16", "--steps", "2", "--warmup", "0", "--threads", "1"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = summary.encoder_rows(out.stdout)
    assert set(rows) == {"minbert", "transformers"}
    assert rows["minbert"]["ratio"] > 0 and rows["minbert"]["median_s"] > 0 and rows["transformers"]["median_s"] > 0
    assert rows["minbert"]["mfu"] is None and rows["minbert"]["peak_mib"] is None  # no peak known, no CUDA
