"""The inference and output path against independent references, never the project's own output.

References:
  * the course's code (gpoesia/minbert-default-final-project): evaluation.py's test_model_multitask writes
    `id \\t Predicted_X \\n` then `f"{id} , {pred} \\n"` per row, ids from the csv `id` column (lower().strip()),
    every test row; model_eval_multitask scores accuracy and np.corrcoef; prepare_submit.py zips
    predictions/* and the code's *.py;
  * a plain per-example forward written here: token ids built by hand from the vocabulary, one unpadded
    sequence through the encoder's own forward (no mask, no batching code), pooling and every head computed
    by hand from their weights (heads/tasks.py's docstring: 5 sigmoid(w.y + b) cross, 5 max(0, cos(z1, z2))
    siamese, (W1 y1 + b1).(W2 y2 + b2) siamese paraphrase);
  * softmax / sigmoid / averaging by hand in numpy.
A test whose docstring begins "Was a bug" failed on the code this file was written against; it says why.
"""
from __future__ import annotations

import csv
import math
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import VOCAB, tiny_run

from data.loaders import COURSE_FILES, SENTIMENTS, TASKS, load_task_file
from training import evaluate as evaluate_mod
from training.api import load
from training.run.checkpointing import model_from_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

HEADER = {"sst": "Predicted_Sentiment", "para": "Predicted_Is_Paraphrase", "sts": "Predicted_Similiary"}


# ----------------------------------------------------------------------------- runs and the hand reference

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    cross, _ = tiny_run(root, "cross", predict_both_orders=True)
    siam, _ = tiny_run(root, "siam", pair_encoding="siamese", pooling="mean", seed=4)
    ema, _ = tiny_run(root, "ema", ema_decay=0.5, epochs=4, seed=5)
    return {"cross": cross, "siam": siam, "ema": ema}


def dev(cfg, task, split="dev"):
    return load_task_file(Path(cfg.data_dir) / COURSE_FILES[task][split], task, labelled=split == "dev").examples


def hand_ids(a: str, b: str | None = None) -> tuple[list[int], list[int]]:
    """[CLS] a [SEP] (b [SEP]) over the tiny whitespace vocabulary; type 1 for b and its [SEP]."""
    v = {w: i for i, w in enumerate(VOCAB)}
    ids = [v["[CLS]"], *(v[w] for w in a.lower().split()), v["[SEP]"]]
    types = [0] * len(ids)
    if b is not None:
        tail = [v[w] for w in b.lower().split()] + [v["[SEP]"]]
        ids, types = ids + tail, types + [1] * len(tail)
    return ids, types


def pooled(net, a, b=None) -> torch.Tensor:
    ids, types = hand_ids(a, b)
    out = net.encoder(torch.tensor([ids]), None, torch.tensor([types]))  # one sequence: nothing to mask
    if net.pooling == "cls":
        return torch.tanh(out.last_hidden_state[0, 0] @ net.encoder.pooler.weight.T + net.encoder.pooler.bias)
    return out.last_hidden_state[0].mean(0)


def lin(m, x):
    return x @ m.weight.T + m.bias


@torch.no_grad()
def hand_output(net, task, a, b=None) -> np.ndarray:
    """The head's output for one example: sst logits (5,), para logit, sts score; fp64 numpy."""
    head = net.heads[task]
    if task == "sst":
        y = pooled(net, a)
        h = lin(head.mlp[1], y)
        return lin(head.mlp[4], 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))).double().numpy()
    if net.pair_encoding == "cross":
        s = lin(head.out, pooled(net, a, b))[0]
        return np.float64(5 / (1 + math.exp(-float(s))) if task == "sts" else float(s))
    z1, z2 = lin(head.w1, pooled(net, a)).double(), lin(head.w2, pooled(net, b)).double()
    if task == "para":
        return np.float64(float(z1 @ z2))
    return np.float64(5 * max(0.0, float(z1 @ z2 / (z1.norm() * z2.norm()))))


