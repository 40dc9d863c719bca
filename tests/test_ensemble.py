"""python -m training.ensemble against a hand computation: three tiny trained runs (cross, siamese,
cross predicting both orders), each example run alone through each model, the probabilities formed
here with scipy (softmax, sigmoid), averaged, turned into labels, and scored with numpy; the
command's files and metrics must match. Bad input: one line, exit 2."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import special
from tiny_runs import make_encoder

from data.batching import encode_task, make_batch
from data.loaders import COURSE_FILES, load_task_file
from minbert import Tokenizer
from training import ensemble as ensemble_mod
from training import evaluate as evaluate_mod
from training.config.train_config import TrainConfig
from training.inference.formats import read_predictions
from training.run.checkpointing import model_from_checkpoint, save_checkpoint
from training.run.trainer import train

WORDS = "apple river stone cloud lamp tiger honey piano garden silver rocket paper window forest candle".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
N = 10

pytestmark = pytest.mark.usefixtures("one_thread")


def sent(i: int, k: int) -> str:
    return " ".join(WORDS[(i * 5 + j * 3) % len(WORDS)] for j in range(k))


def write_data(d: Path) -> Path:
    d.mkdir(parents=True)
    sst = "\tid\tsentence\tsentiment\n" + "".join(f"{i}\ts{i}\t{sent(i, 2 + i % 3)}\t{i % 5}\n" for i in range(N))
    para = "\tid\tsentence1\tsentence2\tis_duplicate\n" + "".join(
        f"{i}\tp{i}\t{sent(i + 1, 2 + i % 2)}\t{sent(i + 7, 3)}\t{float(i % 2)}\n" for i in range(N))
    sts = "\tid\tsentence1\tsentence2\tsimilarity\n" + "".join(
        f"{i}\tt{i}\t{sent(i + 2, 4 - i % 3)}\t{sent(i + 4, 2)}\t{5 * i / (N - 1):.2f}\n" for i in range(N))
    ids = ["z9", "a3", "m1", "b7"]
    sst_test = "\tid\tsentence\n" + "".join(f"{j}\t{t}\t{sent(3 * j + 1, 3)}\n" for j, t in enumerate(ids))
    pair_test = "\tid\tsentence1\tsentence2\n" + "".join(
        f"{j}\t{t}\t{sent(j + 3, 2)}\t{sent(j + 9, 3)}\n" for j, t in enumerate(ids))
    for task, (labelled, unlabelled) in {"sst": (sst, sst_test), "para": (para, pair_test),
                                         "sts": (sts, pair_test)}.items():
        for split in ("train", "dev"):
            (d / COURSE_FILES[task][split]).write_text(labelled)
        (d / COURSE_FILES[task]["test"]).write_text(unlabelled)
    return d


def make_checkpoint(d: Path) -> Path:
    return make_encoder(d, VOCAB, hidden=16, layers=1)


MEMBERS = {  # name -> settings; different seeds, encodings and prediction orders
    "cross": dict(seed=1),
    "siamese": dict(seed=2, pair_encoding="siamese"),
    "both": dict(seed=3, predict_both_orders=True),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble")
    data, ckpt = write_data(root / "data"), make_checkpoint(root / "ckpt")
    dirs = {}
    for name, kw in MEMBERS.items():
        cfg = TrainConfig(model=str(ckpt), data_dir=str(data), epochs=3, batch_size=N, eval_batch_size=4, lr=3e-3,
                          warmup_ratio=0.0, head_dropout=0.0, device="cpu", precision="fp32",
                          out_dir=str(root / name), predictions_dir=str(root / name / "predictions"), **kw)
        train(cfg)
        dirs[name] = root / name
    return data, dirs


# ----------------------------------------------------------------------------- the hand computation


def examples_of(data: Path, split: str, task: str):
    return load_task_file(data / COURSE_FILES[task][split], task, labelled=split == "dev").examples


def one_by_one(run: Path, task: str, examples) -> np.ndarray:
    """Each example alone (no padding, no batching) through the run's model: raw head outputs,
    both orders' outputs averaged where the run predicts both orders."""
    model, cfg, _ = model_from_checkpoint(run / "best.pt")
    model.eval()
    tok = Tokenizer.from_checkpoint(run / "tokenizer")
    orders = [False, True] if (cfg.predict_both_orders and cfg.pair_encoding == "cross" and task != "sst") else [False]
    outs = []
    with torch.no_grad():
        for e in examples:
            per_order = []
            for swap in orders:
                ex = type(e)(e.id, e.text_b, e.text_a, e.label) if swap else e
                batch = make_batch(encode_task(task, [ex], tok, cfg.pair_encoding, cfg.max_length), [0], tok)
                per_order.append(model(task, batch.inputs)[0].double().numpy())
            outs.append(np.mean(per_order, axis=0))
    return np.array(outs)


