"""The README's quick start and CI must not drift apart, and every command the README shows must exist
with the flags it shows."""
import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

from training.args import existing_path

REPO = Path(__file__).resolve().parents[1]


def _quick_start_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    commands = _quick_start_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    run, test = commands
    assert "run_multitask.py" in run and "pytest" in test
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in ci_lines
    for cmd in commands:  # the torch version the project is tested with (a version, not a build: the README says how)
        assert cmd.startswith("pip install torch==")


def test_readme_is_read_in_five_minutes():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the detail to docs/ (issue 63)"


def test_the_readme_states_lora_r8s_trainable_share_of_the_default_model():
    """The share the README gives for `--peft lora:r=8`, with the default pooling (the pooler trains) and with
    `--pooling mean`, is the one the trainer's own model has."""
    from training.config.train_config import TrainConfig
    from training.methods.peft import trainable_counts
    from training.run.build import build_model

    text = (REPO / "README.md").read_text()
    shares = {}
    for pooling in ("cls", "mean"):
        trainable, total = trainable_counts(build_model(TrainConfig(peft="lora:r=8", pooling=pooling))[0])
        shares[pooling] = f"{100 * trainable / total:.2f}%"
    assert re.search(rf"LoRA r=8 trains {re.escape(shares['cls'])} of MiniLM's parameters with the default\s+"
                     rf"`--pooling cls`.*?{re.escape(shares['mean'])} with `--pooling mean`", text,
                     flags=re.DOTALL), shares


# --------------------------------------------------------------------------- every command the README shows

NOT_OURS = {"pip", "pytest"}  # modules the README runs that this repository does not define


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def real_parser(module: str) -> argparse.ArgumentParser:
    """The parser `python -m MODULE` (or run_multitask.py: MODULE None) builds, taken from its main() at the
    moment it would parse: main runs up to there and no further."""
    if module is None:
        main = importlib.import_module("training.train").main
    else:
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise ModuleNotFoundError(f"no module {module}")
        if spec.submodule_search_locations:  # a package: its __main__ says where main comes from
            source = Path(spec.submodule_search_locations[0], "__main__.py").read_text()
            main = importlib.import_module(re.search(r"from ([\w.]+) import main", source)[1]).main
        else:
            main = importlib.import_module(module).main

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    real = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = capture
    try:
        main([])
    except _Captured as c:
        for action in c.parser._actions:  # the docs' RUN folders are examples, not paths on this machine
            if action.type is existing_path:
                action.type = None
        return c.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = real
    raise AssertionError(f"{module or 'run_multitask.py'}: main() returned without parsing its command line")


def _variants(argv: list[str]) -> list[list[str]]:
    """A table's shorthand spelt out: `a\\|b` one command per alternative, `[--dest DIR]` the flag,
    `RUN...` one RUN, `...` (whatever else) nothing."""
    out = [[]]
    for token in argv:
        token = token.strip("[]")
        if token == "..." or not token:
            continue
        choices = [t.removesuffix("...") for t in token.split("|")]  # shlex has read the table's \| as |
        out = [done + [c] for done in out for c in choices]
    return out


def commands(text: str) -> list[tuple[str | None, list[str], bool]]:
    """(module, argv, inline) of each of our commands in a README: the bash blocks' lines (`&&` chains,
    `\\` continuations, comments) and the inline `python -m ...`, `minbert COMMAND ...`, `python run_multitask.py
    ...` and `torchrun ... run_multitask.py ...`. Module None: run_multitask.py; a `minbert` command (or
    `python -m training COMMAND`): its module in training.main's COMMANDS."""
    found = []
    blocks = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
    inline = re.findall(r"`((?:python|torchrun|minbert) [^`]*)`", prose)
    for chunk, is_inline in [(b, False) for b in blocks] + [(i, True) for i in inline]:
        for line in chunk.replace("\\\n", " ").splitlines():
            words = shlex.shlex(line, posix=True, punctuation_chars=True)  # && ; | as words of their own
            words.whitespace_split, words.commenters = True, "#"
            part = []
            for word in [*words, ";"]:
                if word in ("&&", "||", ";", "|"):
                    found += _command(part, is_inline)
                    part = []
                else:
                    part.append(word)
    return found


