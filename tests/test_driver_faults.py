"""The experiment drivers (training.experiments: the sweep's workers, the study, the search) under kills and bad
state (issue 44): what a worker killed between recording a run and cleaning it up leaves, stop signals
at given points of a run's or a trial's life (sent by the process to itself from a hook, so that the
moment is exact), recipes and folders refused before training, a record the disk cannot take, and a
torn or damaged search journal. Each test failed on the code before the fix; docs/guarantees.md lists
them. Subprocess tests run a driver with one function wrapped (PROBE scripts), on the tiny model and
data of tests/tiny_runs.py."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_runs
from test_bad_input import read_only

from training.experiments.study import cli as C
from training.experiments.study.recipe import load_recipe
from training.experiments.sweep import cli as sweep_cli
from training.experiments.sweep import engine
from training.experiments.sweep import measure as measure_mod
from training.experiments.sweep import records as sweep_records

ROOT = Path(__file__).parents[1]
TRAIN = {"epochs": 1, "batch_size": 4, "lr": 1e-3, "device": "cpu", "precision": "fp32"}


def recipe_argv(tmp_path, seeds=(1, 2), **over) -> list[str]:
    """A study of len(seeds) runs (full fine-tuning, 6 examples per task), trained in this process."""
    data, enc = tiny_runs.inputs(tmp_path)
    raw = {"title": "t", "kind": "depth", "results": str(tmp_path / "results"), "report": str(tmp_path / "report"),
           "tasks": ["sst"], "depths": ["none"], "sizes": [6], "seeds": list(seeds), "train": TRAIN, **over}
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(raw))
    return [str(path), "--model", str(enc), "--data-dir", str(data), "--in-process", "--threads", "1",
            "--runs-dir", str(tmp_path / "runs")]


def run_probe(script: str, argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """`script` (which wraps a function of a driver, then calls it) in a fresh Python, with argv."""
    return subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})


def counting_measure(monkeypatch) -> list[str]:
    """measure_mod.measure wrapped to note the runs it trains."""
    trained, real = [], measure_mod.measure

    def measure(cfg, threads=None):
        trained.append(Path(cfg.out_dir).name)
        return real(cfg, threads)
    monkeypatch.setattr(engine, "measure", measure)
    return trained


def one_line_error(err: str, code: int, rc: int) -> str:
    assert rc == code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# ----------------------------------------------------------------------------- 1: killed after the record

DIE_AFTER_FIRST_RECORD = """
import os, sys
from training.experiments.sweep import engine
from training.experiments.study import cli as C
real = engine.append_result
def append_then_die(path, record):  # SIGKILL right after the record is on disk: no `finally` runs
    real(path, record)
    os._exit(9)
