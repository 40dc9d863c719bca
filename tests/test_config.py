"""TrainConfig is the one source of every option: the command line, the sweep's flags, validation,
resume and `--config FILE` all come from its fields (the import graph's rules: tests/test_layout.py)."""
import json
from dataclasses import fields
from pathlib import Path

import pytest

from data.loaders import TASKS
from training.args import config_from_args
from training.common.errors import ConfigError
from training.config.train_config import TrainConfig, default_of, flag_of, resume_may_differ, validate
from training.experiments.sweep import cli as sweep_cli
from training.experiments.sweep import records as sweep_records
from training.train import build_parser, main, parse

REPO = Path(__file__).resolve().parents[1]


def _flags(parser) -> dict[str, object]:
    return {s: a for a in parser._actions for s in a.option_strings}


def test_every_field_is_a_flag_with_its_default_and_help():
    flags = _flags(build_parser())
    for f in fields(TrainConfig):
        assert f.metadata["help"] and f.metadata["group"], f.name
        if f.name == "files":
            assert all(f"--{t}-{s}" in flags for t in TASKS for s in ("train", "dev", "test"))
            continue
        flag = flag_of(f.name) if f.name in flags or default_of(f) is not True else f"--no-{f.name.replace('_', '-')}"
        action = flags.get(flag_of(f.name)) or flags[flag]
        assert action.dest == f.name
        shown = action.default
        if f.metadata["onoff"]:
            shown = shown == "on"
        elif f.name == "tasks":
            shown = tuple(shown)
        elif default_of(f) is True:  # an off-switch: its dest defaults to True
            shown = True
        assert shown == default_of(f), f.name


def test_the_parser_has_no_flag_without_a_field():
    """Apart from --help, --config and --verbose, every flag is a TrainConfig field's."""
    names = {f.name for f in fields(TrainConfig)} | {f"{t}_{s}" for t in TASKS for s in ("train", "dev", "test")}
    dests = {a.dest for a in build_parser()._actions} - {"help", "config", "verbose"}
    assert dests <= names, dests - names


def test_the_sweep_flags_come_from_the_same_fields():
    run_flags, sweep_flags = _flags(build_parser()), _flags(sweep_cli.build_parser())
    for name in sweep_records.SWEEP_OPTIONS + ("data_dir", "model"):
        a, b = run_flags[flag_of(name)], sweep_flags[flag_of(name)]
        assert (a.default, a.choices, a.type) == (b.default, b.choices, b.type), name
        assert a.help in b.help


def test_resume_may_differ_is_read_from_the_fields():
    may = resume_may_differ()
    assert {"out_dir", "resume", "device", "eval_batch_size", "keep_last"} <= may
    assert not {"lr", "seed", "batch_size", "smart_eps", "tasks"} & may


def test_pcgrad_implies_mixed_sampling_in_python_too():
    assert TrainConfig(pcgrad=True).task_sampling == "mixed"
    assert TrainConfig().task_sampling == "mtdnn"
    assert TrainConfig(pcgrad=True, task_sampling="mtdnn").task_sampling == "mtdnn"  # given: kept, then refused
    assert any("--pcgrad needs" in e for e in validate(TrainConfig(pcgrad=True, task_sampling="mtdnn")))


def test_train_from_python_validates_before_any_work(tmp_path):
    from training.run.trainer import train

    cfg = TrainConfig(data_dir=str(tmp_path / "none"), epochs=0, lr=float("nan"), out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError) as e:
        train(cfg)
    assert "--epochs must be >= 1, not 0" in str(e.value) and "--lr must be > 0, not nan" in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field, value, message", [
    ("epochs", 2.5, "--epochs must be an int, not 2.5"),
    ("lr", "1e-4", "--lr must be a float, not '1e-4'"),
    ("lr", float("inf"), "--lr must be finite, not inf"),
    ("max_grad_norm", float("nan"), "--max-grad-norm must be >= 0 (0: no clipping), not nan"),
    ("pooling", "max", "--pooling must be one of cls, mean, not 'max'"),
    ("tasks", ("sst", "nli"), "--tasks must be some of sst, para, sts, not sst nli"),
    ("tasks", "sst", "--tasks must be a list, not 'sst'"),
    ("lr", None, "--lr must be a float, not None"),
    ("eval_batch_size", None, "--eval-batch-size must be an int, not None"),
    ("pcgrad", None, "--pcgrad must be a bool, not None"),
    ("tasks", None, "--tasks must be a list, not None"),
    ("files", None, "files must be a dict, not None"),
    ("files", {"sst_trian": "x.csv"}, "files: unknown key(s) sst_trian (the keys: sst_train, sst_dev, sst_test,"),
    ("files", {"sst_train": 3}, "files: sst_train must be a path, not 3"),
])
def test_values_from_python_or_a_file_are_checked_like_flags(field, value, message):
    assert any(e.startswith(message) for e in validate(TrainConfig(**{field: value}))), validate(
        TrainConfig(**{field: value}))


