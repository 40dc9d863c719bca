"""bench/ scripts as modules, for the tests of their functions (bench/ is not a package)."""
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_script(name: str):
    """bench/NAME.py as a module. Its folder goes on sys.path first: the scripts import their neighbours
    (common.py puts the repository on the path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
