"""Never lose a run: exact resume after a real SIGTERM, atomic checkpoint writes, NaN steps skipped."""
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_training import make_checkpoint, write_data

from minbert import BertConfig
from training.run.checkpointing import atomic_save, read_checkpoint
from training.train import main as cli_main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    return make_checkpoint(root / "ckpt"), write_data(root / "data") or root / "data"


def _args(ckpt, data, out, *extra):
    # dropout on, so that resuming must restore the RNG to match; batch 4 -> 2 steps per task per epoch.
    # fp32: what these runs compared bit for bit were written for (auto is bf16 on a CPU with AVX512-BF16)
    return ["--model", str(ckpt), "--data-dir", str(data), "--out-dir", str(out), "--predictions-dir",
            str(out / "pred"), "--epochs", "3", "--batch-size", "4", "--lr", "3e-3", "--head-dropout", "0.3",
            "--save-every", "1", "--log-every", "1", "--eval-batch-size", "4", "--precision", "fp32", *extra]


# Runs the CLI in a child process that sends itself a real SIGTERM right after step K.
CHILD = """
import os, signal, sys
import training.methods.stepper as T
K = int(sys.argv[1])
step = T.Stepper.step
def step_then_signal(self, batches, n):
    out = step(self, batches, n)
    if n + 1 == K:
        os.kill(os.getpid(), signal.SIGTERM)
    return out
T.Stepper.step = step_then_signal
from training.train import main
sys.exit(main(sys.argv[2:]))
"""


def _epoch_records(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("train_seconds", "frozen_cache_seconds")}
            for r in rows if "dev_overall" in r]


# mid-epoch, at an epoch's last step, with a weight EMA that must be restored too, and right after a
# mid-epoch evaluation (which the resumed run must not repeat)
# and LoRA (its dropout draws from the restored stream) and BitFit above a cached frozen prefix, and a
# learning rate scaled with the batch
@pytest.mark.parametrize("k, extra", [(3, ()), (6, ()), (3, ("--ema-decay", "0.5")), (9, ("--evals-per-epoch", "2")),
                                      (4, ("--peft", "lora:r=2,dropout=0.1")),
                                      (3, ("--peft", "bitfit", "--freeze-upto", "1")),
                                      (4, ("--scale-lr-with-batch", "2"))])  # the rate's schedule scaled
def test_sigterm_then_resume_equals_an_uninterrupted_run(files, tmp_path, k, extra):
    def interrupted_at_k(out):
        saved = read_checkpoint(out / "checkpoints" / f"step-{k:07d}.pt")
        assert saved["run_state"]["global_step"] == k
        return saved["run_state"]["epoch_seconds"]

    out, before = resume_equals_uninterrupted(*files, tmp_path, k, extra, interrupted_at_k)
    assert before > 0  # the interrupted epoch's time counts both parts
    epoch = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train_seconds"' in x]
    assert epoch[(k - 1) // 6]["train_seconds"] >= round(before, 1)  # the epoch of step k


def resume_equals_uninterrupted(ckpt, data, tmp_path, k, extra, interrupted=lambda out: None):
    """Train straight; train again with a real SIGTERM after step k (interrupted(out) sees the stopped run),
    then --resume auto: the epoch records, best.pt and the six prediction files must be the straight run's.
    Returns the resumed run's folder and what interrupted() returned."""
    torch.set_num_threads(1)
    assert cli_main(_args(ckpt, data, tmp_path / "straight", *extra)) == 0
    out = tmp_path / "interrupted"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(k), *_args(ckpt, data, out, *extra)], env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 143, r.stderr
    assert f"SIGTERM received: stopped after step {k}" in r.stderr and "--resume auto" in r.stderr
    seen = interrupted(out)
    assert cli_main(_args(ckpt, data, out, *extra, "--resume", "auto")) == 0
    assert _epoch_records(out) == _epoch_records(tmp_path / "straight")
    a, b = read_checkpoint(out / "best.pt")["model"], read_checkpoint(tmp_path / "straight" / "best.pt")["model"]
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    predictions = sorted((tmp_path / "straight" / "pred").glob("*-output.csv"))  # manifest.json: other run, time
    assert len(predictions) == 6
    for f in predictions:
        assert (out / "pred" / f.name).read_text() == f.read_text()
    return out, seen


