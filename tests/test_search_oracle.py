"""The hyperparameter search (training/experiments/search) checked against references outside it: Optuna's own
API and documented semantics (distributions, the median and threshold pruners, a pruned trial's value, best_trial,
best_trials), the rules of docs/search.md written out here, and fronts, medians and best trials computed by hand
from the trials' values.

Almost everything runs on in-memory Optuna studies and a stand-in for `train` that reports given dev curves; one
test trains a real tiny run (tests/tiny_runs.py) to check what the trainer reports. Six faults this check found
(2026-11-30) are fixed; their tests say what was wrong.
"""
import csv
import json
import math
import os
import statistics
from itertools import product
from pathlib import Path

import pytest
import tiny_runs

from training.common.errors import ConfigError
from training.config.train_config import TrainConfig, field_errors
from training.experiments.search import cli as C
from training.experiments.search import engine as E
from training.experiments.search import summary as S
from training.experiments.search.space import load_space

optuna = pytest.importorskip("optuna", reason="the [search] extra (in [test]) is not installed")
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.usefixtures("one_thread")

METRICS = ("sst_acc", "para_acc", "sts_pearson", "overall")  # docs/search.md's objectives
LR = {"low": 1e-4, "high": 1e-2, "log": True}


# ----------------------------------------------------------------------------- helpers


def space_path(d: Path, name: str = "space.json", **over) -> Path:
    raw = {"objective": "overall", "trials": 4, "sampler": "random", "pruner": "none",
           "fixed": {"epochs": 1, "device": "cpu", "precision": "fp32"},
           "params": {"lr": LR}, **over}
    path = d / name
    path.write_text(json.dumps(raw))
    return path


def space_of(d: Path, **over):
    return load_space(space_path(d, **over))


def metrics_at(v: float) -> dict:
    """One dev evaluation whose overall score is v; the other metrics differ from it and from each other, so
    that a test sees which one was reported."""
    return {"sst_acc": v + 0.01, "para_acc": v + 0.02, "sts_pearson": v + 0.03, "overall": v}


def fake_train(curves, evals_per_epoch: int = 1, epoch_seconds: float = 1.5):
    """A stand-in for trainer.train: call n trains the n-th curve's dev evaluations, each written to the run's
    metrics.jsonl (an epoch's last one with the epoch's train_seconds, as the trainer does) and handed to
    on_evaluation; returns the last evaluation's metrics. `calls` lists the configs it was given."""
    calls = []

    def train(cfg, on_evaluation=None):
        curve = curves[len(calls)]
        calls.append(cfg)
        run = Path(cfg.out_dir)
        run.mkdir(parents=True, exist_ok=True)
        with open(run / "metrics.jsonl", "w") as f:
            for i, v in enumerate(curve):
                record = {"epoch": i // evals_per_epoch, "step": i + 1,
                          **({"train_seconds": epoch_seconds} if (i + 1) % evals_per_epoch == 0 else {}),
                          **{f"dev_{k}": x for k, x in metrics_at(v).items()}}
                f.write(json.dumps(record) + "\n")
                f.flush()
                if on_evaluation is not None:
                    on_evaluation(record)
        return metrics_at(curve[-1])
    train.calls = calls
    return train


def new_study(space, seed: int = 0, storage=None, name=None):
    return optuna.create_study(storage=storage, study_name=name, directions=space.directions,
                               sampler=E.sampler_for(optuna, space, seed), pruner=E.pruner_for(optuna, space))


BASE = TrainConfig(test_predictions=False, save_every=0, keep_last=1)


def run_all(study, space, out: Path, limit: int = 30) -> list:
    """run_trial until it says the budget is spent (None), at most `limit` times."""
    states = []
    for _ in range(limit):
        state = E.run_trial(optuna, study, space, BASE, out, 0)
        if state is None:
            return states
        states.append(state)
    return states


def hand_front(points: dict) -> set:
    """{trial: (score up, seconds down)} -> the trials no other point dominates (at least as good on both,
    better on one). Ties on both are all kept: neither dominates the other."""
    def dominates(a, b):
        return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])
    return {n for n, p in points.items() if not any(dominates(q, p) for m, q in points.items() if m != n)}