def _command(words: list[str], inline: bool) -> list[tuple[str | None, list[str], bool]]:
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
        words = words[1:]
    if words[:1] == ["torchrun"]:
        words = ["python"] + words[next(i for i, w in enumerate(words) if w.endswith("run_multitask.py")):]
    if words[:1] == ["minbert"]:
        return _minbert(words[1:], inline)
    if words[:3] in (["python", "-m", "training"], ["python3", "-m", "training"]):
        return _minbert(words[3:], inline)
    if len(words) < 2 or words[0] not in ("python", "python3") or words[1] == "-c":
        return []
    if words[1].endswith("run_multitask.py"):
        return [(None, argv, inline) for argv in _variants(words[2:])]
    if words[1] != "-m" or words[2] in NOT_OURS:
        return []
    if words[3:4] == ["/"]:  # `python -m training.export / analyze / submit`: three modules, no operands
        package = words[2].rsplit(".", 1)[0]
        return [(words[2], [], True)] + [(f"{package}.{m}", [], True) for m in words[4:] if m != "/"]
    return [(m, argv, inline) for [m] in _variants([words[2]]) for argv in _variants(words[3:])]


def _minbert(words: list[str], inline: bool) -> list[tuple[str | None, list[str], bool]]:
    """`minbert NAME ARGV` as (NAME's module, ARGV, inline); an unknown NAME as the module "minbert NAME".
    `minbert --help` and `minbert COMMAND ...` (a placeholder) name no command."""
    from training.main import COMMANDS

    if not words or not re.fullmatch(r"[a-z|-]+", words[0]) or words[0].startswith("-"):
        return []

    def module(name: str) -> str:
        return COMMANDS[name].module if name in COMMANDS else f"minbert {name}"
    if words[1:2] == ["/"]:  # `minbert export / analyze / submit`: three commands, no operands
        return [(module(n), [], True) for n in words if n != "/"]
    return [(module(n), argv, inline) for [n] in _variants([words[0]]) for argv in _variants(words[1:])]


def problems(module: str | None, argv: list[str], inline: bool) -> list[str]:
    """Why `argv` is not a command line of `module` as its real parser reads it (none: it is)."""
    name = module or "run_multitask.py"
    if name.startswith("minbert "):
        return [f"{name}: no such command (minbert --help lists them)"]
    try:
        parser = real_parser(module)
    except ModuleNotFoundError as e:
        return [f"{name}: {e}"]
    known, found, argv = parser._option_string_actions, [], list(argv)
    found += [f"{name}: no flag {w.split('=')[0]} (shown as: {' '.join(argv)})" for w in argv
              if w.startswith("-") and not re.fullmatch(r"-[\d.]+", w) and w.split("=")[0] not in known]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as e:
        missing_operands = "the following arguments are required" in err.getvalue()
        if e.code and not (inline and missing_operands):  # a table names a command without its operands
            found.append(f"{name} {' '.join(argv)}: {err.getvalue().strip().splitlines()[-1]}")
    return found


def test_every_command_the_readme_shows_exists_with_its_flags():
    shown = commands((REPO / "README.md").read_text())
    modules = {m for m, _, _ in shown}
    assert (len(shown) > 20
            and {None, "training.experiments.study.cli", "training.evaluate", "data.download"} <= modules), shown
    assert [p for cmd in shown for p in problems(*cmd)] == []


def test_the_readme_check_finds_a_missing_flag_a_bad_value_and_a_missing_module():
    text = ("Try `python run_multitask.py --epochs 1 --no-such-flag 3`, then\n\n```bash\n"
            "pip install -e . && python run_multitask.py --pooling max \\\n  --epochs 2  # a comment\n```\n"
            "and `python -m training.nothing RUN...` or `python -m training.evaluate RUN --nope`.")
    shown = commands(text)
    assert shown == [(None, ["--pooling", "max", "--epochs", "2"], False),
                     (None, ["--epochs", "1", "--no-such-flag", "3"], True),
                     ("training.nothing", ["RUN"], True), ("training.evaluate", ["RUN", "--nope"], True)]
    found = [p for cmd in shown for p in problems(*cmd)]
    assert [p.split(":")[0] for p in found] == ["run_multitask.py --pooling max --epochs 2", "run_multitask.py",
                                                "run_multitask.py --epochs 1 --no-such-flag 3", "training.nothing",
                                                "training.evaluate", "training.evaluate RUN --nope"], found
    assert "argument --pooling: invalid choice: 'max'" in found[0]
    assert found[1].startswith("run_multitask.py: no flag --no-such-flag") and "unrecognized arguments" in found[2]
    assert found[3] == "training.nothing: no module training.nothing"
    assert found[4].startswith("training.evaluate: no flag --nope")


