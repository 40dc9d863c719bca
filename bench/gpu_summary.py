"""The GPU check's reports (bench/gpu_check.sh calls it; not a benchmark itself).

    python bench/gpu_summary.py RESULTS_DIR                  # write RESULTS_DIR/summary.md from the logs
    python bench/gpu_summary.py --environment PREP_DIR       # print the machine and the prepared folder

The summary reads RESULTS_DIR/status.tsv (one line per part run: name, exit status, seconds, date,
note), each part's NAME.log, the training run's copied train/metrics.jsonl and train/train.log, and
the GPU utilisation samples train-gpu-util.csv, and sets the figures against issue 22's targets.
A part that did not run or failed is said so; nothing is filled in.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import re
import statistics
import sys
from pathlib import Path

from common import REPO  # noqa: E402  (puts the repository on sys.path)

# The README's best recipe on the CPU (Results, seed 2, 2026-11-23): best epoch, the 3rd.
CPU_RECIPE = {"sst_acc": 0.4923, "para_acc": 0.8403, "sts_pearson": 0.8603, "overall": 0.7543}
TARGETS = {"step_ratio": 0.9, "mfu": 0.40, "train_wall_s": 180.0, "busy": 0.80}
PARTS = ["env", "cuda-tests", "tests", "train", "bert-base", "bench-encoder-bert-base", "bench-encoder-minilm",
         "bench-throughput", "bench-compile"]


# ----------------------------------------------------------------------------- reading the logs

def read_status(res: Path) -> dict[str, dict]:
    """The latest record of each part in status.tsv."""
    out = {}
    path = res / "status.tsv"
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 4:
            out[fields[0]] = {"rc": fields[1], "seconds": float(fields[2]), "date": fields[3],
                              "note": fields[4] if len(fields) > 4 else ""}
    return out


def read_log(res: Path, name: str) -> str:
    path = res / f"{name}.log"
    return path.read_text(errors="replace") if path.is_file() else ""


def pytest_outcome(text: str) -> dict:
    """The final counts line of a pytest run, and its FAILED / ERROR / SKIPPED lines."""
    counts = re.findall(r"^[= ]*((?:\d+ (?:passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?|"
                        r"tests? collected)[, ]*)+) in [\d.]+s", text, re.M)
    return {"counts": counts[-1].strip().rstrip(",") if counts else None,
            "failed": re.findall(r"^(?:FAILED|ERROR) .*$", text, re.M),
            "skipped": re.findall(r"^SKIPPED .*$", text, re.M),
            "n_skipped": int(m.group(1)) if (m := re.search(r"(\d+) skipped", counts[-1] if counts else "")) else 0}


def encoder_rows(text: str) -> dict[str, dict]:
    """The rows of bench/encoder_vs_hf.py's table (MFU None where no peak is known, peak MiB None on a
    CPU), and under "minbert" its ratio line: the median of the paired per-step ratios."""
    rows = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 7 and f[0] in ("minbert", "transformers"):
            rows[f[0]] = {"median_s": float(f[2]), "tflops": float(f[4]),
                          "mfu": float(f[5][:-1]) / 100 if f[5].endswith("%") else None,
                          "peak_mib": float(f[6]) if f[6] != "-" else None}
    ratio = re.search(r"^ratio minbert / transformers: ([\d.]+)x", text, re.M)
    if ratio and "minbert" in rows:
        rows["minbert"]["ratio"] = float(ratio.group(1))
    return rows


def table_lines(text: str) -> list[str]:
    """A benchmark's output without the harness's '==' lines and library noise: its '#' header and table."""
    keep = []
    for line in text.splitlines():
        if line.startswith("#") or re.match(r"^(arm|implementation|minbert|transformers|hf-|fp32|bf16|ratio)\b", line):
            keep.append(line)
    return keep


def epoch_records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if "dev_overall" in r]


# ----------------------------------------------------------------------------- GPU busy fraction

def _stamp(text: str) -> datetime.datetime | None:
    """nvidia-smi's '2026/11/23 20:23:40.123' or logging's '2026-11-23 20:23:40,123'."""
    text = text.strip().replace("/", "-").replace(",", ".")
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return None


def training_windows(train_log: str, train_seconds: dict[int, float]) -> list[tuple[datetime.datetime,
                                                                                  datetime.datetime]]:
    """(start, end) of each epoch's training: from its 'epoch N: K steps' line for the epoch's
    train_seconds (the dev evaluations after it are logged only once they are done, so their lines
    would take in one evaluation)."""
    windows = []
    for line in train_log.splitlines():
        m = re.match(r"^(\S+ \S+) \S+ training\.(?:run\.)?trainer: epoch (\d+): \d+ steps", line)
        if m and (t := _stamp(m.group(1))) is not None and int(m.group(2)) in train_seconds:
            windows.append((t, t + datetime.timedelta(seconds=train_seconds[int(m.group(2))])))
    return windows


def busy_fraction(samples_csv: str, train_log: str, train_seconds: dict[int, float]) -> dict[str, float] | None:
    """Mean of nvidia-smi's utilization.gpu (the share of each sample period in which a kernel ran):
    over the whole command, and over the epochs' training alone (no loading, no evaluation)."""
    samples = []
    for line in samples_csv.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 2 and f[1].isdigit() and (t := _stamp(f[0])) is not None:
            samples.append((t, int(f[1]) / 100))
    if not samples:
        return None
    out = {"whole_run": statistics.fmean(u for _, u in samples), "samples": len(samples)}
    windows = training_windows(train_log, train_seconds)
    inside = [u for t, u in samples if any(a <= t <= b for a, b in windows)]
    if inside:
        out["training"] = statistics.fmean(inside)
    return out