def hand_median_pruning(curves) -> list:
    """Optuna's MedianPruner(n_startup_trials=2, n_warmup_steps=0) as its documentation states it, trials run
    one after the other: no pruning until two trials have completed; then a trial is pruned at the first step
    where its best value so far is below the median of the completed trials' values at that step. The step
    where each trial is pruned, or None."""
    done, out = [], []
    for curve in curves:
        at = None
        if len(done) >= 2:
            for step in range(1, len(curve) + 1):
                others = [c[step - 1] for c in done if len(c) >= step]
                if others and max(curve[:step]) < statistics.median(others):
                    at = step
                    break
        out.append(at)
        if at is None:
            done.append(curve)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(data folder, encoder folder) of tests/tiny_runs.py, made once."""
    return tiny_runs.inputs(tmp_path_factory.mktemp("tiny"))


def cli_argv(tiny, space: Path, out: Path, *extra, seed: bool = True) -> list[str]:
    data, enc = tiny
    return [str(space), "--out", str(out), "--data-dir", str(data), "--model", str(enc), "--threads", "1",
            *(["--sampler-seed", "7"] if seed else []), *extra]


@pytest.fixture
def no_training(monkeypatch):
    """train must not be reached."""
    def refuse(cfg, on_evaluation=None):
        raise AssertionError("a trial was trained")
    monkeypatch.setattr(E, "train", refuse)


def one_line_error(capsys, rc) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    return err


# ----------------------------------------------------------------------------- the space's parameter types


def suggested(space, seed: int = 0):
    """The distributions the space's options give on an Optuna trial."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    trial = study.ask()
    for p in space.params.values():
        p.suggest(trial)
    return trial.distributions


def test_ranges_are_optunas_float_or_int_distributions_log_uniform_with_log(tmp_path):
    """docs: a range (low, high, optionally log: log-uniform; integers for integer options)."""
    space = space_of(tmp_path, params={
        "lr": LR, "head_dropout": {"low": 0.0, "high": 0.3},
        "weight_decay": {"low": 0, "high": 1},                     # a float option given integer bounds
        "batch_size": {"low": 4, "high": 64, "log": True},         # int
        "max_train_examples": {"low": 10, "high": 1000, "log": True},  # int | None
        "freeze_upto": {"low": -1, "high": 2}})                    # int | str | None: a depth
    assert suggested(space) == {
        "lr": FloatDistribution(1e-4, 1e-2, log=True), "head_dropout": FloatDistribution(0.0, 0.3),
        "weight_decay": FloatDistribution(0.0, 1.0), "batch_size": IntDistribution(4, 64, log=True),
        "max_train_examples": IntDistribution(10, 1000, log=True), "freeze_upto": IntDistribution(-1, 2)}


def test_a_log_range_draws_log_uniformly(tmp_path):
    """Half of a log-uniform [1e-4, 1e-2] lies below the geometric mean 1e-3 (a uniform draw: 9%)."""
    space = space_of(tmp_path, params={"lr": LR})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    draws = []
    for _ in range(300):
        t = study.ask()
        draws.append(space.params["lr"].suggest(t))
        study.tell(t, 0.0)
    assert all(1e-4 <= x <= 1e-2 for x in draws)
    assert 0.4 < sum(x < 1e-3 for x in draws) / len(draws) < 0.6


def test_choices_are_categorical_null_is_the_options_none_and_shares_are_depths(tmp_path):
    space = space_of(tmp_path, params={"ema_decay": {"choices": [None, 0.99]},
                                       "freeze_upto": {"choices": [None, -1, 2, "75%", "100%"]},
                                       "batch_size": {"choices": [16, 32]}})
    assert suggested(space) == {"ema_decay": CategoricalDistribution((None, 0.99)),
                                "freeze_upto": CategoricalDistribution((None, -1, 2, "75%", "100%")),
                                "batch_size": CategoricalDistribution((16, 32))}
    for params, want in [({"ema_decay": None, "freeze_upto": None}, (None, None)),    # none: no EMA, no freezing
                         ({"ema_decay": 0.99, "freeze_upto": "75%"}, (0.99, "75%"))]:
        cfg = E.trial_config(space, BASE, params, tmp_path / "run")
        assert (cfg.ema_decay, cfg.freeze_upto) == want and field_errors(cfg) == []
        assert TrainConfig().ema_decay is None and TrainConfig().freeze_upto is None  # the options' "none"


def test_a_trials_settings_reach_its_run_with_the_fixed_ones(tmp_path):
    space = space_of(tmp_path, params={"lr": LR, "batch_size": {"choices": [16, 32]}})
    cfg = E.trial_config(space, BASE, {"lr": 3e-4, "batch_size": 32}, tmp_path / "trial-0007")
    assert (cfg.lr, cfg.batch_size, cfg.epochs, cfg.device) == (3e-4, 32, 1, "cpu")
    assert cfg.out_dir == str(tmp_path / "trial-0007")


@pytest.mark.parametrize("key", ["overwrite", "out_dir", "predictions_dir", "test_predictions", "save_every",
                                 "keep_last", "resume"])