def test_table_shorthand_is_spelt_out():
    shown = commands("| `python -m training.experiments.study depth\\|size --out DIR` | "
                     "`python -m data.download [--dest DIR]` |"
                     " `python -m training.export / analyze / submit` |")
    study = "training.experiments.study"
    assert shown == [(study, ["depth", "--out", "DIR"], True), (study, ["size", "--out", "DIR"], True),
                     ("data.download", ["--dest", "DIR"], True), ("training.export", [], True),
                     ("training.analyze", [], True), ("training.submit", [], True)]


def test_minbert_commands_are_checked_as_their_modules():
    """`minbert NAME ...` and `python -m training NAME ...` are NAME's module in training.main's COMMANDS, checked
    by its real parser like `python -m` ones; an unknown NAME is reported, `minbert --help` is not a command."""
    text = ("Run `minbert study whole\\|size --out DIR`, `minbert stduy whole`, `minbert --help`, `minbert COMMAND "
            "--help`, `minbert export / analyze / submit` and\n\n```bash\npython -m training sweep --no-such-flag\n"
            "minbert train --epochs 1  # a comment\n```\n")
    shown = commands(text)
    study = "training.experiments.study.cli"
    assert shown == [("training.experiments.sweep.cli", ["--no-such-flag"], False),
                     ("training.train", ["--epochs", "1"], False), (study, ["whole", "--out", "DIR"], True),
                     (study, ["size", "--out", "DIR"], True),
                     ("minbert stduy", ["whole"], True), ("training.export", [], True), ("training.analyze", [], True),
                     ("training.submit", [], True)]
    found = [p for cmd in shown for p in problems(*cmd)]
    assert [p.split(":")[0] for p in found] == ["training.experiments.sweep.cli",
                                                "training.experiments.sweep.cli --no-such-flag", "minbert stduy"], found
    assert found[0].startswith("training.experiments.sweep.cli: no flag --no-such-flag")


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "docs").glob("*.md")))
def test_every_command_the_docs_show_exists_with_its_flags(page):
    """The same check on each page of docs/: every `minbert ...`, `python -m training...` and run_multitask.py
    command it shows parses with the command's real parser (placeholders in capitals, `...` for the rest)."""
    shown = commands((REPO / "docs" / page).read_text())
    assert [p for cmd in shown for p in problems(*cmd)] == []


# ----------------------------------------------------------------------------- links between pages

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens, a
    repeated one numbered."""
    anchors, seen, fenced = set(), {}, False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if fenced or not line.startswith("#"):
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip().replace("`", ""))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_links(pages: list[Path]) -> list[str]:
    """page:line: target for each relative link whose file, or whose heading in a .md file, does not exist."""
    bad = []
    for page in pages:
        fenced = False
        for i, line in enumerate(page.read_text().splitlines(), 1):
            fenced ^= line.startswith("```")
            for target in [] if fenced else LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # https:, mailto:
                path, _, anchor = target.partition("#")
                dest = page.parent / path if path else page
                if not dest.exists() or anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
                    bad.append(f"{page}:{i}: {target}")
    return bad


def test_every_link_between_the_pages_finds_its_file_and_heading():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
    assert broken_links(pages) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Two words, and `code`\n\n## Two words, and code\n")
    page = tmp_path / "docs" / "b.md"
    page.write_text("[ok](a.md#two-words-and-code) [ok](a.md#two-words-and-code-1) [ok](#here)\n# Here\n"
                    "[no](a.md#nowhere) [no](c.md) [web](https://example.com/x.md#y)\n```\n[fenced](gone.md)\n```\n")
    assert [b.split(": ", 1)[1] for b in broken_links([page])] == ["a.md#nowhere", "c.md"]


def test_the_readme_counts_the_cuda_tests_there_are(request):
    """The README's count of CUDA tests is the number pytest collects from tests/test_cuda.py (this session's
    collection where it holds that file, as the suite's does; else a collection of its own)."""
    said = re.search(r"`tests/test_cuda\.py`, (\d+) today", (REPO / "README.md").read_text())
    assert said, "the README no longer says how many CUDA tests there are"
    collected = sum(Path(item.fspath).name == "test_cuda.py" for item in request.session.items)
    if not collected:
        import subprocess
        import sys
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                            "-p", "no:cacheprovider", "tests/test_cuda.py"], cwd=REPO, capture_output=True,
                           text=True, timeout=300, check=False)
        found = re.search(r"(\d+) tests? collected", r.stdout)
        assert found, r.stdout + r.stderr
        collected = int(found.group(1))
    assert int(said.group(1)) == collected
