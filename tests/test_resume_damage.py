"""Issue 20: resume survives what a crash or a power loss leaves behind -- a torn last line in
metrics.jsonl, an unreadable newest checkpoint, temp files of writes killed mid-way -- and each resumed
run ends bit-identical to the same run uninterrupted (records, best.pt, prediction files)."""
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from test_resume import REPO, _args, files  # noqa: F401  (files: the module's tiny model and data)

from training.run.checkpointing import read_checkpoint
from training.train import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def straight(files, tmp_path_factory):  # noqa: F811
    """The uninterrupted run every resumed one must equal (3 epochs of 6 steps, a checkpoint per step)."""
    ckpt, data = files
    out = tmp_path_factory.mktemp("straight") / "run"
    assert cli_main(_args(ckpt, data, out, "--keep-last", "100")) == 0
    return out


def _records(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("train_seconds", "frozen_cache_seconds")} for r in rows]


def assert_same_run(out, straight):
    assert _records(out) == _records(straight)
    a, b = read_checkpoint(out / "best.pt")["model"], read_checkpoint(straight / "best.pt")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    names = sorted(p.name for p in (straight / "pred").glob("*-output.csv"))  # manifest.json names its run
    assert len(names) == 6
    assert sorted(p.name for p in (out / "pred").iterdir() if p.suffix != ".tmp") == sorted(names + ["manifest.json"])
    assert all((out / "pred" / n).read_bytes() == (straight / "pred" / n).read_bytes() for n in names)


def crashed_copy(straight, dest, after_step: int):
    """The straight run as a crash after step `after_step`'s checkpoint would have left it: the later
    checkpoints gone, the records up to that step and the next step's record (written before a crash
    in its checkpoint), best.pt and the predictions of the finished run (newer ones are written again)."""
    shutil.copytree(straight, dest)
    for p in (dest / "checkpoints").iterdir():
        if int(p.stem.split("-")[1]) > after_step:
            p.unlink()
    lines = (dest / "metrics.jsonl").read_text().splitlines(keepends=True)
    (dest / "metrics.jsonl").write_text("".join(x for x in lines if json.loads(x)["step"] <= after_step + 1))
    return dest


def test_a_torn_last_line_in_metrics_is_dropped_with_a_warning(files, straight, tmp_path, caplog):  # noqa: F811
    ckpt, data = files
    out = crashed_copy(straight, tmp_path / "run", after_step=8)
    record = [x for x in (straight / "metrics.jsonl").read_text().splitlines() if json.loads(x)["step"] == 10][0]
    with open(out / "metrics.jsonl", "a") as f:
        f.write(record[: len(record) // 2])  # step 10's record, cut by a power loss: no closing brace, no newline
    with pytest.raises(json.JSONDecodeError):  # what --resume auto used to die of
        [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    with caplog.at_level(logging.WARNING):
        assert cli_main(_args(ckpt, data, out, "--keep-last", "100", "--resume", "auto")) == 0
    said = [r.getMessage() for r in caplog.records]
    torn = f"{out / 'metrics.jsonl'}: dropped line(s) 11, not a whole JSON record"  # 10 whole records before it
    assert any(m.startswith(torn) for m in said), said
    assert_same_run(out, straight)


def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous_one(files, straight, tmp_path,  # noqa: F811
                                                                        caplog):
    ckpt, data = files
    out = crashed_copy(straight, tmp_path / "run", after_step=8)
    newest = out / "checkpoints" / "step-0000008.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # cut short: a power loss before the data reached the disk
    with caplog.at_level(logging.WARNING):
        assert cli_main(_args(ckpt, data, out, "--keep-last", "100", "--resume", "auto")) == 0
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"--resume auto: skipping the checkpoint {newest}: cannot read the checkpoint: not a "
                            f"torch.save archive, or one cut short (1000 bytes)") for m in said), said
    assert any("resuming from step-0000007.pt, an older checkpoint than step-0000008.pt" in m for m in said), said
    assert_same_run(out, straight)


def test_no_readable_checkpoint_at_all_is_one_line(files, straight, tmp_path, capsys):  # noqa: F811
    ckpt, data = files
    out = crashed_copy(straight, tmp_path / "run", after_step=2)
    for p in (out / "checkpoints").iterdir():
        p.write_bytes(b"")
    assert cli_main(_args(ckpt, data, out, "--keep-last", "100", "--resume", "auto")) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"run_multitask.py: error: --resume auto: none of the 2 checkpoint(s) in {out / 'checkpoints'} can "
                   f"be read (see the warnings above); pass --overwrite to start afresh")


