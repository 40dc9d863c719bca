"""The package's layout rules (docs/development.md): the library never imports a command, common/ sits at
the bottom, packages import only the packages below them (PACKAGE_ORDER), the experiment drivers
(training/experiments/) above the whole library and never imported by it, no import circles; and every command
is reachable from `minbert` and `python -m training.X` (training.experiments.X) with one error shape.

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
    "training.main", "training.__main__", "training.args", "training.experiments.sweep.__main__",
    "training.experiments.study.__main__", "training.experiments.search.__main__"}


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
        elif (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
              and node.module.startswith("training")):
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


# The packages of training/, bottom first (docs/development.md, "Layout"): a module imports only modules of its
# own package or of one listed before it. A top-level module (training/api.py) is a package of its own; the
# library's command modules (main.py, args.py, train.py, evaluate.py, ...) are "commands"; the experiment
# drivers (training/experiments/) sit above the whole library, each of their packages on its own, and their
# command modules (report.py, stats.py, sweep/, study/ and search/'s cli.py and __main__.py) at the top.
PACKAGE_ORDER = [
    "common",                # errors, device, progress, places, processes
    "config",                # TrainConfig and its validation, the method flags' small languages (no torch)
    "methods",               # what a user switches on, built from the config
    "inference",             # a trained model's outputs, metrics, prediction files
    "run",                   # one training run: the Run, building, checkpoints, the run directory
    "api",                   # a trained model from Python
    "results",               # finished runs: statistics, summaries, the export
    "commands",              # the library's commands: main.py, args.py, train.py, evaluate.py, ...
    "experiments",           # training/experiments/ (its __init__): the experiment drivers, above the library
    "experiments.sweep",     # grids of runs ...
    "experiments.study",     # ... the freezing study (plans sweeps) ...
    "experiments.search",    # ... hyperparameter search (runs sweep's records)
    "experiments.commands",  # report.py, stats.py, and sweep/, study/ and search/'s cli.py and __main__.py
]


def package_of(module: str) -> str:
    """The PACKAGE_ORDER name of a training.* module."""
    parts = module.split(".")
    experiment = parts[1] == "experiments"
    if module in COMMAND_MODULES:
        return "experiments.commands" if experiment else "commands"
    return f"experiments.{parts[2]}" if experiment and len(parts) > 2 else parts[1]


def upward_imports(edges: dict[str, set[str]], order: list[str], package=package_of) -> list[str]:
    """'module (package) imports module (package)' for each import of a package listed later in `order`
    (and of any module whose package is not listed: a new package is placed in the order first)."""
    rank = {name: i for i, name in enumerate(order)}
    bad = []
    for m, deps in sorted(edges.items()):
        for d in sorted(deps):
            pm, pd = package(m), package(d)
            if pm not in rank or pd not in rank or rank[pd] > rank[pm]:
                bad.append(f"{m} ({pm}) imports {d} ({pd})")
    return bad


def test_packages_import_only_downwards():
    """Among every import, those inside functions too: no package imports one above it in PACKAGE_ORDER, so
    there is no circle between packages either (a module circle inside one package is test_no_import_circles')."""
    edges = {m: {d for d in deps if d != "training"} for m, deps in graph().items() if m != "training"}
    assert upward_imports(edges, PACKAGE_ORDER) == []


def test_upward_imports_finds_a_package_circle():
    """The checker itself, on a planted package circle (methods -> run -> methods, through different modules,
    with no module circle): the import that runs up is reported; the same graph without it passes."""
    planted = {"training.methods.stepper": {"training.run.config"},
               "training.run.trainer": {"training.methods.stepper"},
               "training.run.config": set()}
    assert find_cycle(planted) is None  # no module circle: only the package order catches it
    assert upward_imports(planted, PACKAGE_ORDER) == [
        "training.methods.stepper (methods) imports training.run.config (run)"]
    assert upward_imports({**planted, "training.methods.stepper": set()}, PACKAGE_ORDER) == []
    # a package the order does not know is reported, not let through
    assert upward_imports({"training.newpkg.x": {"training.common.errors"}}, PACKAGE_ORDER) == [
        "training.newpkg.x (newpkg) imports training.common.errors (common)"]


def test_upward_imports_on_the_real_tree_with_a_planted_module(tmp_path, monkeypatch):
    """A module written into a copy of training/ that imports upwards (config -> methods) fails the real graph."""
    import shutil
    copy = tmp_path / "training"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "config" / "planted.py").write_text("from training.methods.freezing import FreezeSchedule\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    edges = {m: {d for d in deps if d != "training"} for m, deps in graph().items() if m != "training"}
    assert upward_imports(edges, PACKAGE_ORDER) == [
        "training.config.planted (config) imports training.methods.freezing (methods)"]


def experiment_imports(edges: dict[str, set[str]]) -> list[str]:
    """'module imports module' for each import of training.experiments.* from a module outside it."""
    return [f"{m} imports {d}" for m, deps in sorted(edges.items()) if not m.startswith("training.experiments")
            for d in sorted(deps) if d.startswith("training.experiments")]


def test_the_library_never_imports_an_experiment():
    """training/experiments/ (the sweep, the study, the search, report, stats) imports the library; nothing outside
    it imports training/experiments/, commands included (minbert reaches them by name, main.py's COMMANDS)."""
    assert experiment_imports(graph()) == []


def test_an_upward_import_into_the_experiments_fails_the_real_graph(tmp_path, monkeypatch):
    """In a copy of training/: a library module (run/) and a library command (evaluate.py) that import an
    experiment driver are both reported, by the package order and by the rule above; the copy without them passes."""
    import shutil
    copy = tmp_path / "training"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)

    def edges():
        return {m: {d for d in deps if d != "training"} for m, deps in graph().items() if m != "training"}
    assert upward_imports(edges(), PACKAGE_ORDER) == []
    (copy / "run" / "planted.py").write_text("from training.experiments.sweep.records import RESULTS\n")
    with (copy / "evaluate.py").open("a") as f:
        f.write("\nfrom training.experiments.study import recipe\n")
    assert upward_imports(edges(), PACKAGE_ORDER) == [
        "training.evaluate (commands) imports training.experiments.study.recipe (experiments.study)",
        "training.run.planted (run) imports training.experiments.sweep.records (experiments.sweep)"]
    assert experiment_imports(edges()) == ["training.evaluate imports training.experiments.study.recipe",
                                           "training.run.planted imports training.experiments.sweep.records"]


