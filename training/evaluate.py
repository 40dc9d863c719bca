"""Dev metrics, the course's prediction files, and predictions for any file.

    python -m training.evaluate --checkpoint runs/default --data-dir data
    python -m training.evaluate --checkpoint runs/default/best.pt --score sts my-sts.csv --predict sst new.csv out.csv
    python -m training.evaluate --checkpoint runs/default --predict-text sst reviews.txt reviews.tsv --probabilities

--checkpoint takes a run directory (its best.pt), a checkpoint file (best.pt, checkpoints/step-N.pt) or
a folder written by python -m training.export.

Course format (--data-dir, --predict): a header `id \t Predicted_Sentiment` (`Predicted_Is_Paraphrase`,
`Predicted_Similiary` -- the course's spelling), then one `id , prediction` row per example. --data-dir
writes its files with a manifest.json as one set, replacing the folder's earlier set whole
(training/predictions.py; python -m training.submit checks it).

Plain text (--predict-text TASK FILE OUT): one sentence per line for sst, one `sentence1<TAB>sentence2`
pair per line for para and sts; blank lines skipped; ids are line numbers. Its output, and --predict's
with --probabilities, is our TSV format, not the course's: id, the sentence(s), the label (sst 0..4,
para 0/1) or the score (sts), and with --probabilities the class probabilities (prob_0..prob_4 for sst,
prob_paraphrase for para) -- training/textio.py describes it.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import pearsonr

from data.batching import TaskData, encode_task
from data.loaders import COURSE_FILES, TASKS, DataError, load_task_file
from heads import predict, probabilities

from .config import TrainConfig
# The model-running and course-file functions live below this module (api.py and predictions.py use them,
# and this module uses api.py); their names stay importable from here.
from .inference import predict_sets, predict_task, raw_outputs, run_tokenizer_dir, task_outputs  # noqa: F401
from .progress import setup_logging
from .textio import HEADERS, read_predictions, write_predictions  # noqa: F401
from .textio import read_text_examples, write_tsv_predictions

log = logging.getLogger(__name__)

METRIC = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_pearson"}


@torch.inference_mode()
def score(task: str, preds: np.ndarray, labels) -> float:
    labels = np.asarray(labels, dtype=np.float64)
    if task == "sts":
        if len(labels) < 2 or np.std(preds) == 0 or np.std(labels) == 0:
            return 0.0  # Pearson is undefined for constant inputs; count it as no correlation
        return float(pearsonr(preds, labels)[0])
    return float(np.mean(preds == labels))


def overall(metrics: dict[str, float]) -> float:
    """The course's score: mean of SST accuracy, paraphrase accuracy and (Pearson + 1) / 2."""
    parts = [metrics["sst_acc"]] if "sst_acc" in metrics else []
    parts += [metrics["para_acc"]] if "para_acc" in metrics else []
    parts += [(metrics["sts_pearson"] + 1) / 2] if "sts_pearson" in metrics else []
    return float(np.mean(parts))


def metrics_of(dev: dict[str, TaskData], preds: dict[str, np.ndarray]) -> dict[str, float]:
    """Each task's dev metric of `preds`, and the course's overall score."""
    metrics = {METRIC[task]: score(task, preds[task], [e.label for e in data.examples]) for task, data in dev.items()}
    metrics["overall"] = overall(metrics)
    return metrics


def evaluate(model, dev: dict[str, TaskData], tokenizer, batch_size: int, device,
             autocast=contextlib.nullcontext, max_tokens: int | str | None = "auto") -> dict[str, float]:
    """Dev metrics; max_tokens: see inference.raw_outputs."""
    return metrics_of(dev, predict_sets(model, dev, tokenizer, batch_size, device, autocast, max_tokens))


def write_all_predictions(model, splits, folder, overwrite: bool = False, source: str | None = None) -> dict:
    """The dev metrics of `model` (a training.api.Model) printed, and the course's files of every set in
    `splits` written to `folder` with their manifest, as one set replacing the folder's earlier one whole
    (training/predictions.py). A folder holding another run's set is refused unless `overwrite`."""
    from .predictions import check_predictions_dir, config_digest, write_prediction_set

    run = run_of(model.source)
    check_predictions_dir(folder, run, overwrite)

    def predict(sets):
        return predict_sets(model.network, sets, model.tokenizer, model.batch_size, model.device, model.autocast)

    dev, test = predict(splits.dev), predict(splits.test)
    metrics = metrics_of(splits.dev, dev) if dev else {}
    if metrics:
        print(f"dev metrics of {source or model.source}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    files = {(task, split): ([e.id for e in sets[task].examples], preds[task])
             for split, sets, preds in (("dev", splits.dev, dev), ("test", splits.test, test)) for task in preds}
    manifest = {"run": str(run.resolve()), "checkpoint": str(model.source.resolve()), "epoch": model.epoch,
                "step": model.step, "config_digest": config_digest(model.config.to_dict()), "dev_metrics": metrics}
    write_prediction_set(folder, files, manifest)
    return metrics