@pytest.mark.parametrize("where", ["params", "fixed"])
def test_options_the_search_sets_per_trial_are_refused_in_one_line(tmp_path, key, where):
    """docs: options the search sets per trial (out_dir, overwrite, ...) are refused; each trial's out_dir,
    predictions_dir and overwrite, and the base's test_predictions, save_every and keep_last, are the
    search's. (overwrite was accepted and then dropped: trial_config sets it True after the space's.)"""
    value = {"overwrite": False, "out_dir": "x", "predictions_dir": "x", "test_predictions": True, "save_every": 5,
             "keep_last": 2, "resume": "auto"}[key]
    over = ({"params": {"lr": LR, key: {"choices": [value]}}} if where == "params"
            else {"fixed": {"epochs": 1, key: value}})
    path = space_path(tmp_path, **over)
    with pytest.raises(ConfigError) as e:
        load_space(path)
    assert len(str(e.value).splitlines()) == 1 and str(path) in str(e.value) and key in str(e.value)


def test_the_training_seed_is_fixed_not_searched(tmp_path):
    """Every trial trains with the training seed: TrainConfig's default, or the one `fixed` gives (it had been
    refused as an option the search sets, which it never set); searching it is refused (a setting picked over
    seeds is picked for its luck)."""
    space = space_of(tmp_path, fixed={"epochs": 1, "seed": 3})
    assert E.trial_config(space, BASE, {"lr": 1e-3}, tmp_path / "r").seed == 3
    assert E.trial_config(space_of(tmp_path), BASE, {"lr": 1e-3}, tmp_path / "r").seed == TrainConfig().seed
    path = space_path(tmp_path, params={"lr": LR, "seed": {"choices": [1, 2]}})
    with pytest.raises(ConfigError) as e:
        load_space(path)
    assert len(str(e.value).splitlines()) == 1 and str(path) in str(e.value) and "params: seed" in str(e.value)


# ----------------------------------------------------------------------------- bad spaces: one line, exit 2


@pytest.mark.parametrize("over, key", [
    ({"params": {"wings": {"low": 1, "high": 2}}}, "wings"),                         # unknown option
    ({"fixed": {"epochs": 1, "wings": 3}}, "wings"),
    ({"params": {"lr": {"low": 1e-2, "high": 1e-4}}}, "params.lr"),                  # low > high
    ({"params": {"lr": {"low": 1e-3, "high": 1e-3}}}, "params.lr"),                  # empty range
    ({"params": {"lr": {"low": 0.0, "high": 1e-2, "log": True}}}, "params.lr"),      # log through zero
    ({"params": {"head_dropout": {"low": -0.1, "high": 0.2, "log": True}}}, "params.head_dropout"),
    ({"params": {"max_train_examples": {"low": 0, "high": 100, "log": True}}}, "params.max_train_examples"),
    ({"params": {"batch_size": {"choices": []}}}, "params.batch_size"),              # empty choices
    ({"params": {"lr": {"choices": [None]}}}, "params.lr"),                          # lr has no "none"
    ({"params": {"freeze_upto": {"choices": [2, "150%"]}}}, "params.freeze_upto"),
    ({"objective": "loss"}, "objective"),                                            # wrong objective name
    ({"objective": ["overall", "wall_seconds"]}, "objective"),
    ({"objective": ["train_seconds"]}, "objective"),
    ({"objective": ["overall", "train_seconds", "train_seconds"]}, "objective"),
    ({"trails": 4}, "trails"),                                                       # unknown key
    ({"sampler": "cmaes"}, "sampler"),
    ({"pruner": "hyperband"}, "pruner"),
    ({"trials": 0}, "trials"),
])
def test_a_bad_space_is_one_line_naming_file_and_key_before_any_training(tmp_path, capsys, no_training, over,
                                                                          key):
    space = space_path(tmp_path, **over)
    err = one_line_error(capsys, C.main([str(space), "--out", str(tmp_path / "out")]))
    assert str(space) in err and key in err, err
    assert not (tmp_path / "out").exists()


def test_a_params_list_is_one_line(tmp_path, capsys, no_training):
    """"params": ["lr"] (a list, not an object) is one line naming the file and the key (it was an
    AttributeError's traceback: the loader called .items() on it)."""
    space = space_path(tmp_path, params=["lr"])
    err = one_line_error(capsys, C.main([str(space), "--out", str(tmp_path / "out")]))
    assert str(space) in err and "params" in err


@pytest.mark.parametrize("seed", ["x", None])
def test_a_bad_space_seed_is_one_line_before_the_out_folder_is_made(tmp_path, capsys, no_training, tiny, seed):
    """The space's "seed" must be an integer: "x" or null is one line naming the file and the key, before
    --out or the journal exists (it was a TypeError once the search added the process id to it)."""
    space = space_path(tmp_path, seed=seed)
    out = tmp_path / "out"
    err = one_line_error(capsys, C.main(cli_argv(tiny, space, out, seed=False)))
    assert str(space) in err and "seed" in err
    assert not out.exists()


