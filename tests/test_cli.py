"""run_multitask.py's command line: --help, and every refusal is exit status 2 with one line naming the
problem, given before any heavy work (or, for problems only the model shows, before training)."""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data.loaders import COURSE_FILES, TASKS
from minbert import Bert, BertConfig, save_hf
from training.args import config_from_args
from training.config.train_config import TrainConfig, validate
from training.main import COMMANDS
from training.train import build_parser, main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s"]
GROUPS = ["model:", "data:", "schedule:", "optimisation:", "PCGrad:", "SMART (Jiang et al. 2020):", "run:"]


def write_course_files(d, skip=()):
    d.mkdir(parents=True, exist_ok=True)
    sst = "\tid\tsentence\tsentiment\n0\ta\tthe cat sat\t3\n1\tb\tthe mats\t1\n"
    pair = "\tid\tsentence1\tsentence2\t{}\n0\tc\tthe cat\ton the mat\t{}\n1\td\tcats sat\tthe cat\t{}\n"
    text = {"sst": sst, "para": pair.format("is_duplicate", 1.0, 0.0), "sts": pair.format("similarity", 4.2, 1.0)}
    for task in TASKS:
        for split in ("train", "dev"):
            if (task, split) not in skip:
                (d / COURSE_FILES[task][split]).write_text(text[task])
    return d


def tiny_checkpoint(d, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=128)
    save_hf(Bert(BertConfig(**{**cfg, **kw})), d)
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return d


def run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith("run_multitask.py: error: "), lines[0]
    return lines[0]


@pytest.fixture
def args(tmp_path):
    """Flags of a run that would be valid but for what a test adds; the model does not exist, so a
    problem not caught by validation would surface as a different error."""
    data = write_course_files(tmp_path / "data")
    return ["--data-dir", str(data), "--model", str(tmp_path / "no-model"), "--out-dir", str(tmp_path / "run"),
            "--predictions-dir", str(tmp_path / "pred")]


# ----------------------------------------------------------------------------- --help

def test_help_lists_every_group_and_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for group in GROUPS:
        assert f"\n{group}\n" in out, group
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert (flag in out) is (action.help != argparse.SUPPRESS), flag  # a switch's opposite: unlisted