def hand_probabilities(task: str, out: np.ndarray) -> np.ndarray:
    if task == "sst":
        return special.softmax(out, axis=-1)
    if task == "para":
        return special.expit(out)
    return out


def hand_labels(task: str, p: np.ndarray) -> np.ndarray:
    if task == "sst":
        top2 = np.sort(p, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0] > 1e-5).all()  # no near-tie that float error could flip
        return p.argmax(-1)
    if task == "para":
        assert (np.abs(p - 0.5) > 1e-5).all()
        return (p > 0.5).astype(float)
    return np.clip(p, 0.0, 5.0)


def hand_metrics(labels: dict, data: Path) -> dict:
    m = {}
    for task, name in (("sst", "sst_acc"), ("para", "para_acc")):
        gold = np.array([e.label for e in examples_of(data, "dev", task)], dtype=float)
        m[name] = float(np.mean(labels[task] == gold))
    gold = np.array([e.label for e in examples_of(data, "dev", "sts")], dtype=float)
    m["sts_pearson"] = float(np.corrcoef(labels["sts"], gold)[0, 1])
    m["overall"] = (m["sst_acc"] + m["para_acc"] + (m["sts_pearson"] + 1) / 2) / 3
    return m


def test_ensemble_matches_hand_computation(runs, tmp_path, capsys):
    data, dirs = runs
    members = [dirs["cross"], dirs["siamese"] / "best.pt", dirs["both"]]  # a run directory or a checkpoint
    out, js = tmp_path / "pred", tmp_path / "metrics.json"
    assert ensemble_mod.main([*map(str, members), "--data-dir", str(data), "--predictions-dir", str(out),
                              "--json", str(js), "--device", "cpu", "--eval-batch-size", "3"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(js.read_text())

    labels, member_labels = {}, {name: {} for name in dirs}
    for split in ("dev", "test"):
        for task in ("sst", "para", "sts"):
            exs = examples_of(data, split, task)
            probs = {name: hand_probabilities(task, one_by_one(d, task, exs)) for name, d in dirs.items()}
            mean = (probs["cross"] + probs["siamese"] + probs["both"]) / 3
            want = hand_labels(task, mean)
            got_task, rows = read_predictions(out / f"{task}-{split}-output.csv")
            assert got_task == task and [r[0] for r in rows] == [e.id for e in exs]
            got = np.array([r[1] for r in rows])
            if task == "sts":
                np.testing.assert_allclose(got, want, atol=5e-5 + 1e-6)  # the file keeps 4 decimals
            else:
                np.testing.assert_array_equal(got, want)
            if split == "dev":
                labels[task] = want
                for name in dirs:
                    member_labels[name][task] = hand_labels(task, probs[name])

    want_metrics = hand_metrics(labels, data)
    for k, v in want_metrics.items():
        assert result["ensemble"][k] == pytest.approx(v, abs=1e-5), k
    assert f"dev metrics of the ensemble of 3: sst_acc {want_metrics['sst_acc']:.4f}" in printed
    for member, name in zip(result["members"], dirs):
        assert member["checkpoint"] == str(dirs[name] / "best.pt")
        for k, v in hand_metrics(member_labels[name], data).items():
            assert member["dev"][k] == pytest.approx(v, abs=1e-5), (name, k)
    # averaging matters here: the ensemble's labels are not any one member's
    for name in dirs:
        assert any((labels[t] != member_labels[name][t]).any() for t in ("sst", "para", "sts")), name


def test_one_member_is_what_evaluate_writes(runs, tmp_path, capsys):
    data, dirs = runs
    for name in ("cross", "both"):
        ens, ev = tmp_path / f"ens-{name}", tmp_path / f"eval-{name}"
        assert ensemble_mod.main([str(dirs[name]), "--data-dir", str(data), "--predictions-dir", str(ens),
                                  "--device", "cpu"]) == 0
        assert evaluate_mod.main([str(dirs[name] / "best.pt"), "--data-dir", str(data),
                                  "--predictions-dir", str(ev), "--device", "cpu"]) == 0
        predictions = sorted(ev.glob("*-output.csv"))  # evaluate's set has a manifest.json beside them
        assert len(predictions) == 6
        for f in predictions:
            assert (ens / f.name).read_text() == f.read_text(), (name, f.name)
    capsys.readouterr()


def test_probabilities_are_averaged_not_logits():
    """Three SST members, one very sure of class 0, two fairly sure of class 1: the mean logit picks
    0, the mean probability 1. Quora: logits 8, -2, -2 average to 4/3 > 0 but their probabilities
    to (0.9997 + 2 * 0.1192) / 3 = 0.4127 < 0.5; logits -8, 2, 2 the other way round."""
    sst = [torch.tensor([[20.0, 0, 0, 0, 0]]), torch.tensor([[-1.0, 3, 0, 0, 0]]), torch.tensor([[-1.0, 3, 0, 0, 0]])]
    mean = sum(ensemble_mod.probabilities("sst", o) for o in sst) / 3
    want = (special.softmax([20.0, 0, 0, 0, 0]) + 2 * special.softmax([-1.0, 3, 0, 0, 0])) / 3
    np.testing.assert_allclose(mean[0].numpy(), want, rtol=1e-12)
    assert ensemble_mod.predictions("sst", mean).tolist() == [1.0]
    assert (sum(sst) / 3).argmax().item() == 0
    para = torch.tensor([[8.0, -8.0], [-2.0, 2.0], [-2.0, 2.0]])
    mean = sum(ensemble_mod.probabilities("para", row) for row in para) / 3
    np.testing.assert_allclose(mean.numpy(), special.expit(para.double().numpy()).mean(0), rtol=1e-12)
    assert ensemble_mod.predictions("para", mean).tolist() == [0.0, 1.0]
    assert ((para.sum(0) / 3) > 0).tolist() == [True, False]
    sts = ensemble_mod.probabilities("sts", torch.tensor([5.4, -0.2, 2.5]))
    assert ensemble_mod.predictions("sts", sts).tolist() == pytest.approx([5.0, 0.0, 2.5])


# ----------------------------------------------------------------------------- bad input


def _error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        ensemble_mod.main([*map(str, argv), "--device", "cpu"])
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_input_is_one_line_exit_2(runs, tmp_path, capsys):
    data, dirs = runs
    good = dirs["cross"]
    assert f"argument RUN: {tmp_path / 'nope'} does not exist" in _error(
        capsys, good, tmp_path / "nope", "--data-dir", data)
    with pytest.raises(ensemble_mod.EnsembleError, match="no such checkpoint or run directory"):
        ensemble_mod.member_checkpoint(str(tmp_path / "nope"))  # the library's own check, the CLI's being argparse's
    (tmp_path / "empty").mkdir()
    assert f"{tmp_path / 'empty'}: a directory without best.pt" in _error(capsys, good, tmp_path / "empty",
                                                                          "--data-dir", data)
    assert "--data-dir" in _error(capsys, good, "--data-dir", tmp_path / "nowhere")
    no_dev = tmp_path / "no-dev"
    shutil.copytree(data, no_dev)
    (no_dev / COURSE_FILES["para"]["dev"]).unlink()
    assert str(no_dev / COURSE_FILES["para"]["dev"]) in _error(capsys, good, "--data-dir", no_dev)
    # a member trained on other tasks
    model, cfg, _ = model_from_checkpoint(good / "best.pt")
    sst_only = tmp_path / "sst-only"
    save_checkpoint(sst_only / "best.pt", model, TrainConfig.from_dict({**cfg.to_dict(), "tasks": ["sst"]}))
    shutil.copytree(good / "tokenizer", sst_only / "tokenizer")
    assert "trained on sst, the first member on sst+para+sts" in _error(capsys, good, sst_only, "--data-dir", data)
    # a file that is not a checkpoint
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    assert str(junk) in _error(capsys, junk, "--data-dir", data)


def test_the_ensembles_set_has_a_manifest_and_zips(runs, tmp_path, capsys):
    """The ensemble writes its set with a manifest naming its members, which training.submit accepts;
    the same members replace it again, other predictions are refused before any work unless --overwrite."""
    from training import submit as submit_mod
    data, dirs = runs
    out, js = tmp_path / "ens", tmp_path / "m.json"
    args = [str(dirs["cross"]), str(dirs["both"]), "--data-dir", str(data), "--predictions-dir", str(out),
            "--device", "cpu", "--json", str(js)]
    assert ensemble_mod.main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ensemble"] == [str(dirs["cross"] / "best.pt"), str(dirs["both"] / "best.pt")]
    assert manifest["dev_metrics"] == json.loads(js.read_text())["ensemble"]
    assert sorted(manifest["files"]) == sorted(p.name for p in out.glob("*-output.csv")) and len(manifest["files"]) == 6
    assert submit_mod.main([str(out), "--no-code", "--zip", str(tmp_path / "ens.zip")]) == 0
    assert "6 prediction files of the ensemble of 2 checkpoints" in capsys.readouterr().out
    assert "--json " + str(js) + ": exists; pass --overwrite" in _error(capsys, *args)  # a file named: asked
    same = args[:-2]  # without --json
    assert ensemble_mod.main(same) == 0  # the same members: replaced
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    other = [str(dirs["cross"]), str(dirs["siamese"]), *same[2:]]
    assert "--predictions-dir " + str(out) + " holds the predictions of the ensemble of 2 checkpoints" in _error(
        capsys, *other)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched
    assert ensemble_mod.main([*other, "--overwrite"]) == 0
    assert json.loads((out / "manifest.json").read_text())["ensemble"][1] == str(dirs["siamese"] / "best.pt")
    capsys.readouterr()