# ----------------------------------------------------------------------------- the summary

def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def status_table(status: dict[str, dict]) -> list[str]:
    lines = ["| part | result | seconds |", "|---|---|---:|"]
    for name in PARTS:
        s = status.get(name)
        if s is None:
            lines.append(f"| {name} | not run | |")
            continue
        result = ("ok" if s["rc"] == "0" else "skipped: " + s["note"] if s["rc"] == "skipped"
                  else f"**timed out** ({s['rc']})" if s["rc"] in ("124", "137") else f"**failed** (exit {s['rc']})")
        lines.append(f"| {name} | {result} | {s['seconds']:.0f} |")
    return lines


def tests_section(res: Path, status: dict, dry_run: bool) -> list[str]:
    out = ["## Tests"]
    for name in ("cuda-tests", "tests"):
        if name not in status:
            continue
        r = pytest_outcome(read_log(res, name))
        out.append(f"- {name}: {r['counts'] or 'no pytest summary line in ' + name + '.log'}")
        if name == "cuda-tests" and r["n_skipped"] and not dry_run:
            out.append("  - **CUDA-marked tests were skipped: they did not run on a GPU here**")
        out += [f"  - {line}" for line in r["failed"][:12]]
        if len(r["failed"]) > 12:
            out.append(f"  - ... {len(r['failed']) - 12} more in {name}.log")
        out += [f"  - {line}" for line in r["skipped"][:4]]
    return out


