"""The README's quick start and CI must not drift apart."""
import re
from pathlib import Path

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
    for cmd in commands:  # CPU machines must pin torch, or pip pulls gigabytes of CUDA packages
        assert cmd.startswith("pip install torch==")