def hand_outputs(net, task, examples, both_orders=False) -> np.ndarray:
    out = np.array([hand_output(net, task, e.text_a, e.text_b) for e in examples])
    if both_orders and task != "sst":
        out = (out + np.array([hand_output(net, task, e.text_b, e.text_a) for e in examples])) / 2
    return out


def network(cfg):
    net, _, _ = model_from_checkpoint(Path(cfg.out_dir) / "best.pt")
    return net.eval()


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def hand_predictions(task, out):
    if task == "sst":
        return out.argmax(-1)
    return (out > 0).astype(np.int64) if task == "para" else np.clip(out, 0, 5)


def read_course(path: Path, task: str) -> tuple[list[str], np.ndarray]:
    """A prediction file read the course's way: the header line, then `id , prediction` per line."""
    lines = path.read_text().split("\n")
    assert lines[0] == f"id \t {HEADER[task]} "
    assert lines[-1] == ""
    rows = [line.split(" , ") for line in lines[1:-1]]
    assert all(len(r) == 2 and r[1].endswith(" ") for r in rows)
    return [r[0] for r in rows], np.array([float(r[1]) for r in rows])


# ----------------------------------------------------------------------------- 0. the reference is a fair one

def test_hand_token_ids_are_the_tokenizers(runs):
    model = load(Path(runs["cross"].out_dir), device="cpu")
    e = dev(runs["cross"], "para")[3]
    assert model.tokenizer.encode([e.text_a], [e.text_b])[0] == hand_ids(e.text_a, e.text_b)
    assert model.tokenizer.encode([e.text_a])[0] == hand_ids(e.text_a)


# ----------------------------------------------------------------------------- 2. batching changes nothing

@pytest.mark.parametrize("kind", ["cross", "siam"])
def test_outputs_equal_a_plain_per_example_forward_for_any_batching(runs, kind):
    cfg = runs[kind]
    net = network(cfg)
    for task in TASKS:
        examples = [replace(e, label=None) for e in dev(cfg, task)] + dev(cfg, task, "test")
        want = hand_outputs(net, task, examples)
        for eval_tokens in (0, 64, 1024):
            model = load(Path(cfg.out_dir), device="cpu", precision="fp32", both_orders=False, eval_tokens=eval_tokens)
            for bs in (1, 3, 256):
                got = model.outputs(task, examples, batch_size=bs).double().numpy()
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{kind} {task} batch {bs} tokens {eval_tokens}")


def test_outputs_of_labelled_and_unlabelled_examples_together(runs):
    """Was a bug (data/batching.py:112): Model.outputs(task, examples) (docs/api.md: the raw head outputs) failed
    with a TypeError when the first example carried a label and a later one did not (a dev file's examples followed
    by a test file's, or Examples of one's own): a batch's labels were read when the first example had one. Now a
    batch with an unlabelled example has no labels, which predictions never read."""
    cfg = runs["cross"]
    model = load(Path(cfg.out_dir), device="cpu", precision="fp32", both_orders=False)
    examples = dev(cfg, "sst")[:2] + dev(cfg, "sst", "test")[:2]
    got = model.outputs("sst", examples, batch_size=4).double().numpy()
    np.testing.assert_allclose(got, hand_outputs(network(cfg), "sst", examples), rtol=1e-4, atol=1e-5)


def test_padding_to_a_multiple_changes_nothing(runs):
    """--pad-multiple pads past the longest: the extra [PAD] columns must be masked out (cls and mean pooling)."""
    from data.batching import EvalBatching, encode_task
    from training.inference.outputs import task_outputs

    for kind in ("cross", "siam"):
        cfg = runs[kind]
        model = load(Path(cfg.out_dir), device="cpu", precision="fp32", both_orders=False)
        for task in TASKS:
            examples = dev(cfg, task)
            data = encode_task(task, examples, model.tokenizer, cfg.pair_encoding, cfg.max_length)
            batching = EvalBatching(5, None, 16, 128)
            got = task_outputs(model.network, data, model.tokenizer, batching, torch.device("cpu"))
            np.testing.assert_allclose(got.double().numpy(), hand_outputs(model.network, task, examples),
                                       rtol=1e-4, atol=1e-5, err_msg=f"{kind} {task}")


