"""The training loop end to end on a tiny random BERT and a few examples per task: it overfits, writes
its artefacts, is deterministic, exports an encoder Hugging Face can load, and its checkpoint can be
evaluated again by `python -m training.evaluate`.

The model is tiny (2 layers, hidden 32) and initialised wider than BERT (std 0.5 instead of 0.02) with
dropout off, so that random sentences get distinct enough features for 8 examples a task to be learnt
in ~40 full-batch epochs (a few seconds). With BERT's own init, SST-5 memorisation takes several times
longer. Checked on training seeds 1-8, cross and siamese: all 16 runs reached 8/8 SST, 8/8 Quora and
Pearson > 0.99; the same run with lr 1e-9 (nothing learnt) stays near chance (SST 2/8, Quora 4-6/8) and
fails check_learnt.
"""
import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import VOCAB, sent
from tiny_runs import make_encoder as make_checkpoint  # the 2-layer, hidden-32 encoder of every tiny run

from data.loaders import COURSE_FILES, load_task_file
from heads import MultitaskBert, predict
from minbert import Bert, BertConfig, Tokenizer, load_bert
from training import evaluate as evaluate_mod
from training.config.train_config import TrainConfig
from training.inference.formats import HEADERS, read_predictions
from training.run.checkpointing import model_from_checkpoint, read_checkpoint
from training.run.trainer import train
from training.train import main as cli_main

N = 8  # examples per task
EPOCHS = 40
SEED = 3


pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- fixtures: model and data

def write_data(d):
    """Course-format files; dev = train (the test is memorisation). Sentences vary in length so that
    length-sorted evaluation batches come in a different order from the file. The test files hold
    other, unlabelled sentences, with ids out of numeric order."""
    d.mkdir(parents=True, exist_ok=True)
    sst = "\tid\tsentence\tsentiment\n" + "".join(
        f"{i}\ts{i}\t{sent(i, 2 + i % 3)}\t{i % 5}\n" for i in range(N))
    para = "\tid\tsentence1\tsentence2\tis_duplicate\n" + "".join(
        f"{i}\tp{i}\t{sent(i + 1, 2 + i % 2)}\t{sent(i + 9)}\t{float(i % 2)}\n" for i in range(N))
    sts = "\tid\tsentence1\tsentence2\tsimilarity\n" + "".join(
        f"{i}\tt{i}\t{sent(i + 2, 4 - i % 3)}\t{sent(i + 5, 2)}\t{5 * i / (N - 1):.2f}\n" for i in range(N))
    test_ids = ["z9", "a3", "m1", "b7", "q0"]
    sst_test = "\tid\tsentence\n" + "".join(f"{j}\t{t}\t{sent(3 * j + 1, 4 - j % 3)}\n" for j, t in enumerate(test_ids))
    pair_test = "\tid\tsentence1\tsentence2\n" + "".join(
        f"{j}\t{t}\t{sent(j + 4, 2 + j % 3)}\t{sent(j + 11)}\n" for j, t in enumerate(test_ids))
    text = {"sst": (sst, sst_test), "para": (para, pair_test), "sts": (sts, pair_test)}
    for task, (labelled, unlabelled) in text.items():
        for split in ("train", "dev"):
            (d / COURSE_FILES[task][split]).write_text(labelled)
        (d / COURSE_FILES[task]["test"]).write_text(unlabelled)
    return d


def config(root, data, ckpt, **kw) -> TrainConfig:
    base = dict(model=str(ckpt), data_dir=str(data), epochs=EPOCHS, batch_size=N, eval_batch_size=3, lr=1e-2,
                warmup_ratio=0.0, head_dropout=0.0, seed=SEED, device="cpu", precision="fp32", log_every=4,
                out_dir=str(root / "run"), predictions_dir=str(root / "pred"))
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    return write_data(root / "data"), make_checkpoint(root / "ckpt")


@pytest.fixture(scope="module")
def cross_run(tmp_path_factory, inputs):
    root = tmp_path_factory.mktemp("cross")
    cfg = config(root, *inputs)
    return cfg, train(cfg)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, inputs):
    """The same run as cross_run, through the command line, also exporting the encoder."""
    root = tmp_path_factory.mktemp("cli")
    data, ckpt = inputs
    rc = cli_main(["--model", str(ckpt), "--data-dir", str(data), "--epochs", str(EPOCHS), "--batch-size", str(N),
                   "--eval-batch-size", "3", "--lr", "1e-2", "--warmup-ratio", "0", "--head-dropout", "0",
                   "--seed", str(SEED), "--device", "cpu", "--precision", "fp32", "--log-every", "4",
                   "--out-dir", str(root / "run"),
                   "--predictions-dir", str(root / "pred"), "--export-hf", str(root / "hf")])
    assert rc == 0
    return root


