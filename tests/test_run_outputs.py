"""What a run leaves for its user: prediction files in its own folder that never mix with another run's,
train.log's closing lines, checkpoint modes that follow the umask; and the trainer staples: gradient
accumulation, early stopping, quick-run flags, one-line answers to unknown flags."""
import json
import os
from pathlib import Path

import pytest
import torch
from test_training import config, make_checkpoint, write_data

from data.batching import EvalBatching, encode_task, make_batch
from data.loaders import Example
from minbert import Tokenizer
from training.methods.stepper import Stepper
from training.run.build import build_model
from training.run.trainer import train
from training.train import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    return write_data(root / "data"), make_checkpoint(root / "ckpt")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _quick(root, inputs, **kw):
    data, ckpt = inputs
    cfg = config(root, data, ckpt, **{"epochs": 1, **kw})
    return cfg.__class__(**{**cfg.to_dict(), "predictions_dir": kw.get("predictions_dir")})  # the default place


# ----------------------------------------------------------------------------- predictions

def test_two_runs_in_their_default_places_share_no_prediction_file(tmp_path, inputs):
    a = _quick(tmp_path / "a", inputs)
    b = _quick(tmp_path / "b", inputs, tasks=("sst",))
    train(a)
    train(b)
    pa, pb = Path(a.out_dir) / "predictions", Path(b.out_dir) / "predictions"
    assert set(_files(pa)) == {"manifest.json"} | {f"{t}-{s}-output.csv" for t in ("sst", "para", "sts")
                                                      for s in ("dev", "test")}
    assert set(_files(pb)) == {"manifest.json", "sst-dev-output.csv", "sst-test-output.csv"}
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (pa, pb))
    assert ma["run"] == str(Path(a.out_dir).resolve()) and mb["run"] == str(Path(b.out_dir).resolve())
    assert ma["config_digest"] != mb["config_digest"]
    assert ma["checkpoint"] == str((Path(a.out_dir) / "best.pt").resolve()) and ma["dev_metrics"]["overall"] > 0


def test_another_runs_prediction_folder_is_refused_then_replaced_whole(tmp_path, inputs, capsys):
    a = _quick(tmp_path / "a", inputs)
    train(a)
    shared = Path(a.out_dir) / "predictions"
    before = _files(shared)
    data, ckpt = inputs
    args = ["--model", str(ckpt), "--data-dir", str(data), "--device", "cpu", "--epochs", "1", "--tasks", "sst",
            "--out-dir", str(tmp_path / "b"), "--predictions-dir", str(shared)]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(shared) in err[0] and "holds the run in" in err[0], err
    assert _files(shared) == before and not (tmp_path / "b" / "best.pt").exists()  # refused before any work
    assert cli_main(args + ["--overwrite"]) == 0
    assert set(_files(shared)) == {"manifest.json", "sst-dev-output.csv", "sst-test-output.csv"}  # not mixed


def test_the_dev_files_are_the_kept_evaluations_predictions(tmp_path, inputs, caplog):
    """The prediction phase predicts the test sets only: the dev files come from the evaluation that kept
    best.pt (the run says so), and equal a fresh prediction from best.pt byte for byte."""
    from training.evaluate import main as evaluate_main

    cfg = _quick(tmp_path, inputs, epochs=2, ema_decay=0.5, predict_both_orders=True)
    caplog.set_level("INFO")
    train(cfg)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dev prediction files:")]
    assert said == ["dev prediction files: the predictions of the evaluation that kept best.pt"]
    mine = _files(Path(cfg.out_dir) / "predictions")
    data, _ = inputs
    assert evaluate_main([str(Path(cfg.out_dir) / "best.pt"), "--device", "cpu", "--data-dir",
                          str(data), "--predictions-dir", str(tmp_path / "again")]) == 0
    again = _files(tmp_path / "again")
    assert {k: v for k, v in mine.items() if k != "manifest.json"} == \
        {k: v for k, v in again.items() if k != "manifest.json"}
    first, second = (json.loads(files["manifest.json"]) for files in (mine, again))  # the same set, said twice
    assert second["config_digest"] == first["config_digest"] and second["sha256"] == first["sha256"]


