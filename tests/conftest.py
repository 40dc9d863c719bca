"""Shared fixtures: where the course data lives, and the embedded MiniLM checkpoint."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _course_data_dir() -> Path | None:
    candidates = [os.environ.get("MINBERT_DATA_DIR"), REPO.parent / "shared" / "data" / "cs224n", REPO / "data"]
    for c in candidates:
        if c and (Path(c) / "ids-sst-train.csv").is_file():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def course_data_dir() -> Path:
    """The course's CSV files: $MINBERT_DATA_DIR, ../shared/data/cs224n, or data/ (after
    `python -m data.download`). Missing data is a failure, not a skip: these tests are the
    only check that the loaders cope with the real files."""
    d = _course_data_dir()
    if d is None:
        pytest.fail("course data not found: set MINBERT_DATA_DIR, put it in ../shared/data/cs224n, "
                    "or run `python -m data.download`")
    return d