def test_script_help_runs_without_importing_torch():
    code = ("import runpy, sys; sys.argv = ['run_multitask.py', '--help']\n"
            "try:\n    runpy.run_path('run_multitask.py', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "assert 'torch' not in sys.modules, 'torch imported just to print --help'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "usage: run_multitask.py" in r.stdout and "--freeze-upto" in r.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_help_comes_before_torch_and_scipy(command):
    """`minbert COMMAND --help` (and a flag error) answers at once: torch and scipy, seconds of imports, load
    only once the flags are known."""
    code = (f"import sys\nfrom training.main import main\ntry:\n    main([{command!r}, '--help'])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print('loaded:', *[name for name in ('torch', 'scipy') if name in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"usage: minbert {command}" in r.stdout
    assert r.stdout.splitlines()[-1] == "loaded:", r.stdout.splitlines()[-1]


@pytest.mark.parametrize("command,extra", [("evaluate", []), ("predict", ["sst", "in.txt", "out.tsv"]),
                                           ("export", ["out"]), ("analyze", []), ("ensemble", ["."])])
def test_a_mistyped_run_is_refused_before_torch(command, extra, tmp_path):
    """A RUN that does not exist is refused as the command line is read, in one line naming it, before the
    seconds of importing torch."""
    typo = str(tmp_path / "runs" / "typo")
    code = (f"import sys\nfrom training.main import main\ntry:\n    main([{command!r}, {typo!r}, *{extra!r}])\n"
            "except SystemExit as e:\n    assert e.code == 2, e.code\n"
            "print('loaded:', *[name for name in ('torch', 'scipy') if name in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines() == [f"minbert {command}: error: argument RUN: {typo} does not exist "
                                             "(see --help)"]
    assert r.stdout.splitlines()[-1] == "loaded:", r.stdout


def test_defaults_match_trainconfig(tmp_path):
    """Flags left out give TrainConfig's defaults (mtdnn sampling unless --pcgrad)."""
    cfg = config_from_args(build_parser().parse_args([]))
    assert cfg == TrainConfig()
    assert config_from_args(build_parser().parse_args(["--pcgrad"])).task_sampling == "mixed"
    assert config_from_args(build_parser().parse_args(["--sst-dev", "x.csv"])).file("sst", "dev") == "x.csv"


# ----------------------------------------------------------------------------- validation errors

def test_a_valid_configuration_has_no_errors(args):
    assert validate(config_from_args(build_parser().parse_args(args + ["--device", "cpu"]))) == []


@pytest.mark.parametrize("task,split", [("sst", "train"), ("para", "dev"), ("sts", "dev")])
def test_missing_data_file_names_the_path(tmp_path, capsys, task, split):
    data = write_course_files(tmp_path / "data", skip={(task, split)})
    rc, _, err = run(["--data-dir", str(data), "--model", str(tmp_path / "m"), "--out-dir", str(tmp_path / "run")],
                     capsys)
    assert rc == 2
    line = one_error_line(err)
    assert str(data / COURSE_FILES[task][split]) in line and "no such file" in line
    assert not (tmp_path / "run").exists()


def test_missing_override_file_names_the_path(args, tmp_path, capsys):
    missing = tmp_path / "elsewhere" / "my-sts-train.csv"
    rc, _, err = run(args + ["--sts-train", str(missing)], capsys)
    assert rc == 2
    assert str(missing) in one_error_line(err)


def test_pcgrad_with_mtdnn_sampling(args, capsys):
    rc, _, err = run(args + ["--pcgrad", "--task-sampling", "mtdnn"], capsys)
    assert rc == 2
    line = one_error_line(err)
    assert "--pcgrad" in line and "--task-sampling mixed" in line


def test_pair_swap_needs_cross_encoding(args, capsys):
    rc, _, err = run(args + ["--pair-swap", "--pair-encoding", "siamese"], capsys)
    assert rc == 2
    assert "--pair-swap is for --pair-encoding cross" in one_error_line(err)


def test_predict_both_orders_needs_cross_encoding(args, capsys):
    rc, _, err = run(args + ["--predict-both-orders", "--pair-encoding", "siamese"], capsys)
    assert rc == 2
    assert "--predict-both-orders is for --pair-encoding cross" in one_error_line(err)


def test_siamese_init_needs_siamese_encoding(args, capsys):
    rc, _, err = run(args + ["--siamese-init", "identity"], capsys)
    assert rc == 2
    assert "--siamese-init is for --pair-encoding siamese" in one_error_line(err)


def test_pair_swap_doubles_the_pair_tasks_training_sets_only(tmp_path):
    from minbert import Tokenizer
    from training.run.build import load_data

    data, ckpt = write_course_files(tmp_path / "data"), tiny_checkpoint(tmp_path / "ckpt")
    tok = Tokenizer.from_checkpoint(ckpt)
    plain = load_data(TrainConfig(model=str(ckpt), data_dir=str(data)), tok)
    swapped = load_data(TrainConfig(model=str(ckpt), data_dir=str(data), pair_swap=True), tok)
    assert swapped.train["sst"].examples == plain.train["sst"].examples
    for task in ("para", "sts"):
        assert swapped.dev[task].examples == plain.dev[task].examples  # scored on the file as it is
        orig, both = plain.train[task], swapped.train[task]
        assert both.examples[: len(orig)] == orig.examples
        for e, s in zip(orig.examples, both.examples[len(orig):]):
            assert (s.id, s.text_a, s.text_b, s.label) == (f"{e.id}#swap", e.text_b, e.text_a, e.label)
        # [CLS] b [SEP] a [SEP]: b's tokens now carry type 0
        ids, types = both.sequences[0][len(orig)]
        want_ids, want_types = tok.encode([orig.examples[0].text_b], [orig.examples[0].text_a])[0]
        assert (ids, types) == (want_ids, want_types)


def test_predict_both_orders_encodes_the_swapped_dev_and_test_pairs_only(tmp_path):
    from minbert import Tokenizer
    from training.run.build import load_data

    data, ckpt = write_course_files(tmp_path / "data"), tiny_checkpoint(tmp_path / "ckpt")
    for task in TASKS:  # the test files: the dev files without their labels will do
        labelled = (data / COURSE_FILES[task]["dev"]).read_text().splitlines()
        (data / COURSE_FILES[task]["test"]).write_text("".join(r.rsplit("\t", 1)[0] + "\n" for r in labelled))
    tok = Tokenizer.from_checkpoint(ckpt)
    splits = load_data(TrainConfig(model=str(ckpt), data_dir=str(data), predict_both_orders=True), tok)
    assert all(d.swapped is None for d in splits.train.values())  # training data as it is
    for split in (splits.dev, splits.test):
        assert split["sst"].swapped is None
        for task in ("para", "sts"):
            d = split[task]
            assert d.swapped.examples == d.examples  # same ids and labels: predictions line up
            a, b = [e.text_a for e in d.examples], [e.text_b for e in d.examples]
            assert d.swapped.sequences == [tok.encode(b, a)]
            assert d.sequences == [tok.encode(a, b)]


def test_zero_epochs(args, capsys):
    rc, _, err = run(args + ["--epochs", "0"], capsys)
    assert rc == 2
    assert one_error_line(err) == "run_multitask.py: error: --epochs must be >= 1, not 0"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_device_without_cuda(args, capsys, device):
    rc, _, err = run(args + ["--device", device], capsys)
    assert rc == 2
    line = one_error_line(err)
    assert f"--device {device}" in line and "CUDA is not available" in line


def test_several_problems_one_line_each(tmp_path, capsys):
    data = write_course_files(tmp_path / "data", skip={("sst", "train")})
    rc, _, err = run(["--data-dir", str(data), "--epochs", "0", "--lr", "0", "--warmup-ratio", "1"], capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("run_multitask.py: error: ") for line in lines)


# ----------------------------------------------------------------------------- problems the model shows

def test_tokenizer_larger_than_the_embedding(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "ckpt", vocab_size=8)  # vocab.txt has 11 tokens
    rc, _, err = _run_on(tmp_path, capsys, ckpt)
    assert rc == 2
    line = one_error_line(err)
    assert f"the tokenizer has {len(VOCAB)} tokens" in line and "embedding has 8 rows" in line
    assert str(ckpt) in line
    assert not (tmp_path / "run" / "best.pt").exists()


def _run_on(tmp_path, capsys, ckpt, *flags):
    data = write_course_files(tmp_path / "data")
    return run(["--model", str(ckpt), "--data-dir", str(data), "--device", "cpu", "--epochs", "1",
                "--out-dir", str(tmp_path / "run"), "--predictions-dir", str(tmp_path / "pred"), *flags], capsys)


def test_max_length_beyond_the_models_positions(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "ckpt", max_position_embeddings=32)
    rc, _, err = _run_on(tmp_path, capsys, ckpt, "--max-length", "33")
    assert rc == 2
    line = one_error_line(err)
    assert "--max-length 33 is longer than the model's 32 positions" in line and str(ckpt / "config.json") in line


@pytest.mark.parametrize("edit, names", [({"num_attention_heads": 0}, "num_attention_heads 0"),
                                         ({"hidden_size": 15}, "not divisible"),
                                         ({"max_position_embeddings": "512"}, "max_position_embeddings '512'")])
def test_a_broken_config_json_is_one_line_naming_it(tmp_path, capsys, edit, names):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, **edit}))
    rc, _, err = _run_on(tmp_path, capsys, ckpt)
    assert rc == 2
    line = one_error_line(err)
    assert str(ckpt / "config.json") in line and names in line