@pytest.mark.parametrize("over, key", [
    ({"params": {"lr": {"low": 1e-4, "high": 1e-2, "log": "no"}}}, "log"),
    ({"pruner": {"threshold": True}}, "threshold"),
])
def test_wrongly_typed_space_values_are_one_line(tmp_path, over, key):
    """"log": "no" and {"threshold": true} are one line naming the file and the key (they were taken: the
    first as a log-uniform range, bool("no") being True, the second as a threshold of 1.0)."""
    path = space_path(tmp_path, **over)
    with pytest.raises(ConfigError) as e:
        load_space(path)
    assert str(path) in str(e.value) and key in str(e.value)


# ----------------------------------------------------------------------------- reports and pruning


def test_each_dev_evaluation_is_reported_once_at_increasing_steps(tmp_path, monkeypatch):
    """The objective's dev value of every evaluation goes to Optuna's trial.report at steps 1, 2, ...; the
    completed trial's value is the objective's metric, maximised."""
    space = space_of(tmp_path, objective="sts_pearson", trials=1)
    curve = [0.2, 0.5, 0.4, 0.6]
    monkeypatch.setattr(E, "train", fake_train([curve], evals_per_epoch=2))
    study = new_study(space)
    assert run_all(study, space, tmp_path / "out") == ["COMPLETE"]
    t, = study.trials
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert t.intermediate_values == pytest.approx({i + 1: v + 0.03 for i, v in enumerate(curve)})  # sts_pearson
    assert t.value == pytest.approx(0.63)
    assert t.user_attrs["train_seconds"] == 3.0  # two epochs of 1.5 s


@pytest.mark.parametrize("curves, pruned_at", [
    # 0, 1 complete (the two startup trials); 2 below the step-1 median (0.4); 3 above it, then its best (0.5)
    # below the step-2 median (0.55); 4 falls below the medians at steps 2 and 3, but its best so far (0.8)
    # does not (Optuna compares the best so far: not pruned); 5 below the step-1 median of 0, 1 and 4 (0.5)
    ([[0.5, 0.6, 0.7], [0.3, 0.5, 0.6], [0.3, 0.9, 0.9], [0.45, 0.5, 0.9], [0.8, 0.3, 0.1], [0.1, 0.1, 0.1]],
     [None, None, 1, 2, None, 1]),
    # a first trial far below a second cannot be pruned before two trials complete; at the median: not below
    ([[0.1, 0.1], [0.9, 0.9], [0.2, 0.95], [0.5, 0.5], [0.6, 0.2]], [None, None, 1, None, None]),
])
def test_the_median_pruner_prunes_where_optunas_rule_does_by_hand(tmp_path, monkeypatch, curves, pruned_at):
    space = space_of(tmp_path, pruner="median", trials=len(curves))
    train = fake_train(curves)
    monkeypatch.setattr(E, "train", train)
    study = new_study(space)
    assert isinstance(study.pruner, optuna.pruners.MedianPruner)
    states = run_all(study, space, tmp_path / "out")
    expected = hand_median_pruning(curves)
    assert expected == pruned_at  # the rule, worked through by hand in the comments above
    assert states == ["COMPLETE" if at is None else "PRUNED" for at in expected]
    for t, curve, at in zip(study.trials, curves, expected):
        steps = len(curve) if at is None else at
        assert t.intermediate_values == pytest.approx({i + 1: v for i, v in enumerate(curve[:steps])})
        # a pruned trial's value in Optuna is its last reported one; a completed one's, its metrics' overall
        assert t.value == pytest.approx(curve[steps - 1])


def test_the_threshold_pruner_prunes_below_x_not_at_x(tmp_path, monkeypatch):
    """docs: {"threshold": X} prunes below X; Optuna's ThresholdPruner(lower=X): a value smaller than X."""
    curves = [[0.5, 0.6], [0.7, 0.49, 0.9], [0.2]]
    space = space_of(tmp_path, pruner={"threshold": 0.5}, trials=3)
    monkeypatch.setattr(E, "train", fake_train(curves))
    study = new_study(space)
    assert run_all(study, space, tmp_path / "out") == ["COMPLETE", "PRUNED", "PRUNED"]
    assert [sorted(t.intermediate_values) for t in study.trials] == [[1, 2], [1, 2], [1]]