def test_keeps_the_last_k_checkpoints(files, tmp_path):
    ckpt, data = files
    assert cli_main(_args(ckpt, data, tmp_path, "--keep-last", "2")) == 0
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-0000017.pt", "step-0000018.pt"]


def test_resume_refuses_an_incompatible_config(files, tmp_path, capsys):
    ckpt, data = files
    assert cli_main(_args(ckpt, data, tmp_path, "--epochs", "1")) == 0
    code = cli_main(_args(ckpt, data, tmp_path, "--epochs", "1", "--lr", "1e-3", "--resume", "auto"))
    err = capsys.readouterr().err
    assert code == 2 and "incompatible config: --lr was 0.003, now 0.001" in err
    assert cli_main(_args(ckpt, data, tmp_path, "--resume", str(tmp_path / "best.pt"))) == 2
    assert "not a training checkpoint" in capsys.readouterr().err


def test_interrupted_checkpoint_write_leaves_the_previous_one_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    atomic_save({"w": torch.ones(3)}, path)

    def dies_halfway(obj, f):
        f.write(b"partial bytes")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(read_checkpoint(path)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp file left behind


def test_nan_losses_are_skipped_and_a_run_of_them_stops(files, tmp_path, monkeypatch, capsys):
    import training.methods.stepper as T
    ckpt, data = files
    real = T.task_loss
    calls = {"n": 0}

    def sometimes_nan(task, out, labels):
        calls["n"] += 1
        loss = real(task, out, labels)
        return loss * float("nan") if calls["n"] in (2, 5) else loss

    monkeypatch.setattr(T, "task_loss", sometimes_nan)
    assert cli_main(_args(ckpt, data, tmp_path / "a", "--epochs", "1")) == 0
    records = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "lr" in r]
    assert len(steps) == 6 - 2
    # each record has the rate its step used, and the skipped steps moved the schedule on as well:
    # no warm-up here (int(6 * 0.1) = 0 steps), then linear decay from 3e-3 over 6 steps
    assert all(r["lr"] == pytest.approx(3e-3 * (6 - (r["step"] - 1)) / 6) for r in steps), steps

    monkeypatch.setattr(T, "task_loss", lambda task, out, labels: real(task, out, labels) * float("nan"))
    code = cli_main(_args(ckpt, data, tmp_path / "b", "--max-bad-steps", "3"))
    err = capsys.readouterr().err
    assert code == 1 and "3 consecutive non-finite steps, the last at step 3 on task" in err


def test_out_of_memory_names_the_batch_and_what_to_lower(files, tmp_path, monkeypatch, capsys):
    import training.methods.stepper as T
    ckpt, data = files

    def oom(self, batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(T.Stepper, "task_loss", oom)
    assert cli_main(_args(ckpt, data, tmp_path)) == 1
    assert re.search(r"error: out of memory on a (sst|para|sts) batch of 4 sequences x \d+ tokens.*"
                     r"lower --batch-size \(now 4\) or --max-length", capsys.readouterr().err)


def test_smart_with_pcgrad_and_freezing_trains_end_to_end(files, tmp_path):
    """The regularised loss per task is what PCGrad's per-task gradients come from."""
    ckpt, data = files
    assert cli_main(_args(ckpt, data, tmp_path, "--epochs", "1", "--pcgrad", "--smart", "--freeze-upto", "1",
                          "--smart-perturb-at", "first-trainable")) == 0
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "pcgrad_conflict" in r]
    # SMART's terms per task present in the step (mixed batches hold several): r_s_<task>, d_breg_<task>
    for r in steps:
        tasks = [k[len("loss_"):] for k in r if k.startswith("loss_")]
        assert any(f"r_s_{t}" in r for t in tasks), r
        assert all(r[f"r_s_{t}"] >= 0 and f"d_breg_{t}" in r for t in tasks if f"r_s_{t}" in r), r
    assert any(r.get("dev_overall") is not None for r in records)
    # the training checkpoint stores the teacher's trained tensors; its frozen layers are the student's
    saved = read_checkpoint(sorted((tmp_path / "checkpoints").glob("step-*.pt"))[-1])
    teacher = saved["smart"]["teacher"]
    frozen = [n for n in saved["model"] if n.startswith(("encoder.embeddings.", "encoder.layers.0."))]
    assert frozen and set(frozen) <= set(teacher["same_as_student"])
    assert any(n.startswith("encoder.layers.1.") for n in teacher["module"])
    assert sorted([*teacher["module"], *teacher["same_as_student"]]) == sorted(saved["model"])


