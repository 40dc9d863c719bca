"""Shared fixtures: where the course data lives, and the embedded MiniLM checkpoint."""
import os
from pathlib import Path

import pytest
import torch

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


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only spin against each other (up to ~40x slower on a busy
    2-core machine) and change no result. Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s"]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """A random 2-layer, hidden-16 BERT without dropout, saved in the Hugging Face layout."""
    from minbert import Bert, BertConfig, save_hf

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(TINY_VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=128, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    d = save_hf(Bert(cfg), tmp_path_factory.mktemp("ckpt") / "tiny")
    (d / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n")
    return d


# The files of a minute or more of the suite, collected and handed out first. Under `-n auto --dist loadfile`
# (the README's command) a worker takes whole files, by default those with the most tests first: one of these
# (test_gpu_speed.py holds one test of 80 s) then came last and ran alone while the other worker had nothing
# left. pytest_configure keeps xdist to the collection order (its --no-loadscope-reorder, set here and not in
# addopts, which a pytest without xdist would refuse: bench/gpu_speed.sh runs one on the GPU machine).
SLOW_FILES = ("test_bench.py", "test_worker_restart.py", "test_front_clock.py", "test_gpu_speed.py",
              "test_driver_faults.py", "test_resume.py", "test_schedules.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order
