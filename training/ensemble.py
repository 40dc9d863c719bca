"""An ensemble of trained checkpoints: averaged probabilities, dev metrics, the course's prediction files.

    python -m training.ensemble runs/seed1 runs/seed2 runs/seed3 --data-dir data --predictions-dir ens

Each member is a run directory (its best.pt) or a checkpoint file. Per task the members' outputs
are averaged, then turned into predictions: SST, the softmax probabilities of the five classes,
then the most probable class; Quora, the probability sigmoid(logit) of a paraphrase, then > 0.5;
STS, the similarity scores, then clamped to [0, 5]. Every member reads the data its own way (its
run's tokenizer/, pair encoding, max length and --predict-both-orders), so members trained with
different settings mix; they must have been trained on the same tasks. Prints each member's dev
metrics and the ensemble's, and writes PREDICTIONS_DIR/{sst,para,sts}-{dev,test}-output.csv for the
ensemble (the test files where the data folder has them) with a manifest.json naming its members and
dev metrics, so that `python -m training.submit PREDICTIONS_DIR` zips it. The folder is replaced as a
whole; one holding anything but an earlier set of the same members is refused unless --overwrite.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch

from data.batching import encode_task
from data.loaders import COURSE_FILES, DataError, load_task_file
from heads.tasks import MAX_SIMILARITY

from .evaluate import METRIC, add_inference_flags, overall, run_tokenizer_dir, score, task_outputs
from .predictions import read_manifest, write_prediction_set
from .progress import setup_logging

log = logging.getLogger(__name__)

SPLITS = ("dev", "test")


class EnsembleError(ValueError):
    """Bad input: the message is the one line the command prints."""


def member_checkpoint(arg: str) -> Path:
    """A run directory means its best.pt; anything else must be a checkpoint file."""
    path = Path(arg)
    if path.is_dir():
        if not (path / "best.pt").is_file():
            raise EnsembleError(f"{arg}: a directory without best.pt (a run directory of run_multitask.py has one)")
        return path / "best.pt"
    if not path.is_file():
        raise EnsembleError(f"{arg}: no such checkpoint or run directory")
    return path


def probabilities(task: str, out: torch.Tensor) -> torch.Tensor:
    """What the ensemble averages: SST class probabilities (N, 5), paraphrase probabilities (N,),
    similarity scores (N,)."""
    if task == "sst":
        return torch.softmax(out.double(), dim=-1)
    if task == "para":
        return torch.sigmoid(out.double())
    return out.double()


def predictions(task: str, probs: torch.Tensor) -> np.ndarray:
    """The course's predictions from (averaged) probabilities: what heads.predict gives for one model."""
    if task == "sst":
        return probs.argmax(-1).double().numpy()
    if task == "para":
        return (probs > 0.5).double().numpy()
    return probs.clamp(0.0, MAX_SIMILARITY).numpy()


def load_examples(data_dir: Path, tasks: list[str]) -> dict[tuple[str, str], list]:
    """{(split, task): examples}: every dev file (labelled), the test files that exist."""
    examples = {}
    for task in tasks:
        examples["dev", task] = load_task_file(data_dir / COURSE_FILES[task]["dev"], task, labelled=True).examples
        test = data_dir / COURSE_FILES[task]["test"]
        if test.is_file():
            examples["test", task] = load_task_file(test, task, labelled=False).examples
    return examples


def load_member(ckpt: Path):
    from minbert import Tokenizer

    from .checkpointing import model_from_checkpoint

    try:
        model, cfg, _ = model_from_checkpoint(ckpt)
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        # torch.load's messages run over several lines: the first names the file and the cause
        raise EnsembleError(str(e).splitlines()[0] + ("..." if "\n" in str(e) else "")) from e
    except KeyError as e:
        raise EnsembleError(f"{ckpt}: not a checkpoint written by run_multitask.py (no {e})") from e
    try:
        tokenizer = Tokenizer.from_checkpoint(run_tokenizer_dir(ckpt, None))
    except (FileNotFoundError, ValueError) as e:
        raise EnsembleError(str(e)) from e
    return model, cfg, tokenizer