def run_of(source: Path) -> Path:
    """The run directory a checkpoint belongs to: best.pt's folder, one up from checkpoints/step-N.pt; an
    export folder is its own."""
    source = Path(source)
    if source.is_dir():
        return source
    return source.parent.parent if source.parent.name == "checkpoints" else source.parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="a run directory (its best.pt), a checkpoint file (best.pt, checkpoints/step-N.pt), or a "
                        "folder written by python -m training.export")
    p.add_argument("--raw-weights", action="store_true",
                   help="a training checkpoint of an --ema-decay run: its raw weights instead of their average, "
                        "the weights the run evaluates (default: the average)")
    p.add_argument("--data-dir", default=None, help="evaluate the course's dev files and predict its test files "
                   "from this folder, writing PREDICTIONS_DIR/{sst,para,sts}-{dev,test}-output.csv and manifest.json")
    p.add_argument("--predictions-dir", default="predictions",
                   help="where --data-dir's prediction files go, with their manifest.json; an earlier set of the same "
                        "run there is replaced as a whole (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true",
                   help="let --data-dir replace a --predictions-dir holding another run's set (or files of no run)")
    p.add_argument("--score", nargs=2, action="append", default=[], metavar=("TASK", "FILE"),
                   help="score a labelled file in the course format (repeatable)")
    p.add_argument("--predict", nargs=3, action="append", default=[], metavar=("TASK", "FILE", "OUT"),
                   help="predict for an unlabelled (or labelled) file in the course format, writing OUT in the "
                        "course format, or in the TSV format with --probabilities (repeatable)")
    p.add_argument("--predict-text", nargs=3, action="append", default=[], metavar=("TASK", "FILE", "OUT"),
                   help="predict for a plain-text FILE: one sentence per line (sst), one sentence1<TAB>sentence2 "
                        "pair per line (para, sts); OUT is in the TSV format, ids are line numbers (repeatable)")
    p.add_argument("--probabilities", action="store_true",
                   help="--predict and --predict-text write the TSV format with the class probabilities as extra "
                        "columns (prob_0..prob_4 for sst, prob_paraphrase for para; sts has its score)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the run's tokenizer/)")
    add_inference_flags(p, "the training run's", "cross encoding: predict each paraphrase/similarity pair as "
                        "(a, b) and (b, a) and average")
    return p


def add_inference_flags(p: argparse.ArgumentParser, whose: str, both_orders_help: str) -> None:
    """--batch-size, --device, --precision, --both-orders of the commands that run trained models; `whose`
    says where the last two default from (e.g. "the training run's")."""
    p.add_argument("--batch-size", type=int, default=256, help="examples per batch (default: %(default)s)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    precisions = TrainConfig.__dataclass_fields__["precision"].metadata["choices"]
    p.add_argument("--precision", choices=precisions, default=None,
                   help=f"autocast for inference (default: {whose} --precision)")
    p.add_argument("--both-orders", action=argparse.BooleanOptionalAction, default=None,
                   help=f"{both_orders_help} (default: {whose} --predict-both-orders)")


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    setup_logging()
    for task, *_ in args.score + args.predict + args.predict_text:
        if task not in TASKS:
            p.error(f"unknown task {task!r}; one of {', '.join(TASKS)}")
    if not (args.data_dir or args.score or args.predict or args.predict_text):
        p.error("nothing to do: give --data-dir, --score, --predict or --predict-text")
    if args.probabilities and not (args.predict or args.predict_text):
        p.error("--probabilities applies to --predict and --predict-text")
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, not {args.batch_size}")

    from .api import LoadError, load

    try:
        model = load(args.checkpoint, device=args.device, precision=args.precision, batch_size=args.batch_size,
                     both_orders=args.both_orders, raw_weights=args.raw_weights, tokenizer=args.tokenizer)
    except LoadError as e:
        p.error(str(e))
    try:
        run_commands(args, model)
    except (DataError, ValueError) as e:  # a missing or unusable file, an untrained task, another run's folder
        p.error(str(e))
    return 0


def run_commands(args, model) -> None:
    cfg = model.config

    def encoded(task, path, labelled):
        examples = load_task_file(path, task, labelled=labelled).examples
        return encode_task(task, examples, model.tokenizer, cfg.pair_encoding, cfg.max_length, model.both_orders)

    if args.data_dir:
        from .build import Splits
        splits = Splits({}, {}, {})
        for task in cfg.tasks:
            splits.dev[task] = encoded(task, Path(args.data_dir) / COURSE_FILES[task]["dev"], True)
            test = Path(args.data_dir) / COURSE_FILES[task]["test"]
            if test.is_file():
                splits.test[task] = encoded(task, test, False)
        write_all_predictions(model, splits, args.predictions_dir, args.overwrite, source=str(args.checkpoint))
    for task, path in args.score:
        examples = load_task_file(path, task, labelled=True).examples
        preds = predict(task, model.outputs(task, examples)).double().numpy()
        value = score(task, preds, [e.label for e in examples])
        print(f"{path}: {METRIC[task]} {value:.4f} ({len(examples)} examples)")
    inputs = [(t, f, o, False) for t, f, o in args.predict] + [(t, f, o, True) for t, f, o in args.predict_text]
    for task, path, out, plain in inputs:
        examples = read_text_examples(path, task) if plain else load_task_file(path, task, labelled=None).examples
        outputs = model.outputs(task, examples)
        preds = predict(task, outputs).double().numpy()
        if plain or args.probabilities:
            probs = probabilities(task, outputs).double().numpy() if args.probabilities and task != "sts" else None
            write_tsv_predictions(out, task, examples, preds, probs)
        else:
            write_predictions(out, task, [e.id for e in examples], preds)
        print(f"{path}: wrote {len(examples)} {task} predictions to {out}")


if __name__ == "__main__":
    sys.exit(main())
