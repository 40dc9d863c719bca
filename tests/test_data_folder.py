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
from training.run.config import TrainConfig, validate

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
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("python -m data.download: error: could not download "), lines[0]
    assert "set MINBERT_DATA_DIR" in lines[0] and "ids-sst-train.csv" in lines[0]
    assert list((tmp_path / "d").iterdir()) == []
