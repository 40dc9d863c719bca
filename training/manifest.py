"""The manifest of a predictions folder: which checkpoint wrote its files, so that files of two models
never mix unseen.

    PREDICTIONS/manifest.json
    {"format": "minbert-mt-predictions", "version": 1,
     "checkpoint": "runs/default/best.pt", "step": 1250, "config_digest": "<sha256 of the run's config>",
     "dev_metrics": {"sst_acc": ..., "overall": ...}, "time": "2026-11-24T10:00:00+00:00",
     "files": {"sst-dev-output.csv": {"sha256": "...", "rows": 1101}, ...}}

Writing a folder's predictions replaces its earlier set as a whole (`clear_predictions`) before the
new files and their manifest go in. `check_folder` is what `python -m training.submit` trusts: every
file the manifest lists is there with its sha256, and no other prediction file is.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "minbert-mt-predictions"
PREDICTION_FILE = re.compile(r"^(sst|para|sts)-(dev|test)-output\.csv$")  # the course's names


class ManifestError(ValueError):
    """A predictions folder whose files cannot be shown to come from one checkpoint; one line."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def config_digest(config: dict) -> str:
    """sha256 of the run's config (TrainConfig.to_dict()), keys sorted: equal digests, equal configs."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def prediction_files(folder: Path) -> list[Path]:
    folder = Path(folder)
    return sorted(p for p in folder.iterdir() if PREDICTION_FILE.match(p.name)) if folder.is_dir() else []


def clear_predictions(folder: Path) -> list[Path]:
    """Remove an earlier set from `folder` (its course-named files and manifest) before a new set is
    written there: a folder holds one model's predictions or none."""
    folder = Path(folder)
    gone = prediction_files(folder) + ([folder / MANIFEST] if (folder / MANIFEST).is_file() else [])
    for p in gone:
        p.unlink()
    if gone:
        log.info("%s: removed the earlier predictions (%s) before writing the new set", folder,
                 ", ".join(p.name for p in gone))
    return gone


def write_manifest(folder: Path, files: list[Path], checkpoint, config: dict, metrics: dict,
                   step: int | None = None) -> Path:
    """Written last, after the files it lists, and atomically: a folder with a manifest is complete."""
    folder = Path(folder)
    manifest = {"format": FORMAT, "version": 1, "checkpoint": str(checkpoint), "step": step,
                "config_digest": config_digest(config), "dev_metrics": metrics,
                "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "files": {p.name: {"sha256": sha256_of(p), "rows": _rows(p)} for p in sorted(files)}}
    tmp = folder / f"{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return folder / MANIFEST


def _rows(path: Path) -> int:
    with open(path, "rb") as f:
        return max(sum(1 for _ in f) - 1, 0)  # the header is not a row


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ManifestError(f"{folder}: no {MANIFEST}, so nothing says that its files come from one run") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: not a readable manifest ({e})") from None
    if not isinstance(manifest, dict) or "files" not in manifest:
        raise ManifestError(f"{path}: not a predictions manifest (no 'files')")
    return manifest


def listed_files(manifest: dict) -> dict[str, str | None]:
    """{file name: sha256 or None}: the manifest's `files`, a dict of entries (ours) or a list of names."""
    files = manifest["files"]
    if isinstance(files, list):
        return {str(name): None for name in files}
    return {name: (v.get("sha256") if isinstance(v, dict) else v) for name, v in files.items()}


def check_folder(folder: Path) -> tuple[dict, list[Path]]:
    """The folder's manifest and its prediction files, when they are exactly the manifest's set: none
    missing, none extra, none changed since. Else ManifestError naming the files."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    listed = listed_files(manifest)
    present = {p.name for p in prediction_files(folder)}
    missing = sorted(set(listed) - present)
    extra = sorted(present - set(listed))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                ([f"not from its manifest: {', '.join(extra)}"] if extra else [])
        raise ManifestError(f"{folder}: the files are not one run's set ({'; '.join(parts)})")
    changed = [n for n, digest in listed.items() if digest and sha256_of(folder / n) != digest]
    if changed:
        raise ManifestError(f"{folder}: {', '.join(changed)} changed since {MANIFEST} was written (another "
                            f"run or an edit wrote over them)")
    return manifest, [folder / n for n in sorted(listed)]