def test_no_import_circles():
    """Among every import, those inside functions too (deferring an import hides a circle, not removes it)."""
    edges = {m: {d for d in deps if d != "training"} for m, deps in graph().items()}
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_find_cycle_finds_one():
    """The checker itself: a circle of three is found, a chain is not."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def defined_names(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments), not those it imports."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_names_are_imported_from_the_module_that_defines_them():
    """No re-exports: `from training.X import name` (in training/, tests/ and bench/) names a module X that
    defines `name`, so each import line says where the name lives and one name has one home (freeze_depth
    once came through the config module as well as its own)."""
    known = modules()
    defined = {m: defined_names(p) for m, p in known.items()}
    files = [p for d in ("training", "tests", "bench") for p in (REPO / d).rglob("*.py")]
    bad = [f"{p.relative_to(REPO)}:{node.lineno}: {a.name} from {node.module}" for p in files
           for node in ast.walk(ast.parse(p.read_text()))
           if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known
           for a in node.names if f"{node.module}.{a.name}" not in known and a.name not in defined[node.module]]
    assert bad == []


# --------------------------------------------------------------------------- the commands

def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_minbert_help_lists_every_command():
    p = run("-m", "training", "--help")
    assert p.returncode == 0
    listed = [line.split()[0] for line in p.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)


def test_minbert_version_names_the_package_torch_and_python():
    """From the installed metadata, checked against what the modules themselves say, without importing torch."""
    import platform
    from importlib import metadata

    import torch
    p = run("-c", "import sys\nfrom training.main import main\nmain(['--version'])\nprint('torch' in sys.modules)")
    assert p.returncode == 0, p.stderr
    line, torch_loaded = p.stdout.splitlines()
    assert line == (f"minbert: minbert-mt {metadata.version('minbert-mt')}, torch {torch.__version__}, "
                    f"Python {platform.python_version()} ({sys.executable})")
    assert torch_loaded == "False"


def test_unknown_command_is_one_line_with_the_nearest():
    p = run("-m", "training", "evalute")
    assert p.returncode == 2 and p.stderr == ("minbert: error: unknown command 'evalute' (did you mean evaluate?) "
                                              "(see --help)\n")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_help_and_unknown_flag(name):
    """`minbert NAME --help` is the command's own help under its minbert name; an unknown flag (given with
    whatever arguments the command requires, so that only the flag is wrong) is the same one line, exit 2,
    from every command."""
    p = run("-m", "training", name, "--help")
    assert p.returncode == 0 and p.stdout.startswith(f"usage: minbert {name} "), p.stdout[:200]
    run_dir = str(REPO)  # a RUN that exists: a missing one is refused as it is read, before the flags' check
    required = {"predict": [run_dir, "sst", "in.csv", "out.csv"], "export": [run_dir, "OUT"],
                "ensemble": [run_dir, "--data-dir", "D"], "stats": ["A", "--vs", "B"], "study": ["whole"],
                "search": ["space.json"], "analyze": [run_dir], "submit": [run_dir],
                "evaluate": [run_dir]}.get(name, [])
    p = run("-m", "training", name, *required, "--frozen-cahce", "on")
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith(f"minbert {name}: error: unrecognized arguments: --frozen-cahce"), lines[0]
    assert lines[0].endswith("(see --help)")


@pytest.mark.parametrize("module", sorted(COMMAND_MODULES - {"training.main", "training.__main__", "training.args"}))
def test_python_m_runs_each_command(module):
    """`python -m training.X --help` keeps working for every command (sweep, study and search are packages)."""
    target = module.removesuffix(".cli").removesuffix(".__main__")
    p = run("-m", target, "--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: "), (target, p.stderr[-300:])


def test_predict_and_compare_through_minbert(tmp_path):
    """On a real tiny run: `minbert predict` writes the course-format predictions the Python API gives for
    the same file (an independent path: training.api, not the command), and `minbert report --compare`
    prints the run's row."""
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
    p = run("-m", "training", "report", "--compare", cfg.out_dir)
    assert p.returncode == 0 and Path(cfg.out_dir).name in p.stdout, p.stderr
