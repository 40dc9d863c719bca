"""Issue 43: `--resume auto` on a finished run says the run is complete and exits 0 without building
a model or writing a byte (mtimes included); asked for another --epochs it refuses in one line that
says how to train further; a run with work left (steps, or the prediction files) still does it."""
import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
from tiny_runs import tiny_config

import training.run.trainer
from training.run.trainer import train
from training.train import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def run(tmp_path) -> Path:
    """A finished tiny run of 2 epochs (3 steps each), a checkpoint after every step, the last two kept. Each
    test trains its own: the prediction manifest names its run directory, so a copy would be another run."""
    train(tiny_config(tmp_path, epochs=2, save_every=1, keep_last=2))
    return tmp_path / "run"


def snapshot(d: Path) -> dict:
    """Every path under d (d's parent's entries too) -> content digest, size and mtime in ns."""
    paths = sorted(d.parent.rglob("*"))
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir", p.stat().st_size,
                     p.stat().st_mtime_ns) for p in paths}


def resume(run: Path, *flags: str) -> int:
    # --config: the run's own options (a copy of config.json, so that reading it leaves the run as it was)
    config = run.parent / "same-options.json"
    if not config.exists():
        shutil.copy(run / "config.json", config)
    return main(["--config", str(config), "--resume", "auto", *flags])


def _no_model_may_be_built(monkeypatch):
    def refuse(cfg):
        raise AssertionError("a finished run was built again")
    monkeypatch.setattr(training.run.trainer, "build_model", refuse)


def test_resume_auto_on_a_finished_run_says_so_and_writes_nothing(run, monkeypatch, caplog):
    resume(run, "--device", "cpu")  # the copy file is made; then nothing may change
    before = snapshot(run)
    _no_model_may_be_built(monkeypatch)
    with caplog.at_level(logging.INFO):
        assert resume(run) == 0
    assert snapshot(run) == before
    said = [r.getMessage() for r in caplog.records if "finished run" in r.getMessage()]
    best = json.loads((run / "predictions" / "manifest.json").read_text())["dev_metrics"]
    assert len(said) == 1 and f"{run} holds a finished run (2 epoch(s); best dev" in said[0], said
    assert f"overall {best['overall']:.3f}" in said[0] and "nothing to do, nothing written" in said[0]


def test_settings_that_change_no_output_still_find_it_finished(run, monkeypatch):
    resume(run)
    before = snapshot(run)
    _no_model_may_be_built(monkeypatch)
    assert resume(run, "--keep-last", "5", "--log-every", "7", "--eval-batch-size", "3", "--device", "cpu") == 0
    assert snapshot(run) == before


def test_no_test_predictions_on_a_finished_run_keeps_the_test_files_it_wrote(run, monkeypatch):
    """Asking a finished run for fewer files is nothing to do: its predictions were written again without the
    test files, which were lost."""
    resume(run)
    before = snapshot(run)
    assert len(list((run / "predictions").glob("*-test-output.csv"))) == 3
    _no_model_may_be_built(monkeypatch)
    assert resume(run, "--no-test-predictions") == 0
    assert snapshot(run) == before


def test_more_epochs_on_a_finished_run_is_refused_in_one_line_that_says_how_to_train_further(run, capsys,
                                                                                             monkeypatch):
    resume(run)
    before = snapshot(run)
    _no_model_may_be_built(monkeypatch)
    assert resume(run, "--epochs", "3") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"run_multitask.py: error: --resume auto: {run} holds a finished "
                                               f"run of 2 epoch(s), and --epochs is now 3. "), err
    for words in ("decays linearly to 0", "start a new run with --epochs 3 and another --out-dir",
                  f"python -m training.export {run} DIR", "--model DIR"):
        assert words in err[0], words
    assert snapshot(run) == before


def test_a_run_killed_before_its_predictions_writes_them_on_resume(run):
    expected = {p.name: p.read_bytes() for p in (run / "predictions").iterdir() if p.suffix == ".csv"}
    shutil.rmtree(run / "predictions")
    assert resume(run) == 0
    got = {p.name: p.read_bytes() for p in (run / "predictions").iterdir() if p.suffix == ".csv"}
    assert got == expected and len(got) == 6


def test_a_run_with_steps_left_trains_them(run):
    checkpoints = sorted((run / "checkpoints").glob("step-*.pt"))
    assert [p.name for p in checkpoints] == ["step-0000005.pt", "step-0000006.pt"]
    checkpoints[-1].unlink()  # as if killed before the last step's checkpoint: step 6 is left to train
    metrics = records(run)
    assert resume(run) == 0
    assert (run / "checkpoints" / "step-0000006.pt").is_file()
    assert records(run) == metrics  # step 6 and the last evaluation, written once again


def records(run: Path) -> list[dict]:
    """metrics.jsonl without its timings."""
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_another_epochs_on_a_run_with_steps_left_says_why_too(run, capsys):
    sorted((run / "checkpoints").glob("step-*.pt"))[-1].unlink()
    assert resume(run, "--epochs", "3") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "the checkpoint comes from an incompatible config: --epochs was 2, now 3. A run's " \
                              "learning rate warms up and then decays linearly to 0" in err[0], err


@pytest.mark.parametrize("flags, lost", [
    (["--sst-test", "gone.csv"], "sst-test-output.csv (gone.csv: not found)"),
    (["--no-test-predictions"], "sst-test-output.csv (--no-test-predictions); para-test-output.csv "
                                "(--no-test-predictions); sts-test-output.csv (--no-test-predictions)"),
])
def test_a_finished_run_writing_its_set_again_without_a_test_file_is_refused(run, monkeypatch, capsys, flags, lost):
    """Another --max-eval-examples makes a finished run write its prediction set again, replacing the folder
    whole: the test files it cannot (or is told not to) write again would be lost. Refused in one line, before
    a model is built; --overwrite writes the new set without them."""
    resume(run)
    before = snapshot(run)
    monkeypatch.chdir(run.parent)
    _no_model_may_be_built(monkeypatch)
    assert resume(run, "--max-eval-examples", "5", *flags) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"run_multitask.py: error: --predictions-dir {run / 'predictions'} holds test predictions this "
                   f"resumed run would not write again, and its new set replaces the folder whole: {lost}; give the "
                   f"test file (--data-dir, --sst-test, ...), another --predictions-dir, or --overwrite to lose them"]
    assert contents(snapshot(run)) == contents(before)  # train.log reopened and left as it was: its mtime moves
    monkeypatch.undo()
    monkeypatch.chdir(run.parent)
    assert resume(run, "--max-eval-examples", "5", "--overwrite", *flags) == 0
    manifest = json.loads((run / "predictions" / "manifest.json").read_text())
    assert sorted(manifest["files"]) == sorted(
        ["sst-dev-output.csv", "para-dev-output.csv", "sts-dev-output.csv"]
        + ([] if "--no-test-predictions" in flags else ["para-test-output.csv", "sts-test-output.csv"]))


def contents(snap: dict) -> dict:
    return {path: digest_and_size[:2] for path, digest_and_size in snap.items()}
