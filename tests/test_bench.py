"""The benchmark scripts start as the README runs them: `python bench/X.py` from any folder."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name != "common.py")


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 6, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs_from_another_folder(script, tmp_path):
    r = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout and "--threads" in r.stdout, r.stdout
