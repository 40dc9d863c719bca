"""The paths the commands that read a trained model (and stats, report, submit) write: a bad one is one line
naming it, exit status 2, before the model loads; nothing the user or an earlier run wrote is written over
unless asked (--overwrite), and an input never is. One tiny run, its files copied where a test changes them."""
import json
import os
import shutil
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from training import analyze, ensemble, evaluate, export, predict, submit
from training.common.errors import WriteError
from training.experiments import report, stats
from training.inference.predictions import write_prediction_set

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg, _ = tiny_run(tmp_path_factory.mktemp("outputs"), epochs=1)
    return cfg


@pytest.fixture
def here(tmp_path, monkeypatch):
    """tmp_path as the working directory, holding a file of sentences and a folder `o`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sents.txt").write_text("apple river\ntiger honey piano\n")
    (tmp_path / "o").mkdir()
    return tmp_path


@pytest.fixture
def no_model(monkeypatch):
    """The model must not load: each path here is refused before it."""
    import training.api
    import training.results.export

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad path was refused")

    monkeypatch.setattr(training.api, "load", loaded)
    monkeypatch.setattr(training.results.export, "export", loaded)


def error(capsys, command, *argv) -> str:
    """The one line a refusal prints (exit status 2), less the program's name."""
    with pytest.raises(SystemExit) as e:
        command.main([*map(str, argv)])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0].split(": error: ", 1)[1]


def filled(argv, run) -> list[str]:
    """A case's argv with RUN and DATA put in."""
    return [{"RUN": run.out_dir, "DATA": run.data_dir}.get(a, a) for a in argv]


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(folder.rglob("*"))}


# ----------------------------------------------------------------------------- a file as a folder

FOLDER, UNDER = "is a directory, not a file", "sents.txt is a file, not a directory"
CPU = ["--device", "cpu"]


@pytest.mark.parametrize("command,argv,want", [
    (evaluate, ["RUN", "--predictions-dir", "file.txt", "--data-dir", "DATA"], "is a file, not a directory"),
    (ensemble, ["RUN", "--predictions-dir", "file.txt", "--data-dir", "DATA"], "is a file, not a directory"),
    (evaluate, ["RUN", "--predictions-dir", "file.txt/p", "--data-dir", "DATA"],
     "file.txt is a file, not a directory"),
], ids=["evaluate", "ensemble", "evaluate-under-a-file"])
def test_a_file_as_predictions_dir_is_refused_before_the_model_loads_and_kept(run, here, capsys, no_model, command,
                                                                             argv, want):
    """It was moved aside to a hidden .file.txt.old-PID, a folder put in its place, after the inference."""
    (here / "file.txt").write_text("mine\n")
    before = files_of(here)
    assert error(capsys, command, *filled(argv, run), *CPU) == f"--predictions-dir {argv[2]}: {want}"
    assert files_of(here) == before


def test_write_prediction_set_never_moves_a_file_aside(tmp_path):
    """The library's own guard, for a caller that did not check: the file stays, under its own name."""
    mine = tmp_path / "file.txt"
    mine.write_text("mine\n")
    with pytest.raises(WriteError, match="is a file, not a directory"):
        write_prediction_set(mine, {}, {"run": "x"})
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"] and mine.read_text() == "mine\n"


# ----------------------------------------------------------------------------- OUT over an input or a file

SAME = "is an input of this command too: the predictions would be written over it; name another OUT"


@pytest.mark.parametrize("out", ["keep.txt", "sub/../keep.txt", "ABSOLUTE", "hard.txt"])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["", "overwrite"])
@pytest.mark.parametrize("command", [predict, evaluate], ids=["predict", "evaluate"])
def test_out_is_never_the_input(run, here, capsys, no_model, command, overwrite, out):
    """Not under another spelling (`..`, absolute), nor a hard link to it; not with --overwrite either."""
    (here / "keep.txt").write_text("apple river\n")
    (here / "sub").mkdir()
    os.link(here / "keep.txt", here / "hard.txt")
    out = str(here / "keep.txt") if out == "ABSOLUTE" else out
    before = files_of(here)
    if command is predict:
        assert error(capsys, predict, run.out_dir, "sst", "keep.txt", out, "--text", *overwrite) == f"OUT {out}: {SAME}"
    else:
        assert error(capsys, evaluate, run.out_dir, "--predict-text", "sst", "keep.txt", out, *overwrite) == \
            f"--predict-text OUT {out}: {SAME}"
    assert files_of(here) == before