def test_none_stays_valid_where_an_option_has_it():
    """null in a --config file is the flag's "none" where it has one (--freeze-upto none, --ema-decay none)."""
    assert validate(TrainConfig(freeze_upto=None, ema_decay=None, resume=None, device="cpu",
                                data_dir=TrainConfig().data_dir)) == validate(TrainConfig(device="cpu"))


def test_a_null_in_a_config_file_is_one_line_before_any_work(tmp_path, capsys):
    """A null where the option has no "none" crashed with a TypeError, some only once training had begun
    (--eval-batch-size), after --overwrite had removed the earlier run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"an earlier run")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"eval_batch_size": None, "files": {"sst_trian": "x.csv"}}))
    with pytest.raises(SystemExit) as e:
        parse(["--config", str(path), "--out-dir", str(run), "--overwrite"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"run_multitask.py: error: --config {path}: files: unknown key(s) sst_trian (the keys: sst_train, sst_dev, "
        "sst_test, para_train, para_dev, para_test, sts_train, sts_dev, sts_test)",
        f"run_multitask.py: error: --config {path}: --eval-batch-size must be an int, not None"]
    assert (run / "best.pt").read_bytes() == b"an earlier run"


# ----------------------------------------------------------------------------- --config FILE

def test_config_file_then_flags_override_it(tmp_path):
    saved = TrainConfig(lr=3e-5, epochs=5, pooling="mean", smart=True, smart_adv_dropout=True,
                        files={"sst_dev": "x.csv"}, tasks=("sst", "sts"), ema_decay=0.99)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved.to_dict()))
    _, same = parse(["--config", str(path)])
    assert same == saved
    _, changed = parse(["--config", str(path), "--epochs", "1", "--smart-adv-dropout", "off", "--sts-test", "t.csv"])
    assert (changed.epochs, changed.smart_adv_dropout, changed.lr, changed.pooling) == (1, False, 3e-5, "mean")
    assert changed.files == {"sst_dev": "x.csv", "sts_test": "t.csv"}


def test_a_recipe_file_of_some_options_and_pcgrad_given_over_it(tmp_path):
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"lr": 5e-5, "task_sampling": "mtdnn"}))
    _, cfg = parse(["--config", str(path), "--pcgrad"])
    assert (cfg.lr, cfg.pcgrad, cfg.task_sampling) == (5e-5, True, "mixed")  # mtdnn was only the default


def test_a_smart_config_from_before_smart_perturbation_warns(tmp_path, caplog):
    """Such a run ran paper mode; the default is now reference: rerunning it says so instead of silently
    running another recipe. A recipe file (some options, no smart_perturb_at) and a current config do not warn."""
    old = {k: v for k, v in TrainConfig(smart=True).to_dict().items() if k != "smart_perturbation"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "recipe.json").write_text(json.dumps({"smart": True, "lr": 5e-5}))
    (tmp_path / "new.json").write_text(json.dumps(TrainConfig(smart=True).to_dict()))
    for name, warns in (("old", True), ("recipe", False), ("new", False)):
        caplog.clear()
        assert parse(["--config", str(tmp_path / f"{name}.json")])[1].smart_perturbation == "reference"
        said = "that run used 'paper' (add --smart-perturbation paper to repeat it)" in caplog.text
        assert said == warns, name
    assert parse(["--config", str(tmp_path / "old.json"), "--smart-perturbation", "paper"])[1].smart_perturbation \
        == "paper"


def test_a_runs_own_config_json_reruns_it(tmp_path):
    """config.json as the trainer writes it (TrainConfig.to_dict) reads back to the same config."""
    cfg = config_from_args(build_parser().parse_args(["--pcgrad", "--freeze-upto", "2", "--max-train-examples", "9"]))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    assert parse(["--config", str(tmp_path / "config.json")])[1] == cfg


@pytest.mark.parametrize("content, names", [(None, "no such file"), ("{", "not a readable JSON file"),
                                            ("[]", "expected a JSON object"),
                                            ('{"lr": 1, "lrr": 2}', "unknown option(s) lrr")])
def test_a_bad_config_file_is_one_line(tmp_path, capsys, content, names):
    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as e:
        main(["--config", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and str(path) in err[0] and names in err[0], err


def test_a_config_file_value_of_the_wrong_type_is_refused(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"epochs": "three"}))
    with pytest.raises(SystemExit) as e:
        main(["--config", str(path)])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"run_multitask.py: error: --config {path}: --epochs must be an int, "
                                       "not 'three'\n")