engine.append_result = append_then_die
sys.exit(C.main(sys.argv[1:]))
"""


def test_a_worker_killed_after_recording_a_run_leaves_nothing_once_another_starts(tmp_path, monkeypatch):
    argv = recipe_argv(tmp_path)
    p = run_probe(DIE_AFTER_FIRST_RECORD, argv)
    assert p.returncode == 9, p.stderr
    first = load_recipe(argv[0]).resolve(2).plan([])[0].name
    run = tmp_path / "runs" / first
    assert (run / "best.pt").is_file() and (run / "checkpoints").is_dir()  # what the kill left
    assert (tmp_path / "runs" / f".{first}.lock").is_file()
    trained = counting_measure(monkeypatch)
    assert C.main(argv) == 0
    assert first not in trained and len(trained) == 1  # recorded: not trained again
    assert not list((tmp_path / "runs").glob(".*.lock"))
    for d in (tmp_path / "runs").glob("sst-*"):
        assert not (d / "best.pt").exists() and not (d / "checkpoints").exists(), d
        assert (d / "metrics.jsonl").is_file()  # the logs and metrics stay
    records = sweep_records.read_results(tmp_path / "results" / sweep_records.RESULTS)
    assert sorted(sweep_records.RunKey.of(r).name for r in records) == sorted([first, *trained])


def test_keep_checkpoints_keeps_them_after_a_kill_too(tmp_path):
    argv = recipe_argv(tmp_path, seeds=(1,))
    assert run_probe(DIE_AFTER_FIRST_RECORD, argv + ["--keep-checkpoints"]).returncode == 9
    assert C.main(argv + ["--keep-checkpoints"]) == 0
    run = next((tmp_path / "runs").glob("sst-*"))
    assert (run / "best.pt").is_file() and not list((tmp_path / "runs").glob(".*.lock"))


def test_a_run_another_worker_recorded_meanwhile_is_not_claimed(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    runs.mkdir()
    out.mkdir()
    a, b = sweep_records.RunKey("sst", None, 6, 1), sweep_records.RunKey("sst", None, 6, 2)
    # read before another worker finished a, claimed after it released a's lock
    sweep_records.append_result(out / sweep_records.RESULTS, {**a.to_dict(), "dev": {}})
    busy = set()
    assert engine.claim_next(runs, [a, b], busy, out / sweep_records.RESULTS) == b
    assert not (runs / f".{a.name}.lock").exists() and (runs / f".{b.name}.lock").is_file()


# ----------------------------------------------------------------------------- 5-7: refused before training

def test_a_recipe_seed_numpy_cannot_take_is_one_line_before_training(tmp_path, capsys, monkeypatch):
    argv = recipe_argv(tmp_path, seeds=(1, -1))
    trained = counting_measure(monkeypatch)
    rc = C.main(argv)
    err = one_line_error(capsys.readouterr().err, 2, rc)
    assert err.startswith(f"python -m training.experiments.study: error: {argv[0]}: seeds must be in [0, 2**32)")
    assert "-1" in err
    assert trained == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("over, says", [
    ({"lr_grid": {"lrs": [0.001], "tuning_seeds": [-1]}}, "lr_grid.tuning_seeds must be in [0, 2**32)"),
    ({"tuning_split": {"share": 0.25, "seed": 2**32}}, "tuning_split.seed must be in [0, 2**32)"),
    ({"lr_grid": {"lrs": [float("inf")], "tuning_seeds": [7]}}, "lr_grid must be"),  # json writes Infinity
])
def test_an_arms_recipes_other_seeds_and_rates_are_checked_too(tmp_path, capsys, over, says):
    from test_study_protocol import arms_recipe
    path = arms_recipe(tmp_path, **over)
    rc = C.main([str(path), "--dry-run"])
    err = one_line_error(capsys.readouterr().err, 2, rc)
    assert str(path) in err and says in err, err


def test_recipe_sizes_past_the_data_name_the_recipe_not_a_flag(tmp_path, capsys):
    argv = recipe_argv(tmp_path, sizes=[100])
    rc = C.main(argv)
    err = one_line_error(capsys.readouterr().err, 2, rc)
    assert f"{argv[0]}: sizes 100: sst has only {tiny_runs.N} training examples" in err and "--sizes" not in err


@pytest.mark.parametrize("folder, names", [("runs", "--runs-dir"), ("results", "recipe.json: results"),
                                           ("report", "recipe.json: report")])
def test_a_read_only_folder_is_one_line_before_training(tmp_path, capsys, monkeypatch, folder, names):
    argv = recipe_argv(tmp_path, seeds=(1,))
    (tmp_path / folder).mkdir()
    trained = counting_measure(monkeypatch)
    with read_only(tmp_path / folder):
        rc = C.main(argv)
    err = one_line_error(capsys.readouterr().err, 2, rc)
    assert f"{names} {tmp_path / folder}: not writable" in err
    assert trained == [] and not (tmp_path / "results" / sweep_records.RESULTS).exists()


def test_a_read_only_sweep_out_is_one_line_before_training(tmp_path, capsys):
    data, enc = tiny_runs.inputs(tmp_path)
    (tmp_path / "out").mkdir()
    with read_only(tmp_path / "out"):
        rc = sweep_cli.main(["--tasks", "sst", "--depths", "none", "--sizes", "6", "--seeds", "1",
                             "--data-dir", str(data), "--model", str(enc), "--out", str(tmp_path / "out"),
                             "--runs-dir", str(tmp_path / "runs"), "--epochs", "1", "--in-process"])
    err = one_line_error(capsys.readouterr().err, 2, rc)
    assert f"--out {tmp_path / 'out'}: not writable" in err and not (tmp_path / "runs").exists()


def test_a_full_disk_at_the_record_keeps_the_run_and_the_next_start_records_it_untrained(tmp_path, capsys,
                                                                                        monkeypatch):
    argv = recipe_argv(tmp_path, seeds=(1,))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / sweep_records.RESULTS).symlink_to("/dev/full")  # every write: ENOSPC, a real one
    assert C.main(argv) == 1
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and line.startswith("training.experiments.sweep: error: ")
    run = next((tmp_path / "runs").glob("sst-*"))
    assert "No space left on device" in line and str(run / engine.KEPT) in line and "without training" in line
    kept = json.loads((run / engine.KEPT).read_text())["record"]
    assert (run / "best.pt").is_file() and kept["run_dir"] == str(run)
    (tmp_path / "results" / sweep_records.RESULTS).unlink()  # room again
    trained = counting_measure(monkeypatch)
    assert C.main(argv) == 0
    assert trained == []
    assert sweep_records.read_results(tmp_path / "results" / sweep_records.RESULTS) == [kept]
    assert not (run / engine.KEPT).exists() and not (run / "best.pt").exists()


def test_a_write_that_fails_part_way_is_cut_off_again(tmp_path, monkeypatch):
    path = tmp_path / sweep_records.RESULTS
    sweep_records.append_result(path, {"a": 1})
    real = os.write

    def half_then_full(fd, data):  # the disk fills in the middle of the line
        real(fd, bytes(data[:5]))
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        sweep_records.append_result(path, {"b": 2})
    assert path.read_text() == '{"a": 1}\n'


# ----------------------------------------------------------------------------- 2-4: signals

STUDY_SIGTERM_IN_A_WEAKREF_CALLBACK = """
import os, signal, sys, weakref
from training.experiments.sweep import engine
from training.experiments.study import cli as C
real = engine.append_result
class Thing: pass
def append_then_signal(path, record):
    real(path, record)
    def callback(ref):  # the handler runs here, inside a weakref callback, where exceptions are dropped
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing
engine.append_result = append_then_signal
sys.exit(C.main(sys.argv[1:]))
"""


def test_a_study_signalled_inside_a_weakref_callback_stops_after_the_run(tmp_path):
    argv = recipe_argv(tmp_path, seeds=(1, 2, 3))
    p = run_probe(STUDY_SIGTERM_IN_A_WEAKREF_CALLBACK, argv)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr
    assert any(x.startswith("training.experiments.sweep: stopped by SIGTERM (1 run(s) finished")
               for x in p.stderr.splitlines())
    assert len(sweep_records.read_results(tmp_path / "results" / sweep_records.RESULTS)) == 1
    assert not list((tmp_path / "runs").glob(".*.lock"))


STUDY_TWO_SIGNALS_AFTER_THE_FIRST_RUN = """
import os, signal, sys
from training.experiments.sweep import engine
from training.experiments.study import cli as C
real = engine.append_result
def append_then_two_signals(path, record):
    real(path, record)
    os.kill(os.getpid(), signal.SIGINT)  # the first asks to stop after this run
    for _ in range(1000):
        pass
    os.kill(os.getpid(), signal.SIGTERM)  # the second stops at once
    for _ in range(1000):
        pass
    raise AssertionError("still running after the second signal")