@pytest.mark.parametrize("extra", [(), ("--ema-decay", "0.5"), ("--smart",), ("--smart", "--freeze-upto", "1"),
                                   ("--smart", "--peft", "bitfit"), ("--smart", "--unfreeze-schedule", "lp-ft:5steps")])
def test_the_disk_check_predicts_a_training_checkpoints_tensors(files, tmp_path, extra):
    # the estimate from the config's sizes (the heads, which it leaves out, added here) against the
    # floating-point tensors of the written checkpoint: weights, AdamW's moments, the average, the teacher
    from training.config.train_config import TrainConfig
    from training.run.preflight import footprint
    ckpt, data = files
    assert cli_main(_args(ckpt, data, tmp_path, "--epochs", "1", *extra)) == 0
    saved = read_checkpoint(sorted((tmp_path / "checkpoints").glob("step-*.pt"))[-1])
    cfg = TrainConfig.from_dict(saved["config"])
    need = footprint(BertConfig(**saved["bert_config"]), cfg)
    heads = sum(t.numel() for name, t in saved["model"].items() if name.startswith("heads."))
    copies = 3 + (cfg.ema_decay is not None) + cfg.smart  # weights, two moments, average, teacher
    assert _float_bytes(saved) == need.checkpoint + 4 * heads * copies