def train_section(res: Path, status: dict) -> list[str]:
    if "train" not in status:
        return []
    out = ["## Training: the README's best recipe (3 epochs, MiniLM, --smart --smart-lambda 0 --pooling mean "
           "--ema-decay 0.998 --predict-both-orders --seed 2)"]
    wall = status["train"]["seconds"]
    out.append(f"- wall time of the whole command (loading, 3 epochs, evaluations, prediction files): {wall:.0f} s "
               f"(target < {TARGETS['train_wall_s']:.0f} s: {verdict(wall < TARGETS['train_wall_s'])})")
    records = epoch_records(res / "train")
    if records:
        best = max(records, key=lambda r: r["dev_overall"])
        got = {k: best[f"dev_{k}"] for k in CPU_RECIPE}
        out.append("- best dev (epoch {}), SST / Quora / STS / overall: {} — CPU run: {}".format(
            best["epoch"], " / ".join(f"{got[k]:.4f}" for k in CPU_RECIPE),
            " / ".join(f"{CPU_RECIPE[k]:.4f}" for k in CPU_RECIPE)))
        secs = [f"{r['train_seconds']:.0f}" for r in records if "train_seconds" in r]
        out.append(f"- training seconds per epoch: {', '.join(secs)}")
    else:
        out.append("- no dev records (train/metrics.jsonl missing or empty)")
    util_csv, log = res / "train-gpu-util.csv", res / "train" / "train.log"
    seconds = {r["epoch"]: r["train_seconds"] for r in records if "train_seconds" in r}
    busy = (busy_fraction(util_csv.read_text(), log.read_text() if log.is_file() else "", seconds)
            if util_csv.is_file() else None)
    if busy is None:
        out.append("- GPU busy fraction: not measured (no nvidia-smi samples)")
    else:
        training = busy.get("training")
        out.append(f"- GPU busy (nvidia-smi utilization.gpu, {busy['samples']} samples at 0.2 s): whole command "
                   f"{busy['whole_run']:.0%}; inside the epochs' training "
                   f"{'n/a' if training is None else f'{training:.0%}'} (target >= {TARGETS['busy']:.0%}: "
                   f"{verdict(None if training is None else training >= TARGETS['busy'])})")
    return out


def encoder_lines(res: Path, name: str, title: str) -> list[str]:
    text = read_log(res, name)
    rows = encoder_rows(text)
    out = [f"### {title}"] + [f"    {line}" for line in table_lines(text)]
    if {"minbert", "transformers"} <= set(rows) and "ratio" in rows["minbert"]:
        ours, ref = rows["minbert"], rows["transformers"]
        mem_ok = None if ours["peak_mib"] is None else ours["peak_mib"] <= ref["peak_mib"]
        out.append(f"- step time ours / transformers {ours['ratio']:.2f}x (target <= {TARGETS['step_ratio']}: "
                   f"{verdict(ours['ratio'] <= TARGETS['step_ratio'])}); MFU "
                   f"{'n/a' if ours['mfu'] is None else format(ours['mfu'], '.1%')} (target >= {TARGETS['mfu']:.0%}: "
                   f"{verdict(None if ours['mfu'] is None else ours['mfu'] >= TARGETS['mfu'])}); peak memory "
                   f"ours <= reference: {verdict(mem_ok)}")
    else:
        out.append(f"- no result table in {name}.log")
    return out


def bench_section(res: Path, status: dict) -> list[str]:
    out = ["## Benchmarks"]
    if "bench-encoder-bert-base" in status:
        out += encoder_lines(res, "bench-encoder-bert-base", "Training step, bert-base shape, 32 x 128, bf16")
    if "bench-encoder-minilm" in status:
        out += encoder_lines(res, "bench-encoder-minilm", "Training step, MiniLM, 32 x 128, bf16")
    for name, title in (("bench-throughput", "Inference throughput, Quora dev (training.evaluate vs transformers)"),
                        ("bench-compile", "--compile and bf16 against fp32, training step")):
        if name in status:
            lines = table_lines(read_log(res, name))
            out += [f"### {title}"] + ([f"    {line}" for line in lines] or [f"- no result table in {name}.log"])
    return out if len(out) > 1 else []