@pytest.mark.parametrize("argv,want", [
    (["--predict-text", "sst", "sents.txt", "a.tsv", "--predict-text", "sst", "keep.txt", "sents.txt"],
     f"--predict-text OUT sents.txt: {SAME}"),
    (["--predict", "sst", "keep.txt", "a.tsv", "--score", "sst", "sents.txt", "--predict", "sst", "b", "sents.txt"],
     f"--predict OUT sents.txt: {SAME}"),
    (["--predict-text", "sst", "sents.txt", "a.tsv", "--predict-text", "sts", "keep.txt", "a.tsv"],
     "--predict-text OUT a.tsv: is given as OUT twice: the second predictions would be written over the first"),
    (["--data-dir", "DATA", "--predictions-dir", "p", "--predict", "sst", "sents.txt", "DEV", "--overwrite"],
     f"--predict OUT DEV: {SAME}"),
], ids=["another-input", "a-scored-file", "out-twice", "a-course-file"])
def test_evaluates_out_is_no_input_of_the_command_nor_another_out(run, here, capsys, no_model, argv, want):
    (here / "keep.txt").write_text("apple river\n")
    dev = str(Path(run.data_dir) / "ids-sst-dev.csv")
    before, data = files_of(here), files_of(Path(run.data_dir))
    argv = [dev if a == "DEV" else a for a in filled(argv, run)]
    assert error(capsys, evaluate, run.out_dir, *argv) == want.replace("DEV", dev)
    assert files_of(here) == before and files_of(Path(run.data_dir)) == data


def test_evaluate_keeps_the_test_predictions_a_data_folder_without_test_files_cannot_write_again(run, tmp_path,
                                                                                                   capsys, no_model):
    """The run's predictions/ is replaced as a whole: a --data-dir lacking a test file lost its test predictions."""
    data = tmp_path / "data"
    shutil.copytree(run.data_dir, data)
    (data / "sts-test-student.csv").unlink()
    folder = tmp_path / "p"
    shutil.copytree(Path(run.out_dir) / "predictions", folder)
    before = files_of(folder)
    assert error(capsys, evaluate, run.out_dir, "--data-dir", data, "--predictions-dir", folder) == (
        f"--predictions-dir {folder} holds sts-test-output.csv, and {data} lacks the test file behind it: the new "
        f"set would lose it; pass --overwrite, or another --predictions-dir")
    assert files_of(folder) == before


def test_ensemble_keeps_the_test_predictions_a_data_folder_without_test_files_cannot_write_again(run, tmp_path,
                                                                                                 capsys):
    data, folder = tmp_path / "data", tmp_path / "p"
    shutil.copytree(run.data_dir, data)
    assert ensemble.main([run.out_dir, "--data-dir", str(data), "--predictions-dir", str(folder), *CPU]) == 0
    (data / "ids-sst-test-student.csv").unlink()
    (data / "quora-test-student.csv").unlink()
    before = files_of(folder)
    capsys.readouterr()
    assert error(capsys, ensemble, run.out_dir, "--data-dir", data, "--predictions-dir", folder, *CPU) == (
        f"--predictions-dir {folder} holds sst-test-output.csv, para-test-output.csv, and {data} lacks the test file "
        f"behind each: the new set would lose them; pass --overwrite, or another --predictions-dir")
    assert files_of(folder) == before


@pytest.mark.parametrize("command", [predict, evaluate], ids=["predict", "evaluate"])
def test_an_existing_out_is_replaced_only_with_overwrite(run, here, capsys, monkeypatch, command):
    (here / "out.tsv").write_text("mine\n")
    exists = "exists; pass --overwrite to replace it, or name another OUT"
    argv = ([run.out_dir, "sst", "sents.txt", "out.tsv", "--text"] if command is predict
            else [run.out_dir, "--predict-text", "sst", "sents.txt", "out.tsv"])
    with monkeypatch.context() as m:
        import training.api
        m.setattr(training.api, "load", lambda *a, **k: pytest.fail("the model was loaded"))
        flag = "" if command is predict else "--predict-text "
        assert error(capsys, command, *argv) == f"{flag}OUT out.tsv: {exists}"
    assert (here / "out.tsv").read_text() == "mine\n"
    assert command.main([*argv, "--overwrite", *CPU]) == 0
    assert (here / "out.tsv").read_text().startswith("id\tsentence\tlabel\n")
    capsys.readouterr()


# ----------------------------------------------------------------------------- bad output paths, up front

ENSEMBLE = ["RUN", "RUN", "--predictions-dir", "o/e", "--data-dir", "DATA"]