engine.append_result = append_then_two_signals
sys.exit(C.main(sys.argv[1:]))
"""


def test_a_second_signal_stops_the_worker_at_once_and_releases_its_claim(tmp_path):
    argv = recipe_argv(tmp_path, seeds=(1, 2))
    p = run_probe(STUDY_TWO_SIGNALS_AFTER_THE_FIRST_RUN, argv)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert "Traceback" not in p.stderr and "still running" not in p.stderr
    assert "SIGINT received: stopping after the current run" in p.stderr
    assert "stopped by" not in p.stderr  # not after the run: at once, before its clean-up
    assert len(sweep_records.read_results(tmp_path / "results" / sweep_records.RESULTS)) == 1
    assert not list((tmp_path / "runs").glob(".*.lock"))  # its `finally` ran, and cleaned the recorded run
    assert (not list((tmp_path / "runs").glob("sst-*/best.pt"))
            and not list((tmp_path / "runs").glob("sst-*/checkpoints")))


SWEEP_SIGTERM_AS_ITS_CHILD_STARTS = """
import os, signal, sys
import multiprocessing.context as mc
from training.experiments.study import cli as C
real = mc.SpawnProcess.start
def start_then_signal(self):  # the worker signalled while its training process starts
    real(self)
    os.kill(os.getpid(), signal.SIGTERM)
