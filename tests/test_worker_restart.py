"""A study worker killed alone (SIGKILL to the worker, not its process group) while its run's training
process trains, then started again at once (issue 62): the orphaned training process notices its worker
gone, finishes its step and writes a checkpoint. The restarted worker must wait for it, go on from that
checkpoint, and end with rc 0, the same records as an uninterrupted run's and no checkpoint left.

To make the race certain rather than likely, the orphan is stopped (SIGSTOP) the moment its worker is
killed and let go only once the restarted worker has either cleaned the run's folder (the old fault: the
orphan's checkpoint then lands in a folder the new worker owns, whose trainer refuses it) or says it waits."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny_runs

from training.experiments.sweep import records as sweep_records

ROOT = Path(__file__).parents[1]
# two epochs of a few seconds each, with no checkpoint before the first epoch's end: a worker killed in
# the first epoch leaves none, so the orphan's is the run's first
TRAIN = {"epochs": 2, "batch_size": 4, "lr": 1e-3, "device": "cpu", "precision": "fp32"}
COPIES = 40  # of each of tiny_runs' labelled rows


def long_data(root: Path) -> Path:
    """tiny_runs' course files with each labelled row written COPIES times (under new ids)."""
    data = tiny_runs.write_data(root / "data-rows")
    for f in data.glob("*.csv"):
        head, *rows = f.read_text().splitlines()
        if "test" not in f.name:
            rows = [f"{n}\t{r.split(chr(9))[1]}c{n}\t{r.split(chr(9), 2)[2]}"
                    for n, r in enumerate(r for _ in range(COPIES) for r in rows)]
        f.write_text("\n".join([head, *rows]) + "\n")
    return data


def study_argv(root: Path, seeds) -> list[str]:
    data, enc = long_data(root), tiny_runs.make_encoder(root / "encoder")
    recipe = root / "recipe.json"
    recipe.write_text(json.dumps({"title": "t", "kind": "depth", "results": str(root / "results"),
                                  "report": str(root / "report"), "tasks": ["sst"], "depths": ["none"],
                                  "sizes": [200], "seeds": list(seeds), "train": TRAIN}))
    return [sys.executable, "-m", "training.experiments.study", str(recipe), "--model", str(enc),
            "--data-dir", str(data), "--threads", "1", "--runs-dir", str(root / "runs")]


# The worker, with one pause: after cleaning a folder an earlier run left, it waits 5 s before training,
# time in which an orphan that was not waited for writes into the folder (on the old code: every time).
SLOW_CLEAN = """
import sys, time
from training.experiments.sweep import engine
from training.experiments.study import cli as C
real = engine._clean_run_dir
def clean_then_pause(run_dir):
    left_over = run_dir.exists()
    real(run_dir)
    if left_over:
        time.sleep(5)
engine._clean_run_dir = clean_then_pause
sys.exit(C.main(sys.argv[1:]))
"""


# The worker as it is, looking again half a second after it found nothing to claim (15 s in use).
QUICK_LOOK = """
import sys
from training.experiments.sweep import engine
from training.experiments.study import cli as C
engine.WAIT_SECONDS = 0.5
sys.exit(C.main(sys.argv[1:]))
"""


def start(argv: list[str], log: Path, code: str = SLOW_CLEAN) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *argv[3:]], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})