@pytest.mark.parametrize("command,argv,want", [
    (predict, ["RUN", "sst", "sents.txt", "o", "--text", *CPU], f"OUT o: {FOLDER}"),
    (predict, ["RUN", "sst", "sents.txt", "sents.txt/x.tsv", "--text", *CPU], f"OUT sents.txt/x.tsv: {UNDER}"),
    (evaluate, ["RUN", "--predict-text", "sst", "sents.txt", "o", *CPU], f"--predict-text OUT o: {FOLDER}"),
    (evaluate, ["RUN", "--predict", "sst", "sents.txt", "sents.txt/x.csv", *CPU],
     f"--predict OUT sents.txt/x.csv: {UNDER}"),
    (ensemble, [*ENSEMBLE, "--json", "o", *CPU], f"--json o: {FOLDER}"),
    (ensemble, [*ENSEMBLE, "--json", "sents.txt/x.json", *CPU], f"--json sents.txt/x.json: {UNDER}"),
    (export, ["RUN", "sents.txt/sub"], f"OUT_DIR sents.txt/sub: {UNDER}"),
    (analyze, ["RUN", "--out", "sents.txt", *CPU], "--out sents.txt: is a file, not a directory"),
    (analyze, ["RUN", "--out", "sents.txt/sub", *CPU], f"--out sents.txt/sub: {UNDER}"),
], ids=["predict-folder", "predict-under-a-file", "evaluate-folder", "evaluate-under-a-file", "ensemble-json-folder",
        "ensemble-json-under-a-file", "export-under-a-file", "analyze-a-file", "analyze-under-a-file"])
def test_a_bad_output_path_is_one_line_before_the_model_loads(run, here, capsys, no_model, command, argv, want):
    before = files_of(here)
    assert error(capsys, command, *filled(argv, run)) == want
    assert files_of(here) == before


@pytest.mark.parametrize("command,argv,want", [
    (submit, ["RUN", "--zip", "zipdir", "--overwrite", "--no-code"], f"zipdir: {FOLDER}"),
    (submit, ["RUN", "--zip", "sents.txt/x.zip", "--no-code"], f"sents.txt/x.zip: {UNDER}"),
    (stats, ["RUN", "--vs", "RUN", "--json", "o"], f"--json o: {FOLDER}"),
    (stats, ["RUN", "--vs", "RUN", "--json", "sents.txt/x.json"], f"--json sents.txt/x.json: {UNDER}"),
    (report, ["--compare", "RUN", "RUN", "--csv", "o"], f"--csv o: {FOLDER}"),
    (report, ["--compare", "RUN", "RUN", "--csv", "sents.txt/x.csv"], f"--csv sents.txt/x.csv: {UNDER}"),
    (report, ["--curves", "RUN", "-o", "sents.txt/x.png"], f"-o sents.txt/x.png: {UNDER}"),
    (report, ["--compare", "RUN", "RUN", "-o", "sents.txt/x.png"], f"-o sents.txt/x.png: {UNDER}"),
], ids=["submit-folder", "submit-under-a-file", "stats-folder", "stats-under-a-file", "compare-csv-folder",
        "compare-csv-under-a-file", "curves-under-a-file", "compare-figure-under-a-file"])
def test_a_bad_output_path_of_submit_stats_and_report_is_one_line(run, here, capsys, command, argv, want):
    (here / "zipdir").mkdir()
    before = files_of(here)
    assert error(capsys, command, *filled(argv, run)) == want
    assert files_of(here) == before


# ----------------------------------------------------------------------------- every ensemble member first


def test_a_bad_ensemble_member_is_refused_before_any_member_predicts(run, here, capsys, monkeypatch):
    """The second member's best.pt cut short: found before the first one predicted every dev and test set."""
    bad = here / "bad"
    shutil.copytree(run.out_dir, bad)
    data = (bad / "best.pt").read_bytes()
    (bad / "best.pt").write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(ensemble, "member_probabilities",
                        lambda *a: pytest.fail("a member predicted before every member was checked"))
    line = error(capsys, ensemble, run.out_dir, bad, "--data-dir", run.data_dir, "--predictions-dir", "ens", *CPU)
    assert line.startswith(f"{bad / 'best.pt'}: cannot read the checkpoint: not a torch.save archive, or one cut short")
    assert not (here / "ens").exists()


# ----------------------------------------------------------------------------- report's figures


