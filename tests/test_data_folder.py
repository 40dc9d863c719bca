"""Issue 43: a wrong data folder (a typo in --data-dir, a stale MINBERT_DATA_DIR) is one line, exit
status 2, before any work, naming the folder and where its path came from -- not one line per file.

Each case runs run_multitask.py in a child process: TrainConfig reads MINBERT_DATA_DIR when it is
imported, so only a fresh interpreter sees the environment a user's shell gives it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data.loaders import COURSE_FILES
from training.config.train_config import TrainConfig, validate

REPO = Path(__file__).resolve().parents[1]
PROG = "run_multitask.py: error: "


def _run(tmp_path: Path, *flags: str, env_data_dir: str | None = None) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "MINBERT_DATA_DIR"}
    if env_data_dir is not None:
        env["MINBERT_DATA_DIR"] = env_data_dir
    r = subprocess.run([sys.executable, str(REPO / "run_multitask.py"), "--device", "cpu", "--out-dir",
                        str(tmp_path / "run"), *flags], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stderr.splitlines()


def _course_files(d: Path, leave_out: tuple[str, ...] = ()) -> Path:
    d.mkdir()
    for task in COURSE_FILES.values():
        for name in task.values():
            if name not in leave_out:
                (d / name).write_text("\tid\tsentence\tsentiment\n")  # never read: validation only looks
    return d


def _one_line(rc: int, lines: list[str], tmp_path: Path) -> str:
    assert rc == 2 and len(lines) == 1, lines
    assert not (tmp_path / "run").exists()  # refused before any work: not even the run directory
    assert lines[0].startswith(PROG)
    return lines[0].removeprefix(PROG)


def test_a_missing_data_dir_flag_is_one_line_naming_it(tmp_path):
    typo = str(tmp_path / "dta")
    # a good MINBERT_DATA_DIR beside it does not matter: the flag's folder is the one named
    line = _one_line(*_run(tmp_path, "--data-dir", typo, env_data_dir=str(_course_files(tmp_path / "good"))), tmp_path)
    assert line.startswith(f"--data-dir {typo}: no such folder;"), line
    assert "MINBERT_DATA_DIR)" not in line and "no such file" not in line


def test_a_stale_minbert_data_dir_is_one_line_saying_it_came_from_the_environment(tmp_path):
    stale = str(tmp_path / "moved-away")
    line = _one_line(*_run(tmp_path, env_data_dir=stale), tmp_path)
    assert line.startswith(f"--data-dir {stale} (from $MINBERT_DATA_DIR): no such folder;"), line
    assert "set MINBERT_DATA_DIR" in line


def test_the_default_folder_without_the_files_says_how_to_fetch_them(tmp_path):
    (tmp_path / "data").mkdir()  # a clone's data/ package folder, before `python -m data.download`
    line = _one_line(*_run(tmp_path), tmp_path)
    assert line.startswith("--data-dir data (the default; MINBERT_DATA_DIR is unset): holds none of the files "
                           "the run reads (ids-sst-train.csv, ids-sst-dev.csv, quora-train.csv"), line
    assert "python -m data.download" in line


def test_a_data_dir_from_a_config_file_says_so(tmp_path):
    (tmp_path / "recipe.json").write_text('{"data_dir": "elsewhere", "epochs": 1}')
    line = _one_line(*_run(tmp_path, "--config", "recipe.json"), tmp_path)
    assert line.startswith("--data-dir elsewhere (from data_dir in --config recipe.json): no such folder;"), line


def test_a_folder_lacking_some_files_names_each_missing_file(tmp_path):
    data = _course_files(tmp_path / "d", leave_out=("sts-dev.csv", "quora-train.csv"))
    rc, lines = _run(tmp_path, "--data-dir", str(data))
    assert rc == 2 and sorted(lines) == [
        f"{PROG}{data / 'quora-train.csv'}: no such file (para train); run `python -m data.download` or pass "
        f"--data-dir / --para-train",
        f"{PROG}{data / 'sts-dev.csv'}: no such file (sts dev); run `python -m data.download` or pass --data-dir / "
        f"--sts-dev"], lines


@pytest.mark.parametrize("tasks", [("sst",), ("sst", "para", "sts")])
def test_a_python_caller_gets_the_same_one_line(tmp_path, tasks):
    missing = tmp_path / "nowhere"
    errors = validate(TrainConfig(data_dir=str(missing), tasks=tasks, out_dir=str(tmp_path / "run")))
    assert errors == [f"--data-dir {missing}: no such folder; pass --data-dir the folder that holds the course's "
                      f"CSV files (`python -m data.download --dest DIR` fetches them)"]


def test_files_given_one_by_one_are_checked_alone_and_the_folder_for_the_rest(tmp_path):
    good = _course_files(tmp_path / "good")
    missing = tmp_path / "nowhere"
    files = {f"{t}_{s}": str(good / COURSE_FILES[t][s]) for t in ("sst", "para") for s in ("train", "dev")}
    errors = validate(TrainConfig(data_dir=str(missing), files=files, out_dir=str(tmp_path / "run")))
    assert len(errors) == 1 and errors[0].startswith(f"--data-dir {missing}: no such folder"), errors
    files.update({f"sts_{s}": str(good / COURSE_FILES["sts"][s]) for s in ("train", "dev")})
    assert validate(TrainConfig(data_dir=str(missing), files=files, out_dir=str(tmp_path / "run"))) == []


def test_an_offline_download_is_one_line_naming_minbert_data_dir(tmp_path, monkeypatch, capsys):
    """No network: the one line says what to do instead, put the files in a folder and name it in
    MINBERT_DATA_DIR (which every command reads), and nothing partial is left in DEST."""
    import urllib.error

    from data import download

    def offline(url, timeout):
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    assert download.main(["--dest", str(tmp_path / "d")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("python -m data.download: error: could not download "), lines[0]
    assert "set MINBERT_DATA_DIR" in lines[0] and "ids-sst-train.csv" in lines[0]
    assert list((tmp_path / "d").iterdir()) == []


# ----------------------------------------------------------------------------- one rule for every command

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny finished run (tests/tiny_runs.py), copied by each test that writes into it."""
    from tiny_runs import tiny_run

    cfg, _ = tiny_run(tmp_path_factory.mktemp("trained"), tasks=("sst",), epochs=1)
    return cfg