def metrics_records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


# ----------------------------------------------------------------------------- (1) it learns

def check_learnt(cfg, best):
    assert best["sst_acc"] >= 7 / 8, best
    assert best["para_acc"] >= 7 / 8, best
    assert best["sts_pearson"] >= 0.9, best
    epochs = [r for r in metrics_records(Path(cfg.out_dir))
              if "train_seconds" in r]
    first, last = epochs[0], epochs[-1]
    for task in ("sst", "para", "sts"):  # the training loss itself fell a long way
        assert last[f"train_loss_{task}"] < 0.3 * first[f"train_loss_{task}"], (task, first, last)


def test_overfits_cross(cross_run):
    check_learnt(*cross_run)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_overfits_siamese(tmp_path, inputs, capsys, pooling):
    cfg = config(tmp_path, *inputs, pair_encoding="siamese", pooling=pooling)
    best = train(cfg)
    check_learnt(cfg, best)
    model, saved, _ = model_from_checkpoint(tmp_path / "run" / "best.pt")
    assert saved.pair_encoding == "siamese" and hasattr(model.heads["para"], "w1")
    assert model.pooling == pooling
    # the checkpoint alone rebuilds the same model: evaluation scores what training reported
    sts_dev = Path(cfg.data_dir) / COURSE_FILES["sts"]["dev"]
    assert evaluate_mod.main([str(tmp_path / "run" / "best.pt"), "--device", "cpu",
                              "--score", "sts", str(sts_dev)]) == 0
    assert f"sts_pearson {best['sts_pearson']:.4f}" in capsys.readouterr().out


def test_bf16_autocast_learns_on_cpu(tmp_path, inputs, caplog):
    """--precision bf16 on the CPU (the default there where AMX makes it fast): the same memorisation."""
    cfg = config(tmp_path, *inputs, precision="bf16")
    with caplog.at_level(logging.INFO, logger="training.run.trainer"):
        check_learnt(cfg, train(cfg))
    assert "device cpu, bf16 autocast" in caplog.text


@pytest.mark.parametrize("amx, avx512_bf16, expected", [(True, False, torch.bfloat16), (False, True, torch.bfloat16),
                                                        (False, False, None)])
def test_auto_precision_on_cpu_follows_native_bf16(monkeypatch, amx, avx512_bf16, expected):
    from training.common.device import autocast_dtype

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) is expected
    assert autocast_dtype("fp32", cpu) is None
    assert autocast_dtype("bf16", cpu) is torch.bfloat16


def test_encoder_is_trained_not_just_the_heads(cross_run, inputs):
    cfg, _ = cross_run
    trained = model_from_checkpoint(f"{cfg.out_dir}/best.pt")[0].encoder.state_dict()
    start = load_bert(inputs[1]).state_dict()
    moved = [k for k in start if not torch.equal(start[k], trained[k])]
    assert sorted(moved) == sorted(start), sorted(set(start) - set(moved))


# ----------------------------------------------------------------------------- (2) what a run writes

def test_run_directory(cross_run):
    cfg, best = cross_run
    run = Path(cfg.out_dir)
    assert (run / "best.pt").is_file() and (run / "train.log").is_file()
    assert (run / "tokenizer" / "vocab.txt").read_text() == "\n".join(VOCAB) + "\n"
    assert TrainConfig.from_dict(json.loads((run / "config.json").read_text())) == cfg

    records = metrics_records(run)
    epochs = [r for r in records if "train_seconds" in r]
    assert [r["epoch"] for r in epochs] == list(range(EPOCHS))
    for r in epochs:
        assert {"step", "dev_sst_acc", "dev_para_acc", "dev_sts_pearson", "dev_overall",
                "train_loss_sst", "train_loss_para", "train_loss_sts"} <= set(r)
        assert r["precision"] == "fp32"  # what the run computed in, --precision auto or not
        assert all(math.isfinite(v) for k, v in r.items() if k != "precision")
    assert [r["step"] for r in epochs] == [3 * (e + 1) for e in range(EPOCHS)]  # one batch a task an epoch
    steps = [r for r in records if "train_seconds" not in r]
    assert [r["step"] for r in steps] == list(range(4, 3 * EPOCHS + 1, 4))  # --log-every 4

    ckpt = read_checkpoint(run / "best.pt")
    best_epoch = max(epochs, key=lambda r: r["dev_overall"])  # first of the best: later ties do not replace it
    assert ckpt["epoch"] == best_epoch["epoch"]
    assert ckpt["metrics"] == best
    assert best["overall"] == best_epoch["dev_overall"]