def test_a_pruned_trial_is_pruned_in_optunas_storage_and_the_summary(tmp_path, monkeypatch):
    """Stopped in its first epoch (docs: no training time then), recorded PRUNED in the journal as another
    process reads it, shown pruned in summary.md with its last evaluation as score; the budget counts it."""
    space = space_of(tmp_path, pruner={"threshold": 0.5}, trials=2)
    train = fake_train([[0.6, 0.7, 0.8, 0.9], [0.3, 0.9, 0.9, 0.9]], evals_per_epoch=2)
    monkeypatch.setattr(E, "train", train)
    out = tmp_path / "out"
    study = new_study(space, storage=E.storage_for(optuna, None, out), name="space")
    assert run_all(study, space, out) == ["COMPLETE", "PRUNED"]
    from optuna.storages.journal import JournalFileBackend, JournalStorage
    again = optuna.load_study(study_name="space", storage=JournalStorage(JournalFileBackend(str(out / E.JOURNAL))))
    done, pruned = again.trials
    assert (done.state, pruned.state) == (TrialState.COMPLETE, TrialState.PRUNED)
    assert pruned.intermediate_values == {1: 0.3} and pruned.value == 0.3
    assert pruned.user_attrs["train_seconds"] is None and done.user_attrs["train_seconds"] == 3.0
    assert "dev" not in pruned.user_attrs  # no kept evaluation: not a finished run's
    row = next(r for r in S.rows(again, space) if r["trial"] == 1)
    assert (row["state"], row["score"], row["train_seconds"]) == ("PRUNED", 0.3, None)
    md = S.markdown(again, space, S.rows(again, space))
    assert "| 1 | pruned |" in md and "0.3000" in md.split("| 1 | pruned |")[1].splitlines()[0]
    assert "Best: trial 0." in md and "1 pruned" in md
    assert [r["trial"] for r in S.front(S.rows(again, space))] == [0]


def test_a_real_run_reports_each_evaluation_and_a_pruned_run_is_not_a_finished_one(tmp_path, tiny):
    """The real trainer (tiny data, one epoch, two evaluations): the reports are metrics.jsonl's dev evaluations
    in order at steps 1 and 2, every documented objective among their metrics; pruned at its last evaluation
    (all its steps trained), the trial is PRUNED, with Optuna's value of a pruned trial (its last report), and
    its run folder is not a finished run (--resume auto would not take it for done), nor the best trial."""
    from training.run.metrics_file import evaluations, read_metrics
    from training.run.rundir import finished_run

    class AtStep2(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return trial.last_step == 2

    data, enc = tiny
    space = space_of(tmp_path, trials=1, fixed={"epochs": 1, "evals_per_epoch": 2, "batch_size": 4,
                                                "device": "cpu", "precision": "fp32"},
                     params={"lr": {"low": 1e-3, "high": 1e-2, "log": True}})
    base = TrainConfig(data_dir=str(data), model=str(enc), test_predictions=False, save_every=0, keep_last=1)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), pruner=AtStep2())
    assert E.run_trial(optuna, study, space, base, tmp_path / "out", 0) == "PRUNED"
    t, = study.trials
    run = Path(t.user_attrs["run_dir"])
    records = evaluations(read_metrics(run / "metrics.jsonl"))
    assert len(records) == 2 and all(f"dev_{m}" in r for r in records for m in METRICS)  # every objective's name
    assert t.intermediate_values == {1: records[0]["dev_overall"], 2: records[1]["dev_overall"]}
    assert t.state == TrialState.PRUNED and t.value == records[1]["dev_overall"]
    cfg = TrainConfig.from_dict({**json.loads((run / "config.json").read_text()), "resume": "auto"})
    assert finished_run(cfg, run) is None
    assert S.rows(study, space)[0]["state"] == "PRUNED" and S.best_numbers(study, space) == []


def test_two_objectives_report_nothing_prune_nothing_and_tell_score_and_seconds(tmp_path, monkeypatch):
    """docs: Optuna prunes single-objective studies only; two objectives are the score (up) and the training
    seconds (down)."""
    curves = [[0.5, 0.6], [0.9, 0.9], [0.1, 0.1]]  # the last would be pruned by a median pruner
    space = space_of(tmp_path, objective=["overall", "train_seconds"], pruner="median", trials=3)
    monkeypatch.setattr(E, "train", fake_train(curves))
    study = new_study(space)
    assert isinstance(study.pruner, optuna.pruners.NopPruner)
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    assert run_all(study, space, tmp_path / "out") == ["COMPLETE"] * 3
    for t, curve in zip(study.trials, curves):
        assert t.intermediate_values == {} and t.values == [curve[-1], 1.5 * len(curve)]
    assert "pruner none" in S.markdown(study, space, S.rows(study, space))


