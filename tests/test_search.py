"""The hyperparameter search (training/experiments/search) on Optuna: a search on the file store, its best trial rerun,
pruning, a killed search resumed, two workers on one grid, and the one-line errors."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny_runs

from training.config.train_config import TrainConfig
from training.experiments.search import cli as C
from training.experiments.search import engine as E
from training.run.trainer import train

optuna = pytest.importorskip("optuna", reason="the [search] extra (in [test]) is not installed")
ROOT = Path(__file__).parents[1]
FIXED = {"epochs": 1, "batch_size": 4, "device": "cpu", "precision": "fp32"}


def space_file(path: Path, **over) -> Path:
    raw = {"objective": "overall", "trials": 4, "sampler": "random", "pruner": "none", "fixed": FIXED,
           "params": {"lr": {"low": 1e-4, "high": 1e-2, "log": True}, "freeze_upto": {"choices": [None, 1, "100%"]}},
           **over}
    path.write_text(json.dumps(raw))
    return path


def argv(tmp_path, space, *extra):
    data, enc = tiny_runs.inputs(tmp_path)
    return [str(space), "--out", str(tmp_path / "out"), "--data-dir", str(data), "--model", str(enc), "--threads",
            "1", "--sampler-seed", "7", *extra]


def trials(tmp_path, name="space"):
    from optuna.storages.journal import JournalFileBackend, JournalStorage
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "out" / E.JOURNAL)))
    return optuna.load_study(study_name=name, storage=storage).get_trials()


def test_a_search_names_its_best_trial_whose_config_reruns_it(tmp_path):
    space = space_file(tmp_path / "space.json")
    assert C.main(argv(tmp_path, space)) == 0
    done = trials(tmp_path)
    assert [t.state.name for t in done] == ["COMPLETE"] * 4
    best = max(done, key=lambda t: t.value)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert f"Best: trial {best.number}." in summary and f"| {best.number} **best** |" in summary
    run = Path(best.user_attrs["run_dir"])
    assert (run / "best.pt").is_file() and (run / "config.json").is_file()
    others = [Path(t.user_attrs["run_dir"]) for t in done if t.number != best.number]
    assert all((r / "metrics.jsonl").is_file() and not (r / "best.pt").exists() for r in others)
    rerun = json.loads((run / "config.json").read_text())
    rerun.update(out_dir=str(tmp_path / "rerun"), predictions_dir=str(tmp_path / "rerun" / "predictions"))
    assert train(TrainConfig.from_dict(rerun)) == best.user_attrs["dev"]
    assert best.user_attrs["dev"]["overall"] == best.value
    assert (tmp_path / "out" / "summary.csv").read_text().count("\n") == 5
    assert (tmp_path / "out" / "history.png").is_file()
    # the budget is spent: running again trains nothing
    assert C.main(argv(tmp_path, space)) == 0 and len(trials(tmp_path)) == 4


def test_a_pruned_trial_stops_and_keeps_its_records(tmp_path):
    space = space_file(tmp_path / "space.json", trials=2, pruner={"threshold": 2.0},  # below 2: every score
                       fixed={**FIXED, "epochs": 3})
    assert C.main(argv(tmp_path, space)) == 0
    done = trials(tmp_path)
    assert [t.state.name for t in done] == ["PRUNED", "PRUNED"]
    for t in done:
        assert list(t.intermediate_values) == [1]  # stopped after its first evaluation of three
        records = [json.loads(x) for x in (Path(t.user_attrs["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in records if "dev_overall" in r] == [0]
        assert t.intermediate_values[1] == records[-1]["dev_overall"]
    assert "| pruned |" in (tmp_path / "out" / "summary.md").read_text().replace("| 0 | pruned |", "| pruned |")


def test_an_interrupted_trial_is_failed_and_its_place_run_again(tmp_path, monkeypatch):
    space = space_file(tmp_path / "space.json", trials=3)
    calls, real = [], E.train

    def interrupt_second(cfg, on_evaluation=None):
        calls.append(cfg.out_dir)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(cfg, on_evaluation)
    monkeypatch.setattr(E, "train", interrupt_second)
    with pytest.raises(KeyboardInterrupt):
        C.main(argv(tmp_path, space))
    assert [t.state.name for t in trials(tmp_path)] == ["COMPLETE", "FAIL"]
    assert C.main(argv(tmp_path, space)) == 0
    assert [t.state.name for t in trials(tmp_path)] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]


def test_a_worker_killed_mid_trial_loses_only_that_trial(tmp_path):
    """SIGKILL: no `finally` runs, the trial stays RUNNING in the journal; the next worker marks it failed
    and finishes the budget."""
    space = space_file(tmp_path / "space.json", trials=2)
    slow = ("import sys, time; from training.experiments.search import engine, cli\n"
            "engine.train = lambda cfg, on_evaluation=None: time.sleep(120)\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    p = subprocess.Popen([sys.executable, "-c", slow, *argv(tmp_path, space)], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if (tmp_path / "out" / E.JOURNAL).is_file() and any(  # running, and named its worker (not killed between)
                    t.state.name == "RUNNING" and "worker" in t.user_attrs for t in trials(tmp_path)):
                break
        except KeyError:  # the journal is there, the study not yet in it (a busy machine can catch it between)
            pass
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert [t.state.name for t in trials(tmp_path)] == ["RUNNING"]
    assert C.main(argv(tmp_path, space)) == 0
    assert [t.state.name for t in trials(tmp_path)] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert trials(tmp_path)[0].user_attrs["state_note"] == "its worker died mid-trial"


def test_two_workers_run_each_grid_point_exactly_once(tmp_path):
    space = space_file(tmp_path / "grid.json", sampler="grid", trials=100,
                       params={"lr": {"choices": [1e-3, 3e-3, 1e-2]}, "freeze_upto": {"choices": [None, 1]}})
    workers = [subprocess.Popen([sys.executable, "-m", "training.experiments.search", *argv(tmp_path, space)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for w in workers:
        assert w.wait(300) == 0, w.stderr.read()
    done = trials(tmp_path, "grid")
    complete = [tuple(sorted(t.params.items(), key=lambda kv: kv[0])) for t in done if t.state.name == "COMPLETE"]
    assert len(complete) == 6 and len(set(complete)) == 6
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in done)
    assert all("duplicate" in t.user_attrs["state_note"] for t in done if t.state.name == "FAIL")
    pids = {t.user_attrs["worker"]["pid"] for t in done if t.state.name == "COMPLETE"}
    assert len(pids) <= 2


def test_grid_points_and_duplicates_follow_the_live_trials(tmp_path):
    from types import SimpleNamespace as NS

    from training.experiments.search.space import load_space
    space = load_space(space_file(tmp_path / "g.json", sampler="grid", trials=10,
                                  params={"lr": {"choices": [0.1, 0.2]}, "freeze_upto": {"choices": [None, 1]}}))

    def t(number, state, lr, upto):
        return NS(number=number, state=NS(name=state), params={"lr": lr, "freeze_upto": upto})
    trials = [t(0, "COMPLETE", 0.1, None), t(1, "FAIL", 0.1, 1), t(2, "RUNNING", 0.2, None)]
    assert E.next_grid_point(space, trials) == {"lr": 0.1, "freeze_upto": 1}  # a failed trial frees its point
    trials.append(t(3, "PRUNED", 0.1, 1))
    assert E.next_grid_point(space, trials) == {"lr": 0.2, "freeze_upto": 1}
    trials.append(t(4, "RUNNING", 0.2, 1))
    assert E.next_grid_point(space, trials) is None
    late = t(5, "RUNNING", 0.2, None)
    assert E.duplicate_of(late, trials + [late]) == 2 and E.duplicate_of(trials[2], trials + [late]) is None
    assert E.budget_left(space, trials) and not E.budget_left(NS(trials=4, sampler="grid"), trials)


@pytest.mark.parametrize("over, says", [
    ({"params": {"wings": {"low": 1, "high": 2}}}, "params: wings is not a training option"),
    ({"params": {"lr": {"low": 1e-2, "high": 1e-4}}}, "params.lr: empty range"),
    ({"params": {"lr": {"low": 0.0, "high": 1e-2, "log": True}}}, "params.lr: a log range must be above zero"),
    ({"params": {"pooling": {"choices": ["cls", "max"]}}}, "params.pooling: the choice 'max' is not accepted"),
    ({"params": {"freeze_upto": {"choices": ["150%"]}}}, "params.freeze_upto: the choice '150%' is not accepted"),
    ({"params": {"seed": {"choices": [1, 2]}}}, "params: seed is not searched"),
    ({"params": {"overwrite": {"choices": [False]}}}, "params: overwrite is set by the search"),
    ({"objective": "loss"}, "objective must be one of"),
    ({"sampler": "grid"}, "sampler grid needs choices for every option"),
    ({"fixed": {"epochs": 0}}, "fixed: --epochs must be >= 1"),
])
def test_a_bad_space_is_one_line_before_any_trial(tmp_path, capsys, over, says):
    space = space_file(tmp_path / "bad.json", **over)
    assert C.main(argv(tmp_path, space)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(space) in err and says in err, err
    assert not (tmp_path / "out").exists()


def test_without_optuna_the_command_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(E, "require_optuna", lambda: None)
    assert C.main(argv(tmp_path, space_file(tmp_path / "s.json"))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'pip install -e ".[search]"' in err


def test_the_front_keeps_the_trials_no_other_beats_on_score_and_time():
    from training.experiments.search.summary import front
    table = [{"trial": i, "state": st, "score": sc, "train_seconds": ts} for i, (st, sc, ts) in enumerate([
        ("COMPLETE", 0.70, 100.0), ("COMPLETE", 0.72, 300.0), ("COMPLETE", 0.69, 150.0),  # 2: beaten by 0
        ("COMPLETE", 0.72, 250.0), ("PRUNED", 0.90, 10.0), ("COMPLETE", 0.60, 20.0), ("COMPLETE", 0.60, 20.0)])]
    # 1 is beaten by 3 (same score, faster); 5 and 6 tie: neither beats the other
    assert [r["trial"] for r in front(table)] == [5, 6, 0, 3]


def test_two_objectives_give_the_pareto_front(tmp_path):
    space = space_file(tmp_path / "space.json", trials=3, objective=["overall", "train_seconds"], pruner="median")
    assert C.main(argv(tmp_path, space)) == 0
    done = trials(tmp_path)
    assert [t.state.name for t in done] == ["COMPLETE"] * 3
    for t in done:  # the score up, the training seconds down, as the trial's own records say
        assert t.values == [t.user_attrs["dev"]["overall"], t.user_attrs["train_seconds"]]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "On the front: trial" in summary and (tmp_path / "out" / "pareto_front.png").is_file()