def expected_predictions(model: MultitaskBert, tokenizer: Tokenizer, task, path, pair_encoding, labelled):
    """One example at a time, straight through the model: no batching, no sorting."""
    examples = load_task_file(path, task, labelled=labelled).examples
    model.eval()
    out = []
    with torch.no_grad():
        for e in examples:
            if task == "sst":
                inputs = [tokenizer([e.text_a])]
            elif pair_encoding == "cross":
                inputs = [tokenizer([e.text_a], [e.text_b])]
            else:
                inputs = [tokenizer([e.text_a]), tokenizer([e.text_b])]
            out.append(predict(task, model(task, inputs)).item())
    return [e.id for e in examples], out


def test_prediction_files_round_trip(cross_run):
    cfg, best = cross_run
    model, _, _ = model_from_checkpoint(f"{cfg.out_dir}/best.pt")
    tokenizer = Tokenizer.from_checkpoint(f"{cfg.out_dir}/tokenizer")
    pred_dir = Path(cfg.predictions_dir)
    assert sorted(p.name for p in pred_dir.iterdir()) == sorted(
        ["manifest.json"] + [f"{t}-{s}-output.csv" for t in ("sst", "para", "sts") for s in ("dev", "test")])
    for task in ("sst", "para", "sts"):
        for split in ("dev", "test"):
            path = pred_dir / f"{task}-{split}-output.csv"
            assert path.read_text().splitlines()[0] == f"id \t {HEADERS[task]} "
            got_task, rows = read_predictions(path)
            assert got_task == task
            ids, want = expected_predictions(model, tokenizer, task, cfg.file(task, split), cfg.pair_encoding,
                                             labelled=split == "dev")
            assert [i for i, _ in rows] == ids  # file order, not length order
            values = [v for _, v in rows]
            if task == "sts":
                np.testing.assert_allclose(values, want, atol=1e-4)  # written with 4 decimals
                assert all(0 <= v <= 5 for v in values)
            else:
                assert values == want
            if split == "dev":  # dev = train, memorised
                labels = [e.label for e in load_task_file(cfg.file(task, "dev"), task).examples]
                if task != "sts":
                    assert np.mean(np.array(values) == np.array(labels)) == best[f"{task}_acc"]
    # the test files' ids are not in sorted order, and the lengths differ, so order is really checked
    assert [i for i, _ in read_predictions(pred_dir / "sst-test-output.csv")[1]] == ["z9", "a3", "m1", "b7", "q0"]


# ----------------------------------------------------------------------------- (3) determinism

def test_same_seed_same_run(cross_run, cli_run):
    cfg, _ = cross_run
    a, b = Path(cfg.out_dir), cli_run / "run"

    def strip(records):
        return [{k: v for k, v in r.items() if k not in ("train_seconds", "frozen_cache_seconds")} for r in records]

    ra, rb = metrics_records(a), metrics_records(b)
    assert len([r for r in ra if "train_seconds" in r]) == EPOCHS
    assert strip(ra) == strip(rb)
    ca, cb = read_checkpoint(a / "best.pt"), read_checkpoint(b / "best.pt")
    assert ca["model"].keys() == cb["model"].keys()
    for k in ca["model"]:
        assert torch.equal(ca["model"][k], cb["model"][k]), k
    # the command line built the same TrainConfig, but for where things go
    where = ("out_dir", "predictions_dir", "export_hf")
    da, db = ({k: v for k, v in c["config"].items() if k not in where} for c in (ca, cb))
    assert da == db
    for name in ("sst-dev-output.csv", "para-test-output.csv", "sts-test-output.csv"):
        assert (a.parent / "pred" / name).read_text() == (cli_run / "pred" / name).read_text()


# ----------------------------------------------------------------------------- (4) --export-hf

