"""The training options against references other than our own code: what README.md and docs/*.md say
(each statement checked is written here as a literal: page, the words, the option, the value they mean),
argparse's documented semantics (a flag's default, store_true / store_false, the "(default: ...)" of
ArgumentDefaultsHelpFormatter), and JSON round trips of a run's config.json.

Parse and validate only: no model, no training, no torch. The refusals go through run_multitask.py's
`main` with torch made unimportable, so that a command line that passed validation shows up as an
ImportError (reported as "accepted") instead of starting a run. Tests named test_BUG_ fail on a fault
found by this audit; their docstrings give the reproduction.
"""
import argparse
import json
import os
import re
import shlex
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from data.loaders import COURSE_FILES, TASKS
from training.config.train_config import TrainConfig
from training.train import build_parser, main, parse

REPO = Path(__file__).resolve().parents[1]
PROG = "run_multitask.py"
ACCEPTED = "accepted"  # what run_main returns for a command line that got past validation


# ----------------------------------------------------------------------------- helpers

def page(name: str) -> str:
    """A documentation page with its whitespace collapsed (statements wrap across lines)."""
    return " ".join((REPO / name).read_text().split())


def field_default(name: str):
    f = TrainConfig.__dataclass_fields__[name]
    return f.default_factory() if f.default is MISSING else f.default


def dashed(name: str) -> str:
    return "--" + name.replace("_", "-")


def expected_flags(f) -> list[str]:
    """The flag(s) a field should have by the rule docs/options.md follows: its name with dashes; an option
    on by default is switched off with --no-NAME (`--no-bucket`, `--no-test-predictions`); `files` is one
    flag per task and split (`--sst-train PATH` ... `--sts-test PATH`)."""
    if f.name == "files":
        return [f"--{t}-{s}" for t in TASKS for s in ("train", "dev", "test")]
    if f.type == "bool" and field_default(f.name) is True:
        return ["--no-" + f.name.replace("_", "-")]
    return [dashed(f.name)]


def help_entries(columns: int = 1000) -> dict[str, str]:
    """`--help` as {flag: its help text}, read from the printed page the way a user reads it."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)  # one line per entry where argparse allows it
    try:
        text = build_parser().format_help()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    entries, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^  (-\S.*?)(?:\s{2,}(\S.*))?$", line)
        if m:
            current = [m.group(2) or ""]
            for flag in re.findall(r"(?:^|, )(--?[a-z][a-z0-9-]*)", m.group(1)):
                entries[flag] = current
        elif current is not None and re.match(r"^ {3,}\S", line):
            current.append(line.strip())
        else:
            current = None
    return {flag: " ".join(p for p in parts if p) for flag, parts in entries.items()}


def shown_default(help_text: str) -> str | None:
    m = re.search(r"\(default: ([^()]*)\)\s*$", help_text)
    return m.group(1) if m else None


def actions_by_flag() -> dict[str, argparse.Action]:
    return {s: a for a in build_parser()._actions for s in a.option_strings}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A folder holding the course's train and dev file names (validation checks that they exist)."""
    d = tmp_path_factory.mktemp("course")
    for task in TASKS:
        for split in ("train", "dev"):
            (d / COURSE_FILES[task][split]).write_text("")
    return d


def run_main(argv, monkeypatch, capsys):
    """run_multitask.py's main on argv: (exit status, stderr lines). torch is made unimportable, so a
    command line that passes validation stops at the trainer's `import torch`: ACCEPTED."""
    monkeypatch.setitem(sys.modules, "torch", None)
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    except ImportError as e:
        if "torch" not in str(e):
            raise
        rc = ACCEPTED
    return rc, capsys.readouterr().err.strip().splitlines()


