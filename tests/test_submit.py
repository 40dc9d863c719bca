"""python -m training.submit, and the manifest that `python -m training.evaluate --data-dir` writes with
a prediction set: a folder holds one model's files, and a folder that does not is never zipped."""
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from training import evaluate as evaluate_mod
from training.inference.predictions import sha256_of
from training.submit import COURSE_FILES, COURSE_ZIP, REPO, main

pytestmark = pytest.mark.usefixtures("one_thread")

PROG = "python -m training.submit: error: "


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Predictions in the run directory (the trainer's default place), with the trainer's manifest."""
    root = tmp_path_factory.mktemp("submit")
    full, _ = tiny_run(root, "full", epochs=1)
    sst, _ = tiny_run(root, "sst", epochs=1, tasks=("sst",))
    return full, sst


def write_set(cfg, folder: Path, *extra: str, checkpoint=None) -> None:
    assert evaluate_mod.main([str(checkpoint or cfg.out_dir), "--data-dir", cfg.data_dir, "--device",
                              "cpu", "--predictions-dir", str(folder), "--eval-batch-size", "5", "--overwrite",
                              *extra]) == 0


def error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main([*map(str, argv)])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PROG), lines
    return lines[0][len(PROG):]


def test_the_zip_has_the_courses_layout(runs, tmp_path, capsys):
    """The trainer's own set zips as it is; `training.evaluate --data-dir` writes the same set again."""
    full, _ = runs
    run = tmp_path / "run"
    shutil.copytree(full.out_dir, run)
    trainers = json.loads((run / "predictions" / "manifest.json").read_text())
    assert main([str(run)]) == 0
    assert f"wrote {run / COURSE_ZIP}: 6 prediction files of {Path(full.out_dir).resolve()}/best.pt, dev overall " \
        f"{trainers['dev_metrics']['overall']:.4f}" in capsys.readouterr().out
    with zipfile.ZipFile(run / COURSE_ZIP) as z:
        names = z.namelist()
        for name in COURSE_FILES + ["manifest.json"]:
            assert z.read(f"predictions/{name}") == (run / "predictions" / name).read_bytes()
        assert z.read("run_multitask.py") == (REPO / "run_multitask.py").read_bytes()
        assert "training/submit.py" in names and "minbert/model.py" in names
        assert not [n for n in names if "__pycache__" in n or n.startswith("tests/")]
    old = {p.name: p.read_bytes() for p in (run / "predictions").iterdir() if p.name != "manifest.json"}
    write_set(full, run / "predictions", checkpoint=run)
    ours = json.loads((run / "predictions" / "manifest.json").read_text())
    assert {p.name: p.read_bytes() for p in (run / "predictions").iterdir() if p.name != "manifest.json"} == old
    assert ours["config_digest"] == trainers["config_digest"] and ours["dev_metrics"] == trainers["dev_metrics"]
    assert ours["run"] == str(run.resolve()) and ours["checkpoint"] == str((run / "best.pt").resolve())
    assert ours["sha256"] == {n: sha256_of(run / "predictions" / n) for n in COURSE_FILES}
    assert main([str(run), "--no-code", "--zip", str(tmp_path / "only.zip")]) == 0
    with zipfile.ZipFile(tmp_path / "only.zip") as z:
        assert sorted(z.namelist()) == sorted(f"predictions/{n}" for n in COURSE_FILES + ["manifest.json"])
    assert error(capsys, run) == f"{run / COURSE_ZIP}: exists; pass --overwrite to replace it, or --zip another file"
    assert main([str(run), "--overwrite"]) == 0


def test_a_folder_of_two_models_is_refused(runs, tmp_path, capsys):
    full, _ = runs
    folder = tmp_path / "predictions"
    write_set(full, folder)
    (folder / "notes.txt").write_text("not a prediction file: ignored")
    foreign = tmp_path / "other"
    write_set(full, foreign, "--predict-both-orders")  # other similarity scores
    shutil.copy(foreign / "sts-dev-output.csv", folder / "sts-dev-output.csv")  # another set's file, same name
    assert error(capsys, folder) == f"{folder}: sts-dev-output.csv changed since manifest.json was written (another " \
                                    f"run or an edit wrote over them)"
    write_set(full, folder)
    (folder / "para-test-output.csv").unlink()
    shutil.copy(foreign / "sst-dev-output.csv", folder / "sst-dev-copy.csv")  # not a course name: not a prediction
    assert error(capsys, folder).startswith(f"{folder}: the files are not one run's set (missing para-test-output.csv)")
    shutil.copy(foreign / "para-test-output.csv", folder / "para-test-output.csv")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"].remove("para-test-output.csv")  # a set of five, and a sixth file from elsewhere
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert error(capsys, folder).startswith(f"{folder}: the files are not one run's set (not from its manifest: "
                                            f"para-test-output.csv)")
    write_set(full, folder)
    (folder / "manifest.json").unlink()
    assert error(capsys, folder).startswith(f"{folder}: no manifest.json, so nothing says that its files come from "
                                            f"one run; write the set again with python -m training.evaluate")


def test_writing_a_set_replaces_the_folders_earlier_one_as_a_whole(runs, tmp_path, capsys):
    """An sst-only model's predictions into a folder holding a three-task model's: the para and sts files
    go, so the folder never mixes two models; submit then wants --partial for the two files left."""
    full, sst = runs
    folder = tmp_path / "predictions"
    write_set(full, folder)
    with pytest.raises(SystemExit) as e:  # another run's set: refused without --overwrite
        evaluate_mod.main([sst.out_dir, "--data-dir", sst.data_dir, "--device", "cpu",
                           "--predictions-dir", str(folder)])
    assert e.value.code == 2
    assert f"--predictions-dir {folder} holds the run in {Path(full.out_dir).resolve()}" in capsys.readouterr().err
    write_set(sst, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "sst-dev-output.csv", "sst-test-output.csv"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["checkpoint"] == str((Path(sst.out_dir) / "best.pt").resolve())
    assert manifest["sha256"] == {n: sha256_of(folder / n) for n in ("sst-dev-output.csv", "sst-test-output.csv")}
    msg = error(capsys, folder)
    assert msg.startswith(f"{folder}: the course expects all six prediction files; missing para-dev-output.csv, "
                          f"para-test-output.csv, sts-dev-output.csv, sts-test-output.csv")
    assert main([str(folder), "--partial", "--no-code"]) == 0
    with zipfile.ZipFile(tmp_path / COURSE_ZIP) as z:
        assert sorted(z.namelist()) == ["predictions/manifest.json", "predictions/sst-dev-output.csv",
                                        "predictions/sst-test-output.csv"]
    capsys.readouterr()


def test_a_renamed_file_is_caught_by_its_header(runs, tmp_path, capsys):
    full, _ = runs
    folder = tmp_path / "predictions"
    write_set(full, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    # swap two files and their manifest entries: the hashes agree, the headers do not
    a, b = folder / "sst-dev-output.csv", folder / "para-dev-output.csv"
    a_text, b_text = a.read_text(), b.read_text()
    a.write_text(b_text)
    b.write_text(a_text)
    digests = manifest["sha256"]
    digests["sst-dev-output.csv"], digests["para-dev-output.csv"] = digests["para-dev-output.csv"], \
        digests["sst-dev-output.csv"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert error(capsys, folder) in (f"{b}: holds sst predictions (its header) under another task's name",
                                     f"{a}: holds para predictions (its header) under another task's name")
    assert error(capsys, tmp_path / "nothing-here").startswith(f"{tmp_path / 'nothing-here'}: no predictions/ folder")
