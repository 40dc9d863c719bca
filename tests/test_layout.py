"""The package's layout rules (docs/development.md): the library never imports a command, common/ sits at
the bottom, no import circles; and every command is reachable from `minbert` and `python -m training.X`
with one error shape.

The import graph is read from the source with ast (every import, those inside functions too), so a rule
broken in a branch no test runs still fails here.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from training.main import COMMANDS

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "training"
# the modules that are commands (argument parsing, printing, exit statuses): training.main's subcommands,
# their shared argument groups, and the `python -m` entry files
COMMAND_MODULES = {cmd.module for cmd in COMMANDS.values()} | {
    "training.main", "training.__main__", "training.args", "training.sweep.__main__", "training.study.__main__",
    "training.search.__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """The training.* modules `path` imports (`from training.x import y` counts training.x.y where that is
    a module, else training.x)."""
    known, found = modules(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("training")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("training"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in known else node.module)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    return {name: imports_of(path) - {name} for name, path in modules().items()}


def test_no_relative_imports():
    """Absolute imports only: a module's imports say where each name lives, whatever folder it is in."""
    relative = [f"{name}: line {node.lineno}" for name, path in modules().items()
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and node.level > 0]
    assert relative == []


def test_every_command_module_exists():
    assert COMMAND_MODULES <= set(modules()), COMMAND_MODULES - set(modules())


def test_library_never_imports_a_command():
    bad = [f"{lib} imports {cmd}" for lib, deps in graph().items() if lib not in COMMAND_MODULES
           for cmd in sorted(deps & COMMAND_MODULES)]
    assert bad == []


def test_common_is_the_bottom():
    """training.common.* (errors, device, progress) import nothing else of the package."""
    bad = [f"{m} imports {d}" for m, deps in graph().items() if m.startswith("training.common")
           for d in sorted(deps) if not d.startswith("training.common") and d != "training"]
    assert bad == []


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for d in sorted(edges.get(n, ())):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        state[n] = "done"
        stack.pop()
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_circles():
    """Among every import, those inside functions too (deferring an import hides a circle, not removes it)."""
    edges = {m: {d for d in deps if d != "training"} for m, deps in graph().items()}
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_find_cycle_finds_one():
    """The checker itself: a circle of three is found, a chain is not."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


# --------------------------------------------------------------------------- the commands

def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_minbert_help_lists_every_command():
    p = run("-m", "training", "--help")
    assert p.returncode == 0
    listed = [line.split()[0] for line in p.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)


def test_unknown_command_is_one_line_with_the_nearest():
    p = run("-m", "training", "evalute")
    assert p.returncode == 2 and p.stderr == "minbert: error: unknown command 'evalute' (did you mean evaluate?) (see --help)\n"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_help_and_unknown_flag(name):
    """`minbert NAME --help` is the command's own help under its minbert name; an unknown flag (given with
    whatever arguments the command requires, so that only the flag is wrong) is the same one line, exit 2,
    from every command."""
    p = run("-m", "training", name, "--help")
    assert p.returncode == 0 and p.stdout.startswith(f"usage: minbert {name} "), p.stdout[:200]
    required = {"predict": ["RUN", "sst", "in.csv", "out.csv"], "export": ["RUN", "OUT"], "ensemble": ["RUN", "--data-dir", "D"],
                "stats": ["A", "--vs", "B"], "study": ["whole"], "search": ["space.json"], "analyze": ["RUN"],
                "submit": ["RUN"], "compare": ["RUN"], "evaluate": ["RUN"]}.get(name, [])
    p = run("-m", "training", name, *required, "--frozen-cahce", "on")
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith(f"minbert {name}: error: unrecognized arguments: --frozen-cahce"), lines[0]
    assert lines[0].endswith("(see --help)")


@pytest.mark.parametrize("name", ["evaluate", "predict", "analyze", "export"])
def test_missing_run_directory_is_one_line(name, tmp_path):
    """The same missing model, the same one line from each command that reads one, before any work."""
    missing = tmp_path / "no-such-run"
    rest = {"evaluate": ["--score", "sst", "x.csv"], "predict": ["sst", "x.csv", str(tmp_path / "o.csv")],
            "export": [str(tmp_path / "out")]}.get(name, [])
    p = run("-m", "training", name, str(missing), *rest)
    assert p.returncode == 2, p.stderr
    assert p.stderr == f"minbert {name}: error: checkpoint {missing} does not exist\n", p.stderr


@pytest.mark.parametrize("module", sorted(COMMAND_MODULES - {"training.main", "training.__main__", "training.args"}))
def test_python_m_runs_each_command(module):
    """`python -m training.X --help` keeps working for every command (sweep, study and search are packages)."""
    target = module.removesuffix(".cli").removesuffix(".__main__")
    p = run("-m", target, "--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: "), (target, p.stderr[-300:])


def test_predict_and_compare_through_minbert(tmp_path):
    """The two commands that are new with `minbert` on a real tiny run: `predict` writes the course-format
    predictions the Python API gives for the same file (an independent path: training.api, not the
    command), and `compare` prints the run's row."""
    import tiny_runs
    from data.loaders import COURSE_FILES, load_task_file
    from training.api import load

    cfg, _ = tiny_runs.tiny_run(tmp_path)
    dev = Path(cfg.data_dir) / COURSE_FILES["sst"]["dev"]
    out = tmp_path / "sst-out.csv"
    p = run("-m", "training", "predict", cfg.out_dir, "sst", str(dev), str(out), "--device", "cpu")
    assert p.returncode == 0, p.stderr
    rows = [line.split(" , ") for line in out.read_text().splitlines()[1:]]
    examples = load_task_file(dev, "sst", labelled=True).examples
    expected = load(cfg.out_dir, device="cpu").sentiment([e.text_a for e in examples]).labels
    assert [r[0] for r in rows] == [e.id for e in examples]
    assert [int(float(r[1])) for r in rows] == list(expected)
    p = run("-m", "training", "compare", cfg.out_dir)
    assert p.returncode == 0 and Path(cfg.out_dir).name in p.stdout, p.stderr