# ----------------------------------------------------------------------------- best trial and front, by hand


def add_trial(study, space, state: str, lr: float, value=None, reports=(), dev=None, seconds=None, note=None):
    """One trial through Optuna's own ask/report/tell, with the user attributes the engine sets."""
    study.enqueue_trial({"lr": lr})
    t = study.ask()
    for p in space.params.values():
        p.suggest(t)
    for step, v in enumerate(reports, 1):
        t.report(v, step)
    t.set_user_attr("run_dir", f"runs/trial-{t.number:04d}")
    t.set_user_attr("train_seconds", seconds)
    if dev is not None:
        t.set_user_attr("dev", dev)
    if note:
        t.set_user_attr("state_note", note)
    if state == "COMPLETE":
        study.tell(t, value)
    elif state != "RUNNING":
        study.tell(t, state=TrialState[state])
    return t.number


def table_order(md: str) -> list[int]:
    """The trial numbers of summary.md's main table, in order."""
    rows = md.split("| note |")[1].split("\n\n")[0].splitlines()[2:]
    return [int(r.split("|")[1].split()[0]) for r in rows]


def front_rows(md: str) -> list[int]:
    section = md.split("Accuracy against cost")[1].splitlines()[4:]
    return [int(r.split("|")[1]) for r in section if r.startswith("|")]


SINGLE = [  # state, score, seconds, reports, note
    ("COMPLETE", 0.60, 10.0, (), None),
    ("COMPLETE", 0.80, 50.0, (), None),
    ("PRUNED", None, None, (0.95, 0.97), None),   # higher than any: neither best nor on the front
    ("COMPLETE", 0.80, 50.0, (), None),           # ties 1 on both: both on the front
    ("FAIL", 0.99, 1.0, (0.99,), "stopped: RuntimeError: boom"),
    ("COMPLETE", 0.70, 60.0, (), None),           # beaten by 1
    ("COMPLETE", 0.60, 5.0, (), None),            # beats 0: same score, faster
    ("FAIL", None, None, (), "duplicate of trial 1, not run"),  # not a trial of the search
    ("RUNNING", None, None, (0.5,), None),
    ("COMPLETE", 0.75, 20.0, (), None),
]


def single_study(tmp_path):
    space = space_of(tmp_path, pruner="median", trials=20)
    study = optuna.create_study(direction="maximize")
    for i, (state, score, seconds, reports, note) in enumerate(SINGLE):
        dev = metrics_at(score) if score is not None else None
        add_trial(study, space, state, 1e-4 * (1 + i), score, reports, dev, seconds, note)
    return study, space


def test_the_best_trial_is_optunas_and_the_highest_completed_score(tmp_path):
    study, space = single_study(tmp_path)
    complete = {n: s for n, (st, s, *_) in enumerate(SINGLE) if st == "COMPLETE"}
    top = max(complete.values())
    assert study.best_trial.number in {n for n, s in complete.items() if s == top}  # Optuna agrees with the hand
    assert S.best_numbers(study, space) == [study.best_trial.number]
    md = S.markdown(study, space, S.rows(study, space))
    assert f"Best: trial {study.best_trial.number}. Rerun the best with `python run_multitask.py --config " \
           f"runs/trial-{study.best_trial.number:04d}/config.json" in md
    assert md.count("**best**") == 1 and f"| {study.best_trial.number} **best** |" in md


def test_the_summary_counts_states_shows_pruned_scores_and_leaves_out_duplicates(tmp_path, monkeypatch):
    study, space = single_study(tmp_path)
    table = S.rows(study, space)
    assert [r["trial"] for r in table] == [n for n, row in enumerate(SINGLE) if "duplicate" not in str(row[4])]
    md = S.markdown(study, space, table)
    assert "Trials: 6 complete, 1 pruned, 1 running, 1 fail (budget 20; sampler random, pruner median)." in md
    pruned = next(r for r in table if r["trial"] == 2)
    assert pruned["state"] == "PRUNED" and pruned["score"] == study.trials[2].value == 0.97  # Optuna's pruned value
    # completed trials by score (down), ties by number, then the others by number
    complete = sorted((-s, n) for n, (st, s, *_) in enumerate(SINGLE) if st == "COMPLETE")
    others = [n for n, (st, *_, note) in enumerate(SINGLE) if st != "COMPLETE" and "duplicate" not in str(note)]
    assert table_order(md) == [n for _, n in complete] + others
    monkeypatch.setattr(S, "figures", lambda *a, **k: [])
    with open(S.write(study, space, tmp_path / "o").with_name("summary.csv")) as f:
        csv_rows = list(csv.DictReader(f))
    assert [(int(r["trial"]), r["state"]) for r in csv_rows] == [(r["trial"], r["state"]) for r in table]


