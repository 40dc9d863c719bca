"""training.api: a trained model from Python, and training.evaluate's plain-text input and probabilities.

The API's predictions are checked against training.evaluate's files for the same checkpoint (the run's
own prediction files, and --predict / --probabilities), and its probabilities against a reference
written out here: one example at a time through the network (no padding), softmax and sigmoid by hand,
the two pair orders averaged by hand.
"""
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import tiny_run

from data.loaders import COURSE_FILES, TASKS, Example, load_task_file
from minbert import Tokenizer
from training import evaluate as evaluate_mod
from training.api import load
from training.common.errors import LoadError
from training.inference.formats import read_predictions, read_tsv_predictions
from training.run.checkpointing import model_from_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Pairs predicted in both orders, as the run did: the API must do the same."""
    cfg, _ = tiny_run(tmp_path_factory.mktemp("api"), predict_both_orders=True)
    return cfg


def dev_examples(cfg, task):
    return load_task_file(Path(cfg.data_dir) / COURSE_FILES[task]["dev"], task, labelled=True).examples


def api_call(model, task, examples):
    if task == "sst":
        return model.sentiment([e.text_a for e in examples])
    pairs = [(e.text_a, e.text_b) for e in examples]
    return model.paraphrase(pairs) if task == "para" else model.similarity(pairs)


def evaluate(*argv) -> None:
    assert evaluate_mod.main([*map(str, argv), "--device", "cpu", "--eval-batch-size", "5"]) == 0


# ----------------------------------------------------------------------------- the API against training.evaluate

def test_api_predictions_equal_training_evaluates(run, tmp_path, capsys):
    run_dir = Path(run.out_dir)
    step = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    for n, source in enumerate((run_dir, run_dir / "best.pt", step)):
        model = load(source, device="cpu", batch_size=4)
        for task in TASKS:
            dev = Path(run.data_dir) / COURSE_FILES[task]["dev"]
            course, tsv = tmp_path / f"{task}-{n}.csv", tmp_path / f"{task}-{n}.tsv"  # an existing OUT is refused
            evaluate(source, "--predict", task, dev, course)
            evaluate(source, "--predict", task, dev, tsv, "--probabilities")
            examples = dev_examples(run, task)
            got = api_call(model, task, examples)
            _, rows = read_predictions(course)
            assert [i for i, _ in rows] == [e.id for e in examples]
            if source != step:  # the trainer's own dev predictions come from best.pt
                assert course.read_text() == (run_dir / "predictions" / f"{task}-dev-output.csv").read_text()
            _, tsv_rows = read_tsv_predictions(tsv)
            if task == "sts":
                np.testing.assert_allclose(got.scores, [v for _, v in rows], atol=5e-5)  # 4 decimals
                np.testing.assert_allclose(got.scores, [float(r["score"]) for r in tsv_rows], atol=2e-6)
                continue
            assert got.labels.tolist() == [int(v) for _, v in rows]
            cols = [f"prob_{k}" for k in range(5)] if task == "sst" else ["prob_paraphrase"]
            want = np.array([[float(r[c]) for c in cols] for r in tsv_rows]).squeeze(-1 if task == "para" else None)
            np.testing.assert_allclose(got.probabilities, want, atol=2e-6)  # 6 decimals, and another batching
    capsys.readouterr()


def test_eval_tokens_reaches_the_files_written_for_a_data_folder(run, tmp_path, monkeypatch):
    """--eval-tokens caps the batches that write a data folder's prediction files as it caps --score's (it was
    once dropped there): with 16, every batch of more than one example within 16 padded tokens, where
    without it batches are larger; the files are the run's own either way."""
    from data import batching
    made: dict[str, list[tuple[int, int]]] = {}
    real = batching.make_batch

    def spy(*args):
        batch = real(*args)
        made.setdefault(name, []).append(tuple(batch.inputs[0]["input_ids"].shape))
        return batch

    monkeypatch.setattr(batching, "make_batch", spy)
    for name, budget in (("16", ["--eval-tokens", 16]), ("none", [])):
        evaluate(run.out_dir, "--data-dir", run.data_dir, "--predictions-dir", tmp_path / name, *budget)
        for task in TASKS:
            file = f"{task}-dev-output.csv"
            assert (tmp_path / name / file).read_text() == (Path(run.out_dir) / "predictions" / file).read_text()
    assert all(rows * width <= 16 for rows, width in made["16"] if rows > 1)
    assert max(rows * width for rows, width in made["none"]) > 16