def write_summary(res: Path, dry_run: bool = False) -> Path:
    status = read_status(res)
    env = [line for line in read_log(res, "env").splitlines() if line.startswith("- ")]
    lines = [f"# GPU check{' (dry run on the CPU: plumbing only, no figure means anything)' if dry_run else ''}",
             f"Written {datetime.datetime.now():%Y-%m-%d %H:%M} from {res}.", ""]
    lines += env[:12] + [""] + status_table(status) + [""]
    for section in (tests_section(res, status, dry_run), train_section(res, status), bench_section(res, status)):
        if section:
            lines += section + [""]
    bert = status.get("bert-base")
    if bert is not None:
        records = epoch_records(res / "bert-base")
        best = max(records, key=lambda r: r["dev_overall"]) if records else None
        lines += ["## bert-base-uncased", "- " + (bert["note"] if bert["rc"] == "skipped" else
                  f"best dev overall {best['dev_overall']:.4f} (SST {best['dev_sst_acc']:.4f}, Quora "
                  f"{best['dev_para_acc']:.4f}, STS {best['dev_sts_pearson']:.4f}), {bert['seconds']:.0f} s"
                  if best else f"no dev records; exit {bert['rc']}"), ""]
    path = res / "summary.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


# ----------------------------------------------------------------------------- the environment

def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def check_prep(prep: Path) -> tuple[bool, str]:
    """Every file MANIFEST.json lists is there with its size and sha256 (a broken copy is caught here)."""
    manifest = prep / "MANIFEST.json"
    if not manifest.is_file():
        return False, f"{prep}: no MANIFEST.json (run bench/gpu_prepare.py and carry its folder)"
    files = json.loads(manifest.read_text())["files"]
    bad = []
    for name, want in files.items():
        f = prep / name
        if (not f.is_file() or f.stat().st_size != want["bytes"]
                or hashlib.sha256(f.read_bytes()).hexdigest() != want["sha256"]):
            bad.append(name)
    if bad:
        return False, f"{prep}: {len(bad)} of {len(files)} files missing or changed: {', '.join(bad[:4])}"
    return True, f"{prep}: all {len(files)} files of MANIFEST.json present and intact"


def environment(prep: Path, device: str) -> int:
    import torch

    ok = True
    print(f"- python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
          f"{_version('transformers')}, pytest {_version('pytest')}, hypothesis {_version('hypothesis')}, "
          f"pytest-xdist {_version('pytest-xdist')}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"- GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}, "
              f"{p.multi_processor_count} SMs, bf16 {torch.cuda.is_bf16_supported()}")
    else:
        print("- GPU: none visible to torch")
        ok = device != "cuda"
    prep_ok, message = check_prep(prep)
    print(f"- prepared folder: {message}")
    ok = ok and prep_ok
    from minbert import CheckpointError, resolve_checkpoint
    try:
        print(f"- minilm-l6 resolves to {resolve_checkpoint('minilm-l6')}")
    except CheckpointError as e:
        print(f"- minilm-l6: {e}")
        ok = False
    print(f"- course data: {os.environ.get('MINBERT_DATA_DIR', 'MINBERT_DATA_DIR unset')}")
    try:
        resolve_checkpoint("bert-base-uncased")
        print("- bert-base-uncased: in the Hugging Face cache")
    except CheckpointError:
        print("- bert-base-uncased: not in the Hugging Face cache")
    head = REPO / ".git"
    print(f"- repository: {REPO}{' (a git checkout)' if head.exists() else ' (no .git: a copy)'}")
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("results", nargs="?", metavar="RESULTS_DIR", help="the folder gpu_check.sh writes")
    p.add_argument("--environment", metavar="PREP_DIR", default=None,
                   help="print the machine's versions and GPU and check the prepared folder, instead")
    p.add_argument("--device", default="cuda", help="with --environment: the device the check will use; cuda "
                   "without a visible GPU is a failure (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="say in the summary that it was a dry run on the CPU")
    args = p.parse_args(argv)
    if args.environment is not None:
        return environment(Path(args.environment), args.device)
    if args.results is None or not Path(args.results).is_dir():
        p.error(f"RESULTS_DIR {args.results}: not a folder")
    print(f"wrote {write_summary(Path(args.results), args.dry_run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