def test_export_hf_loads_in_minbert_and_transformers(cli_run, inputs, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    hf_dir = cli_run / "hf"
    assert {"config.json", "model.safetensors", "vocab.txt"} <= {p.name for p in hf_dir.iterdir()}

    ckpt = read_checkpoint(cli_run / "run" / "best.pt")
    trained = Bert(BertConfig(**ckpt["bert_config"]), attn_impl="matmul").eval()
    trained.load_state_dict({k[len("encoder."):]: v for k, v in ckpt["model"].items() if k.startswith("encoder.")})
    ours = load_bert(hf_dir, attn_impl="matmul").eval()
    hf = transformers.BertModel.from_pretrained(str(hf_dir), attn_implementation="eager").eval()

    tok = Tokenizer.from_checkpoint(hf_dir)
    batch = tok(["apple river stone", "tiger", "ocean desert lamp piano"], ["cloud", "honey silver", "violin"])
    with torch.no_grad():
        want = trained(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        ref = hf(**batch)
    for out in (got, ref):
        torch.testing.assert_close(out.last_hidden_state, want.last_hidden_state, rtol=0, atol=1e-5)
        torch.testing.assert_close(out.pooler_output, want.pooler_output, rtol=0, atol=1e-5)
    # and it is the trained encoder, not the one training started from
    start = load_bert(inputs[1], attn_impl="matmul").eval()
    with torch.no_grad():
        assert (start(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).pooler_output
                - want.pooler_output).abs().max() > 1e-2


# ----------------------------------------------------------------------------- (5) python -m training.evaluate

def test_evaluate_rewrites_the_same_predictions_and_scores(cross_run, tmp_path, capsys, inputs):
    cfg, best = cross_run
    data, _ = inputs
    pred_dir = Path(cfg.predictions_dir)
    # the checkpoint travels with its run directory alone (tokenizer/ inside it)
    run = tmp_path / "copied-run"
    shutil.copytree(cfg.out_dir, run)
    rc = evaluate_mod.main([str(run / "best.pt"), "--data-dir", str(data), "--device", "cpu",
                            "--predictions-dir", str(tmp_path / "again"), "--eval-batch-size", "3"])
    assert rc == 0
    out = capsys.readouterr().out
    assert f"dev metrics of {run / 'best.pt'}: sst_acc" in out
    predictions = sorted(pred_dir.glob("*-output.csv"))
    assert len(predictions) == 6
    for f in predictions:
        assert (tmp_path / "again" / f.name).read_text() == f.read_text(), f.name
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (pred_dir, tmp_path / "again")]
    assert manifests[1]["run"] == str(run.resolve()) and manifests[1]["checkpoint"] == str((run / "best.pt").resolve())
    for key in ("config_digest", "dev_metrics", "files", "sha256", "step", "epoch"):
        assert manifests[1][key] == manifests[0][key], key

    sst_dev = data / COURSE_FILES["sst"]["dev"]
    sts_dev = data / COURSE_FILES["sts"]["dev"]
    rc = evaluate_mod.main([str(run / "best.pt"), "--device", "cpu", "--score", "sst", str(sst_dev),
                            "--score", "sts", str(sts_dev)])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [f"{sst_dev}: sst_acc {best['sst_acc']:.4f} ({N} examples)",
                     f"{sts_dev}: sts_pearson {best['sts_pearson']:.4f} ({N} examples)"]


def write_pairs(path, pairs):
    path.write_text("\tid\tsentence1\tsentence2\n"
                    + "".join(f"{j}\tx{j}\t{a}\t{b}\n" for j, (a, b) in enumerate(pairs)))
    return path


def predicted(path) -> list[float]:
    return [v for _, v in read_predictions(path)[1]]


def test_evaluate_both_orders_averages_the_two_orders(cross_run, tmp_path, capsys):
    cfg, _ = cross_run
    best = Path(cfg.out_dir) / "best.pt"
    model, _, _ = model_from_checkpoint(best)
    tokenizer = Tokenizer.from_checkpoint(Path(cfg.out_dir) / "tokenizer")
    model.eval()
    pairs = [(sent(j + 4, 2 + j % 3), sent(j + 11, 1 + j % 4)) for j in range(7)]  # lengths vary: padding differs
    src, rev = write_pairs(tmp_path / "ab.csv", pairs), write_pairs(tmp_path / "ba.csv", [(b, a) for a, b in pairs])
    for task in ("para", "sts"):
        one, both = tmp_path / f"{task}-one.csv", tmp_path / f"{task}-both.csv"
        both_rev = tmp_path / f"{task}-both-rev.csv"
        base = [str(best), "--device", "cpu", "--eval-batch-size", "3"]
        assert evaluate_mod.main(base + ["--predict", task, str(src), str(one)]) == 0
        assert evaluate_mod.main(base + ["--predict-both-orders", "--predict", task, str(src), str(both),
                                         "--predict", task, str(rev), str(both_rev)]) == 0
        # one pair at a time, no padding: the mean of the head's outputs for (a, b) and (b, a)
        with torch.no_grad():
            want = [predict(task, (model(task, [tokenizer([a], [b])]) + model(task, [tokenizer([b], [a])])) / 2).item()
                    for a, b in pairs]
        tol = 1e-4 if task == "sts" else 0  # similarity written with 4 decimals
        np.testing.assert_allclose(predicted(both), want, atol=tol)
        np.testing.assert_allclose(predicted(both_rev), want, atol=tol)  # the order in the file no longer matters
        if task == "sts":  # the model is not symmetric: one order alone gives other scores
            assert np.abs(np.array(predicted(one)) - want).max() > 1e-3
    capsys.readouterr()


def test_evaluate_both_orders_defaults_to_the_runs(cross_run, tmp_path, capsys):
    cfg, _ = cross_run
    run = tmp_path / "run"
    shutil.copytree(cfg.out_dir, run)
    ckpt = read_checkpoint(run / "best.pt")
    ckpt["config"]["predict_both_orders"] = True
    torch.save(ckpt, run / "best.pt")
    sts_dev = Path(cfg.data_dir) / COURSE_FILES["sts"]["dev"]
    outs = {}
    for name, extra in (("default", []), ("on", ["--predict-both-orders"]), ("off", ["--no-predict-both-orders"])):
        outs[name] = tmp_path / f"{name}.csv"
        assert evaluate_mod.main([str(run / "best.pt"), "--device", "cpu",
                                  "--predict", "sts", str(sts_dev), str(outs[name]), *extra]) == 0
    assert outs["default"].read_text() == outs["on"].read_text() != outs["off"].read_text()
    capsys.readouterr()


def test_evaluate_both_orders_needs_a_cross_encoder(cross_run, tmp_path, capsys):
    from training.run.checkpointing import save_checkpoint

    cfg, _ = cross_run
    siamese = TrainConfig.from_dict({**cfg.to_dict(), "pair_encoding": "siamese"})
    save_checkpoint(tmp_path / "best.pt", MultitaskBert(load_bert(cfg.model), "siamese"), siamese)
    with pytest.raises(SystemExit):
        evaluate_mod.main([str(tmp_path / "best.pt"), "--device", "cpu", "--predict-both-orders",
                           "--tokenizer", str(Path(cfg.out_dir) / "tokenizer"),
                           "--score", "sts", str(Path(cfg.data_dir) / COURSE_FILES["sts"]["dev"])])
    assert "--predict-both-orders is for cross-encoded pairs; this model is siamese" in capsys.readouterr().err


def test_evaluate_errors_are_one_line_naming_the_file(cross_run, tmp_path, capsys):
    cfg, _ = cross_run
    sts_dev = str(Path(cfg.data_dir) / COURSE_FILES["sts"]["dev"])

    def error(checkpoint, *extra):
        with pytest.raises(SystemExit) as e:
            evaluate_mod.main([str(checkpoint), "--device", "cpu", *extra])
        assert e.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    assert f"argument RUN: {tmp_path / 'nope.pt'} does not exist" in error(tmp_path / "nope.pt", "--score", "sts",
                                                                           sts_dev)
    missing = tmp_path / "missing.csv"
    assert str(missing) in error(Path(cfg.out_dir) / "best.pt", "--score", "sts", str(missing))
    shutil.copy(Path(cfg.out_dir) / "best.pt", tmp_path / "alone.pt")
    assert "pass --tokenizer DIR" in error(tmp_path / "alone.pt", "--score", "sts", sts_dev)
    # a training checkpoint under checkpoints/ finds the run's tokenizer one folder up
    step = sorted((Path(cfg.out_dir) / "checkpoints").iterdir())[-1]
    assert evaluate_mod.main([str(step), "--device", "cpu", "--score", "sts", sts_dev]) == 0
    assert "sts_pearson" in capsys.readouterr().out


@pytest.mark.parametrize("flag, expected", [(None, "fp32"), ("bf16", "bf16"), ("fp32", "fp32")])
def test_evaluate_precision_defaults_to_the_runs(cross_run, tmp_path, monkeypatch, flag, expected):
    import training.common.device as device_mod
    cfg, _ = cross_run
    assert cfg.precision == "fp32"
    seen = []
    real = device_mod.autocast_dtype
    monkeypatch.setattr(device_mod, "autocast_dtype", lambda p, d: seen.append(p) or real(p, d))
    sts_dev = Path(cfg.data_dir) / COURSE_FILES["sts"]["dev"]
    extra = ["--precision", flag] if flag else []
    assert evaluate_mod.main([str(Path(cfg.out_dir) / "best.pt"), "--device", "cpu",
                              "--score", "sts", str(sts_dev), *extra]) == 0
    assert seen == [expected]