def _copy_run(cfg, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(cfg.out_dir, tmp_path / "run"))


def _elsewhere(tmp_path: Path, monkeypatch) -> Path:
    """A working directory that is neither the run's nor the data's: nothing may land here."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_the_data_folder_is_the_flag_else_the_environment_else_data(monkeypatch):
    from data.folder import data_folder

    monkeypatch.delenv("MINBERT_DATA_DIR", raising=False)
    assert (data_folder(), data_folder("mine"), TrainConfig().data_dir) == ("data", "mine", "data")
    monkeypatch.setenv("MINBERT_DATA_DIR", "/srv/cs224n")  # set after every import: read when used
    assert (data_folder(), data_folder("mine"), TrainConfig().data_dir) == ("/srv/cs224n", "mine", "/srv/cs224n")


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_evaluate_writes_into_the_run_and_reads_the_data_folder_as_train_does(trained, tmp_path, monkeypatch, how,
                                                                               capsys):
    from training.evaluate import main as evaluate_main

    run, cwd = _copy_run(trained, tmp_path), _elsewhere(tmp_path, monkeypatch)
    (run / "predictions").rename(run / "trainers-predictions")
    monkeypatch.setenv("MINBERT_DATA_DIR", trained.data_dir if how == "environment" else str(tmp_path / "nowhere"))
    flags = ["--data-dir", trained.data_dir] if how == "flag" else []
    assert evaluate_main([str(run), *flags, "--device", "cpu"]) == 0
    assert list(cwd.iterdir()) == []
    assert (run / "predictions" / "sst-dev-output.csv").read_text() == \
        (run / "trainers-predictions" / "sst-dev-output.csv").read_text()
    capsys.readouterr()


def test_evaluate_names_a_missing_default_data_folder_and_where_it_came_from(trained, tmp_path, monkeypatch, capsys):
    from training.evaluate import main as evaluate_main

    _elsewhere(tmp_path, monkeypatch)
    monkeypatch.setenv("MINBERT_DATA_DIR", str(tmp_path / "moved-away"))
    with pytest.raises(SystemExit) as e:
        evaluate_main([trained.out_dir, "--device", "cpu"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"python -m training.evaluate: error: --data-dir {tmp_path / 'moved-away'} (from $MINBERT_DATA_DIR): no "
        f"such folder; set MINBERT_DATA_DIR to the folder that holds the course's CSV files, or pass --data-dir"]


def test_analyze_reads_the_data_folder_of_the_environment_and_writes_into_the_run(trained, tmp_path, monkeypatch,
                                                                                   capsys):
    import json
    import shutil

    from training.analyze import main as analyze_main

    run, cwd = _copy_run(trained, tmp_path), _elsewhere(tmp_path, monkeypatch)
    fewer = Path(shutil.copytree(trained.data_dir, tmp_path / "fewer"))
    dev = fewer / COURSE_FILES["sst"]["dev"]
    dev.write_text("".join(dev.read_text().splitlines(keepends=True)[:6]))  # the header and 5 examples
    monkeypatch.setenv("MINBERT_DATA_DIR", str(fewer))
    step = max((run / "checkpoints").glob("step-*.pt"))
    analyze_main([str(step), "--device", "cpu"])  # exit 2 (after writing) where matplotlib is missing
    results = json.loads((run / "analysis" / "analysis.json").read_text())
    assert results["tasks"]["sst"]["n"] == 5 and results["tasks"]["sst"]["file"] == str(dev)
    assert list(cwd.iterdir()) == [] and not (run / "checkpoints" / "analysis").exists()
    capsys.readouterr()


def test_export_writes_into_the_run_unless_told(trained, tmp_path, monkeypatch, capsys):
    from training.export import main as export_main

    run, cwd = _copy_run(trained, tmp_path), _elsewhere(tmp_path, monkeypatch)
    assert export_main([str(run / "best.pt")]) == 0
    assert (run / "export" / "heads.json").is_file() and list(cwd.iterdir()) == []
    assert export_main([str(run), str(tmp_path / "there")]) == 0
    assert (tmp_path / "there" / "heads.json").is_file()
    capsys.readouterr()


def test_download_writes_where_the_commands_read(tmp_path, monkeypatch, capsys):
    """Without --dest and MINBERT_DATA_DIR, data in the working directory: train's default folder."""
    from data import download

    def offline(url, timeout):
        raise download.urllib.error.URLError("offline")

    monkeypatch.delenv("MINBERT_DATA_DIR", raising=False)
    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    cwd = _elsewhere(tmp_path, monkeypatch)
    assert download.main([]) == 1
    assert [p.name for p in cwd.iterdir()] == ["data"]
    monkeypatch.setenv("MINBERT_DATA_DIR", str(tmp_path / "shared"))
    assert download.main([]) == 1
    assert (tmp_path / "shared").is_dir()
    capsys.readouterr()


def test_ensemble_reads_the_data_folder_of_the_environment(trained, tmp_path, monkeypatch, capsys):
    from training.ensemble import main as ensemble_main

    monkeypatch.setenv("MINBERT_DATA_DIR", str(tmp_path / "moved-away"))
    with pytest.raises(SystemExit) as e:
        ensemble_main([trained.out_dir, trained.out_dir, "--predictions-dir", str(tmp_path / "ens")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().startswith(
        f"python -m training.ensemble: error: --data-dir {tmp_path / 'moved-away'} (from $MINBERT_DATA_DIR): no such "
        f"folder;")