def member_probabilities(model, cfg, tokenizer, examples: dict, args, device) -> dict:
    """One member's {(split, task): probabilities} on every example set, the data read its own way."""
    from .device import autocast_dtype

    model.to(device)
    dtype = autocast_dtype(args.precision or cfg.precision, device)

    def autocast():
        return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()

    both = (cfg.predict_both_orders if args.both_orders is None else args.both_orders) and cfg.pair_encoding == "cross"
    probs = {}
    for (split, task), exs in examples.items():
        data = encode_task(task, exs, tokenizer, cfg.pair_encoding, cfg.max_length, both)
        out = task_outputs(model, data, tokenizer, args.batch_size, device, autocast)
        probs[split, task] = probabilities(task, out)
    return probs


def dev_metrics(probs: dict, examples: dict, tasks: list[str]) -> dict[str, float]:
    metrics = {}
    for task in tasks:
        labels = [e.label for e in examples["dev", task]]
        metrics[METRIC[task]] = score(task, predictions(task, probs["dev", task]), labels)
    metrics["overall"] = overall(metrics)
    return metrics


def _line(source: str, metrics: dict[str, float]) -> str:
    return f"dev metrics of {source}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def run(args) -> dict:
    """Score every member and the ensemble; write the ensemble's prediction files. Returns the metrics."""
    from .device import pick_device

    ckpts = [member_checkpoint(m) for m in args.members]
    out = Path(args.predictions_dir)
    check_ensemble_folder(out, ckpts, args.overwrite)
    device = pick_device(args.device)
    tasks, examples, total, members = None, None, {}, []
    for ckpt in ckpts:  # one member in memory at a time
        model, cfg, tokenizer = load_member(ckpt)
        if tasks is None:
            tasks = list(cfg.tasks)
            examples = load_examples(Path(args.data_dir), tasks)
        elif sorted(cfg.tasks) != sorted(tasks):
            raise EnsembleError(f"{ckpt}: trained on {'+'.join(cfg.tasks)}, the first member on "
                                f"{'+'.join(tasks)}: an ensemble's members need the same tasks")
        probs = member_probabilities(model, cfg, tokenizer, examples, args, device)
        del model
        members.append({"checkpoint": str(ckpt), "dev": dev_metrics(probs, examples, tasks)})
        print(_line(str(ckpt), members[-1]["dev"]))
        for key, p in probs.items():
            total[key] = total[key] + p if key in total else p
    mean = {key: p / len(ckpts) for key, p in total.items()}
    ensemble = dev_metrics(mean, examples, tasks)
    print(_line(f"the ensemble of {len(ckpts)}", ensemble))
    files = {(task, split): ([e.id for e in examples[split, task]], predictions(task, p))
             for (split, task), p in mean.items()}
    write_prediction_set(out, files, {"checkpoint": f"the ensemble of {len(ckpts)} checkpoints",
                                      "ensemble": [str(c) for c in ckpts], "dev_metrics": ensemble,
                                      "members": members})
    return {"members": members, "ensemble": ensemble}


def check_ensemble_folder(folder: Path, ckpts: list[Path], overwrite: bool) -> None:
    """Before any work: the folder is free, or holds an earlier set of these very members, or --overwrite."""
    if overwrite or not folder.is_dir() or not any(folder.iterdir()):
        return
    manifest = read_manifest(folder)
    if manifest is not None and manifest.get("ensemble") == [str(c) for c in ckpts]:
        return
    held = (f"the predictions of {manifest.get('checkpoint') or manifest.get('run')}" if manifest
            else "files no ensemble or run wrote")
    raise EnsembleError(f"--predictions-dir {folder} holds {held}: the ensemble would replace them as a whole; "
                        f"pass --overwrite, or another --predictions-dir")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.ensemble", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("members", nargs="+", metavar="RUN_OR_CHECKPOINT",
                   help="run directories (their best.pt) or checkpoint files, one per member")
    p.add_argument("--data-dir", required=True, help="the course's files: dev sets scored, test sets predicted")
    p.add_argument("--predictions-dir", default="predictions",
                   help="where the ensemble's prediction files go (default: %(default)s)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write every dev metric to FILE as JSON")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a --predictions-dir holding other predictions (another run's, or other members')")
    add_inference_flags(p, "each member's", "cross-encoded members: predict each pair in both orders and average; "
                        "siamese members ignore it")
    args = p.parse_args(argv)
    setup_logging()
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, not {args.batch_size}")
    if not Path(args.data_dir).is_dir():
        p.error(f"--data-dir {args.data_dir}: no such directory")
    try:
        result = run(args)
    except (EnsembleError, DataError) as e:
        p.error(str(e))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