def children(pid: int) -> list[int]:
    """pid's child processes that train (multiprocessing's spawned processes, not its resource tracker)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
                found.append(int(child))
    return found


def wait_until(what, timeout: float = 120.0, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what.__doc__ or what}")


def training_child(worker: subprocess.Popen, runs: Path) -> int:
    """The worker's training process once its run has written a first epoch's metrics."""
    def training():
        kids = children(worker.pid)
        busy = [d for d in runs.glob("sst-*") if (d / "metrics.jsonl").is_file()
                and (d / "metrics.jsonl").stat().st_size]
        return kids[0] if kids and busy else None
    return wait_until(training)


def results(root: Path) -> dict[str, dict]:
    """Each recorded run's dev metrics and dev predictions (what an uninterrupted run must equal)."""
    out = {}
    for r in sweep_records.read_results(root / "results" / sweep_records.RESULTS):
        preds = {t: (root / "results" / p).read_text() for t, p in sorted(r.get("dev_predictions", {}).items())}
        out[sweep_records.RunKey.of(r).name] = {"dev": r["dev"], "predictions": preds}
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("uninterrupted")
    p = subprocess.run(study_argv(root, (1, 2)), check=False, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert p.returncode == 0, p.stderr
    return results(root)


def kill_worker_alone_then_restart(root: Path, argv: list[str], worker: subprocess.Popen) -> subprocess.Popen:
    """SIGKILL `worker` (not its training process) mid-training and start the same command again at
    once; the orphan is held stopped until a live worker has cleaned the folder or waits for it."""
    orphan = training_child(worker, root / "runs")
    os.kill(orphan, signal.SIGSTOP)
    worker.kill()
    worker.wait()
    log = root / "restarted.log"
    again = start(argv, log)

    def cleaned_or_waits():  # by whichever live worker takes the run over: the restarted one or another
        text = "".join(p.read_text() for p in root.glob("*.log") if p.name != "first.log")
        return any(said in text for said in ("starting it again", "going on from its last", "waiting for it"))
    try:
        wait_until(cleaned_or_waits, timeout=60)
    finally:
        os.kill(orphan, signal.SIGCONT)
    return again


def finished(p: subprocess.Popen, log: Path) -> None:
    assert p.wait(timeout=300) == 0, log.read_text()[-3000:]


def no_checkpoint_left(root: Path) -> None:
    runs = root / "runs"
    assert not list(runs.glob("*/checkpoints/*.pt")) and not list(runs.glob("*/best.pt")), list(runs.rglob("*.pt"))
    assert not list(runs.glob(".*.lock"))


def test_a_worker_killed_alone_mid_run_and_restarted_goes_on(tmp_path, uninterrupted):
    argv = study_argv(tmp_path, (1, 2))
    worker = start(argv, tmp_path / "first.log")
    again = kill_worker_alone_then_restart(tmp_path, argv, worker)
    finished(again, tmp_path / "restarted.log")
    assert "going on from its last checkpoint" in (tmp_path / "restarted.log").read_text()
    assert results(tmp_path) == uninterrupted
    no_checkpoint_left(tmp_path)


def test_one_of_two_workers_killed_alone_and_restarted_goes_on(tmp_path, uninterrupted):
    argv = study_argv(tmp_path, (1, 2))
    first = start(argv, tmp_path / "first.log")
    wait_until(lambda: "seed1" in (tmp_path / "first.log").read_text())  # claimed: the second takes seed 2
    other = start(argv, tmp_path / "other.log")
    again = kill_worker_alone_then_restart(tmp_path, argv, first)
    finished(other, tmp_path / "other.log")
    finished(again, tmp_path / "restarted.log")
    assert results(tmp_path) == uninterrupted
    no_checkpoint_left(tmp_path)


def test_the_other_worker_takes_over_the_run_of_a_worker_killed_and_not_restarted(tmp_path, uninterrupted):
    """The second worker saw seed 1 claimed by a live worker when it started; once that worker is gone
    (killed alone, its training process left to checkpoint and end), the second must take seed 1 over
    when it next looks, not finish with seed 1 never recorded."""
    argv = study_argv(tmp_path, (1, 2))
    first = start(argv, tmp_path / "first.log")
    wait_until(lambda: "seed1" in (tmp_path / "first.log").read_text())  # claimed: the second takes seed 2
    other = start(argv, tmp_path / "other.log")
    wait_until(lambda: "seed2" in (tmp_path / "other.log").read_text())  # it has seen seed 1 claimed
    training_child(first, tmp_path / "runs")
    first.kill()
    first.wait()
    finished(other, tmp_path / "other.log")
    assert results(tmp_path) == uninterrupted
    no_checkpoint_left(tmp_path)


def test_a_worker_with_nothing_to_claim_waits_and_takes_over_when_the_claimant_dies(tmp_path, uninterrupted):
    """Both runs claimed by a live process (a stand-in that never trains): the worker must wait rather
    than end with nothing recorded, and train both once that process is gone."""
    argv, log = study_argv(tmp_path, (1, 2)), tmp_path / "worker.log"
    (tmp_path / "runs").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    for seed in (1, 2):
        lock = tmp_path / "runs" / f".sst-freezenone-n200-seed{seed}.lock"
        lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
    worker = start(argv, log, QUICK_LOOK)
    try:
        wait_until(lambda: "waiting for the 2 run(s) other workers train" in log.read_text())
        time.sleep(2)  # four more looks
        assert worker.poll() is None and log.read_text().count("waiting for the") == 1  # said once
    finally:
        holder.kill()
        holder.wait()
    finished(worker, log)
    assert results(tmp_path) == uninterrupted
    no_checkpoint_left(tmp_path)


def test_a_training_process_whose_worker_is_gone_before_it_holds_the_folder_does_not_train(tmp_path):
    from training.common.processes import TRAINER_LOCK, hold_run_folder
    assert hold_run_folder(tmp_path / "run", parent=os.getppid() + 10**6) is None  # not our parent: gone
    assert (tmp_path / "run" / TRAINER_LOCK).read_text() == ""  # nothing claimed, the lock left free
    fd = hold_run_folder(tmp_path / "run", parent=os.getppid())
    assert fd is not None and (tmp_path / "run" / TRAINER_LOCK).read_text() == str(os.getpid())
    os.close(fd)


HOLD = """
import sys, time
from pathlib import Path
from training.common.processes import hold_run_folder
import os
assert hold_run_folder(Path(sys.argv[1]), os.getppid()) is not None
print("held", flush=True)
time.sleep(1.5)
"""


def test_a_worker_waits_for_the_process_that_trains_in_the_folder(tmp_path, caplog):
    import logging

    from training.common.processes import wait_for_run_folder
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO):
        wait_for_run_folder(tmp_path, logging.getLogger("test"))
    assert holder.poll() is not None and time.monotonic() - t0 > 0.5  # returned only once the holder ended
    assert f"pid {holder.pid}" in caplog.text
    holder.wait()
