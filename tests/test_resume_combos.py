"""Exact resume over combinations of features (docs/guarantees.md, docs/training.md): a run stopped and
resumed with --resume auto ends as the uninterrupted run did, with the stop inside an accumulation group
(a partial one too), between mid-epoch evaluations, at a freezing schedule's phase change, right after an
adaptive freeze, just before an early stop.

test_resume.py's helper checks each combination (the uninterrupted run, one stopped by a real SIGTERM
after step K, then --resume auto: evaluation records, best.pt, the six prediction files). Its stopped run
runs here in this process (_child_in_this_process), with a real SIGTERM all the same: a child process
spends ~5 s of this 2-core machine importing torch, and every combination below also passes with the
helper's child process (checked by hand: ~50 s in all). The signal comes from inside step K, while the
step's first batch loads: test_resume.CHILD hooks Stepper.step, which an update of --grad-accum-steps
steps never calls. The encoder has dropout (0.1), so that its draws, not only the heads' and LoRA's, come
from the restored random streams. Besides the helper's checks, every metrics.jsonl record (not only the
evaluations) must be the uninterrupted run's, timing fields apart.

Two faults this check found (2026-11-30) are fixed; their tests say what was wrong.
"""
import contextlib
import io
import json
import os
import signal
import subprocess
import types

import pytest
import test_resume
import torch
from test_resume import _args, resume_equals_uninterrupted
from test_training import make_checkpoint, write_data

from training.methods.stepper import Stepper
from training.run.checkpointing import read_checkpoint
from training.run.trainer import Run
from training.train import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread")