def write_json(path: Path, values) -> Path:
    path.write_text(json.dumps(values, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- flags, help, docs/options.md

def test_every_field_has_exactly_one_flag_named_after_it():
    """One listed flag per field (files: one per task and split), spelt as the field with dashes, and no field
    reachable by a second spelling but a switch's unlisted opposite (below)."""
    by_dest: dict[str, list[str]] = {}
    for a in build_parser()._actions:
        if a.help != argparse.SUPPRESS:
            by_dest.setdefault(a.dest, []).extend(a.option_strings)
    for f in fields(TrainConfig):
        flags = expected_flags(f)
        if f.name == "files":
            assert {dest: by_dest.get(dest) for dest in (flag[2:].replace("-", "_") for flag in flags)} == \
                {flag[2:].replace("-", "_"): [flag] for flag in flags}
        else:
            assert by_dest.get(f.name) == flags, f.name


def test_every_flag_has_a_help_line_in_help():
    entries = help_entries()
    for f in fields(TrainConfig):
        for flag in expected_flags(f):
            assert flag in entries, f"{flag} is not in --help"
            assert len(entries[flag]) > 3, f"{flag} has no help text: {entries[flag]!r}"
    assert "--config" in entries and "--verbose" in entries


def test_options_md_documents_every_field_and_names_only_real_flags():
    """docs/options.md "says the rest" for every option: each field's flag is named on the page (the
    per-file flags as the range `--sst-train PATH` ... `--sts-test PATH`), and every flag it names exists."""
    text = (REPO / "docs" / "options.md").read_text()
    spans = re.findall(r"`([^`]+)`", text)
    named = {flag for s in spans for flag in re.findall(r"(?:^|[\s,])(--[a-z][a-z0-9-]*)", s)}
    flags = set(actions_by_flag())
    assert named - flags == set(), f"docs/options.md names flags that do not exist: {sorted(named - flags)}"
    assert "`--sst-train PATH` ... `--sts-test PATH` override one file each" in page("docs/options.md")
    missing = [f.name for f in fields(TrainConfig) for flag in expected_flags(f)
               if flag not in named and not (f.name == "files" and flag not in ("--sst-train", "--sts-test"))]
    assert missing == [], f"fields without a word on docs/options.md: {missing}"
    assert "--config" in named and "--verbose" in named


# ----------------------------------------------------------------------------- defaults the docs state

# (page, the page's words, the flag they are about, the value they mean[, --help's words for a default
# that is not a value]). Each is checked three ways: the words are on the page, TrainConfig's default is
# the value, and the parser's default and its `--help` line say the same.
DOCUMENTED_DEFAULTS = [
    ("docs/api.md", "dropout before the task heads (default 0.1)", "--head-dropout", 0.1),
    ("docs/api.md", "`--lr` | default 1e-4 (MiniLM)", "--lr", 1e-4),
    ("docs/api.md", "`--batch-size` | default 32", "--batch-size", 32),
    ("docs/api.md", "`--epochs` | default 3", "--epochs", 3),
    ("docs/api.md", "| `--seed 11711` | 11711 | `--seed` | same default |", "--seed", 11711),
    ("docs/api.md", "our default `auto` already takes the GPU", "--device", "auto"),
    ("docs/api.md", "our default is `minilm-l6`", "--model", "minilm-l6"),
    ("docs/api.md", "| the default | everything trains |", "--freeze-upto", None),
    ("docs/peft.md", "the `--lr` default, 1e-4", "--lr", 1e-4),
    ("docs/peft.md", "with `--pooling cls`, the course's default", "--pooling", "cls"),
    ("README.md", "(`--keep-last`, 2 by default)", "--keep-last", 2),
    ("README.md", "with the default `--pooling cls`", "--pooling", "cls"),
    ("README.md", "| all-MiniLM-L6-v2 (the default) | `minilm-l6` |", "--model", "minilm-l6"),
    ("README.md", "MiniLM, batch 32. Rows 1-3: `python run_multitask.py` with the flags shown, learning rate 1e-4",
     "--batch-size", 32),
    ("README.md", "MiniLM, batch 32. Rows 1-3: `python run_multitask.py` with the flags shown, learning rate 1e-4",
     "--lr", 1e-4),
    ("README.md", "**Files.** `runs/default/`: the best checkpoint `best.pt`", "--out-dir", "runs/default"),
    ("docs/training.md", "(`--out-dir`, default `runs/default`)", "--out-dir", "runs/default"),
    ("docs/training.md", "`minilm-l6` (default): all-MiniLM-L6-v2", "--model", "minilm-l6"),
    ("docs/training.md", "(`--pooling cls`, the course's default)", "--pooling", "cls"),
    ("docs/training.md", "`auto` (the default): bf16 where the device computes it natively", "--precision", "auto"),
    ("docs/training.md", "`--keep-last 2` (the default)", "--keep-last", 2),
    ("docs/training.md", "so it is off by default; `bench/gpu_speed.sh`", "--step-graphs", False),
    ("docs/training.md", "python run_multitask.py # MiniLM, cross-encoded pairs, 3 epochs", "--epochs", 3),
    ("docs/training.md", "python run_multitask.py # MiniLM, cross-encoded pairs, 3 epochs", "--pair-encoding",
     "cross"),
    ("docs/training.md", "default 1024 on CPU, the fastest measured", "--eval-tokens", None,
     "1024 on CPU, none on CUDA"),
    ("docs/options.md", "Default: 1024 on CPU, none on CUDA", "--eval-tokens", None, "1024 on CPU, none on CUDA"),
    ("docs/options.md", "Default: train every epoch", "--early-stop-patience", None),
    ("docs/options.md", "Default: off, `--lr` as given", "--scale-lr-with-batch", None, "off"),
    ("docs/options.md", "(default: OUT_DIR/predictions)", "--predictions-dir", None, "OUT_DIR/predictions"),
    ("docs/options.md", "Not measured on a GPU yet: off by default", "--step-graphs", False),
    ("docs/options.md", "Why reference is the default", "--smart-perturbation", "reference"),
    ("docs/freezing.md", "`--cache-dir` (default `.cache/frozen`)", "--cache-dir", ".cache/frozen"),
    ("docs/freezing.md", "(`fixed`, the default schedule)", "--unfreeze-schedule", "fixed"),
    ("docs/freezing.md", "SMART perturbs the embeddings by default", "--smart-perturb-at", "embeddings"),
    ("docs/freezing.md", "With `--pooling cls` (the default)", "--pooling", "cls"),
    ("docs/guarantees.md", "After `--max-bad-steps` (default 10)", "--max-bad-steps", 10),
    ("docs/smart.md", "Defaults are the SMART paper's: lambda_s 1", "--smart-lambda", 1.0),
    ("docs/smart.md", "(the paper tries 1, 3, 5), mu 1, epsilon 1e-5", "--smart-mu", 1.0),
    ("docs/smart.md", "mu 1, epsilon 1e-5, step size 1e-3", "--smart-eps", 1e-5),
    ("docs/smart.md", "epsilon 1e-5, step size 1e-3, noise 1e-5", "--smart-step-size", 1e-3),
    ("docs/smart.md", "step size 1e-3, noise 1e-5, K = 1", "--smart-noise-var", 1e-5),
    ("docs/smart.md", "noise 1e-5, K = 1, l_inf ball", "--smart-steps", 1),
    ("docs/smart.md", "| steps | K (default 1)", "--smart-steps", 1),
    ("docs/smart.md", "K = 1, l_inf ball", "--smart-norm", "inf"),
    ("docs/smart.md", "beta 0.99 raised to 0.999 after the first 10% of the updates", "--smart-beta", 0.99),
    ("docs/smart.md", "with the default `--smart-adv-dropout off`", "--smart-adv-dropout", False),
    ("docs/smart.md", "what `reference` mode (the default) does", "--smart-perturbation", "reference"),
    ("docs/log.md", "since then the trainer's default is `reference`", "--smart-perturbation", "reference"),
    ("docs/benchmarks.md", "`--pooling cls` (the default)", "--pooling", "cls"),
    ("docs/benchmarks.md", "`--compile` does not pay", "--compile", False),
    ("docs/benchmarks.md", "so it stays off by default", "--compile", False),
    ("docs/sampling.md", "as `epoch_schedule` takes them; the trainer's default", "--no-bucket", True),
]


@pytest.mark.parametrize("statement", DOCUMENTED_DEFAULTS, ids=lambda s: f"{s[0]}:{s[2]}")
def test_a_documented_default_is_the_default(statement):
    where, words, flag, value = statement[:4]
    help_words = statement[4] if len(statement) > 4 else None
    assert " ".join(words.split()) in page(where), f"{where} no longer says {words!r}: update this test"
    action = actions_by_flag()[flag]
    name = action.dest
    # the dataclass
    assert getattr(TrainConfig(), name) == value, f"{where}: {flag} default {value!r}, TrainConfig has " \
                                                  f"{getattr(TrainConfig(), name)!r}"
    # the parser (argparse: a flag left out takes its action's default; store_true's is False,
    # store_false's True)
    parsed = getattr(build_parser().parse_args([]), name)
    if isinstance(value, bool) and action.choices == ["off", "on"]:
        parsed = parsed == "on"
    assert parsed == value, f"{flag}: the parser's default is {parsed!r}"
    # --help
    shown = shown_default(help_entries()[flag])
    if isinstance(value, bool) and action.choices != ["off", "on"]:
        assert isinstance(action, argparse._StoreTrueAction if not value else argparse._StoreFalseAction)
        assert shown is None, f"{flag}: a switch shows no default, not {shown!r}"
    elif isinstance(value, bool):
        assert shown == ("on" if value else "off")
    elif value is None:
        assert shown is not None, f"{flag}: --help says nothing of what leaving it out does"
        assert help_words is None or shown == help_words, f"{flag}: --help says {shown!r}, {where} {words!r}"
    elif isinstance(value, (int, float)):
        assert shown is not None and float(shown) == value, f"{flag}: --help shows {shown!r}, {where} {value}"
    else:
        assert shown == value, f"{flag}: --help shows {shown!r}, {where} {value!r}"


def test_task_sampling_defaults_to_mixed_with_pcgrad_else_mtdnn():
    assert "Default: mixed with `--pcgrad`, else mtdnn" in page("docs/options.md")
    assert parse([])[1].task_sampling == "mtdnn"
    assert parse(["--pcgrad"])[1].task_sampling == "mixed"
    assert TrainConfig().task_sampling == "mtdnn" and TrainConfig(pcgrad=True).task_sampling == "mixed"
    shown = shown_default(help_entries()["--task-sampling"])
    assert "mtdnn" in shown and "mixed" in shown and "--pcgrad" in shown


def test_data_dir_is_the_environments_folder_else_data(monkeypatch, tmp_path):
    """docs/options.md: `--data-dir DIR`: ... `$MINBERT_DATA_DIR` if set, else `data`."""
    assert "`$MINBERT_DATA_DIR` if set, else `data`" in page("docs/options.md")
    monkeypatch.delenv("MINBERT_DATA_DIR", raising=False)
    assert TrainConfig().data_dir == "data" and build_parser().parse_args([]).data_dir == "data"
    assert shown_default(help_entries()["--data-dir"]) == "data"
    monkeypatch.setenv("MINBERT_DATA_DIR", str(tmp_path))
    assert TrainConfig().data_dir == str(tmp_path) and parse([])[1].data_dir == str(tmp_path)


def test_eval_tokens_default_is_1024_on_cpu_and_none_on_cuda():
    """docs/options.md: `--eval-tokens N` ... 0: no budget ... Default: 1024 on CPU, none on CUDA. (Imports
    torch, through data.batching: the one test here that does.)"""
    from data.batching import eval_token_budget

    batching = TrainConfig().eval_batching()
    assert eval_token_budget(batching.max_tokens, "cpu") == 1024
    assert eval_token_budget(batching.max_tokens, "cuda") is None
    assert TrainConfig(eval_tokens=0).eval_batching().max_tokens is None  # 0: no budget
    assert TrainConfig(eval_tokens=512).eval_batching().max_tokens == 512


def test_lora_and_schedule_settings_default_as_documented():
    """docs/options.md / peft.md: lora's alpha 8, dropout 0, targets all (every linear map) by default;
    freezing.md: gradual's floor all, adaptive's threshold 0.1 and ceiling all layers by default."""
    from training.config.freeze_spec import parse_schedule
    from training.config.peft_spec import parse_peft

    assert "(Hu et al. 2021; alpha 8, dropout 0 by default). T: all (the default: every linear map)" in \
        page("docs/options.md")
    lora = parse_peft("lora:r=8")
    assert (lora.kind, lora.r, lora.alpha, lora.dropout) == ("lora", 8, 8.0, 0.0)
    assert set(lora.targets) == {"q", "k", "v", "attn_out", "ffn_in", "ffn_out"}
    assert parse_peft("lora:r=4,alpha=8,targets=q+v").targets == ("q", "v")
    assert "depth F (`all`, the default: nothing frozen" in page("docs/freezing.md")
    assert parse_schedule("gradual:1epoch").floor is None
    assert "is under T (default 0.1)" in page("docs/freezing.md")
    assert "up to depth C (default: all layers)" in page("docs/freezing.md")
    adaptive = parse_schedule("adaptive:20steps")
    assert adaptive.threshold == 0.1 and adaptive.ceiling is None


# ----------------------------------------------------------------------------- grammar and meaning the docs give

@pytest.mark.parametrize("value", [
    "lp-ft:1epoch", "lp-ft:2steps,probe-lr=1e-3,warmup=10", "gradual:15steps", "gradual:1epoch,layers=2,floor=2",
    "gradual:1epoch,floor=50%,warmup=0", "adaptive:20steps,percentile=50", "adaptive:5steps,threshold=0.2,ceiling=4",
    "adaptive:1epoch,ceiling=75%", "fixed"])
def test_documented_schedule_forms_are_accepted(value):
    """docs/options.md: lp-ft:K[,probe-lr=R][,warmup=W]; gradual:K[,layers=S][,floor=F][,warmup=W];
    adaptive:K[,threshold=T|percentile=P][,ceiling=C]; K: Nsteps or Nepochs."""
    cfg = parse(["--unfreeze-schedule", value, "--epochs", "3"])[1]
    from training.config.freeze_spec import parse_schedule

    assert cfg.unfreeze_schedule == value and parse_schedule(value).kind == value.partition(":")[0]


def test_threshold_or_percentile_not_both():
    """docs/options.md writes adaptive's test as `threshold=T|percentile=P`: one of them."""
    from training.config.freeze_spec import parse_schedule

    with pytest.raises(ValueError, match="--unfreeze-schedule"):
        parse_schedule("adaptive:5steps,threshold=0.1,percentile=50")


@pytest.mark.parametrize("share, layers, depth", [
    ("75%", 6, 4), ("75%", 12, 9), ("0%", 6, 0), ("100%", 6, 6), ("100%", 12, 12), ("50%", 6, 3), ("50%", 5, 2),
    ("25%", 6, 1)])
def test_a_share_of_the_layers_rounds_as_documented(share, layers, depth):
    """docs/freezing.md: P x L / 100 rounded to the nearest whole layer, an exact half rounded down (75% is 4
    of 6 layers and 9 of 12; 0% freezes the embeddings alone, 100% every layer); README: 50% of MiniLM's 6
    is "half the layers" (its row of --freeze-upto 3)."""
    from training.config.run_settings import resolve_settings

    assert "an exact half rounded down (75% is 4 of 6 layers and 9 of 12; 0% freezes the embeddings alone, " \
           "100% every layer)" in page("docs/freezing.md")
    cfg = parse(["--freeze-upto", share])[1]
    assert cfg.freeze_upto == share
    assert resolve_settings(cfg, layers).freeze_depth == depth


def test_a_12_layer_recipe_on_the_6_layer_default_names_what_to_run_instead():
    """docs/freezing.md: `--freeze-upto 9 --smart` on the 6-layer default "is refused in one line that names
    what to run instead (`--model bert-base-uncased`, or `--freeze-upto 75%` here)"."""
    from training.config.freeze_spec import depth_error

    line = depth_error(9, 6, "minilm-l6")
    assert "\n" not in line and "bert-base-uncased" in line and "--freeze-upto 75%" in line


@pytest.mark.parametrize("flag, value", [
    (f"--{f.name.replace('_', '-')}", True) for f in fields(TrainConfig)
    if f.type == "bool" and field_default(f.name) is False and not f.metadata["onoff"]
] + [
    (f"--no-{f.name.replace('_', '-')}", False) for f in fields(TrainConfig)
    if f.type == "bool" and field_default(f.name) is True
])
def test_a_switch_sets_what_its_name_says(flag, value):
    """argparse: --x (store_true) sets True, --no-x (store_false) sets False; left out, the other."""
    name = flag[2:].removeprefix("no-").replace("-", "_")
    assert getattr(parse([flag])[1], name) is value
    assert getattr(parse([])[1], name) is (not value)


@pytest.mark.parametrize("name", [f.name for f in fields(TrainConfig) if f.type == "bool" and not f.metadata["onoff"]])
def test_a_switch_set_by_a_config_file_is_undone_by_its_opposite(name, tmp_path):
    """docs/options.md: flags given over --config override the file, switches too: every switch has its
    opposite (--no-smart, --bucket), which --help does not list; the last one given wins, as argparse's."""
    on, off = dashed(name), "--no-" + name.replace("_", "-")
    for value, undo in ((True, off), (False, on)):
        path = write_json(tmp_path / f"{name}-{value}.json", {name: value})
        assert getattr(parse(["--config", str(path)])[1], name) is value
        assert getattr(parse(["--config", str(path), undo])[1], name) is (not value)
    assert getattr(parse([on, off])[1], name) is False and getattr(parse([off, on])[1], name) is True
    hidden = {a.option_strings[0] for a in build_parser()._actions if a.help == argparse.SUPPRESS}
    assert (on if field_default(name) else off) in hidden and (off if field_default(name) else on) not in hidden


@pytest.mark.parametrize("word, value", [("on", True), ("off", False)])
def test_smart_adv_dropout_on_off(word, value):
    """docs/options.md: `--smart-adv-dropout on|off`."""
    assert parse(["--smart", "--smart-adv-dropout", word])[1].smart_adv_dropout is value


@pytest.mark.parametrize("flag, word", [("--freeze-upto", "none"), ("--ema-decay", "off"),
                                        ("--early-stop-patience", "off"), ("--scale-lr-with-batch", "off"),
                                        ("--max-train-examples", "all"), ("--max-eval-examples", "all")])
def test_the_word_help_gives_as_the_default_selects_it(flag, word):
    """--help's "(default: none)" / "(default: off)" / "(default: all)": the same word given on the command line
    means it ("all" had been refused)."""
    assert shown_default(help_entries()[flag]) == word
    name = flag[2:].replace("-", "_")
    assert getattr(parse([flag, word])[1], name) is None
    assert getattr(parse([flag, word.upper()])[1], name) is None


# ----------------------------------------------------------------------------- --config FILE

def hand_written(tmp_path, values) -> Path:
    return write_json(tmp_path / "recipe.json", values)


def test_a_hand_written_recipe_reads_as_written(tmp_path):
    """A JSON of some options (docs/options.md): each value as written, lists in their order, null as the
    option's "none", every other option at its default."""
    values = {"freeze_upto": "75%", "tasks": ["sts", "sst"], "ema_decay": None, "early_stop_patience": 2,
              "eval_tokens": 0, "smart": True, "smart_adv_dropout": True, "smart_lambda": 0, "bucket": False,
              "lr": 3e-5, "max_train_examples": None, "files": {"sst_dev": "dev.csv"}, "task_sampling": "mixed"}
    cfg = parse(["--config", str(hand_written(tmp_path, values))])[1]
    expected = {**values, "tasks": ("sts", "sst")}
    assert {k: getattr(cfg, k) for k in values} == expected
    assert isinstance(cfg.tasks, tuple)
    untouched = {f.name for f in fields(TrainConfig)} - set(values)
    assert {k: getattr(cfg, k) for k in untouched} == {k: getattr(TrainConfig(), k) for k in untouched}


@pytest.mark.parametrize("flags, values", [
    (["--freeze-upto", "75%"], {"freeze_upto": "75%"}),
    (["--freeze-upto", "0%", "--frozen-cache", "disk"], {"freeze_upto": "0%", "frozen_cache": "disk"}),
    (["--freeze-upto", "-1"], {"freeze_upto": -1}),
    (["--freeze-upto", "0"], {"freeze_upto": 0}),
    (["--freeze-upto", "none", "--ema-decay", "off"], {"freeze_upto": None, "ema_decay": None}),
    (["--tasks", "sts", "para"], {"tasks": ("sts", "para")}),
    (["--eval-tokens", "0", "--save-every", "0", "--max-grad-norm", "0", "--weight-decay", "0",
      "--warmup-ratio", "0"], {"eval_tokens": 0, "save_every": 0, "max_grad_norm": 0.0, "weight_decay": 0.0,
                               "warmup_ratio": 0.0}),
    (["--task-sampling", "mixed"], {"task_sampling": "mixed", "pcgrad": False}),
    (["--pcgrad", "--pcgrad-variant", "dominant"], {"pcgrad": True, "task_sampling": "mixed",
                                                    "pcgrad_variant": "dominant"}),
    (["--no-bucket", "--no-test-predictions", "--strict"], {"bucket": False, "test_predictions": False,
                                                            "strict": True}),
    (["--smart", "--smart-adv-dropout", "on", "--smart-lambda", "0", "--smart-perturbation", "paper",
      "--smart-eps", "1e-7"], {"smart_adv_dropout": True, "smart_lambda": 0.0, "smart_eps": 1e-7}),
    (["--ema-decay", "0.999", "--early-stop-patience", "3", "--resume", "auto", "--export-hf", "hf",
      "--predictions-dir", "pred", "--max-eval-examples", "7"],
     {"ema_decay": 0.999, "early_stop_patience": 3, "resume": "auto", "export_hf": "hf", "predictions_dir": "pred",
      "max_eval_examples": 7}),
    (["--lr", "3.3e-5", "--scale-lr-with-batch", "32", "--layer-lr-decay", "0.9", "--seed", "4294967295"],
     {"lr": 3.3e-5, "scale_lr_with_batch": 32, "layer_lr_decay": 0.9, "seed": 2**32 - 1}),
    (["--sst-train", "a.csv", "--sts-test", "b.csv"], {"files": {"sst_train": "a.csv", "sts_test": "b.csv"}}),
    (["--peft", "lora:r=8,targets=q+v", "--unfreeze-schedule", "fixed", "--pooling", "mean"],
     {"peft": "lora:r=8,targets=q+v", "pooling": "mean"}),
    (["--unfreeze-schedule", "gradual:1epoch,floor=50%", "--pair-encoding", "siamese", "--siamese-init",
      "identity"], {"unfreeze_schedule": "gradual:1epoch,floor=50%", "siamese_init": "identity"}),
    (["--compile", "--compile-mode", "reduce-overhead", "--pad-multiple", "8"],
     {"compile": True, "compile_mode": "reduce-overhead", "pad_multiple": 8}),
])
def test_a_runs_config_json_reads_back_to_the_same_config(tmp_path, flags, values):
    """config.json as a run writes it (the whole config, json.dumps(..., indent=2), training/run/trainer.py)
    read back with --config: the same TrainConfig, None, lists, shares and zeros included; the file holds
    each value as JSON spells it."""
    cfg = parse(flags)[1]
    assert {k: getattr(cfg, k) for k in values} == values
    path = write_json(tmp_path / "config.json", cfg.to_dict())
    on_disk = json.loads(path.read_text())
    assert set(on_disk) == {f.name for f in fields(TrainConfig)}
    assert {k: on_disk[k] for k in values} == {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    back = parse(["--config", str(path)])[1]
    assert back == cfg
    assert parse(["--config", str(write_json(tmp_path / "again.json", back.to_dict()))])[1] == cfg


@pytest.mark.parametrize("saved, flags, name, value", [
    ({"epochs": 5}, ["--epochs", "2"], "epochs", 2),
    ({"epochs": 5}, ["--epochs", "3"], "epochs", 3),  # the flag at the default still wins
    ({"lr": 3e-5}, ["--lr", "1e-3"], "lr", 1e-3),
    ({"freeze_upto": "75%"}, ["--freeze-upto", "2"], "freeze_upto", 2),
    ({"freeze_upto": 3}, ["--freeze-upto", "50%"], "freeze_upto", "50%"),
    ({"freeze_upto": 3}, ["--freeze-upto", "none"], "freeze_upto", None),
    ({"ema_decay": 0.99}, ["--ema-decay", "off"], "ema_decay", None),
    ({"ema_decay": None}, ["--ema-decay", "0.9"], "ema_decay", 0.9),
    ({"max_train_examples": 100}, ["--max-train-examples", "none"], "max_train_examples", None),
    ({"tasks": ["sst"]}, ["--tasks", "para", "sts"], "tasks", ("para", "sts")),
    ({"pooling": "mean"}, ["--pooling", "cls"], "pooling", "cls"),
    ({"bucket": True}, ["--no-bucket"], "bucket", False),
    ({"test_predictions": True}, ["--no-test-predictions"], "test_predictions", False),
    ({"pcgrad": False}, ["--pcgrad"], "pcgrad", True),
    ({"smart": True, "smart_adv_dropout": True}, ["--smart-adv-dropout", "off"], "smart_adv_dropout", False),
    ({"smart": True}, ["--smart-adv-dropout", "on"], "smart_adv_dropout", True),
    ({"task_sampling": "round-robin"}, ["--task-sampling", "annealed"], "task_sampling", "annealed"),
    ({"files": {"sst_train": "a.csv"}}, ["--sst-train", "b.csv"], "files", {"sst_train": "b.csv"}),
    ({"files": {"sst_train": "a.csv"}}, ["--sst-dev", "d.csv"], "files", {"sst_train": "a.csv", "sst_dev": "d.csv"}),
    ({"resume": "auto"}, ["--resume", "x.pt"], "resume", "x.pt"),
    ({"out_dir": "runs/a"}, ["--out-dir", "runs/b"], "out_dir", "runs/b"),
])
@pytest.mark.parametrize("order", ["flag after", "flag before"])
def test_a_flag_overrides_the_config_file(tmp_path, saved, flags, name, value, order):
    """docs/options.md: `--config FILE` starts from the options in FILE; flags given on the command line
    override it (wherever they stand: argparse takes a flag over any default)."""
    path = str(hand_written(tmp_path, saved))
    argv = ["--config", path, *flags] if order == "flag after" else [*flags, "--config", path]
    assert getattr(parse(argv)[1], name) == value
    if name not in ("files", "tasks"):
        assert getattr(parse(["--config", path])[1], name) == (saved[name] if name in saved else field_default(name))


# ----------------------------------------------------------------------------- refusals: one line, exit 2, no torch

def refused_in_one_line(rc, err, *names):
    assert rc != ACCEPTED, "accepted: the command line passed validation"
    assert rc == 2, f"exit status {rc}: {err}"
    assert len(err) == 1, f"expected one line, got {err}"
    assert err[0].startswith(f"{PROG}: error: "), err[0]
    assert "Traceback" not in err[0]
    for name in names:
        assert name in err[0], f"{name!r} not in {err[0]!r}"
    real = set(actions_by_flag())
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", err[0]))
    assert named <= real, f"the line names flags that do not exist: {sorted(named - real)}"
    return err[0]


@pytest.mark.parametrize("flags, names", [
    # argparse's own refusals: a value of the wrong type, a choice not offered
    (["--epochs", "three"], ["--epochs", "'three'"]),
    (["--epochs", "1.5"], ["--epochs", "'1.5'"]),
    (["--seed", "1e3"], ["--seed", "'1e3'"]),
    (["--lr", "fast"], ["--lr", "'fast'"]),
    (["--batch-size", "32.0"], ["--batch-size", "'32.0'"]),
    (["--pooling", "max"], ["--pooling", "'max'"]),
    (["--tasks", "nli"], ["--tasks", "'nli'"]),
    (["--tasks"], ["--tasks"]),
    (["--smart-adv-dropout", "yes"], ["--smart-adv-dropout", "'yes'"]),
    (["--precision", "fp8"], ["--precision", "'fp8'"]),
    (["--frozen-cache", "never"], ["--frozen-cache", "'never'"]),
    (["--report-to", "wandb"], ["--report-to", "'wandb'"]),
    (["--freeze-upto", "150%"], ["--freeze-upto", "150%"]),
    (["--freeze-upto", "-2"], ["--freeze-upto", "-2"]),
    (["--freeze-upto", "1.5"], ["--freeze-upto", "1.5"]),
    (["--freeze-upto", "most"], ["--freeze-upto", "most"]),
    (["--freeze-upto", "nan%"], ["--freeze-upto", "nan%"]),
    # validation's: not finite, out of range
    (["--lr", "nan"], ["--lr", "nan"]),
    (["--lr", "inf"], ["--lr", "inf"]),
    (["--lr=-1"], ["--lr", "-1"]),
    (["--max-grad-norm", "inf"], ["--max-grad-norm", "inf"]),
    (["--warmup-ratio", "nan"], ["--warmup-ratio", "nan"]),
    (["--warmup-ratio", "1"], ["--warmup-ratio", "1"]),
    (["--layer-lr-decay", "0"], ["--layer-lr-decay", "0"]),
    (["--layer-lr-decay", "1.5"], ["--layer-lr-decay", "1.5"]),
    (["--ema-decay", "1"], ["--ema-decay", "1"]),
    (["--eval-tokens", "-1"], ["--eval-tokens", "-1"]),
    (["--keep-last", "0"], ["--keep-last", "0"]),
    (["--save-every", "-1"], ["--save-every", "-1"]),
    (["--max-bad-steps", "0"], ["--max-bad-steps", "0"]),
    (["--log-every", "0"], ["--log-every", "0"]),
    (["--pad-multiple", "0"], ["--pad-multiple", "0"]),
    (["--grad-accum-steps", "0"], ["--grad-accum-steps", "0"]),
    (["--early-stop-patience", "0"], ["--early-stop-patience", "0"]),
    (["--scale-lr-with-batch", "0"], ["--scale-lr-with-batch", "0"]),
    (["--batch-size", "0"], ["--batch-size", "0"]),
    (["--eval-batch-size", "0"], ["--eval-batch-size", "0"]),
    (["--max-train-examples", "0"], ["--max-train-examples", "0"]),
    (["--max-eval-examples", "0"], ["--max-eval-examples", "0"]),
    (["--smart", "--smart-lambda", "inf"], ["--smart-lambda", "inf"]),
    (["--smart", "--smart-eps", "inf"], ["--smart-eps", "inf"]),
    (["--smart", "--smart-steps", "0"], ["--smart-steps", "0"]),
    (["--smart", "--smart-mu", "-0.5"], ["--smart-mu", "-0.5"]),
    (["--unfreeze-schedule", "sometimes"], ["--unfreeze-schedule", "sometimes"]),
    (["--unfreeze-schedule", "gradual:3epochs"], ["--unfreeze-schedule", "--epochs"]),
    (["--peft", "lora"], ["--peft", "lora"]),
    (["--peft", "lora:r=0"], ["--peft", "r"]),
    (["--peft", "lora:r=8", "--unfreeze-schedule", "lp-ft:1epoch"], ["--peft", "--unfreeze-schedule"]),
    (["--pcgrad", "--tasks", "sst"], ["--pcgrad", "--tasks"]),
    (["--pcgrad", "--grad-accum-steps", "2"], ["--grad-accum-steps", "--pcgrad"]),
    (["--task-sampling", "mixed", "--max-batches-per-task", "5"], ["--max-batches-per-task"]),
    (["--frozen-dropout", "--frozen-cache", "memory"], ["--frozen-dropout", "--frozen-cache"]),
])
def test_a_bad_flag_is_one_line_exit_2_before_torch(flags, names, data_dir, tmp_path, monkeypatch, capsys):
    rc, err = run_main([*flags, "--data-dir", str(data_dir), "--out-dir", str(tmp_path / "run")], monkeypatch, capsys)
    refused_in_one_line(rc, err, *names)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("saved, names", [
    ({"max-length": 64}, ["unknown option(s) max-length"]),
    ({"verbose": True}, ["unknown option(s) verbose"]),
    ({"config": "other.json"}, ["unknown option(s) config"]),
    ({"epochs": True}, ["--epochs", "True"]),
    ({"epochs": 3.0}, ["--epochs", "3.0"]),
    ({"seed": 1.0}, ["--seed"]),
    ({"lr": float("nan")}, ["--lr", "nan"]),
    ({"lr": float("inf")}, ["--lr", "inf"]),
    ({"warmup_ratio": 1.0}, ["--warmup-ratio"]),
    ({"freeze_upto": "none"}, ["--freeze-upto", "'none'"]),
    ({"freeze_upto": 1.5}, ["--freeze-upto", "1.5"]),
    ({"freeze_upto": "150%"}, ["--freeze-upto", "150%"]),
    ({"tasks": "sst"}, ["--tasks", "'sst'"]),
    ({"tasks": []}, ["--tasks"]),
    ({"pair_swap": 0}, ["--pair-swap"]),
    ({"smart": True, "smart_adv_dropout": "on"}, ["--smart-adv-dropout", "'on'"]),
    ({"smart": True, "smart_steps": "2"}, ["--smart-steps", "'2'"]),
    ({"files": []}, ["files"]),
    ({"predictions_dir": 5}, ["--predictions-dir"]),
    ({"data_dir": None}, ["--data-dir", "None"]),
    ({"model": None}, ["--model", "None"]),
    ({"unfreeze_schedule": None}, ["--unfreeze-schedule", "None"]),
    ({"peft": None}, ["--peft", "None"]),
    ({"out_dir": None}, ["--out-dir", "None"]),
    ({"device": None}, ["--device", "None"]),
    ({"tasks": None}, ["--tasks", "None"]),
])
def test_a_bad_config_file_value_is_one_line_naming_the_file(saved, names, data_dir, tmp_path, monkeypatch, capsys):
    """Wrong type, out of range, unknown key, null where the option has no "none": one line naming the
    --config file and the option, exit 2, before anything heavy."""
    path = hand_written(tmp_path, saved)
    rc, err = run_main(["--config", str(path), "--data-dir", str(data_dir), "--out-dir", str(tmp_path / "run")],
                       monkeypatch, capsys)
    refused_in_one_line(rc, err, f"--config {path}", *names)


@pytest.mark.parametrize("saved, name", [({"smart_steps": "two"}, "--smart-steps"),
                                         ({"smart_lambda": None}, "--smart-lambda"),
                                         ({"smart_norm": "l1"}, "--smart-norm")])
def test_a_bad_feature_value_in_the_file_is_refused_when_a_flag_turns_the_feature_on(saved, name, data_dir, tmp_path,
                                                                                       monkeypatch, capsys):
    path = hand_written(tmp_path, saved)
    rc, err = run_main(["--config", str(path), "--smart", "--data-dir", str(data_dir)], monkeypatch, capsys)
    refused_in_one_line(rc, err, name)


def test_the_harness_sees_an_accepted_command_line(data_dir, tmp_path, monkeypatch, capsys):
    """run_main's ACCEPTED is reachable: a valid command line gets past validation to the trainer."""
    rc, err = run_main(["--data-dir", str(data_dir), "--out-dir", str(tmp_path / "run"), "--freeze-upto", "75%"],
                       monkeypatch, capsys)
    assert (rc, err) == (ACCEPTED, [])


# ----------------------------------------------------------------------------- the documented command lines

def documented_command_lines() -> list[tuple[str, str]]:
    """Every `python run_multitask.py FLAGS` in README.md and docs/*.md, as (page, FLAGS), but those with a
    placeholder (`...`, FILE, RUN) or only --help."""
    found = []
    for path in [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")):
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        spans = [line for b in blocks for line in b.splitlines()] + re.findall(r"`([^`]+)`", prose)
        for span in spans:
            m = re.search(r"python\s+run_multitask\.py((?:\s[^#|]*)?)", span)
            if not m:
                continue
            flags = " ".join(m.group(1).split("#")[0].split())
            if flags in ("", "--help") or "..." in flags or re.search(r"\b[A-Z]{3,}\b|--config", flags):
                continue
            found.append((str(path.relative_to(REPO)), flags))
    return sorted(set(found))


# README's "you want | add to `python run_multitask.py`" table, each cell as the page writes it
README_RECIPES = [
    "--epochs 3 --smart --smart-lambda 0 --pooling mean --ema-decay 0.998 --predict-both-orders",
    "--freeze-upto 2",
    "--freeze-upto 50%",
    "--peft lora:r=8 --pooling mean --lr 1e-3",
    "--model mpnet-base --freeze-upto 9 --smart --smart-perturb-at first-trainable",
    "--freeze-upto 75% --smart",
]


def test_the_docs_show_command_lines_to_check():
    assert len(documented_command_lines()) >= 30
    for recipe in README_RECIPES:
        assert f"`{recipe}`" in page("README.md"), recipe


@pytest.mark.parametrize("where, flags", documented_command_lines() + [("README.md", r) for r in README_RECIPES])
def test_a_documented_command_line_is_accepted(where, flags, data_dir, tmp_path, monkeypatch, capsys):
    """The docs' own command lines pass the command line and its validation (their data folder replaced by
    a stand-in; the model's layers are checked later, with the model)."""
    argv = shlex.split(flags) + ["--data-dir", str(data_dir), "--out-dir", str(tmp_path / "run")]
    argv = [a for a in argv if a not in ("--device", "cuda")]  # no CUDA here: validation would say so
    rc, err = run_main(argv, monkeypatch, capsys)
    assert (rc, err) == (ACCEPTED, []), f"{where}: `python run_multitask.py {flags}` refused: {err}"


# ----------------------------------------------------------------------------- the sweep, study, search: field names

def test_every_option_is_taken_by_its_field_name():
    """The study's recipes and the search's spaces name options by field (docs/search.md: "any training
    option of run_multitask.py (its field name)"): each field at its default is accepted, a misspelling is
    named, and a value of the wrong type is refused."""
    from training.config.train_config import options_problem

    for f in fields(TrainConfig):
        assert options_problem({f.name: field_default(f.name)}) is None, f.name
    assert "max-length" in options_problem({"max-length": 64})
    assert "--epochs" in options_problem({"epochs": "3"})


# ----------------------------------------------------------------------------- faults this audit found (fixed)

@pytest.mark.parametrize("saved", [{"smart_eps": "1e-3"}, {"smart_steps": "2"}, {"smart_adv_dropout": "off"}])
def test_a_files_value_for_a_feature_option_is_checked_when_a_flag_turns_the_feature_on(
        saved, data_dir, tmp_path, monkeypatch, capsys):
    """A --config file's value of the wrong type for one of --smart's options is refused whether the file or
    the command line turns --smart on. It had passed with the flag: the file's check skipped a feature's
    options while the feature was off in the file, and argparse then ran the string default through the
    flag's type (float('1e-3')), or read any non-empty string as on ({"smart_adv_dropout": "off"} ran with
    the dropout on)."""
    path = hand_written(tmp_path, saved)
    rc, err = run_main(["--config", str(path), "--smart", "--data-dir", str(data_dir)], monkeypatch, capsys)
    if rc == ACCEPTED:
        cfg = parse(["--config", str(path), "--smart"])[1]
        pytest.fail(f"{saved} with --smart accepted: the run gets {({k: getattr(cfg, k) for k in saved})}")
    refused_in_one_line(rc, err, str(path), dashed(next(iter(saved))))


@pytest.mark.parametrize("tasks", [["sst", "sst"], ["para", "sts", "para"]])
def test_a_task_named_twice_is_refused(tasks, data_dir, tmp_path, monkeypatch, capsys):
    """--tasks is "some of sst, para, sts": a task named twice is refused in one line (`--pcgrad --tasks sst
    sst` had passed PCGrad's two-task check, though the run loads one task)."""
    rc, err = run_main(["--pcgrad", "--tasks", *tasks, "--data-dir", str(data_dir),
                        "--out-dir", str(tmp_path / "run")], monkeypatch, capsys)
    refused_in_one_line(rc, err, "--tasks", "more than once")


@pytest.mark.parametrize("params", [{"smart_steps": {"choices": ["two", 2]}},
                                    {"smart_eps": {"low": -1.0, "high": 1.0}}])
def test_a_search_space_refuses_bad_values_for_a_features_options(params, tmp_path):
    """docs/search.md: "Every mistake is one line naming the file and the option, before any trial: ... a
    choice the option does not accept", for a feature's options too (each was checked alone, its feature off
    in the one-option dict, so nothing about it was checked)."""
    from training.common.errors import ConfigError
    from training.experiments.search.space import load_space

    ok = write_json(tmp_path / "ok.json", {"fixed": {"smart": True}, "params": {"epochs": {"choices": ["two", 2]}}})
    with pytest.raises(ConfigError, match="epochs"):
        load_space(ok)
    path = write_json(tmp_path / "space.json", {"fixed": {"smart": True}, "params": params})
    with pytest.raises(ConfigError, match=next(iter(params))):
        load_space(path)


@pytest.mark.parametrize("flags", [["--ema-decay", "0,99"], ["--max-train-examples", "alll"],
                                   ["--early-stop-patience", "two"]])
def test_an_optional_number_flags_refusal_names_the_type_and_the_words(flags, data_dir, monkeypatch, capsys):
    """The flags that also take none/off say "invalid float value" / "invalid int value" and the words they take
    (they named a private function, "invalid _opt_float value")."""
    rc, err = run_main([*flags, "--data-dir", str(data_dir)], monkeypatch, capsys)
    line = refused_in_one_line(rc, err, flags[0])
    assert "_opt_" not in line and re.search(r"invalid (int|float) value: .*\bnone\b", line), line


@pytest.mark.parametrize("saved", [{"bucket": "false"}, {"test_predictions": None}])
def test_an_off_switchs_refusal_names_the_switch_that_exists(saved, data_dir, tmp_path, monkeypatch, capsys):
    """The options on by default have only an off-switch (--no-bucket, --no-test-predictions): a refusal of
    their value names the key and that switch (it named --bucket / --test-predictions, which do not exist)."""
    path = hand_written(tmp_path, saved)
    rc, err = run_main(["--config", str(path), "--data-dir", str(data_dir)], monkeypatch, capsys)
    key = next(iter(saved))
    refused_in_one_line(rc, err, str(path), f"{key} (--no-{key.replace('_', '-')})")
