"""Issue 20: every bad input is one line naming the culprit, exit status 2, before any work -- and an
earlier run in --out-dir (asked to be replaced with --overwrite) is byte for byte what it was.

The table runs the command line in this process against a copy of one real earlier run; each case edits
the model folder, the data or the paths, or adds flags. Cases that need a child process (the hub) or
fail later than validation (a full disk, a first step that never trains) follow the table.
"""
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from test_cli import VOCAB, tiny_checkpoint, write_course_files

from training.train import main

REPO = Path(__file__).resolve().parents[1]
PROG = "run_multitask.py: error: "

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """A finished tiny run (model, data, run directory with its predictions inside), made once."""
    root = tmp_path_factory.mktemp("earlier")
    model, data, out = tiny_checkpoint(root / "model"), write_course_files(root / "data"), root / "run"
    assert main(_argv(model, data, out)) == 0
    assert {"best.pt", "metrics.jsonl", "config.json", "train.log"} <= {p.name for p in out.iterdir()}
    assert any((out / "checkpoints").iterdir()) and any((out / "pred").iterdir())
    return root


def _argv(model, data, out, *extra):
    return ["--model", str(model), "--data-dir", str(data), "--out-dir", str(out), "--predictions-dir",
            str(out / "pred"), "--device", "cpu", "--epochs", "1", "--save-every", "1", *extra]


def fingerprint(d: Path) -> dict:
    """Every file under d -> its SHA-256 (folders too, so that none appears or goes unnoticed)."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


class Case:
    """A copy of the earlier run's model, data and run directory, for one case to spoil."""

    def __init__(self, root: Path, earlier: Path):
        for name in ("model", "data", "run"):
            shutil.copytree(earlier / name, root / name)
        self.root, self.model, self.data, self.out = root, root / "model", root / "data", root / "run"

    def edit_config(self, **values):
        cfg = json.loads((self.model / "config.json").read_text())
        (self.model / "config.json").write_text(json.dumps({**cfg, **values}))

    def model_file(self, name: str, content: str | bytes) -> None:
        path = self.model / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)

    def file(self, name: str, text: str = "x") -> Path:
        (self.root / name).write_text(text)
        return self.root / name


def _junk_checkpoint(c: Case, what) -> list[str]:
    path = c.root / "junk.pt"
    if isinstance(what, bytes):
        path.write_bytes(what)
    else:
        torch.save(what, path)
    return ["--resume", str(path)]


def _bad_id_row(c: Case, ex_id: str) -> list[str]:
    with open(c.data / "ids-sst-train.csv", "a") as f:
        f.write(f'2\t"{ex_id}"\tthe cat\t2\n')
    return ["--strict"]


class _Functional:
    """Any object of a class: torch.load(weights_only=True) refuses to build it."""


def _checkpoints_a_file(c: Case) -> list[str]:
    shutil.rmtree(c.out / "checkpoints")
    c.file("run/checkpoints")
    return []