TIMING = ("train_seconds", "frozen_cache_seconds")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("combos")
    ckpt = make_checkpoint(root / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    config["hidden_dropout_prob"] = config["attention_probs_dropout_prob"] = 0.1
    (ckpt / "config.json").write_text(json.dumps(config))
    return ckpt, write_data(root / "data")


def _records(out) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _evals(rows) -> list[int]:
    return [r["step"] for r in rows if "dev_overall" in r]


def _depths(rows) -> list[tuple]:
    return [(r["step"], r["frozen_depth"]) for r in rows if "frozen_depth" in r]


# Every run: 8 examples a task of the tiny 2-layer model, --batch-size 4 unless given (6 steps an epoch under
# mtdnn), 2 epochs, --save-every 1. Each entry: the stop step K, the flags, and what the uninterrupted run
# must show for the stop at K to tell.
COMBOS = {
    # 6 updates of 2 batches an epoch, evaluated at updates 2, 4, 6; no new best at update 8 stops the run
    # there: stopped inside update 7's group, after the epoch end's evaluation, before the stopping one
    "accumulation-evals-ema-lora-keep-last-1-patience": (
        7, ("--batch-size", "2", "--grad-accum-steps", "2", "--evals-per-epoch", "3", "--ema-decay", "0.5",
            "--peft", "lora:r=2,dropout=0.1", "--keep-last", "1", "--early-stop-patience", "1"),
        lambda rows: _evals(rows) == [2, 4, 6, 8] and rows[-1]["step"] == 8),
    # PCGrad's mixed steps, both encoders of a siamese pair, LoRA's dropout: between evaluations at 3 and 6
    "pcgrad-siamese-mean-lora": (
        4, ("--pcgrad", "--pair-encoding", "siamese", "--pooling", "mean", "--peft", "lora:r=2,dropout=0.1",
            "--evals-per-epoch", "2"),
        lambda rows: _evals(rows) == [3, 6, 9, 12] and any("pcgrad_conflict" in r for r in rows)),
    # SMART above a cached frozen layer (its teacher and noise stream), 3 updates of 2 steps an epoch, each
    # evaluated; capped proportional sampling of swapped pairs: stopped inside update 2's group, the cache
    # built again by the resumed run
    "smart-accumulation-cache-proportional-pair-swap": (
        2, ("--smart", "--smart-perturb-at", "first-trainable", "--grad-accum-steps", "2", "--freeze-upto", "1",
            "--frozen-cache", "memory", "--evals-per-epoch", "3", "--task-sampling", "proportional",
            "--pair-swap", "--max-batches-per-task", "2"),
        lambda rows: _evals(rows) == [1, 2, 3, 4, 5, 6] and any("r_s_sst" in r for r in rows)),
    # gradual unfreezing of a cached prefix, a weight EMA, mixed batches of swapped pairs (10 steps an
    # epoch): stopped at step 5, evaluated, whose next step unfreezes a layer
    "gradual-cache-evals-ema-mixed-pair-swap": (
        5, ("--unfreeze-schedule", "gradual:5steps", "--frozen-cache", "memory", "--evals-per-epoch", "2",
            "--ema-decay", "0.5", "--task-sampling", "mixed", "--pair-swap"),
        lambda rows: _evals(rows) == [5, 10, 15, 20] and _depths(rows) == [(5, 1), (10, None)]),
    # adaptive freezing (its test every 2 updates) with SMART's teacher above the cache, updates of 2
    # steps: the test at update 6 freezes both layers; stopped there, at the epoch's last update, before
    # the epoch end's evaluation (the resumed run deepens the cache from its chain, then evaluates)
    "adaptive-smart-accumulation-cache": (
        6, ("--unfreeze-schedule", "adaptive:2steps,threshold=0.3", "--frozen-cache", "memory", "--smart",
            "--smart-perturb-at", "first-trainable", "--grad-accum-steps", "2", "--batch-size", "2",
            "--evals-per-epoch", "2"),
        lambda rows: _depths(rows) == [(6, 2)] and _evals(rows) == [3, 6, 9, 12]),
    # annealed sampling capped at 3 batches a task, swapped pairs, updates of 2 steps: 9 batches an
    # epoch, so its 5th update holds one; stopped there, in that partial group
    "annealed-capped-pair-swap-accumulation-lora": (
        5, ("--task-sampling", "annealed", "--max-batches-per-task", "3", "--pair-swap", "--grad-accum-steps",
            "2", "--batch-size", "2", "--peft", "lora:r=2,dropout=0.1", "--evals-per-epoch", "2"),
        lambda rows: _evals(rows) == [2, 5, 7, 10]),
    # bf16 autocast, LP-FT over a cached prefix, updates of 2 steps, the rate scaled with the batch:
    # stopped at update 4, evaluated, after which the encoder unfreezes
    "bf16-lp-ft-cache-accumulation-scaled-lr": (
        4, ("--precision", "bf16", "--unfreeze-schedule", "lp-ft:4steps", "--frozen-cache", "memory",
            "--grad-accum-steps", "2", "--batch-size", "2", "--evals-per-epoch", "3", "--scale-lr-with-batch", "2"),
        lambda rows: _depths(rows) == [(4, None)] and _evals(rows) == [2, 4, 6, 8, 10, 12]
        and all(r["precision"] == "bf16" for r in rows if "padding_efficiency" in r)),
}


def _signalled_take(k):
    """Stepper.take sending this process SIGTERM during step k, as the step's first batch loads."""
    take = Stepper.take

    def take_signalled(self, update, load, step):
        if step + 1 != k:
            return take(self, update, load, step)
        sent = []

        def load_signalled(tb):
            if not sent:
                sent.append(os.kill(os.getpid(), signal.SIGTERM))
            return load(tb)
        return take(self, update, load_signalled, step)
    return take_signalled


def _child_in_this_process(monkeypatch):
    """The helper's child run in this process: the same CLI, and a real SIGTERM (os.kill of this process,
    caught by the handler fit() installs in the main thread) from inside step K; its exit status and stderr
    stand for the child's."""
    def run(cmd, env=None, capture_output=True, text=True, timeout=None, check=False):
        k, argv = int(cmd[3]), cmd[4:]  # [python, "-c", CHILD, K, *argv]
        err = io.StringIO()
        with monkeypatch.context() as m, contextlib.redirect_stderr(err):
            m.setattr(Stepper, "take", _signalled_take(k))
            code = cli_main(argv)
        return subprocess.CompletedProcess(cmd, code, "", err.getvalue())
    monkeypatch.setattr(test_resume, "subprocess", types.SimpleNamespace(run=run))


@pytest.mark.parametrize("name", list(COMBOS))
def test_sigterm_inside_a_step_then_resume_equals_an_uninterrupted_run(files, tmp_path, monkeypatch, name):
    k, extra, telling = COMBOS[name]
    _child_in_this_process(monkeypatch)
    out, _ = resume_equals_uninterrupted(*files, tmp_path, k, ("--epochs", "2", *extra))
    straight = _records(tmp_path / "straight")
    assert telling(straight), [(r["step"], sorted(r)[:4]) for r in straight]
    assert _records(out) == straight


# ----------------------------------------------------------------------------- stopped in this process


class _Killed(BaseException):
    """A hard kill (SIGKILL, power loss): nothing after it runs, no handler sees it."""


def _stopped(ckpt, data, out, monkeypatch, k, extra, how):
    """Run the CLI on out, stopped at step k. how "sigterm": what the SIGTERM handler does, asked after
    step k (exit status 143, a checkpoint of step k). how "kill": _Killed as step k's update begins, after
    what the step records before it (the newest checkpoint: step k - 1)."""
    with monkeypatch.context() as m:
        if how == "sigterm":
            real = Run.stop_requested

            def stop_at_k(self):
                if self.state.global_step == k:
                    self.stop.requested, self.stop.signal_name = True, "SIGTERM"
                return real(self)

            m.setattr(Run, "stop_requested", stop_at_k)
            assert cli_main(_args(ckpt, data, out, *extra)) == 143
        else:
            take = Stepper.take

            def killed_at_k(self, update, load, step):
                if step + 1 == k:
                    raise _Killed
                return take(self, update, load, step)

            m.setattr(Stepper, "take", killed_at_k)
            with pytest.raises(_Killed):
                cli_main(_args(ckpt, data, out, *extra))


def _same_outputs(out, straight):
    """best.pt's tensors and the six prediction files are the uninterrupted run's."""
    a, b = read_checkpoint(out / "best.pt")["model"], read_checkpoint(straight / "best.pt")["model"]
    assert a.keys() == b.keys()
    differ = [n for n in b if not torch.equal(a[n], b[n])]
    assert not differ, f"best.pt differs in {len(differ)} tensors, first {differ[0]}"
    files = sorted((straight / "pred").glob("*-output.csv"))
    assert len(files) == 6
    assert [f.name for f in files if (out / "pred" / f.name).read_text() != f.read_text()] == []


GRADUAL = ("--epochs", "2", "--unfreeze-schedule", "gradual:3steps", "--frozen-cache", "memory")


def test_a_kill_after_a_phase_change_writes_its_frozen_depth_record_once(files, tmp_path, monkeypatch):
    """Fixed 2026-11-30, what was wrong: --unfreeze-schedule gradual:3steps --frozen-cache memory --save-every 1
    (2 epochs of 6 steps, the tiny model, 8 examples a task) killed during step 4 (SIGKILL, or anything that
    runs no handler: the newest checkpoint is step 3's), then --resume auto: the resumed metrics.jsonl held
    the depth change {"step": 3, "epoch": 0, "frozen_depth": 1} twice, the uninterrupted run's once (it
    now carries "written_in_step": 4, which the resume's truncation reads); the weights, the
    evaluations, best.pt and the prediction files are the uninterrupted run's. Why: Run.train_step calls
    follow_schedule as step 4 begins, which records the depth change numbered "step": 3 (global_step before
    its increment), after step 3's checkpoint; the resume keeps the records up to its checkpoint's step
    (truncate_metrics: step <= 3), that one included, and its step 4 writes it again. docs/guarantees.md:
    the records written after the checkpoint are "dropped and written again, once". Also with a real
    SIGKILL (os.kill(os.getpid(), signal.SIGKILL) in Stepper.take of step 4, in a child process), and at an
    epoch boundary (gradual:1epoch killed in step 7: {"step": 6, "epoch": 1, "frozen_depth": 1} twice)."""
    ckpt, data = files
    straight, out = tmp_path / "straight", tmp_path / "killed"
    assert cli_main(_args(ckpt, data, straight, *GRADUAL)) == 0
    _stopped(ckpt, data, out, monkeypatch, 4, GRADUAL, "kill")
    assert read_checkpoint(sorted((out / "checkpoints").glob("step-*.pt"))[-1])["run_state"]["global_step"] == 3
    assert cli_main(_args(ckpt, data, out, *GRADUAL, "--resume", "auto")) == 0
    _same_outputs(out, straight)
    assert _evals(_records(out)) == _evals(_records(straight))
    changes = [r for r in _records(out) if "frozen_depth" in r]
    assert changes == [r for r in _records(straight) if "frozen_depth" in r], changes
    assert _records(out) == _records(straight)


def test_resume_with_the_cache_on_disk_after_memory_is_exact(files, tmp_path, monkeypatch):
    """--frozen-cache may change on a resume (resume_may_differ): memory and disk hold the same bits."""
    ckpt, data = files
    straight, out = tmp_path / "straight", tmp_path / "stopped"
    assert cli_main(_args(ckpt, data, straight, *GRADUAL)) == 0
    _stopped(ckpt, data, out, monkeypatch, 2, GRADUAL, "sigterm")
    assert cli_main(_args(ckpt, data, out, *GRADUAL, "--frozen-cache", "disk", "--cache-dir", str(tmp_path / "c"),
                          "--resume", "auto")) == 0
    assert _records(out) == _records(straight)
    _same_outputs(out, straight)


def test_resume_refuses_frozen_cache_auto_after_memory(files, tmp_path, monkeypatch):
    """Fixed 2026-11-30 (refused now, exit 2), what was wrong: --unfreeze-schedule gradual:3steps
    --frozen-cache memory (2 epochs of 6 steps, the tiny model, 8 examples a task) stopped by SIGTERM after
    step 2, resumed with --frozen-cache auto (the default: the same command with the flag left out does the
    same) and --resume auto. The resume was accepted (exit 0) and ended elsewhere: the first record to
    differ was step 4's, loss_sst 1.5862389 against 1.5862937
    uninterrupted; every tensor of best.pt (encoder.embeddings.word.weight first), both evaluations'
    dev_overall (0.42555000 against 0.42555023 at epoch 0) and the sts dev and test prediction files differ.
    Why: the resume check (rundir.find_resume_checkpoint) refuses a change of --frozen-cache only between
    off and on, but under auto a phase too short to repay its cache (here 3 steps of 4 examples, against
    24 cached) runs uncached, in fp32, where memory runs it on the fp16 cache (the same goes for auto
    resumed as memory or disk). docs/guarantees.md: resuming "refuses a checkpoint whose config differs in
    anything that changes the trajectory": only memory and disk may now stand for each other."""
    ckpt, data = files
    straight, out = tmp_path / "straight", tmp_path / "stopped"
    assert cli_main(_args(ckpt, data, straight, *GRADUAL)) == 0
    _stopped(ckpt, data, out, monkeypatch, 2, GRADUAL, "sigterm")
    code = cli_main(_args(ckpt, data, out, *GRADUAL, "--frozen-cache", "auto", "--resume", "auto"))
    assert code == 2  # refused: what the docs promise for a change of the trajectory