def test_report_says_the_figure_it_wrote(run, here, capsys):
    """-o o, o a folder: matplotlib writes o.png (as for any name without a suffix), and the line says so."""
    pytest.importorskip("matplotlib")
    assert report.main(["--curves", run.out_dir, "-o", "o"]) == 0
    assert capsys.readouterr().out == "wrote o.png\n" and (here / "o.png").stat().st_size > 0
    assert error(capsys, report, "--curves", run.out_dir, "-o", "curves.txt").startswith(
        "-o curves.txt: matplotlib draws no .txt files (it draws ")
    assert not (here / "curves.txt").exists()


def test_report_refuses_curves_of_nothing_as_stats_does(run, here, capsys):
    pytest.importorskip("matplotlib")
    empty = here / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    assert error(capsys, report, "--curves", empty) == \
        f"{empty / 'metrics.jsonl'}: no training loss and no dev evaluation recorded (yet): nothing to draw"
    assert error(capsys, stats, run.out_dir, "--vs", empty) == f"{empty / 'metrics.jsonl'}: no dev evaluation"
    assert not (empty / "curves.png").exists()


# ----------------------------------------------------------------------------- a summary file that exists

EXISTS = "exists; pass --overwrite to replace it, or name another"


@pytest.mark.parametrize("command,argv,flag,name", [
    (stats, ["RUN", "--vs", "RUN"], "--json", "file"),
    (ensemble, ["RUN", "RUN", "--predictions-dir", "e", "--data-dir", "DATA", *CPU], "--json", "file"),
    (report, ["--compare", "RUN", "RUN"], "--csv", "file"),
    (report, ["--compare", "RUN", "RUN"], "-o", "figure"),
    (report, ["--curves", "RUN"], "-o", "figure"),
], ids=["stats-json", "ensemble-json", "compare-csv", "compare-figure", "curves-figure"])
def test_a_named_file_that_exists_is_replaced_only_with_overwrite(run, here, capsys, monkeypatch, command, argv,
                                                                   flag, name):
    """It may be an earlier summary, or anything else (a run's metrics.jsonl): the command asks, as predict and
    submit do, before the runs are read or a model loads."""
    if flag == "-o":
        pytest.importorskip("matplotlib")
    mine = here / ("mine.png" if flag == "-o" else "mine.txt")
    mine.write_bytes(b"mine\n")
    argv = [*filled(argv, run), flag, mine.name]
    with monkeypatch.context() as m:
        import training.api
        m.setattr(training.api, "load", lambda *a, **k: pytest.fail("the model was loaded"))
        assert error(capsys, command, *argv) == f"{flag} {mine.name}: {EXISTS} {name}"
    assert mine.read_bytes() == b"mine\n"
    assert command.main([*argv, "--overwrite"]) == 0
    assert mine.read_bytes() != b"mine\n" and mine.stat().st_size > 0
    capsys.readouterr()


def test_a_runs_own_curves_figure_is_drawn_again_without_overwrite(run, here, capsys):
    pytest.importorskip("matplotlib")
    own = here / "own"
    shutil.copytree(run.out_dir, own)
    for _ in range(2):
        assert report.main(["--curves", str(own)]) == 0
        assert capsys.readouterr().out == f"wrote {own / 'curves.png'}\n"


def test_analyze_replaces_its_own_analysis_and_asks_before_another_models(run, here, capsys):
    """A run's best.pt and its checkpoints share RUN/analysis by default: analysing a checkpoint there would
    replace best.pt's analysis without a word."""
    pytest.importorskip("matplotlib")
    own = here / "own"
    shutil.copytree(run.out_dir, own)
    step = sorted((own / "checkpoints").glob("step-*.pt"))[-1]
    data = ["--data-dir", str(run.data_dir)]
    for _ in range(2):  # the same model's analysis: written again
        assert analyze.main([str(own), *data, *CPU]) == 0
    before = files_of(own / "analysis")
    assert error(capsys, analyze, step, *data, *CPU) == (
        f"--out {own / 'analysis'}: holds the analysis of {own / 'best.pt'}; pass --overwrite to replace it, or "
        f"another --out")
    assert files_of(own / "analysis") == before
    (here / "theirs").mkdir()
    (here / "theirs" / "analysis.md").write_text("mine\n")
    assert error(capsys, analyze, own, "--out", "theirs", *data, *CPU) == \
        "--out theirs: holds analysis.md; pass --overwrite to replace it, or another --out"
    assert analyze.main([str(step), "--overwrite", *data, *CPU]) == 0
    assert json.loads((own / "analysis" / "analysis.json").read_text())["source"] == str(step)
    capsys.readouterr()