# (case id, spoil: Case -> extra flags, what the one line must hold: the culprit's name)
CASES = [
    # ---- numeric flags: finite and in range, every one
    ("lr-nan", lambda c: ["--lr", "nan"], ["--lr must be > 0, not nan"]),
    ("lr-inf", lambda c: ["--lr", "inf"], ["--lr must be finite, not inf"]),
    ("weight-decay-nan", lambda c: ["--weight-decay", "nan"], ["--weight-decay must be >= 0, not nan"]),
    ("max-grad-norm-nan", lambda c: ["--max-grad-norm", "nan"], ["--max-grad-norm must be >= 0", "not nan"]),
    ("smart-lambda-inf", lambda c: ["--smart", "--smart-lambda", "inf"], ["--smart-lambda must be finite, not inf"]),
    ("smart-mu-nan", lambda c: ["--smart", "--smart-mu", "nan"], ["--smart-mu must be finite, not nan"]),
    ("ema-decay-nan", lambda c: ["--ema-decay", "nan"], ["--ema-decay must be in [0, 1), not nan"]),
    ("config-file-lr-NaN", lambda c: ["--config", str(c.file("recipe.json", '{"lr": NaN}'))],
     ["recipe.json: --lr must be > 0, not nan"]),
    # ---- the model's config.json: types and ranges, sizes bounded by the machine, one line naming file and key
    ("vocab-size-1e10", lambda c: c.edit_config(vocab_size=10**10),
     ["config.json", "vocab_size 10000000000", "GiB", "more than this machine's memory"]),
    ("vocab-size-1e10-float", lambda c: c.edit_config(vocab_size=1e10),
     ["config.json", "vocab_size 10000000000.0: must be a positive integer"]),
    ("intermediate-size-1e9", lambda c: c.edit_config(intermediate_size=10**9),
     ["config.json", "intermediate_size 1000000000", "more than this machine's memory"]),
    ("hidden-dropout-2", lambda c: c.edit_config(hidden_dropout_prob=2.0),
     ["config.json", "hidden_dropout_prob 2.0: must be a probability in [0, 1)"]),
    ("attention-dropout-x", lambda c: c.edit_config(attention_probs_dropout_prob="x"),
     ["config.json", "attention_probs_dropout_prob 'x'"]),
    ("pad-token-beyond-vocab", lambda c: c.edit_config(pad_token_id=len(VOCAB)),
     ["config.json", f"pad_token_id {len(VOCAB)}: must be a token of the vocabulary"]),
    ("layer-norm-eps-abc", lambda c: c.edit_config(layer_norm_eps="abc"),
     ["config.json", "layer_norm_eps 'abc': must be a positive finite number"]),
    ("layer-norm-eps-NaN", lambda c: c.model_file("config.json", (c.model / "config.json").read_text().replace(
        '"layer_norm_eps": 1e-12', '"layer_norm_eps": NaN')),
     ["config.json", "layer_norm_eps nan"]),
    ("config-json-list", lambda c: c.model_file("config.json", "[]"),
     ["config.json: must hold a JSON object", "not []"]),
    ("config-json-null", lambda c: c.model_file("config.json", "null"),
     ["config.json: must hold a JSON object", "not null"]),
    ("config-json-not-utf8", lambda c: c.model_file("config.json", b'{"vocab_size": "\xff"}'),
     ["config.json: cannot read the model config", "utf-8"]),
    ("vocab-not-utf8", lambda c: c.model_file("vocab.txt", "\n".join(VOCAB).encode() + b"\ncaf\xe9\n"),
     [f"vocab.txt:{len(VOCAB) + 1}: not UTF-8 text"]),
    # ---- output paths: of the right kind and writable, found before training (not after it)
    ("out-dir-is-a-file", lambda c: ["--out-dir", str(c.file("f"))], ["--out-dir", "is a file, not a directory"]),
    ("out-dir-under-a-file", lambda c: ["--out-dir", str(c.file("f") / "run")],
     ["--out-dir", "f is a file, not a directory"]),
    ("cache-dir-is-a-file", lambda c: ["--cache-dir", str(c.file("f"))], ["--cache-dir", "is a file"]),
    ("predictions-dir-is-a-file", lambda c: ["--predictions-dir", str(c.file("f"))],
     ["--predictions-dir", "is a file"]),
    ("export-hf-is-a-file", lambda c: ["--export-hf", str(c.file("f"))], ["--export-hf", "is a file"]),
    ("checkpoints-is-a-file", _checkpoints_a_file, ["checkpoints is a file, where the run keeps a directory"]),
    # ---- resume: a file that is not a training checkpoint, in one line (not torch's advice)
    ("resume-random-bytes", lambda c: _junk_checkpoint(c, os.urandom(3000)),
     ["junk.pt: cannot read the checkpoint: not a torch.save archive"]),
    ("resume-empty-file", lambda c: _junk_checkpoint(c, b""),
     ["junk.pt: cannot read the checkpoint: the file is empty"]),
    ("resume-pickled-objects", lambda c: _junk_checkpoint(c, {"x": _Functional()}),
     ["junk.pt: cannot read the checkpoint: holds Python objects beyond tensors"]),
    ("resume-a-list", lambda c: _junk_checkpoint(c, [1, 2]), ["junk.pt: cannot read the checkpoint: holds a list"]),
    ("resume-a-model-only-dict", lambda c: _junk_checkpoint(c, {"weights": torch.ones(2)}),
     ["junk.pt: not a training checkpoint of minBERT-MT (no model, optimizer, config, run_state)"]),
    # ---- data: ids the prediction files could not carry (--strict: a bad row is an error)
    ("id-with-comma", lambda c: _bad_id_row(c, "e , f"), ["ids-sst-train.csv:4: id 'e , f' holds a comma"]),
    ("id-with-line-break", lambda c: _bad_id_row(c, "e\nf"),
     ["ids-sst-train.csv:4: id 'e\\nf' holds a comma or a line break"]),
]