def test_the_front_of_one_objective_is_the_hand_computed_non_dominated_set(tmp_path):
    study, space = single_study(tmp_path)
    points = {t.number: (t.value, t.user_attrs["train_seconds"]) for t in study.trials  # as recorded
              if t.state == TrialState.COMPLETE}
    want = hand_front(points)
    assert want == {1, 3, 6, 9}
    got = S.front(S.rows(study, space))
    assert {r["trial"] for r in got} == want
    assert [r["train_seconds"] for r in got] == sorted(points[n][1] for n in want)  # by training time
    assert sorted(front_rows(S.markdown(study, space, S.rows(study, space)))) == sorted(want)


MULTI = [  # state, score, seconds
    ("COMPLETE", 0.60, 10.0), ("COMPLETE", 0.80, 50.0), ("COMPLETE", 0.80, 50.0), ("FAIL", 0.99, 1.0),
    ("COMPLETE", 0.70, 60.0), ("COMPLETE", 0.60, 5.0), ("COMPLETE", 0.85, 70.0), ("COMPLETE", 0.60, 5.0),
    ("COMPLETE", 0.85, 80.0), ("RUNNING", None, None),
]


def test_the_pareto_front_of_two_objectives_is_optunas_and_the_hand_computed_one(tmp_path):
    space = space_of(tmp_path, objective=["overall", "train_seconds"], trials=20)
    study = optuna.create_study(directions=["maximize", "minimize"])
    for i, (state, score, seconds) in enumerate(MULTI):
        dev = metrics_at(score) if score is not None else None
        add_trial(study, space, state, 1e-4 * (1 + i), [score, seconds] if state == "COMPLETE" else None,
                  dev=dev, seconds=seconds, note="stopped: OSError" if state == "FAIL" else None)
    want = hand_front({t.number: tuple(t.values) for t in study.trials if t.state == TrialState.COMPLETE})
    assert want == {1, 2, 5, 6, 7}  # ties kept; the failed trial (0.99 in 1 s) left out
    assert {t.number for t in study.best_trials} == want
    assert S.best_numbers(study, space) == sorted(want)
    md = S.markdown(study, space, S.rows(study, space))
    assert "On the front: " + ", ".join(f"trial {n}" for n in sorted(want)) + "." in md
    assert sorted(front_rows(md)) == sorted(want) and md.count("**best**") == len(want)


def test_a_completed_trial_scoring_zero_is_listed_among_the_completed(tmp_path):
    """summary.md lists completed trials by score, then the rest: a score of exactly 0.0 (an sst_acc on a
    small dev set) is a score (it was listed after a pruned trial: the sort key took 0.0 for "no score")."""
    space = space_of(tmp_path, pruner="median", trials=5)
    study = optuna.create_study(direction="maximize")
    add_trial(study, space, "PRUNED", 1e-4, reports=(0.3,))
    add_trial(study, space, "COMPLETE", 2e-4, 0.5, dev=metrics_at(0.5), seconds=2.0)
    add_trial(study, space, "COMPLETE", 3e-4, 0.0, dev=metrics_at(0.0), seconds=2.0)
    assert table_order(S.markdown(study, space, S.rows(study, space))) == [1, 2, 0]


# ----------------------------------------------------------------------------- seeds and workers


def proposals(space, seed: int, n: int) -> list[dict]:
    study = new_study(space, seed)
    out = []
    for _ in range(n):
        t = study.ask()
        params = {k: p.suggest(t) for k, p in space.params.items()}
        out.append(params)
        study.tell(t, -abs(math.log10(params["lr"]) + 3) + (params["batch_size"] == 16) * 0.1)
    return out


@pytest.mark.parametrize("sampler, n", [("random", 4), ("tpe", 12)])  # TPE: past its 10 random startup trials
def test_a_seeded_sampler_proposes_the_same_settings_again(tmp_path, sampler, n):
    space = space_of(tmp_path, sampler=sampler, params={"lr": LR, "batch_size": {"choices": [16, 32]}})
    first = proposals(space, 11, n)
    assert proposals(space, 11, n) == first
    assert proposals(space, 12, n) != first