def test_a_vocabulary_without_cls_is_one_line(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    (ckpt / "vocab.txt").write_text("\n".join(t for t in VOCAB if t != "[CLS]") + "\n")
    rc, _, err = _run_on(tmp_path, capsys, ckpt)
    assert rc == 2 and f"{ckpt / 'vocab.txt'}: cls_token not found" in one_error_line(err)


@pytest.mark.parametrize("flags, names", [
    (["--max-batches-per-task", "0"], "--max-batches-per-task must be >= 1, not 0"),
    (["--evals-per-epoch", "0"], "--evals-per-epoch must be >= 1, not 0"),
    (["--head-dropout", "1.5"], "--head-dropout must be in [0, 1), not 1.5"),
    (["--weight-decay", "-1"], "--weight-decay must be >= 0, not -1.0"),
    (["--max-grad-norm", "-1"], "--max-grad-norm must be >= 0"),
    (["--max-length", "4"], "5 for cross-encoded pairs"),
    (["--smart", "--smart-beta", "1.5"], "--smart-beta must be in [0, 1), not 1.5"),
    (["--smart", "--smart-step-size", "-1"], "--smart-step-size must be > 0, not -1.0"),
    (["--smart", "--smart-noise-var", "-1"], "--smart-noise-var must be >= 0, not -1.0"),
    (["--smart", "--smart-lambda", "-1"], "--smart-lambda and --smart-mu must be >= 0"),
    (["--smart", "--smart-lambda", "0", "--smart-mu", "0"], "leave nothing of SMART: drop --smart"),
    (["--seed", "-1"], "--seed must be in [0, 2**32)"),
    (["--seed", str(2**32)], "--seed must be in [0, 2**32)"),
    # a feature's options while it is off
    (["--smart-eps", "-1"], "--smart-eps: is for --smart, which is off"),
    (["--smart-lambda", "5", "--smart-perturb-at", "first-trainable"],
     "--smart-lambda, --smart-perturb-at: are for --smart, which is off"),
    (["--pcgrad-variant", "dominant"], "--pcgrad-variant: is for --pcgrad, which is off"),
    (["--compile-mode", "reduce-overhead"], "--compile-mode: is for --compile, which is off"),
])
def test_out_of_range_values_are_refused_before_loading(args, capsys, flags, names):
    rc, _, err = run(args + flags, capsys)  # the model does not exist: validation must speak first
    assert rc == 2 and names in one_error_line(err)


def test_max_length_4_is_enough_without_pair_tasks(args, capsys):
    cfg = config_from_args(build_parser().parse_args(args + ["--max-length", "4", "--tasks", "sst"]))
    assert validate(cfg) == []


def test_a_missing_model_is_one_line_naming_it(args, tmp_path, capsys):
    rc, _, err = run(args, capsys)
    assert rc == 2 and str(tmp_path / "no-model") in one_error_line(err)


def test_help_shows_no_none_defaults(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "(default: None)" not in out and "(default: all)" in out and "--overwrite" in out
    assert "(default: True)" not in out  # an off-switch (--no-bucket) showing its dest's default


# ----------------------------------------------------------------------------- abbreviations

def test_an_abbreviated_flag_is_refused_naming_the_whole_one(capsys):
    """argparse would take --epoch for --epochs without a word (a typo of another flag as well): the
    nearest-flag refusal must see it."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--epoch", "1"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "run_multitask.py: error: unrecognized arguments: --epoch 1 (did you mean --epochs?) (see --help)"]


def test_every_parser_refuses_abbreviations():
    """Every argparse parser in the repository is built with allow_abbrev=False (training.args.Parser
    sets it for the commands; data.download and bench/ build their own)."""
    import ast

    from training.args import Parser

    assert Parser(prog="x").allow_abbrev is False
    lax = []
    for path in sorted(p for folder in ("training", "data", "bench", "minbert", "heads") for p in
                       (Path(REPO) / folder).rglob("*.py")) + [Path(REPO) / "run_multitask.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            strict = any(k.arg == "allow_abbrev" and getattr(k.value, "value", None) is False
                         for k in getattr(node, "keywords", ()))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ArgumentParser" and not strict:
                lax.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert lax == []


def test_download_refuses_an_abbreviated_flag(capsys):
    from data.download import main as download_main

    with pytest.raises(SystemExit) as e:
        download_main(["--forc"])
    assert e.value.code == 2


# ----------------------------------------------------------------------------- help text

MEASURED = re.compile(r"\bmeasured\b|\b\d+(\.\d+)?x\b|\b\d+(\.\d+)? ?(ms|s|min|minutes|seconds|hours|GB|MB|GiB|MiB)\b")


def test_train_help_is_short(monkeypatch):
    """`minbert train --help` fits a screenful or two at 80 columns (it was 357 lines): each option's help at
    most two lines (160 characters), the rest in docs/options.md."""
    monkeypatch.setenv("COLUMNS", "80")
    p = build_parser("minbert train")
    text, fmt = p.format_help(), p._get_formatter()
    assert len(text.splitlines()) < 150, len(text.splitlines())
    long = {a.option_strings[-1]: fmt._expand_help(a) for a in p._actions if a.help and len(fmt._expand_help(a)) > 160}
    assert long == {}
    blocks = re.split(r"\n(?=  -)|\n\n", text.split("\noptions:\n", 1)[1])
    assert [b for b in blocks if b.startswith("  -") and len(b.splitlines()) > 3] == []  # the flags, 2 of help
    assert all(flag in (Path(REPO) / "docs" / "options.md").read_text() for a in p._actions
               for flag in a.option_strings if flag.startswith("--") and flag != "--help"
               and not flag.endswith(("-train", "-dev", "-test")) and a.help != argparse.SUPPRESS)


def test_no_option_help_quotes_a_measurement(monkeypatch):
    """Figures in help go stale (a time, a speed-up, a size measured once): help links docs instead."""
    import importlib

    from training.args import Parser
    from training.main import COMMANDS

    seen = []

    class Built(Exception):
        pass

    def record(self, *args, **kwargs):
        seen.append(self)
        raise Built

    monkeypatch.setattr(Parser, "parse_args", record)
    monkeypatch.setattr(Parser, "parse_known_args", record)
    for name, command in COMMANDS.items():
        with pytest.raises(Built):
            importlib.import_module(command.module).main([], prog=name)
    quoted = [f"{p.prog} {a.option_strings}: {a.help}" for p in seen for a in p._actions
              if a.help and MEASURED.search(a.help)]
    assert len(seen) == len(COMMANDS) and quoted == []