# Runs the CLI in a child that is SIGKILLed half-way through writing checkpoint K: the temp file stays.
KILLED_MID_WRITE = """
import os, signal, sys
import training.run.checkpointing as C
K = int(sys.argv[1])
real_save = C.torch.save
def save(obj, f):
    if obj.get("run_state", {}).get("global_step") == K:
        real_save(obj, f)
        f.flush()
        f.truncate(f.tell() // 2)  # half of it on disk, as a kill mid-write leaves it
        os.kill(os.getpid(), signal.SIGKILL)
    real_save(obj, f)
C.torch.save = save
from training.train import main
sys.exit(main(sys.argv[2:]))
"""


def test_temp_files_of_killed_writes_are_removed_at_the_start(files, straight, tmp_path, caplog):  # noqa: F811
    ckpt, data = files
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, "9", *_args(ckpt, data, out, "--keep-last", "100")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr
    killed = list((out / "checkpoints").glob("step-0000009.pt.*.tmp"))
    assert len(killed) == 1 and killed[0].stat().st_size > 0
    dead_pid = killed[0].name.split(".")[2]
    # leftovers of the same dead writer elsewhere, and files that must stay: not ours, a live writer's, or
    # one written after this run started (a writer on another machine sharing the directory)
    (out / "pred").mkdir()
    cache_entry = tmp_path / "cache" / "0123abcd"  # a frozen-prefix cache entry whose build was killed
    cache_entry.mkdir(parents=True)
    stale = [killed[0], out / "pred" / f"sst-dev-output.csv.{dead_pid}.tmp", out / f"metrics.jsonl.{dead_pid}.tmp",
             out / "best.pt.x1y2z3w4.tmp", cache_entry / f"sst.0.offsets.{dead_pid}.tmp.npy"]
    keep = [out / "notes.tmp", out / "checkpoints" / f"step-0000010.pt.{os.getpid()}.abcdefgh.tmp",
            cache_entry / "sst.0.npy", out / "metrics.jsonl.4.tmp"]  # (not in pred/: the run replaces it whole)
    # a prediction set's folder killed before it took its place, and the replaced one killed before removal
    stale += [out / f".pred.{dead_pid}.q1w2e3r4.tmp", out / f".pred.old-{dead_pid}"]
    keep += [out / f".pred.{os.getpid()}.abcdefgh.tmp", out / f".pred.{dead_pid}.zzzzzzzz.tmp"]  # live; not only ours
    for folder in stale[-2:] + keep[-2:]:
        folder.mkdir()
        for name in ("sst-dev-output.csv", "manifest.json"):
            (folder / name).write_text("partial")
    (keep[-1] / "notes.txt").write_text("someone's")
    for p in stale[1:-2] + keep[:-2]:
        p.write_text("partial")
    future = time.time() + 3600
    os.utime(keep[3], (future, future))
    with caplog.at_level(logging.INFO):
        assert cli_main(_args(ckpt, data, out, "--keep-last", "100", "--resume", "auto", "--cache-dir",
                              str(tmp_path / "cache"))) == 0
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in keep)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "removed 7 temp file(s) or folder(s) of writes cut short by an earlier crash" in said, said
    assert_same_run(out, straight)