def test_quick_run_flags(tmp_path, inputs):
    cfg = _quick(tmp_path, inputs, max_eval_examples=3, test_predictions=False)
    train(cfg)
    pred = Path(cfg.out_dir) / "predictions"
    assert set(_files(pred)) == {"manifest.json", "sst-dev-output.csv", "para-dev-output.csv", "sts-dev-output.csv"}
    assert all(len((pred / f).read_text().splitlines()) == 1 + 3 for f in _files(pred) if f.endswith(".csv"))


# ----------------------------------------------------------------------------- train.log and file modes

def test_train_log_ends_with_the_summary_or_the_error(tmp_path, inputs, monkeypatch):
    cfg = _quick(tmp_path / "ok", inputs)
    metrics = train(cfg)
    last = (Path(cfg.out_dir) / "train.log").read_text().splitlines()[-1]
    assert "finished in" in last and f"overall {metrics['overall']:.3f}" in last and "predictions" in last

    import training.methods.stepper as S
    real, calls = S.task_loss, []

    def nan_after_the_first_step(task, out, labels):  # the first step trains: the run has claimed OUT_DIR
        calls.append(task)
        return real(task, out, labels) * (float("nan") if len(calls) > 1 else 1.0)

    monkeypatch.setattr(S, "task_loss", nan_after_the_first_step)
    bad = _quick(tmp_path / "bad", inputs, max_bad_steps=2)
    with pytest.raises(Exception, match="consecutive non-finite steps"):
        train(bad)
    last = (Path(bad.out_dir) / "train.log").read_text().splitlines()[-1]
    assert "the run stopped: NonFiniteLossError: 2 consecutive non-finite steps" in last


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_checkpoints_follow_the_umask(tmp_path, inputs, umask, mode):
    old = os.umask(umask)
    try:
        cfg = _quick(tmp_path, inputs, save_every=1)
        train(cfg)
    finally:
        os.umask(old)
    out = Path(cfg.out_dir)
    written = [out / "best.pt", *sorted((out / "checkpoints").glob("*.pt")), *(out / "predictions").iterdir()]
    assert all(p.stat().st_mode & 0o777 == mode for p in written), [(p.name, oct(p.stat().st_mode)) for p in written]


# ----------------------------------------------------------------------------- staples

def test_grad_accumulation_of_k_batches_equals_one_batch_of_k_times_b(tmp_path, inputs):
    """k accumulated steps of batch b and one step of batch k*b: the same gradient the optimiser steps
    on (clipped), and the same loss (tiny fp32 model, no dropout), to 1e-6. (Not the updated weights:
    AdamW's first step is lr * g / (|g| + eps), which turns a 1e-9 difference in a near-zero gradient
    into one of order lr.)"""
    data, ckpt = inputs
    cfg = config(tmp_path, data, ckpt, max_grad_norm=0.5, weight_decay=0.01, lr=1e-2)
    tok = Tokenizer.from_checkpoint(ckpt)
    words = "apple river stone cloud lamp tiger honey piano garden silver rocket paper".split()
    exs = [Example(f"s{i}", " ".join(words[(i * 5 + j) % 12] for j in range(2 + i % 4)), None, i % 5)
           for i in range(12)]
    sst = encode_task("sst", exs, tok)
    k, b = 3, 4
    grads, losses = [], []
    for groups in ([[make_batch(sst, list(range(i * b, (i + 1) * b)), tok)] for i in range(k)],
                   [[make_batch(sst, list(range(k * b)), tok)]]):
        model, _, _ = build_model(cfg)
        stepper = Stepper.build(model, cfg, 10)
        seen = []
        step = stepper.optimizer.step
        stepper.optimizer.step = lambda: seen.append([p.grad.clone() for p in model.parameters()
                                                      if p.grad is not None]) or step()
        parts = stepper.accumulated_step(groups, 0)
        grads.append(seen[0])
        losses.append(parts["sst"]["loss"])
    assert len(grads[0]) == len(grads[1]) > 0
    for g, h in zip(*grads):
        torch.testing.assert_close(g, h, atol=1e-6, rtol=0)
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)