mc.SpawnProcess.start = start_then_signal
sys.exit(C.main(sys.argv[1:]))
"""


def test_a_signal_to_a_worker_stops_its_training_process_and_the_worker(tmp_path):
    argv = [a for a in recipe_argv(tmp_path) if a != "--in-process"]
    p = run_probe(SWEEP_SIGTERM_AS_ITS_CHILD_STARTS, argv)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert "Traceback" not in p.stderr
    assert any(x.startswith("training.experiments.sweep: stopped by SIGTERM (0 run(s) finished")
               for x in p.stderr.splitlines())
    assert (not (tmp_path / "results" / sweep_records.RESULTS).exists()
            or not sweep_records.read_results(tmp_path / "results" / sweep_records.RESULTS))
    assert not list((tmp_path / "runs").glob(".*.lock"))


optuna = pytest.importorskip("optuna", reason="the [search] extra (in [test]) is not installed")
from training.experiments.search import cli as SC  # noqa: E402 - after the skip
from training.experiments.search import engine as E  # noqa: E402

SEARCH_SIGNALS_AT_EVALUATION = """
import os, signal, sys
from training.experiments.search import cli, engine
real, which = engine.train, int(os.environ["SIGNAL_AT_EVALUATION"])
def train(cfg, on_evaluation=None):
    count = []
    def report(record):
        on_evaluation(record)
        count.append(1)
        if len(count) == which:
            for name in os.environ.get("SIGNALS", "TERM").split(","):
                os.kill(os.getpid(), getattr(signal, "SIG" + name))
                for _ in range(1000):  # the handler runs here
                    pass
    return real(cfg, on_evaluation=report)
