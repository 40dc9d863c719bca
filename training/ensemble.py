"""An ensemble of trained checkpoints: averaged probabilities, dev metrics, the course's prediction files.

    python -m training.ensemble runs/seed1 runs/seed2 runs/seed3 --predictions-dir ens   # data: as in training

Each member is a run directory (its best.pt) or a checkpoint file. Per task the members' outputs
are averaged, then turned into predictions: SST, the softmax probabilities of the five classes,
then the most probable class; Quora, the probability sigmoid(logit) of a paraphrase, then > 0.5;
STS, the similarity scores, then clamped to [0, 5]. Every member reads the data its own way (its
run's tokenizer/, pair encoding, max length and --predict-both-orders), so members trained with
different settings mix; they must have been trained on the same tasks. Every member is loaded and
checked (its checkpoint, tokenizer and tasks) before the first one predicts. Prints each member's dev
metrics and the ensemble's, and writes PREDICTIONS_DIR/{sst,para,sts}-{dev,test}-output.csv for the
ensemble (the test files where the data folder has them) with a manifest.json naming its members and
dev metrics, so that `python -m training.submit PREDICTIONS_DIR` zips it. The folder is replaced as a
whole; one holding anything but an earlier set of the same members is refused unless --overwrite.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from data.folder import HELP as DATA_HELP
from data.loaders import COURSE_FILES, DataError, load_task_file
from training.args import Parser, add_inference_flags, check_outputs, course_data, existing_path, output_folder_problem
from training.common.errors import LoadError
from training.common.progress import setup_logging
from training.inference.metrics import METRIC, overall, score
from training.inference.predictions import lost_test_outputs, read_manifest, write_prediction_set

if TYPE_CHECKING:  # the tensors come from the members, loaded once the flags are known
    import torch

log = logging.getLogger(__name__)

PROG = "python -m training.ensemble"

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
        return out.double().softmax(dim=-1)
    if task == "para":
        return out.double().sigmoid()
    return out.double()


def predictions(task: str, probs: torch.Tensor) -> np.ndarray:
    """The course's predictions from (averaged) probabilities: what heads.predict gives for one model."""
    from heads.tasks import MAX_SIMILARITY  # torch, which the members have brought in already

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


def member_probabilities(model, examples: dict) -> dict:
    """One member's {(split, task): probabilities} on every example set, the data read its own way (a
    training.api.Model encodes with its run's tokenizer, pair encoding, length and pair orders)."""
    return {(split, task): probabilities(task, model.outputs(task, exs)) for (split, task), exs in examples.items()}


def dev_metrics(probs: dict, examples: dict, tasks: list[str]) -> dict[str, float]:
    metrics = {}
    for task in tasks:
        labels = [e.label for e in examples["dev", task]]
        metrics[METRIC[task]] = score(task, predictions(task, probs["dev", task]), labels)
    metrics["overall"] = overall(metrics)
    return metrics


def _line(source: str, metrics: dict[str, float]) -> str:
    return f"dev metrics of {source}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def ensemble(members: Sequence[str | Path], data_dir: str | Path, predictions_dir: str | Path = "predictions",
             overwrite: bool = False, device: str = "auto", precision: str | None = None, batch_size: int = 256,
             both_orders: bool | None = None, eval_tokens: int | None = None) -> dict:
    """Score every member and the ensemble; write the ensemble's prediction files. Returns the metrics.
    precision and both_orders override each member's own (both_orders applies to cross-encoded members)."""
    from training.api import load

    def load_member(ckpt: Path):
        model = load(ckpt, device=device, precision=precision, batch_size=batch_size, eval_tokens=eval_tokens)
        if both_orders is not None and model.config.pair_encoding == "cross":
            model.both_orders = both_orders
        return model

    ckpts = [member_checkpoint(str(m)) for m in members]
    out = Path(predictions_dir)
    check_ensemble_folder(out, ckpts, overwrite)
    lost = None if overwrite else lost_test_outputs(out, data_dir)
    if lost:
        raise EnsembleError(lost)
    tasks = member_tasks(ckpts, load_member)
    examples, total, scores = load_examples(Path(data_dir), tasks), {}, []
    for ckpt in ckpts:  # one member in memory at a time
        model = load_member(ckpt)
        probs = member_probabilities(model, examples)
        del model
        scores.append({"checkpoint": str(ckpt), "dev": dev_metrics(probs, examples, tasks)})
        print(_line(str(ckpt), scores[-1]["dev"]))
        for key, p in probs.items():
            total[key] = total[key] + p if key in total else p
    mean = {key: p / len(ckpts) for key, p in total.items()}
    together = dev_metrics(mean, examples, tasks)
    print(_line(f"the ensemble of {len(ckpts)}", together))
    files = {(task, split): ([e.id for e in examples[split, task]], predictions(task, p))
             for (split, task), p in mean.items()}
    write_prediction_set(out, files, {"checkpoint": f"the ensemble of {len(ckpts)} checkpoints",
                                      "ensemble": [str(c) for c in ckpts], "dev_metrics": together,
                                      "members": scores})
    return {"members": scores, "ensemble": together}