def test_early_stopping_stops_after_patience_evaluations_without_a_best(tmp_path, inputs):
    """lr 1e-12: nothing changes after the first evaluation, which no later one beats."""
    cfg = _quick(tmp_path, inputs, epochs=6, lr=1e-12, early_stop_patience=2)
    train(cfg)
    records = [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "dev_overall" in r]
    assert [r["epoch"] for r in evaluations] == [0, 1, 2]  # the best, then 2 without a new one
    assert "early stop: 2 dev evaluations without a new best" in (Path(cfg.out_dir) / "train.log").read_text()


def test_grad_accumulation_is_refused_with_pcgrad(tmp_path, inputs, capsys):
    data, ckpt = inputs
    assert cli_main(["--model", str(ckpt), "--data-dir", str(data), "--pcgrad", "--grad-accum-steps", "2",
                     "--out-dir", str(tmp_path)]) == 2
    assert "--grad-accum-steps is not supported with --pcgrad" in capsys.readouterr().err


@pytest.mark.parametrize("argv, hint", [
    (["--use_gpu"], "did you mean --device cuda for the starter code's --use_gpu?"),
    (["--option", "finetune"], "--freeze-upto N"),
    (["--batch_size", "8"], "--batch-size for the starter code's --batch_size"),
    (["--max_length", "64"], "did you mean --max-length?"),
    (["--freeze-up-to", "3"], "did you mean --freeze-upto?"),
])
def test_an_unknown_flag_is_one_line_with_the_nearest_real_one(argv, hint, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and hint in err[0], err


def test_evaluation_and_prediction_show_progress(tmp_path, inputs, caplog):
    """A dev or test set's prediction logs its progress off a terminal (tqdm on one); a handful of
    sentences (an API call) does not."""
    from training.inference.outputs import SHOW_PROGRESS_FROM, raw_outputs

    data, ckpt = inputs
    cfg = config(tmp_path, data, ckpt)
    model, tok, _ = build_model(cfg)
    n = SHOW_PROGRESS_FROM + 5
    sst = encode_task("sst", [Example(f"s{i}", "apple river " * (1 + i % 3), None, i % 5) for i in range(n)], tok)
    with caplog.at_level("INFO", logger="progress"):
        raw_outputs(model, sst, tok, EvalBatching(1), torch.device("cpu"))
    assert f"predicting sst ({n} examples): {n}/{n} (100%)" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="progress"):
        raw_outputs(model, sst, tok, EvalBatching(2 * n), torch.device("cpu"))
    assert "predicting" not in caplog.text


def test_eval_tokens_sets_the_evaluation_batches_and_not_the_metrics(tmp_path, monkeypatch):
    """--eval-tokens caps each evaluation batch's padded size (0: --eval-batch-size alone); the dev
    metrics and prediction files do not depend on it."""
    from tiny_runs import tiny_run

    from data import batching
    sizes: dict[str, list[int]] = {}
    real = batching.make_batch

    def spy(*args):  # every evaluation batch is made here (EvalBatching.batch)
        batch = real(*args)
        sizes.setdefault(run, []).append(batch.inputs[0]["input_ids"].numel())
        return batch

    monkeypatch.setattr(batching, "make_batch", spy)
    runs = {}
    for run, tokens in (("budget", 16), ("none", 0)):
        runs[run] = tiny_run(tmp_path, run, epochs=1, eval_batch_size=12, eval_tokens=tokens)[1]
    assert max(sizes["budget"]) <= 16 < max(sizes["none"])  # one example per batch against whole sets
    assert runs["budget"] == pytest.approx(runs["none"], abs=1e-6)
    for csv in (tmp_path / "none" / "predictions").glob("*-output.csv"):
        assert csv.read_bytes() == (tmp_path / "budget" / "predictions" / csv.name).read_bytes()