engine.train = train
sys.exit(cli.main(sys.argv[1:]))
"""


SEARCH_FIXED = {k: v for k, v in TRAIN.items() if k != "lr"}  # lr is searched


def space_argv(tmp_path, epochs=1, trials=3, **over) -> list[str]:
    data, enc = tiny_runs.inputs(tmp_path)
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"objective": "overall", "trials": trials, "sampler": "random", "pruner": "none",
                                 "fixed": {**SEARCH_FIXED, "epochs": epochs},
                                 "params": {"lr": {"low": 1e-4, "high": 1e-2}},
                                 **over}))
    return [str(space), "--out", str(tmp_path / "out"), "--data-dir", str(data), "--model", str(enc), "--threads",
            "1", "--sampler-seed", "7"]


def journal_trials(tmp_path):
    from optuna.storages.journal import JournalFileBackend, JournalStorage
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "out" / E.JOURNAL)))
    return optuna.load_study(study_name="space", storage=storage).get_trials()


def search_probe(tmp_path, at_evaluation: int, epochs: int, signals: str = "TERM"):
    return subprocess.run([sys.executable, "-c", SEARCH_SIGNALS_AT_EVALUATION, *space_argv(tmp_path, epochs)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SIGNAL_AT_EVALUATION": str(at_evaluation), "SIGNALS": signals})


def test_a_search_signalled_after_a_trials_last_evaluation_stops_after_that_trial(tmp_path):
    p = search_probe(tmp_path, at_evaluation=1, epochs=1)  # no step left to stop after
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("python -m training.experiments.search: stopped by SIGTERM")
    assert [t.state.name for t in journal_trials(tmp_path)] == ["COMPLETE"]


def test_a_search_signalled_mid_training_fails_the_trial_with_the_signals_status(tmp_path):
    p = search_probe(tmp_path, at_evaluation=1, epochs=2)  # stops after the next step, in epoch 2
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("python -m training.experiments.search: stopped by SIGTERM")
    assert [t.state.name for t in journal_trials(tmp_path)] == ["FAIL"]
    assert SC.main(space_argv(tmp_path, epochs=2, trials=1)) == 0  # its place is run again
    assert [t.state.name for t in journal_trials(tmp_path)] == ["FAIL", "COMPLETE"]


def test_a_second_ctrl_c_stops_a_search_trial_at_once_without_a_traceback(tmp_path):
    p = search_probe(tmp_path, at_evaluation=1, epochs=2, signals="INT,INT")
    assert p.returncode == 128 + signal.SIGINT, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("python -m training.experiments.search: stopped by SIGINT")
    assert [t.state.name for t in journal_trials(tmp_path)] == ["FAIL"]
    assert "epoch 1" not in p.stderr  # stopped in the first evaluation's hook, not after a step of the next epoch


def test_a_trial_whose_worker_died_before_naming_itself_is_reaped(tmp_path):
    from optuna.storages.journal import JournalFileBackend, JournalStorage
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "j")))
    study = optuna.create_study(storage=storage, study_name="s")
    study.ask()  # killed right after asking: no worker attribute
    assert E.reap_dead(optuna, study) == []  # a worker may be about to set it
    assert E.reap_dead(optuna, study, orphan_after=0.0) == [0]
    assert study.get_trials()[0].state.name == "FAIL"


# ----------------------------------------------------------------------------- 8-9: the search journal

@pytest.fixture(scope="module")
def one_trial_journal(tmp_path_factory) -> bytes:
    """The journal of a finished one-trial search."""
    root = tmp_path_factory.mktemp("journal")
    assert SC.main(space_argv(root, trials=1)) == 0
    return (root / "out" / E.JOURNAL).read_bytes()


def with_journal(tmp_path, data: bytes) -> Path:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / E.JOURNAL).write_bytes(data)
    return tmp_path / "out" / E.JOURNAL


def test_a_journal_torn_mid_line_is_cut_and_the_search_goes_on(tmp_path, one_trial_journal, caplog):
    last = one_trial_journal.splitlines(keepends=True)[-1]
    journal = with_journal(tmp_path, one_trial_journal + last[:len(last) // 2])  # a full disk mid-append
    with caplog.at_level("WARNING"):
        assert SC.main(space_argv(tmp_path, trials=2)) == 0
    assert f"{journal}: ignoring a partial last line" in caplog.text
    assert [t.state.name for t in journal_trials(tmp_path)] == ["COMPLETE", "COMPLETE"]
    assert all(json.loads(line) for line in journal.read_bytes().splitlines())


def test_an_append_after_a_torn_line_starts_on_a_line_of_its_own(tmp_path, one_trial_journal):
    journal = with_journal(tmp_path, one_trial_journal + b'{"op_code": 4, "worker')
    E.mending_journal(journal).append_logs([{"op_code": 0, "study_name": "x"}])
    assert journal.read_bytes() == one_trial_journal + b'{"op_code":0,"study_name":"x"}\n'


def test_a_damaged_journal_line_is_one_line_then_repairable(tmp_path, one_trial_journal, capsys):
    lines = one_trial_journal.splitlines(keepends=True)
    journal = with_journal(tmp_path, b"".join(lines[:3]) + b"\x00garbage\n" + b"".join(lines[3:]))
    rc = SC.main(space_argv(tmp_path, trials=1))
    err = one_line_error(capsys.readouterr().err, 2, rc)
    assert f"{journal}:4: not an Optuna journal entry" in err and "--repair-journal" in err
    assert SC.main(space_argv(tmp_path, trials=2) + ["--repair-journal"]) == 0
    copy, = journal.parent.glob(f"{E.JOURNAL}.damaged-*")
    assert copy.read_bytes() == b"".join(lines[:3]) + b"\x00garbage\n" + b"".join(lines[3:])
    assert journal.read_bytes().startswith(b"".join(lines[:3]))
    states = [t.state.name for t in journal_trials(tmp_path)]
    assert len(states) == 2 and states[-1] == "COMPLETE"  # the search went on from the 3 entries kept


def test_a_read_only_search_out_is_one_line_before_any_trial(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    with read_only(tmp_path / "out"):
        rc = SC.main(space_argv(tmp_path, trials=1))
    err = one_line_error(capsys.readouterr().err, 2, rc)
    assert f"--out {tmp_path / 'out'}: not writable" in err


def test_a_worker_that_ends_leaves_the_checkpoints_of_trials_still_running(tmp_path):
    from types import SimpleNamespace as NS
    states = ["COMPLETE", "COMPLETE", "RUNNING"]  # trial 2: another worker's, mid-training
    trials = [NS(number=i, state=NS(name=st)) for i, st in enumerate(states)]
    study = NS(get_trials=lambda deepcopy=False: trials, best_trial=trials[0], best_trials=[trials[0]])
    for t in trials:
        (tmp_path / E.TRIALS / f"trial-{t.number:04d}" / "checkpoints").mkdir(parents=True)
        (tmp_path / E.TRIALS / f"trial-{t.number:04d}" / "best.pt").write_bytes(b"w")
    E.keep_best_checkpoints(study, NS(multi=False), tmp_path)
    kept = [(tmp_path / E.TRIALS / f"trial-{i:04d}" / "best.pt").exists() for i in range(3)]
    assert kept == [True, False, True]