# ----------------------------------------------------------------------------- 3. both orders

def test_both_orders_average_the_logits_and_scores(runs):
    """docs/training.md, options.md, api.md: the two orders' paraphrase logits and similarity scores averaged."""
    cfg = runs["cross"]
    net = network(cfg)
    model = load(Path(cfg.out_dir), device="cpu", precision="fp32")
    assert model.both_orders  # the run's --predict-both-orders
    for task in ("para", "sts"):
        examples = dev(cfg, task)
        want = hand_outputs(net, task, examples, both_orders=True)
        one = hand_outputs(net, task, examples)
        assert np.abs(want - one).max() > 1e-3  # the orders differ, so the check can tell
        np.testing.assert_allclose(model.outputs(task, examples).double().numpy(), want, rtol=1e-4, atol=1e-5)
    para = dev(cfg, "para")
    p = model.paraphrase([(e.text_a, e.text_b) for e in para])
    np.testing.assert_allclose(p.probabilities, sigmoid(hand_outputs(net, "para", para, True)), rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- 5. the API

@pytest.mark.parametrize("kind", ["cross", "siam"])
def test_api_results_from_the_heads_by_hand(runs, kind):
    cfg = runs[kind]
    net = network(cfg)
    model = load(Path(cfg.out_dir), device="cpu", precision="fp32", batch_size=4)
    both = model.both_orders
    sst = dev(cfg, "sst")
    s = model.sentiment([e.text_a for e in sst])
    probs = softmax(hand_outputs(net, "sst", sst))
    np.testing.assert_allclose(s.probabilities, probs, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(s.probabilities.sum(1), 1.0, atol=1e-9)
    assert s.labels.tolist() == probs.argmax(1).tolist() == s.probabilities.argmax(1).tolist()
    names = ["negative", "somewhat negative", "neutral", "somewhat positive", "positive"]  # docs/api.md
    assert s.names == [names[i] for i in probs.argmax(1)] and list(SENTIMENTS) == names
    para = dev(cfg, "para")
    p = model.paraphrase([(e.text_a, e.text_b) for e in para])
    prob = sigmoid(hand_outputs(net, "para", para, both))
    np.testing.assert_allclose(p.probabilities, prob, rtol=1e-4, atol=1e-6)
    assert p.labels.tolist() == (prob > 0.5).astype(int).tolist()
    sts = dev(cfg, "sts")
    scores = model.similarity([(e.text_a, e.text_b) for e in sts]).scores
    want = hand_outputs(net, "sts", sts, both)
    np.testing.assert_allclose(scores, want, rtol=1e-4, atol=1e-5)
    assert scores.min() >= 0 and scores.max() <= 5
    assert len(set(np.round(scores, 3))) > 3  # not a constant: the scale is used


# ----------------------------------------------------------------------------- 1, 6. the course's files

def test_course_files_and_metrics_against_the_course(runs, tmp_path, capsys):
    """evaluate --data-dir writes what the course's test_model_multitask would write for the same predictions:
    its header, `id , prediction` rows, every row's id of the csv (course order irrelevant: it shuffles test),
    labels / scores of the hand forward; the manifest's dev metrics are the course's (accuracy, np.corrcoef)
    computed from the files, and overall = mean(sst, para, (r + 1) / 2)."""
    import json

    cfg = runs["cross"]
    net = network(cfg)
    out = tmp_path / "preds"
    assert evaluate_mod.main([cfg.out_dir, "--data-dir", cfg.data_dir, "--predictions-dir", str(out),
                              "--device", "cpu", "--precision", "fp32", "--eval-batch-size", "3"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    from_files = {}
    for task in TASKS:
        for split in ("dev", "test"):
            path = Path(cfg.data_dir) / COURSE_FILES[task][split]
            with open(path) as f:
                rows = list(csv.DictReader(f, delimiter="\t"))
            ids, values = read_course(out / f"{task}-{split}-output.csv", task)
            assert ids == [r["id"].lower().strip() for r in rows]
            examples = load_task_file(path, task, labelled=split == "dev").examples
            want = hand_predictions(task, hand_outputs(net, task, examples, both_orders=True))
            if task == "sts":
                np.testing.assert_allclose(values, want, atol=5e-5 + 1e-6)
            else:
                assert values.tolist() == want.tolist()
            if split == "dev":
                gold = np.array([float(r[{"sst": "sentiment", "para": "is_duplicate", "sts": "similarity"}[task]])
                                 for r in rows])
                from_files[task] = (float(np.corrcoef(values, gold)[1][0]) if task == "sts"
                                    else float(np.mean(values == gold)))
    m = manifest["dev_metrics"]
    assert m["sst_acc"] == pytest.approx(from_files["sst"], abs=1e-12)
    assert m["para_acc"] == pytest.approx(from_files["para"], abs=1e-12)
    assert m["sts_pearson"] == pytest.approx(from_files["sts"], abs=1e-4)  # the files' 4 decimals
    want_overall = (from_files["sst"] + from_files["para"] + (from_files["sts"] + 1) / 2) / 3
    assert m["overall"] == pytest.approx(want_overall, abs=1e-4)


def test_file_writer_matches_the_course_writer(tmp_path):
    """Byte for byte the course's f-strings (sst: numpy int; para: its 0/1; sts: the score), but for the STS
    score's decimals: the course writes the float's repr, ours 4 decimals (rounded, not truncated)."""
    from training.inference.formats import write_predictions

    ids = ["b7573736a6ddf7be102b7fee0", "x1", "z9"]
    cases = {"sst": np.array([3, 0, 4]), "para": np.array([1.0, 0.0, 1.0]), "sts": np.array([3.14159, 0.0, 4.99996])}
    for task, preds in cases.items():
        write_predictions(tmp_path / task, task, ids, preds)
        text = (tmp_path / task).read_text()
        course = f"id \t {HEADER[task]} \n" + "".join(
            f"{i} , {int(p) if task != 'sts' else p} \n" for i, p in zip(ids, preds))
        if task != "sts":
            assert text == course
        got_ids, got = read_course(tmp_path / task, task)
        assert got_ids == ids
        np.testing.assert_allclose(got, preds, atol=5e-5 + 1e-12)


def test_real_course_files_give_the_courses_ids_in_order(course_data_dir):
    """Every row the course's load_multitask_data reads (csv.DictReader, id lower().strip()) is predicted, in
    the file's order, for each dev and test file of the real course data."""
    for task in TASKS:
        for split in ("dev", "test"):
            path = course_data_dir / COURSE_FILES[task][split]
            with open(path) as f:
                course_ids = [r["id"].lower().strip() for r in csv.DictReader(f, delimiter="\t")]
            ours = [e.id for e in load_task_file(path, task, labelled=split == "dev").examples]
            assert ours == course_ids, f"{path}: {len(ours)} ids against the course's {len(course_ids)}"


@pytest.mark.parametrize("kind", ["cross", "siam", "ema"])
def test_the_trainers_own_prediction_set_is_best_pts(runs, kind):
    """The set the trainer writes at the end (OUT_DIR/predictions) holds best.pt's predictions (for an
    --ema-decay run, the weight average best.pt keeps), and its manifest the metrics best.pt records."""
    import json

    cfg = runs[kind]
    net = network(cfg)
    folder = Path(cfg.predictions_dir)
    for task in TASKS:
        for split in ("dev", "test"):
            examples = dev(cfg, task, split)
            want = hand_predictions(task, hand_outputs(net, task, examples, both_orders=cfg.predict_both_orders))
            ids, got = read_course(folder / f"{task}-{split}-output.csv", task)
            assert ids == [e.id for e in examples]
            np.testing.assert_allclose(got, want, atol=5e-5 + 1e-6, err_msg=f"{kind} {task} {split}")
    recorded = torch.load(Path(cfg.out_dir) / "best.pt", map_location="cpu", weights_only=False)["metrics"]
    manifest = json.loads((folder / "manifest.json").read_text())["dev_metrics"]
    for k, v in manifest.items():
        assert recorded[k] == pytest.approx(v, abs=1e-6), k


# ----------------------------------------------------------------------------- 4. ensembles

def test_ensemble_averages_member_probabilities(runs, tmp_path, capsys):
    """docs/training.md: the members' SST class probabilities, paraphrase probabilities and similarity scores
    averaged; each member's own outputs (the cross member's pairs in both orders, its run's setting)."""
    from training.ensemble import ensemble

    members = [runs["cross"], runs["siam"]]
    out = tmp_path / "ens"
    ensemble([m.out_dir for m in members], members[0].data_dir, out, device="cpu", precision="fp32", batch_size=4)
    nets = [network(m) for m in members]
    for task in TASKS:
        for split in ("dev", "test"):
            examples = dev(members[0], task, split)
            outs = [hand_outputs(n, task, examples, both_orders=m.pair_encoding == "cross")
                    for n, m in zip(nets, members)]
            if task == "sst":
                want = np.mean([softmax(o) for o in outs], 0).argmax(1)
            elif task == "para":
                want = (np.mean([sigmoid(o) for o in outs], 0) > 0.5).astype(int)
            else:
                want = np.clip(np.mean(outs, 0), 0, 5)
            ids, got = read_course(out / f"{task}-{split}-output.csv", task)
            assert ids == [e.id for e in examples]
            if task == "sts":
                np.testing.assert_allclose(got, want, atol=5e-5 + 1e-6)
            else:
                assert got.tolist() == want.tolist(), f"{task} {split}"


# ----------------------------------------------------------------------------- 1. the submission zip

def test_submit_zip_holds_what_the_courses_prepare_submit_zips(runs, tmp_path, capsys):
    """prepare_submit.py: zz.write(file, os.path.join(".", file)) for predictions/* and the *.py files:
    entries predictions/<name> (zipfile drops the "./"), named cs224n_default_final_project_submission.zip."""
    from training.submit import submit

    cfg = runs["cross"]
    zip_path, _, _ = submit(cfg.out_dir, tmp_path / "sub.zip", code=False)
    course_dir = tmp_path / "course"
    (course_dir / "predictions").mkdir(parents=True)
    for p in Path(cfg.predictions_dir).iterdir():
        (course_dir / "predictions" / p.name).write_bytes(p.read_bytes())
    course_zip = tmp_path / "cs224n_default_final_project_submission.zip"
    with zipfile.ZipFile(course_zip, "w") as zz:
        for name in sorted(os.listdir(course_dir / "predictions")):
            zz.write(course_dir / "predictions" / name, os.path.join(".", "predictions", name))
    with zipfile.ZipFile(zip_path) as ours, zipfile.ZipFile(course_zip) as theirs:
        assert sorted(ours.namelist()) == sorted(theirs.namelist())
        for n in theirs.namelist():
            assert ours.read(n) == theirs.read(n)
    assert sorted(n for n in os.listdir(cfg.predictions_dir) if n.endswith(".csv")) == sorted(
        f"{t}-{s}-output.csv" for t in TASKS for s in ("dev", "test"))
    default, _, _ = submit(cfg.out_dir, None, code=False)
    assert default == Path(cfg.out_dir) / "cs224n_default_final_project_submission.zip"