def test_pad_multiple_pads_the_evaluation_batches_too(tmp_path, monkeypatch):
    """--pad-multiple reaches the run's evaluations and predictions: every batch they make is padded to a
    multiple of N tokens or to --max-length (under CUDA graphs each new shape would record a graph)."""
    from tiny_runs import tiny_run

    from data import batching
    widths: list[tuple[int, int]] = []
    real = batching.make_batch

    def spy(*args):  # every evaluation batch is made here (EvalBatching.batch)
        batch = real(*args)
        widths.append((batch.inputs[0]["input_ids"].shape[1], max(len(ids) for ids, _ in
                                                                  (args[0].sequences[0][i] for i in args[1]))))
        return batch

    monkeypatch.setattr(batching, "make_batch", spy)
    tiny_run(tmp_path, "padded", epochs=1, pad_multiple=8, max_length=20)
    assert widths and all(w == min(-(-longest // 8) * 8, 20) for w, longest in widths)
    assert any(w != longest for w, longest in widths)  # really padded past the longest


def _board_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value, as TensorBoard itself reads the folder (orphaned events purged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(folder), purge_orphaned_data=True)
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_report_to_tensorboard_mirrors_metrics_jsonl(tmp_path):
    from tiny_runs import tiny_run
    cfg, _ = tiny_run(tmp_path, epochs=2, report_to="tensorboard", ema_decay=0.5)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    board = _board_scalars(tmp_path / "run" / "tensorboard")
    expected: dict[str, dict[int, float]] = {}
    for r in records:
        for key, value in r.items():
            if key in ("step", "epoch") or not isinstance(value, (int, float)):
                continue
            tag = ("dev_raw/" + key[8:] if key.startswith("dev_raw_") else "dev/" + key[4:] if key.startswith("dev_")
                   else "train/" + key)
            expected.setdefault(tag, {})[r["step"]] = value
    assert {"train/loss_sst", "train/lr", "dev/overall", "dev_raw/overall"} <= set(expected)
    assert board.keys() == expected.keys()
    for tag, by_step in expected.items():
        assert board[tag] == pytest.approx(by_step, rel=1e-6), tag  # float32 in the event file


def test_a_resumed_tensorboard_log_shows_each_step_once_with_its_new_value(tmp_path):
    from training.run.rundir import MetricsLog
    log = MetricsLog(tmp_path / "metrics.jsonl", tensorboard=True)
    for step in (1, 2, 3, 4):
        log.write({"step": step, "epoch": 0, "loss_sst": float(step)})
    log.close()
    log = MetricsLog(tmp_path / "metrics.jsonl", resume_step=2, tensorboard=True)  # steps 3, 4 again
    for step in (3, 4):
        log.write({"step": step, "epoch": 0, "loss_sst": 10.0 * step})
    log.close()
    assert _board_scalars(tmp_path / "tensorboard")["train/loss_sst"] == {1: 1.0, 2: 2.0, 3: 30.0, 4: 40.0}


def test_report_to_tensorboard_without_the_package_is_one_line(tmp_path, monkeypatch, capsys):
    import importlib.util

    from tiny_runs import tiny_config
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    cfg = tiny_config(tmp_path)
    assert cli_main(["--model", cfg.model, "--data-dir", cfg.data_dir, "--out-dir", str(tmp_path / "run"),
                     "--report-to", "tensorboard"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--report-to tensorboard needs the tensorboard package" in err[0]
    assert not (tmp_path / "run").exists()