@pytest.mark.parametrize("spoil, names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_the_earlier_run_is_untouched(earlier, tmp_path, capsys, spoil, names):
    case = Case(tmp_path, earlier)
    extra = spoil(case) or []
    before = fingerprint(tmp_path)  # the earlier run, and every file a case wrote
    try:
        rc = main(_argv(case.model, case.data, case.out, "--overwrite", *extra))
    except SystemExit as e:  # argparse's exit, for problems of a --config file
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PROG), err
    assert all(n in lines[0] for n in names), (names, lines[0])
    assert "Traceback" not in out + err
    assert fingerprint(tmp_path) == before


def test_a_read_only_out_dir_is_refused_before_anything_is_written(earlier, tmp_path, capsys):
    case = Case(tmp_path, earlier)
    before = fingerprint(tmp_path)
    with read_only(case.out):
        rc = main(_argv(case.model, case.data, case.out, "--overwrite"))
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == f"{PROG}--out-dir {case.out}: not writable"
    assert fingerprint(tmp_path) == before


def test_a_read_only_file_the_run_appends_to_is_refused(earlier, tmp_path, capsys):
    case = Case(tmp_path, earlier)
    before = fingerprint(tmp_path)
    with read_only(case.out / "metrics.jsonl"):
        rc = main(_argv(case.model, case.data, case.out, "--overwrite"))
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == f"{PROG}--out-dir {case.out}: {case.out / 'metrics.jsonl'} is not writable"
    assert fingerprint(tmp_path) == before


@contextlib.contextmanager
def read_only(p: Path):
    """A file or directory even root cannot write in: chmod for users, the immutable attribute for root."""
    mode = p.stat().st_mode
    if os.geteuid() != 0:
        p.chmod(0o555 if p.is_dir() else 0o444)
    elif subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
        pytest.skip("root on a file system without chattr +i: no way to make a file read-only here")
    try:
        assert not os.access(p, os.W_OK)
        yield
    finally:
        if os.geteuid() != 0:
            p.chmod(mode)
        else:
            subprocess.run(["chattr", "-i", str(p)], check=True)


def test_too_little_disk_for_one_checkpoint_is_refused_with_the_estimate(earlier, tmp_path, capsys, monkeypatch):
    import training.run.preflight as preflight

    case = Case(tmp_path, earlier)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    fresh = tmp_path / "new" / "run"  # nothing to reclaim there (an --overwrite would count the earlier run)
    before = fingerprint(tmp_path)
    assert main(_argv(case.model, case.data, fresh)) == 2
    line = capsys.readouterr().err.strip()
    # the tiny model: 11 x 16 vocabulary, 2 layers of hidden 16 -> its parameters, counted by hand
    H, I, V, P, T, L = 16, 32, len(VOCAB), 128, 2, 2
    params = (V + P + T) * H + 2 * H + L * (4 * H * H + 2 * H * I + 9 * H + I) + H * H + H
    assert line.startswith(f"{PROG}--out-dir {fresh}: 1000 B free on its disk, but a training checkpoint of this "
                           f"model takes about {4 * 3 * params / 1024:.1f} KiB"), line
    assert f"best.pt {4 * params / 1024:.1f} KiB" in line
    assert fingerprint(tmp_path) == before  # not even the new out-dir's folders stay behind


