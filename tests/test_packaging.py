"""What `pip install .` installs: the wheel holds every module and recipe of the checkout, and the installed copy
alone, away from the checkout, imports every module and runs the `minbert` command. (An editable install hides a
package left out of setup.cfg: its finder maps whole folders. training.config was once left out of the wheel.)"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("minbert", "heads", "data", "training")
# What the build reads besides the packages (setup.cfg's long_description, license_files, py_modules).
BUILD_FILES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "run_multitask.py")


def library_files() -> list[str]:
    """Every module and recipe of the four packages in the checkout."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".json"):
                found.append(path.relative_to(ROOT).as_posix())
    return sorted(found)


def module_name(file: str) -> str:
    parts = file.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, list[str]]:
    """The wheel built from a copy of the checkout (the build writes build/ and *.egg-info where it runs), installed
    with pip into a folder of its own; returns the folder and the wheel's file names."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    source.mkdir()
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.csv"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # offline: the build uses this environment's setuptools (>= 70.1, the test extra's), not a download
    built = subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "wheel"),
                                  str(source)], capture_output=True, text=True, cwd=work)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (work / "wheel").glob("*.whl")
    done = subprocess.run(pip + ["install", "--no-deps", "--no-index", "--target", str(work / "site"), str(wheel)],
                          capture_output=True, text=True, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    return work / "site", zipfile.ZipFile(wheel).namelist()


def test_the_wheel_holds_every_module_and_recipe(installed):
    _, names = installed
    missing = [file for file in library_files() if file not in names]
    assert not missing, f"setup.cfg leaves these out of the wheel: {missing}"
    assert "run_multitask.py" in names


def run_installed(site: Path, code: str) -> subprocess.CompletedProcess:
    """`python -S -c code` with only the installed folder and the environment's dependencies on its path: -S skips
    site-packages' .pth files, among them the editable install's finder, which would serve the checkout instead."""
    paths = sysconfig.get_paths()
    path = os.pathsep.join([str(site), paths["purelib"], paths["platlib"]])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env,
                          cwd=site.parent, timeout=300)


def test_the_installed_copy_imports_every_module_on_its_own(installed):
    site, _ = installed
    # __main__ modules are the commands' scripts (python -m PACKAGE runs them); importing one would run it.
    modules = [module_name(file) for file in library_files() if file.endswith(".py")
               and not file.endswith("__main__.py")]
    code = ("import importlib\n"
            f"for name in {modules!r}:\n"
            "    module = importlib.import_module(name)\n"
            f"    assert module.__file__.startswith({str(site)!r}), (name, module.__file__)\n")
    done = run_installed(site, code)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_installed_minbert_command_lists_its_commands_and_plans_a_study(installed, course_data_dir, tmp_path):
    """A recipe read from the installed package data, the course data read, nothing trained (--dry-run)."""
    site, _ = installed
    argv = ["study", "mpnet-whole", "--out", str(tmp_path / "study"), "--data-dir", str(course_data_dir),
            "--dry-run"]
    code = f"import sys\nfrom training.main import main\nmain(['--help'])\nsys.exit(main({argv!r}))"
    done = run_installed(site, code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "evaluate" in done.stdout and "todo" in done.stdout, done.stdout[-3000:]