def test_api_matches_a_forward_pass_written_out(run):
    """One example at a time (no padding, no sorting), the head's outputs turned into probabilities by
    hand; pairs averaged over (a, b) and (b, a) as the run's --predict-both-orders says."""
    run_dir = Path(run.out_dir)
    net, _, _ = model_from_checkpoint(run_dir / "best.pt")
    net.eval()
    tok = Tokenizer.from_checkpoint(run_dir / "tokenizer")
    model = load(run_dir, device="cpu")
    one_order = load(run_dir, device="cpu", both_orders=False)
    with torch.no_grad():
        for task in TASKS:
            examples = dev_examples(run, task)
            if task == "sst":
                logits = [net("sst", [tok([e.text_a])])[0].tolist() for e in examples]
                want = [[math.exp(x - max(row)) / sum(math.exp(y - max(row)) for y in row) for x in row]
                        for row in logits]
                np.testing.assert_allclose(model.sentiment([e.text_a for e in examples]).probabilities, want, atol=1e-5)
                continue
            ab = [net(task, [tok([e.text_a], [e.text_b])]).item() for e in examples]
            ba = [net(task, [tok([e.text_b], [e.text_a])]).item() for e in examples]
            both = [(x + y) / 2 for x, y in zip(ab, ba)]
            got, got_one = api_call(model, task, examples), api_call(one_order, task, examples)
            if task == "para":
                np.testing.assert_allclose(got.probabilities, [1 / (1 + math.exp(-v)) for v in both], atol=1e-5)
                np.testing.assert_allclose(got_one.probabilities, [1 / (1 + math.exp(-v)) for v in ab], atol=1e-5)
                assert got.labels.tolist() == [int(v > 0) for v in both]
            else:
                np.testing.assert_allclose(got.scores, [min(max(v, 0), 5) for v in both], atol=1e-5)
                np.testing.assert_allclose(got_one.scores, [min(max(v, 0), 5) for v in ab], atol=1e-5)
                assert np.abs(got.scores - got_one.scores).max() > 1e-3  # the orders differ: the test can fail


def test_batch_size_and_input_order_do_not_change_predictions(run):
    model = load(run.out_dir, device="cpu")
    sentences = [e.text_a for e in dev_examples(run, "sst")]
    one = model.sentiment(sentences, batch_size=1).probabilities
    np.testing.assert_allclose(model.sentiment(sentences, batch_size=64).probabilities, one, atol=1e-5)
    np.testing.assert_allclose(model.sentiment(sentences[::-1], batch_size=3).probabilities, one[::-1], atol=1e-5)
    assert model.sentiment(sentences[:1]).names[0] in ("negative", "somewhat negative", "neutral",
                                                      "somewhat positive", "positive")
    assert len(model.similarity([])) == 0 and model.sentiment([]).probabilities.shape == (0, 5)