def test_a_model_too_big_for_the_gpu_names_the_gpu(earlier, tmp_path, monkeypatch):
    """On CUDA the training memory is held against the GPU's (faked here: 1 MiB)."""
    from minbert import CheckpointError
    from training.config.train_config import TrainConfig
    from training.run.preflight import check_model

    class Props:
        total_memory = 2**20

    case = Case(tmp_path, earlier)
    case.edit_config(hidden_size=256, num_attention_heads=2, intermediate_size=1024)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props)
    with pytest.raises(CheckpointError, match=r"config\.json: a BERT of [\d,]+ parameters .*training it \(weights, "
                                              r"gradients, AdamW's two moments\) needs about .* MiB, more than the "
                                              r"GPU's memory on cuda:0 \(1\.0 MiB\)"):
        check_model(TrainConfig(model=str(case.model)), torch.device("cuda:0"))


# ----------------------------------------------------------------------------- later than validation

def test_overwrite_keeps_the_earlier_run_until_a_step_has_trained(earlier, tmp_path, capsys, monkeypatch):
    """Every step non-finite: the run stops (exit 1) before any step trained or anything was recorded (no
    checkpoint is due: --save-every 0; 2 bad steps of the epoch's 3), and the earlier run is intact."""
    import training.methods.stepper as T

    case = Case(tmp_path, earlier)
    before = fingerprint(tmp_path)
    real = T.task_loss
    monkeypatch.setattr(T, "task_loss", lambda task, out, labels: real(task, out, labels) * float("nan"))
    assert main(_argv(case.model, case.data, case.out, "--overwrite", "--max-bad-steps", "2", "--save-every", "0")) == 1
    assert "2 consecutive non-finite steps" in capsys.readouterr().err
    assert fingerprint(tmp_path) == before
    # and once a step has trained, the earlier run's files are replaced by the new run's
    monkeypatch.setattr(T, "task_loss", real)
    assert main(_argv(case.model, case.data, case.out, "--overwrite", "--seed", "3")) == 0
    assert json.loads((case.out / "config.json").read_text())["seed"] == 3


def _full_disk(monkeypatch):
    """Every checkpoint write goes to /dev/full: a real ENOSPC from the kernel, through torch's writer."""
    import tempfile

    import training.run.checkpointing as C

    def on_full_disk(dir, prefix, suffix):
        fd, path = tempfile.mkstemp(dir=dir, prefix=prefix, suffix=suffix)
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)
        os.close(full)
        return fd, path

    monkeypatch.setattr(C, "tempfile", types.SimpleNamespace(mkstemp=on_full_disk))


