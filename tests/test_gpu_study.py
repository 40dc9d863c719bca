"""bench/gpu_study.sh's worker slots, with a stand-in for the study on PATH (python3): a worker that stops
with nothing to claim is followed by another until one reports the study complete; a worker that fails
ends its slot. The GPU itself is not needed: the script only starts workers and gathers what they write."""
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Stands in for `python3 -m training.experiments.study ...`: counts its starts; the first BUSY of them find every run
# claimed by another worker and exit 0 (as the study's workers did before they waited), the next reports
# the study complete, or every start fails where FAIL is set.
FAKE_PYTHON = """#!/usr/bin/env bash
n=$(( $(cat "$FAKE_DIR/starts" 2>/dev/null || echo 0) + 1 )); echo $n > "$FAKE_DIR/starts"
echo "start $n: $*"
[[ -n "${FAIL:-}" ]] && { echo "training.experiments.sweep: error: run x failed"; exit 1; }
if (( n <= BUSY )); then echo "INFO training.experiments.sweep.engine: stopped with nothing to claim"
else echo "INFO training.experiments.sweep.engine: sweep complete: results.jsonl"; fi
"""


@pytest.fixture
def layout(tmp_path):
    """A copy of the script in a checkout-like folder with one study's record, the stand-in on PATH."""
    (tmp_path / "bench").mkdir()
    shutil.copy(REPO / "bench" / "gpu_study.sh", tmp_path / "bench")
    (tmp_path / ".gpu" / "study" / "s").mkdir(parents=True)
    (tmp_path / ".gpu" / "study" / "s" / "results.jsonl").write_text("")
    (tmp_path / "data").mkdir()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python3").write_text(FAKE_PYTHON)
    (fake_bin / "python3").chmod(0o755)
    return tmp_path


def run(layout: Path, **env) -> tuple[subprocess.CompletedProcess, float]:
    full = {**os.environ, "PATH": f"{layout / 'bin'}:{os.environ['PATH']}", "FAKE_DIR": str(layout),
            "STUDIES": "s=some-recipe:1", "DATA_AS": str(layout / "data"), "DEADLINE": "300", "RETRY_S": "0.1",
            "STUDY_DIR": str(layout / "out" / "study"), "BUSY": "2", **env}
    full.pop("OUT", None)
    start = time.monotonic()
    done = subprocess.run(["bash", str(layout / "bench" / "gpu_study.sh")], env=full, capture_output=True,
                          text=True, timeout=120, check=False)
    return done, time.monotonic() - start


def test_a_slot_starts_workers_until_the_study_is_complete(layout):
    done, seconds = run(layout)
    assert done.returncode == 0, done.stderr
    assert (layout / "starts").read_text().strip() == "3"  # two found nothing to claim, the third completed
    log = (layout / "out" / "study" / "s-worker1.log").read_text()
    assert log.count("stopped with nothing to claim") == 2 and "sweep complete" in log
    assert "-m training.experiments.study some-recipe --out" in log and "--threads 1" in log
    assert seconds < 60  # it stopped at the completion, not at the deadline


def test_a_failed_worker_ends_its_slot(layout):
    done, _ = run(layout, FAIL="1")
    assert done.returncode == 0, done.stderr
    assert (layout / "starts").read_text().strip() == "1"
    assert "slot: worker exited 1" in (layout / "out" / "study" / "s-worker1.log").read_text()


def test_each_study_gets_its_own_worker_count(layout):
    done, _ = run(layout, BUSY="0", STUDIES="s=some-recipe:3")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (layout / "out" / "study").glob("s-worker*.log")) == [
        "s-worker1.log", "s-worker2.log", "s-worker3.log"]


def test_a_study_without_its_record_is_refused_before_anything_starts(layout):
    done, _ = run(layout, STUDIES="missing=whole")
    assert done.returncode == 2
    assert done.stderr.strip() == ("gpu_study: STUDIES: missing=whole: not NAME=RECIPE with "
                                   ".gpu/study/NAME/results.jsonl")
    assert not (layout / "starts").exists()


def test_a_second_call_goes_on_from_the_first_calls_study_folder(layout):
    """On a warm machine the first call's runs (and the checkpoints of those its deadline cut off) are in
    STUDY_DIR; a second call must train on from them, not copy the record over them."""
    first, _ = run(layout, BUSY="0")
    assert first.returncode == 0, first.stderr
    trained = layout / "out" / "study" / "s" / "results.jsonl"
    trained.write_text('{"a run": "the first call trained"}\n')
    second, _ = run(layout, BUSY="0")
    assert second.returncode == 0, second.stderr
    assert trained.read_text() == '{"a run": "the first call trained"}\n'
    assert not (layout / "out" / "study" / "s" / "s").exists()  # nor a copy nested inside it