def test_the_same_command_and_seed_proposes_the_same_settings_in_the_same_worker(tmp_path, tiny, monkeypatch):
    """docs: the sampler's seed is the space's (or --sampler-seed), to which each worker adds its process id and
    the number of trials so far. So the same command and seed propose the same settings only in a worker of the
    same process id (here made so); another process id proposes others; a restart another seed again."""
    seeds = []
    real_sampler = E.sampler_for
    monkeypatch.setattr(E, "sampler_for", lambda o, space, seed: seeds.append(seed) or real_sampler(o, space, seed))
    monkeypatch.setattr(S, "figures", lambda *a, **k: [])
    space = space_path(tmp_path, trials=3)

    lrs = {}
    for out, pid in (("a", 4242), ("b", 4242), ("c", 4243)):
        seeds.clear()
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        train = fake_train([[0.5]] * 6)
        monkeypatch.setattr(E, "train", train)
        assert C.main(cli_argv(tiny, space, tmp_path / out)) == 0
        assert seeds[-1] == 7 + pid
        lrs[out] = [cfg.lr for cfg in train.calls]
    assert lrs["a"] == lrs["b"] and lrs["a"] != lrs["c"] and len(set(lrs["a"])) == 3
    seeds.clear()
    assert C.main(cli_argv(tiny, space, tmp_path / "a", "--trials", "4")) == 0  # a restart, 3 trials so far
    assert seeds[-1] != 7 + 4243  # the trials so far count: not the first start's proposals again


def test_two_workers_racing_for_one_grid_point_run_it_once(tmp_path, monkeypatch):
    """A worker that picked a grid point another worker's running trial holds (the stale view of two workers
    starting together) marks its trial failed unrun; then every point of the grid (computed here as the product
    of the choices) completes exactly once."""
    space = space_of(tmp_path, sampler="grid", trials=10,
                     params={"lr": {"choices": [1e-3, 1e-2]}, "freeze_upto": {"choices": [None, 1]}})
    study = new_study(space)
    study.enqueue_trial({"lr": 1e-3, "freeze_upto": None})
    other = study.ask()  # the other worker's trial, mid-training
    for p in space.params.values():
        p.suggest(other)
    stale = iter([{"lr": 1e-3, "freeze_upto": None}])
    real_point = E.next_grid_point
    monkeypatch.setattr(E, "next_grid_point", lambda s, trials: next(stale, None) or real_point(s, trials))
    train = fake_train([[0.5]] * 10)
    monkeypatch.setattr(E, "train", train)
    assert E.run_trial(optuna, study, space, BASE, tmp_path / "out", 0) == "DUPLICATE"
    assert train.calls == [] and study.trials[1].state == TrialState.FAIL
    study.tell(other, 0.4)  # the other worker finishes
    assert run_all(study, space, tmp_path / "out") == ["COMPLETE"] * 3
    done = [tuple(t.params[k] for k in ("lr", "freeze_upto")) for t in study.trials if t.state == TrialState.COMPLETE]
    assert sorted(done, key=str) == sorted(product([1e-3, 1e-2], [None, 1]), key=str)
    assert len(train.calls) == 3
    assert [r["trial"] for r in S.rows(study, space)] == [0, 2, 3, 4]  # the duplicate is not a trial of the search


def test_a_space_of_fewer_settings_than_trials_ends_once_each_is_tried(tmp_path, monkeypatch):
    """A random or TPE search over fewer combinations than `trials` ends once every combination has run (it
    had gone on for ever: each further proposal was a duplicate, failed unrun, and the budget counted live
    trials only)."""
    for sampler in ("random", "tpe"):
        space = space_of(tmp_path, trials=3, sampler=sampler, params={"batch_size": {"choices": [4, 8]}})
        monkeypatch.setattr(E, "train", fake_train([[0.5]] * 40))
        study = new_study(space, seed=1)
        states = run_all(study, space, tmp_path / sampler, limit=30)
        assert states.count("COMPLETE") == 2 and len(states) < 30, states
        assert sorted(t.params["batch_size"] for t in study.trials if t.state == TrialState.COMPLETE) == [4, 8]


def test_a_samplers_repeated_proposals_count_in_the_budget(tmp_path, monkeypatch):
    """Settings a random sampler proposes again are not run, and count in the budget (so the search ends
    within it): the completed trials are distinct, completed and repeated trials together are the budget,
    and the summary says how many proposals repeated. Eight draws from eight choices repeat some (seed 1)."""
    space = space_of(tmp_path, trials=8, sampler="random", params={"batch_size": {"choices": list(range(1, 9))}})
    monkeypatch.setattr(E, "train", fake_train([[0.5]] * 40))
    study = new_study(space, seed=1)
    states = run_all(study, space, tmp_path / "out", limit=30)
    done = [t.params["batch_size"] for t in study.trials if t.state == TrialState.COMPLETE]
    repeats = states.count("DUPLICATE")
    assert repeats >= 1 and len(states) == 8 and states.count("COMPLETE") == 8 - repeats == len(set(done))
    assert f" {repeats} proposal(s) repeated settings already tried" in S.markdown(study, space, S.rows(study, space))