def test_a_full_disk_is_one_line_naming_the_file_and_keeps_what_was_there(tmp_path, monkeypatch):
    from training.common.errors import WriteError
    from training.run.checkpointing import atomic_save, read_checkpoint

    path = tmp_path / "ckpt.pt"
    atomic_save({"w": torch.ones(3)}, path)
    _full_disk(monkeypatch)
    with pytest.raises(WriteError) as e:
        atomic_save({"w": torch.zeros(100_000)}, path)
    assert str(e.value) == f"{path}: No space left on device (the file is unchanged)"
    monkeypatch.undo()
    assert torch.equal(read_checkpoint(path)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_torchs_full_disk_error_becomes_one_line():
    """torch.save's writer reports ENOSPC as "[enforce fail at inline_container.cc:...] . unexpected pos",
    the OSError chained behind it (in atomic_save the file's close then raises the OSError itself)."""
    from training.common.errors import write_error

    f = open("/dev/full", "wb")
    try:
        with pytest.raises(RuntimeError) as e:
            torch.save({"w": torch.ones(1000)}, f)
    finally:
        with contextlib.suppress(OSError):  # the buffer's last flush, on the same full disk
            f.close()
    assert "inline_container" in str(e.value) and "No space" not in str(e.value)
    assert str(write_error(e.value, "best.pt")) == "best.pt: No space left on device (the file is unchanged)"


def test_a_full_disk_during_a_run_is_exit_1_and_one_line(earlier, tmp_path, capsys, monkeypatch):
    case = Case(tmp_path, earlier)
    _full_disk(monkeypatch)
    assert main(_argv(case.model, case.data, tmp_path / "new")) == 1
    out, err = capsys.readouterr()
    assert err.strip() == (f"{PROG}{tmp_path / 'new' / 'checkpoints' / 'step-0000001.pt'}: No space left on device "
                           f"(the file is unchanged)")
    assert "Traceback" not in out + err


def test_a_full_disk_under_the_metrics_and_the_log(tmp_path, capsys):
    import logging

    from training.common.errors import WriteError
    from training.run.rundir import MetricsLog, _OneLineFileHandler

    metrics = MetricsLog(Path("/dev/full"))
    with pytest.raises(WriteError, match=r"^/dev/full: No space left on device"):
        metrics.write({"step": 1})
    handler = _OneLineFileHandler("/dev/full")
    for _ in range(3):
        handler.emit(logging.LogRecord("x", logging.INFO, __file__, 1, "a line", None, None))
    handler.close()
    assert capsys.readouterr().err == ("/dev/full: cannot write the log (No space left on device); logging to the "
                                       "console only\n")


def test_an_unreachable_hub_is_one_quick_line_without_retries(earlier, tmp_path):
    """No network retries with back-off (about 30 s before), each hub warning once; port 9 of localhost
    refuses at once, so the test means the same with or without internet."""
    case = Case(tmp_path, earlier)
    before = fingerprint(case.out)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9",
           "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_HUB_CACHE", None)
    r = subprocess.run([sys.executable, str(REPO / "run_multitask.py"), *_argv("someone/bert-tiny", case.data, case.out,
                        "--overwrite")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()  # no "Retrying in 2s [Retry 2/5]" lines, each twice, before it
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}'someone/bert-tiny' is not in the Hugging Face cache"), lines
    assert "the hub cannot be reached (ConnectError" in lines[0] and "--model /path/to/dir" in lines[0]
    assert fingerprint(case.out) == before
    # the look-up alone, timed without the interpreter's start and torch's import
    code = ("import time; from minbert import CheckpointError, resolve_checkpoint\n"
            "start = time.time()\n"
            "try:\n    resolve_checkpoint('someone/bert-tiny')\n"
            "except CheckpointError:\n    print(time.time() - start)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert float(r.stdout) < 5, r.stdout + r.stderr  # huggingface_hub's back-off alone: 2 + 4 + 8 + 8 s


def test_hub_warnings_are_logged_once(tmp_path):
    code = ("import logging; logging.basicConfig(format='ROOT %(message)s')\n"
            "from minbert.checkpoint import _hub_logs_once\n"
            "_hub_logs_once()\n"
            "logging.getLogger('huggingface_hub.utils._http').warning('Retrying in 1s')\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert r.stderr.splitlines() == ["ROOT Retrying in 1s"]


def test_ids_the_prediction_files_cannot_carry_are_bad_rows(tmp_path, caplog):
    from data.loaders import load_task_file
    from training.inference.formats import read_predictions, write_predictions

    path = tmp_path / "sst.csv"
    path.write_text('\tid\tsentence\tsentiment\n0\ta\tthe cat\t1\n1\t"b , c"\tthe mat\t2\n2\t"d\ne"\tsat\t3\n'
                    '3\t"g\x0bh"\ton\t4\n4\tf\ton the mat\t0\n')
    res = load_task_file(path, "sst")
    assert [e.id for e in res.examples] == ["a", "f"]
    assert [str(b) for b in res.bad_rows] == [
        f"{path}:3: id 'b , c' holds a comma or a line break: a prediction file ('id , prediction' per line) cannot "
        f"hold it",
        f"{path}:4: id 'd\\ne' holds a comma or a line break: a prediction file ('id , prediction' per line) cannot "
        f"hold it",
        f"{path}:6: id 'g\\x0bh' holds a comma or a line break: a prediction file ('id , prediction' per line) "
        f"cannot hold it"]
    # why: our own reader would refuse the file these ids make
    write_predictions(tmp_path / "p.csv", "sst", ["a", "b , c"], torch.tensor([1.0, 2.0]).numpy())
    with pytest.raises(ValueError, match="expected 'id , prediction'"):
        read_predictions(tmp_path / "p.csv")


def test_a_full_disk_while_writing_predictions_is_one_line(earlier, tmp_path, capsys, monkeypatch):
    import builtins

    import training.inference.formats as E  # where the course's prediction files are written

    case = Case(tmp_path, earlier)
    monkeypatch.setattr(E, "open", lambda path, mode: builtins.open("/dev/full", mode), raising=False)
    assert main(_argv(case.model, case.data, tmp_path / "new")) == 1
    out, err = capsys.readouterr()
    first = tmp_path / "new" / "pred" / "sst-dev-output.csv"  # the set's first file, named
    assert err.strip() == f"{PROG}{first}: No space left on device (the file is unchanged)"
    assert "Traceback" not in out + err
    assert (tmp_path / "new" / "best.pt").is_file()  # what the run wrote before stays


def test_a_full_disk_while_writing_predictions_names_the_file_and_keeps_the_earlier_set(tmp_path, monkeypatch):
    import numpy as np

    import training.inference.predictions as P
    from training.common.errors import WriteError

    folder = tmp_path / "predictions"
    P.write_prediction_set(folder, {("sst", "dev"): (["a", "b"], np.array([1, 2]))}, {"run": "earlier"})
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def onto_a_full_disk(path, task, ids, values):
        with open("/dev/full", "w") as f:  # the kernel's ENOSPC, at the flush
            f.write("x" * 100_000)

    monkeypatch.setattr(P, "write_predictions", onto_a_full_disk)
    with pytest.raises(WriteError) as e:
        P.write_prediction_set(folder, {("sst", "dev"): (["a", "b"], np.array([3, 4]))}, {"run": "new"})
    assert str(e.value) == f"{folder / 'sst-dev-output.csv'}: No space left on device (the file is unchanged)"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["predictions"]  # no temp folder left


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_plain_text_given_as_a_course_file_names_the_plain_text_flag(earlier, tmp_path, capsys, command):
    """The way on is --text (evaluate: --predict-text), not the course data's --data-dir or download."""
    from training import evaluate, predict

    txt, out = tmp_path / "reviews.txt", tmp_path / "out.csv"
    txt.write_text("the cat sat\nthe mats\n")
    run = str(earlier / "run")
    argv = ([run, "sst", str(txt), str(out)] if command == "predict" else [run, "--predict", "sst", str(txt), str(out)])
    with pytest.raises(SystemExit) as e:
        (predict if command == "predict" else evaluate).main([*argv, "--device", "cpu"])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m training.{command}: error: {txt}: header lacks"), lines
    flag = "--text" if command == "predict" else "--predict-text sst FILE OUT"
    assert lines[0].endswith(f"pass {flag}"), lines[0]
    assert "--data-dir" not in lines[0] and "data.download" not in lines[0]
    assert not out.exists()


def test_a_missing_file_to_predict_is_only_missing(earlier, tmp_path, capsys):
    from training import predict

    missing = tmp_path / "nowhere.csv"
    with pytest.raises(SystemExit):
        predict.main([str(earlier / "run"), "sst", str(missing), str(tmp_path / "o.csv"), "--device", "cpu"])
    assert capsys.readouterr().err.strip().splitlines() == [
        f"python -m training.predict: error: {missing}: no such file"]