def test_bad_inputs_and_paths_are_refused_in_one_line(run, tmp_path):
    import training.api
    assert training.api.LoadError is LoadError  # the name docs/api.md gives users
    model = load(run.out_dir, device="cpu")
    with pytest.raises(TypeError, match="not one string"):
        model.sentiment("a great film")
    with pytest.raises(TypeError, match="pair 1: expected two strings"):
        model.paraphrase([("a", "b"), ("only one",)])
    with pytest.raises(LoadError, match=f"checkpoint {tmp_path / 'nope.pt'} does not exist"):
        load(tmp_path / "nope.pt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LoadError, match="no best.pt .* and no heads.json"):
        load(empty)
    (empty / "checkpoints").mkdir()
    (empty / "checkpoints" / "step-0000004.pt").write_bytes(b"")
    with pytest.raises(LoadError, match="pass a training checkpoint instead, e.g. .*step-0000004.pt"):
        load(empty)
    if not torch.cuda.is_available():
        with pytest.raises(LoadError, match="CUDA is not available"):
            load(run.out_dir, device="cuda")


@pytest.mark.parametrize("kw, message", [
    (dict(precision="fp8"),
     "precision must be one of auto, fp32, fp32-strict, bf16, fp16 or None (the run's), not 'fp8'"),
    (dict(batch_size=0), "batch_size must be an int >= 1, not 0"),
    (dict(batch_size=2.5), "batch_size must be an int >= 1, not 2.5"),
    (dict(eval_tokens=-1), "eval_tokens must be an int >= 0, not -1 (0: no budget; None: the device's default)"),
])
def test_loads_own_arguments_are_checked_as_the_commands_flags_are(run, kw, message, monkeypatch):
    """A wrong precision was a KeyError; a batch size of 0 and a negative budget went through. Refused before the
    weights are read."""
    import training.api
    monkeypatch.setattr(training.api, "_from_checkpoint", lambda *a: pytest.fail("the weights were read"))
    with pytest.raises(LoadError) as e:
        load(run.out_dir, device="cpu", **kw)
    assert str(e.value) == message


def test_a_call_with_a_batch_size_below_one_is_refused(run):
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, not 0"):
        load(run.out_dir, device="cpu").sentiment(["a great film"], batch_size=0)


def test_a_task_the_run_did_not_train_is_refused(tmp_path):
    cfg, _ = tiny_run(tmp_path, tasks=("sst",), epochs=1)
    model = load(cfg.out_dir, device="cpu")
    assert model.tasks == ("sst",)
    assert len(model.sentiment(["apple river"])) == 1
    with pytest.raises(ValueError, match=r"not trained on para \(its tasks: sst\)"):
        model.paraphrase([("apple", "river")])


# ----------------------------------------------------------------------------- plain text and probabilities

def test_plain_text_round_trips(run, tmp_path, capsys):
    """Lines in, one TSV row per non-blank line out: ids are line numbers, the sentences come back as
    written (a quote and a non-ASCII letter included), the predictions are the API's and the same as
    for the same sentences in the course format."""
    model = load(run.out_dir, device="cpu")
    sentences = ["apple river stone", 'tiger "honey" piano', "", "  océan lamp  ", "garden\r"]
    pairs = [("apple river", "tiger honey"), ("", ""), ("lamp", "paper window forest"), ("ocean", "ocean")]
    texts = {"sst": "\n".join(sentences) + "\n", "para": "\n".join(f"{a}\t{b}" if a else "" for a, b in pairs),
             "sts": "\n".join(f"{a}\t{b}" if a else "" for a, b in pairs)}
    kept_sst = [(n, s.strip()) for n, s in enumerate(sentences, 1) if s.strip()]
    kept_pairs = [(n, p) for n, p in enumerate(pairs, 1) if p[0]]
    for task in TASKS:
        src = tmp_path / f"{task}.txt"
        src.write_text(texts[task], encoding="utf-8")
        out, out_probs = tmp_path / f"{task}.tsv", tmp_path / f"{task}-probs.tsv"
        evaluate(run.out_dir, "--predict-text", task, src, out)
        evaluate(run.out_dir, "--predict-text", task, src, out_probs, "--probabilities")
        read_task, rows = read_tsv_predictions(out)
        _, prob_rows = read_tsv_predictions(out_probs)
        assert read_task == task
        if task == "sst":
            assert [(int(r["id"]), r["sentence"]) for r in rows] == kept_sst
            got = model.sentiment([s for _, s in kept_sst])
            assert [int(r["label"]) for r in rows] == got.labels.tolist()
            probs = np.array([[float(r[f"prob_{k}"]) for k in range(5)] for r in prob_rows])
            np.testing.assert_allclose(probs, got.probabilities, atol=2e-6)
            np.testing.assert_allclose(probs.sum(1), 1, atol=1e-5)
            assert "prob_0" not in rows[0]
        else:
            assert [(int(r["id"]), (r["sentence1"], r["sentence2"])) for r in rows] == kept_pairs
            got = api_call(model, task, [Example(str(n), a, b, None) for n, (a, b) in kept_pairs])
            if task == "para":
                assert [int(r["label"]) for r in rows] == got.labels.tolist()
                np.testing.assert_allclose([float(r["prob_paraphrase"]) for r in prob_rows], got.probabilities,
                                           atol=2e-6)
            else:
                np.testing.assert_allclose([float(r["score"]) for r in rows], got.scores, atol=2e-6)
    # the same sentences in the course's format give the same labels
    course = tmp_path / "sst-course.csv"
    course.write_text("\tid\tsentence\n" + "".join(f"{n}\tline{n}\t{s}\n" for n, s in kept_sst))
    evaluate(run.out_dir, "--predict", "sst", course, tmp_path / "sst-course-out.csv")
    _, course_rows = read_predictions(tmp_path / "sst-course-out.csv")
    assert [int(v) for _, v in course_rows] == [int(r["label"]) for r in read_tsv_predictions(tmp_path / "sst.tsv")[1]]
    capsys.readouterr()


def test_plain_text_errors_name_the_file_and_line(run, tmp_path, capsys):
    def error(*argv) -> str:
        with pytest.raises(SystemExit) as e:
            evaluate_mod.main([str(run.out_dir), "--device", "cpu", *map(str, argv)])
        assert e.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    bad = tmp_path / "bad.txt"
    bad.write_text("apple river\n\ntiger\thoney\n")
    assert f"{bad}:3: a tab in the line: sst takes one sentence per line" in error("--predict-text", "sst", bad, "o")
    assert f"{bad}:1: expected two tab-separated sentences for sts, got 1 field(s)" in error(
        "--predict-text", "sts", bad, "o")
    bad.write_bytes(b"apple\n\xff river\n")
    assert f"{bad}:2: not UTF-8 text" in error("--predict-text", "sst", bad, "o")
    bad.write_text("\n  \n")
    assert f"{bad}: no sentences" in error("--predict-text", "sst", bad, "o")
    assert "--probabilities applies to --predict and --predict-text" in error(
        "--data-dir", run.data_dir, "--probabilities")
    assert not (tmp_path / "o").exists()