def member_tasks(ckpts: list[Path], load_member) -> list[str]:
    """Every member loaded and checked (readable, its tokenizer there, trained on the first one's tasks)
    before any predicts: found at its turn, a bad member would cost the members before it their whole dev
    and test sets. Each is let go again, so that one model is in memory at a time (members may be large, and
    on one GPU), at the price of loading each twice: seconds, against minutes of predicting. Returns the
    tasks."""
    tasks = None
    for ckpt in ckpts:
        model = load_member(ckpt)
        if tasks is None:
            tasks = list(model.tasks)
        elif sorted(model.tasks) != sorted(tasks):
            raise EnsembleError(f"{ckpt}: trained on {'+'.join(model.tasks)}, the first member on "
                                f"{'+'.join(tasks)}: an ensemble's members need the same tasks")
        del model
    return tasks


def check_ensemble_folder(folder: Path, ckpts: list[Path], overwrite: bool) -> None:
    """Before any work: the folder can be one (not a file), and is free, or holds an earlier set of these very
    members, or --overwrite."""
    problem = output_folder_problem(folder)
    if problem:
        raise EnsembleError(f"--predictions-dir {folder}: {problem}")
    if overwrite or not folder.is_dir() or not any(folder.iterdir()):
        return
    manifest = read_manifest(folder)
    if manifest is not None and manifest.get("ensemble") == [str(c) for c in ckpts]:
        return
    held = (f"the predictions of {manifest.get('checkpoint') or manifest.get('run')}" if manifest
            else "files no ensemble or run wrote")
    raise EnsembleError(f"--predictions-dir {folder} holds {held}: the ensemble would replace them as a whole; "
                        f"pass --overwrite, or another --predictions-dir")


def main(argv=None, prog: str = PROG) -> int:
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("members", nargs="+", metavar="RUN", type=existing_path,
                   help="run directories (their best.pt) or checkpoint files, one per member")
    p.add_argument("--data-dir", default=None, help=f"{DATA_HELP} (dev sets scored, test sets predicted)")
    p.add_argument("--predictions-dir", default="predictions",
                   help="where the ensemble's prediction files go (default: %(default)s)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write every dev metric to FILE as JSON")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a --predictions-dir holding other predictions (another run's, or other members'), "
                        "or test predictions that --data-dir lacks the test files to write again; and an "
                        "existing --json FILE")
    add_inference_flags(p, "each member's")
    args = p.parse_args(argv)
    setup_logging()
    # --predictions-dir: check_ensemble_folder, for the library too
    check_outputs(p, files={"--json": args.json}, overwrite=args.overwrite)
    data_dir = course_data(p, args.data_dir)
    try:
        result = ensemble(args.members, data_dir, args.predictions_dir, args.overwrite, args.device,
                          args.precision, args.batch_size, args.both_orders, args.eval_tokens)
    except (EnsembleError, LoadError, DataError) as e:
        p.fail(str(e))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