def _float_bytes(obj) -> int:
    """Bytes of the floating-point tensors of one or more dimensions in a nested checkpoint (not AdamW's
    step counters or the random number generators' states)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size() if obj.is_floating_point() and obj.dim() > 0 else 0
    if isinstance(obj, dict):
        return sum(_float_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_float_bytes(v) for v in obj)
    return 0


def test_a_new_run_refuses_an_out_dir_holding_an_earlier_run(files, tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO)  # what train.log receives
    ckpt, data = files
    out = tmp_path / "run"
    assert cli_main(_args(ckpt, data, out, "--keep-last", "100")) == 0  # step checkpoints 1..18
    before = {p: p.stat().st_mtime_ns for p in [out / "best.pt", out / "metrics.jsonl"]}
    assert cli_main(_args(ckpt, data, out, "--epochs", "1")) == 2
    err = capsys.readouterr().err
    assert f"--out-dir {out} holds an earlier run (best.pt, metrics.jsonl" in err and "--overwrite" in err
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing touched

    # --overwrite: the old run's files go, so its later step checkpoints cannot crowd out the new ones
    assert cli_main(_args(ckpt, data, out, "--epochs", "1", "--overwrite")) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000005.pt", "step-0000006.pt"]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records) == 6
    log_text = (out / "train.log").read_text()  # the replaced run's lines went with its records
    assert log_text.count("training.run.trainer: model ") == 1 and "removed" in log_text, log_text[:2000]


def test_a_bad_flag_with_overwrite_leaves_the_earlier_run_alone(files, tmp_path, capsys):
    ckpt, data = files
    out = tmp_path / "run"
    assert cli_main(_args(ckpt, data, out, "--epochs", "1")) == 0
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != "train.log"}
    assert len([p for p in before if p.parent.name == "checkpoints"]) == 2
    # out of range for the 2-layer model: found only once the model has loaded
    assert cli_main(_args(ckpt, data, out, "--epochs", "1", "--overwrite", "--freeze-upto", "5")) == 2
    assert "--freeze-upto 5" in capsys.readouterr().err
    after = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != "train.log"}
    assert after == before


def test_resume_auto_without_a_checkpoint(files, tmp_path, capsys):
    ckpt, data = files
    out = tmp_path / "run"
    assert cli_main(_args(ckpt, data, out, "--epochs", "1", "--save-every", "0", "--keep-last", "1")) == 0
    for p in (out / "checkpoints").iterdir():
        p.unlink()
    # a finished run's best.pt, nothing to continue from: refused, and not told to pass --resume auto again
    assert cli_main(_args(ckpt, data, out, "--epochs", "1", "--resume", "auto")) == 2
    err = capsys.readouterr().err
    assert "no training checkpoint to continue it from" in err and "--overwrite" in err
    assert "pass --resume auto" not in err
    # only the records of a run killed before its first checkpoint: start afresh, records replaced
    (out / "best.pt").unlink()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "epoch": 0, "loss_sst": 1.0}) + "\n")
    assert cli_main(_args(ckpt, data, out, "--epochs", "1", "--resume", "auto")) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "dev_overall" not in r] == list(range(1, 7))


class _Killed(BaseException):
    """A hard kill: nothing after it runs, no handler sees it."""


@pytest.mark.parametrize("crash", ["mid-epoch", "epoch-end save 6", "epoch-end save 12"])
def test_resume_after_a_crash_writes_each_record_once(files, tmp_path, caplog, monkeypatch, crash):
    # A crash (no signal, no final checkpoint): the newest checkpoint is older than the last
    # records in metrics.jsonl and than best.pt. The resumed run must end with the records and
    # best model of the uninterrupted run, each step recorded once. "epoch-end save N": killed while
    # writing the checkpoint that ends an epoch, after its record and best.pt (6 steps per epoch).
    import shutil

    from training.run.checkpointing import RollingCheckpoints
    ckpt, data = files
    torch.set_num_threads(1)
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    assert cli_main(_args(ckpt, data, straight, "--keep-last", "100")) == 0
    if crash == "mid-epoch":
        shutil.copytree(straight, crashed)
        for p in (crashed / "checkpoints").iterdir():
            if int(p.stem.split("-")[1]) > 8:  # "crashed" in epoch 1, after step 8's checkpoint
                p.unlink()
    else:
        at, save = int(crash.split()[-1]), RollingCheckpoints.save

        def killed_at_the_epoch_end(self, obj, step):
            if step == at and obj["run_state"]["step_in_epoch"] == 0:
                raise _Killed
            save(self, obj, step)

        with monkeypatch.context() as m:
            m.setattr(RollingCheckpoints, "save", killed_at_the_epoch_end)
            with pytest.raises(_Killed):
                cli_main(_args(ckpt, data, crashed, "--keep-last", "100"))
    caplog.clear()
    with caplog.at_level("INFO"):
        assert cli_main(_args(ckpt, data, crashed, "--keep-last", "100", "--resume", "auto")) == 0
    assert any(re.search(r"resumed at epoch [01]", r.getMessage()) for r in caplog.records)
    assert max(len(r.getMessage()) for r in caplog.records) < 500  # no state dict dumped into the log

    def records(out):
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("train_seconds", "frozen_cache_seconds")} for r in rows]

    assert records(crashed) == records(straight)
    a, b = read_checkpoint(crashed / "best.pt")["model"], read_checkpoint(straight / "best.pt")["model"]
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_resume_refuses_another_best_pt_or_changed_training_files(files, tmp_path, capsys):
    import shutil
    ckpt, data = files
    out = tmp_path / "run"
    assert cli_main(_args(ckpt, data, out, "--keep-last", "100")) == 0
    step6 = out / "checkpoints" / "step-0000006.pt"  # end of epoch 0: a best score exists

    # another --out-dir without the run's best.pt: the end of the run would have nothing to predict with
    assert cli_main(_args(ckpt, data, tmp_path / "elsewhere", "--resume", str(step6))) == 2
    assert "is not in" in capsys.readouterr().err
    # ... or with an unrelated best.pt (here: another run's)
    other = tmp_path / "other"
    assert cli_main(_args(ckpt, data, other, "--epochs", "1", "--lr", "1e-3")) == 0
    assert cli_main(_args(ckpt, data, other, "--resume", str(step6))) == 2
    assert "holds another model" in capsys.readouterr().err

    # a training file with another number of examples: the sampler's indices would point elsewhere
    data2 = tmp_path / "data2"
    shutil.copytree(data, data2)
    sst = data2 / "ids-sst-train.csv"
    sst.write_text("".join(sst.read_text().splitlines(keepends=True)[:-1]))
    capsys.readouterr()
    assert cli_main(_args(ckpt, data2, out, "--resume", str(step6))) == 2
    assert "the training sets changed since the checkpoint" in capsys.readouterr().err
    # the same number of rows, one label changed
    rows = (data / "ids-sst-train.csv").read_text().splitlines(keepends=True)
    *fields, label = rows[1].rstrip("\n").split("\t")
    rows[1] = "\t".join([*fields, str((int(label) + 1) % 5)]) + "\n"
    sst.write_text("".join(rows))
    assert cli_main(_args(ckpt, data2, out, "--resume", str(step6))) == 2
    assert "the sst training examples changed since the checkpoint" in capsys.readouterr().err


def test_metric_records_are_strict_json(tmp_path):
    from training.run.rundir import MetricsLog
    metrics = MetricsLog(tmp_path / "m.jsonl")
    metrics.write({"step": 1, "pcgrad_cosine": float("nan"), "x": float("inf"), "loss_sst": 0.5})
    metrics.close()
    line = (tmp_path / "m.jsonl").read_text()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in {line}")) == {
        "step": 1, "pcgrad_cosine": None, "x": None, "loss_sst": 0.5}


def test_evals_per_epoch_evaluates_at_even_steps_and_keeps_the_best(files, tmp_path, capsys):
    from test_training import metrics_records
    ckpt, data = files
    out = tmp_path / "run"
    assert cli_main(_args(ckpt, data, out, "--evals-per-epoch", "3", "--ema-decay", "0.5")) == 0
    evals = [r for r in metrics_records(out) if "dev_overall" in r]
    assert [r["step"] for r in evals] == [2, 4, 6, 8, 10, 12, 14, 16, 18]  # 6 steps per epoch
    assert [r.get("epoch_progress") for r in evals[:3]] == [0.3333, 0.6667, None]  # None: the epoch end's
    assert [r["epoch"] for r in evals] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # the raw weights are scored at the epoch ends only
    assert [r for r in evals if "dev_raw_overall" in r] == [r for r in evals if "epoch_progress" not in r]
    best = max(evals, key=lambda r: r["dev_overall"])
    saved = read_checkpoint(out / "best.pt")
    assert saved["step"] == best["step"] and saved["metrics"]["overall"] == best["dev_overall"]
    # the spread of the nine scores is what makes the check above able to fail
    assert len({r["dev_overall"] for r in evals}) > 1

    assert cli_main(_args(ckpt, data, tmp_path / "other", "--evals-per-epoch", "7")) == 2
    assert "--evals-per-epoch 7 is more than the 6 steps of an epoch" in capsys.readouterr().err
    assert not (tmp_path / "other" / "metrics.jsonl").exists()


def test_a_training_checkpoint_evaluates_with_the_weight_average(files, tmp_path, capsys):
    """best.pt holds the weights the run evaluated: with --ema-decay, the average. A step checkpoint
    holds the raw weights and the average; evaluating it must give the average too (--raw-weights the raw)."""
    import training.evaluate as evaluate_mod
    from training.run.checkpointing import model_from_checkpoint
    ckpt, data = files
    out = tmp_path / "run"
    assert cli_main(_args(ckpt, data, out, "--epochs", "1", "--ema-decay", "0.5")) == 0  # one evaluation: best
    step = out / "checkpoints" / "step-0000006.pt"
    best = read_checkpoint(out / "best.pt")["model"]
    raw = read_checkpoint(step)["model"]
    assert any(not torch.equal(raw[k], best[k]) for k in best)  # the average is not the raw weights
    averaged = model_from_checkpoint(step)[0].state_dict()
    assert all(torch.equal(averaged[k], best[k]) for k in best)
    unaveraged = model_from_checkpoint(step, raw_weights=True)[0].state_dict()
    assert all(torch.equal(unaveraged[k], raw[k]) for k in raw)

    sts_dev = str(data / "sts-dev.csv")
    capsys.readouterr()

    def score(checkpoint, *extra):
        assert evaluate_mod.main([str(checkpoint), "--device", "cpu", "--score", "sts", sts_dev,
                                  *extra]) == 0
        return capsys.readouterr().out.split("sts_pearson ")[-1].split()[0]

    assert score(step) == score(out / "best.pt") != score(step, "--raw-weights")
    with pytest.raises(SystemExit):
        evaluate_mod.main([str(out / "best.pt"), "--score", "sts", sts_dev, "--raw-weights"])
    assert "holds one set of weights, no weight average beside them" in capsys.readouterr().err
