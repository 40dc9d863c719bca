"""Dev metrics and the course's prediction files.

    python -m training.evaluate --checkpoint runs/default/best.pt --data-dir data
    python -m training.evaluate --checkpoint best.pt --score sts my-sts-dev.csv --predict sst new.csv out.csv

Prediction files follow the course's submission format: a header `id \t Predicted_Sentiment`
(`Predicted_Is_Paraphrase`, `Predicted_Similiary` -- the course's spelling), then one
`id , prediction` row per example.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import pearsonr

from data.batching import TaskData, encode_task, eval_batches, eval_token_budget
from data.loaders import COURSE_FILES, TASKS, DataError, load_task_file
from heads import MultitaskBert, predict

from .config import CHOICES
from .progress import setup_logging

log = logging.getLogger(__name__)

HEADERS = {"sst": "Predicted_Sentiment", "para": "Predicted_Is_Paraphrase", "sts": "Predicted_Similiary"}
METRIC = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_pearson"}


@torch.inference_mode()
def raw_outputs(model: MultitaskBert, data: TaskData, tokenizer, batch_size: int, device,
                autocast=contextlib.nullcontext, max_tokens: int | str | None = "auto") -> torch.Tensor:
    """The heads' outputs (logits / scores) in the order of data.examples, in fp32 on the CPU;
    batches run sorted by length, at most batch_size examples and max_tokens padded tokens each
    (None: batch_size alone, as before the budget; "auto": the device's, see eval_token_budget)."""
    was_training = model.training
    model.eval()
    out = None
    try:
        for batch in eval_batches(data, tokenizer, batch_size, eval_token_budget(max_tokens, device.type)):
            batch = batch.to(device)
            with autocast():
                o = model(data.task, batch.inputs).float().cpu()
            if out is None:
                out = torch.empty((len(data), *o.shape[1:]))
            out[torch.as_tensor(batch.indices)] = o
    finally:
        model.train(was_training)
    return out if out is not None else torch.empty(0)


def predict_task(model: MultitaskBert, data: TaskData, tokenizer, batch_size: int, device,
                 autocast=contextlib.nullcontext, max_tokens: int | str | None = "auto") -> np.ndarray:
    """Predictions in the order of data.examples. Where data has a `.swapped` copy (pairs in both
    orders), the two orders' outputs are averaged first: the paraphrase logits, the similarity scores."""
    out = raw_outputs(model, data, tokenizer, batch_size, device, autocast, max_tokens)
    if data.swapped is not None:
        out = (out + raw_outputs(model, data.swapped, tokenizer, batch_size, device, autocast, max_tokens)) / 2
    return predict(data.task, out).double().numpy()


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


def evaluate(model, dev: dict[str, TaskData], tokenizer, batch_size: int, device,
             autocast=contextlib.nullcontext, max_tokens: int | str | None = "auto") -> dict[str, float]:
    metrics = {}
    for task, data in dev.items():
        preds = predict_task(model, data, tokenizer, batch_size, device, autocast, max_tokens)
        metrics[METRIC[task]] = score(task, preds, [e.label for e in data.examples])
    metrics["overall"] = overall(metrics)
    return metrics


def _format(task: str, value: float) -> str:
    return f"{value:.4f}" if task == "sts" else str(int(value))


def write_predictions(path: str | os.PathLike, task: str, ids: list[str], preds: np.ndarray) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a temp name per process: two runs sharing --predictions-dir never write into each other's file
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(f"id \t {HEADERS[task]} \n")
            for i, p in zip(ids, preds):
                f.write(f"{i} , {_format(task, p)} \n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_predictions(path: str | os.PathLike) -> tuple[str, list[tuple[str, float]]]:
    """Parse a file in the course's submission format -> (task, [(id, prediction)])."""
    lines = Path(path).read_text().splitlines()
    header = [h.strip() for h in lines[0].split("\t")]
    task = {v: k for k, v in HEADERS.items()}.get(header[1] if len(header) == 2 else "")
    if header[0] != "id" or task is None:
        raise ValueError(f"{path}:1: not a course prediction header: {lines[0]!r}")
    rows = []
    for n, line in enumerate(lines[1:], 2):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            raise ValueError(f"{path}:{n}: expected 'id , prediction', got {line!r}")
        rows.append((parts[0], float(parts[1])))
    return task, rows


def write_all_predictions(model, data, tokenizer, cfg, device, autocast=contextlib.nullcontext,
                          source: str = "the best checkpoint",
                          max_tokens: int | str | None = "auto") -> dict:
    """Dev metrics of the model (from `source`) printed, and {task}-{dev,test}-output.csv written to
    cfg.predictions_dir."""
    out = Path(cfg.predictions_dir)
    metrics = {}
    for split, sets in (("dev", data.dev), ("test", data.test)):
        for task, d in sets.items():
            preds = predict_task(model, d, tokenizer, cfg.eval_batch_size, device, autocast, max_tokens)
            write_predictions(out / f"{task}-{split}-output.csv", task, [e.id for e in d.examples], preds)
            if split == "dev":
                metrics[METRIC[task]] = score(task, preds, [e.label for e in d.examples])
    if metrics:
        metrics["overall"] = overall(metrics)
        print(f"dev metrics of {source}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    log.info("wrote prediction files to %s", out)
    return metrics


def _tokens(value: str) -> int | str:
    """--max-tokens: "auto" or an integer >= 0."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected auto or an integer >= 0, got {value!r}")
    return n


def run_tokenizer_dir(checkpoint, given: str | None) -> Path:
    """--tokenizer, else the run's tokenizer/ beside best.pt, or one folder up for checkpoints/step-N.pt."""
    if given:
        return Path(given)
    run = Path(checkpoint).parent
    found = [d / "tokenizer" for d in (run, run.parent) if (d / "tokenizer").is_dir()]
    if not found:
        raise FileNotFoundError(f"no tokenizer/ beside {checkpoint} or one folder up (where run_multitask.py "
                                f"writes it): pass --tokenizer DIR, e.g. the pretrained model's folder")
    return found[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="a best.pt written by run_multitask.py, or a training checkpoint (checkpoints/step-N.pt)")
    p.add_argument("--raw-weights", action="store_true",
                   help="a training checkpoint of an --ema-decay run: its raw weights instead of their average, "
                        "the weights the run evaluates (default: the average)")
    p.add_argument("--data-dir", default=None, help="evaluate the course's dev files and predict its test files "
                   "from this folder, writing PREDICTIONS_DIR/{sst,para,sts}-{dev,test}-output.csv")
    p.add_argument("--predictions-dir", default="predictions",
                   help="where --data-dir's prediction files go (default: %(default)s)")
    p.add_argument("--score", nargs=2, action="append", default=[], metavar=("TASK", "FILE"),
                   help="score a labelled file in the course format (repeatable)")
    p.add_argument("--predict", nargs=3, action="append", default=[], metavar=("TASK", "FILE", "OUT"),
                   help="predict for an unlabelled (or labelled) file in the course format (repeatable)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the run's tokenizer/)")
    p.add_argument("--batch-size", type=int, default=256, help="at most this many examples per batch "
                   "(default: %(default)s)")
    p.add_argument("--max-tokens", type=_tokens, default="auto",
                   help="at most this many padded tokens (examples x longest) per batch; 0: no budget, "
                   "--batch-size alone; auto: 1024 on CPU, no budget elsewhere (default: %(default)s)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--precision", choices=CHOICES["precision"], default=None,
                   help="autocast for inference (default: the training run's --precision)")
    p.add_argument("--both-orders", action=argparse.BooleanOptionalAction, default=None,
                   help="cross encoding: predict each paraphrase/similarity pair as (a, b) and (b, a) and "
                   "average (default: the training run's --predict-both-orders)")
    args = p.parse_args(argv)
    setup_logging()
    for task, *_ in args.score + args.predict:
        if task not in TASKS:
            p.error(f"unknown task {task!r}; one of {', '.join(TASKS)}")
    if not (args.data_dir or args.score or args.predict):
        p.error("nothing to do: give --data-dir, --score or --predict")
    if args.batch_size < 1:
        p.error(f"--batch-size {args.batch_size} must be >= 1")
    max_tokens = args.max_tokens or None  # 0: no budget

    from minbert import Tokenizer
    from .checkpointing import model_from_checkpoint
    from .trainer import Splits, autocast_dtype, pick_device

    try:
        model, cfg, _ = model_from_checkpoint(args.checkpoint, raw_weights=args.raw_weights)
    except (FileNotFoundError, RuntimeError, ValueError) as e:  # missing, unreadable, not one of ours, no raw
        p.error(str(e))
    except KeyError as e:
        p.error(f"{args.checkpoint}: not a checkpoint written by run_multitask.py (no {e})")
    both_orders = cfg.predict_both_orders if args.both_orders is None else args.both_orders
    if both_orders and cfg.pair_encoding != "cross":
        p.error(f"--both-orders is for cross-encoded pairs; this model is {cfg.pair_encoding}")
    try:
        tokenizer = Tokenizer.from_checkpoint(run_tokenizer_dir(args.checkpoint, args.tokenizer))
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    device = pick_device(args.device)
    model.to(device)
    dtype = autocast_dtype(args.precision or cfg.precision, device)

    def autocast():
        return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()

    def encoded(task, path, labelled):
        examples = load_task_file(path, task, labelled=labelled).examples
        return encode_task(task, examples, tokenizer, cfg.pair_encoding, cfg.max_length, both_orders)

    try:
        if args.data_dir:
            splits = Splits({}, {}, {})
            for task in cfg.tasks:
                splits.dev[task] = encoded(task, Path(args.data_dir) / COURSE_FILES[task]["dev"], True)
                test = Path(args.data_dir) / COURSE_FILES[task]["test"]
                if test.is_file():
                    splits.test[task] = encoded(task, test, False)
            cfg.predictions_dir, cfg.eval_batch_size = args.predictions_dir, args.batch_size
            write_all_predictions(model, splits, tokenizer, cfg, device, autocast, source=str(args.checkpoint),
                                  max_tokens=max_tokens)
        for task, path in args.score:
            d = encoded(task, path, True)
            preds = predict_task(model, d, tokenizer, args.batch_size, device, autocast, max_tokens)
            print(f"{path}: {METRIC[task]} {score(task, preds, [e.label for e in d.examples]):.4f} ({len(d)} examples)")
        for task, path, out in args.predict:
            d = encoded(task, path, None)
            write_predictions(out, task, [e.id for e in d.examples],
                              predict_task(model, d, tokenizer, args.batch_size, device, autocast, max_tokens))
            print(f"{path}: wrote {len(d)} {task} predictions to {out}")
        return 0
    except DataError as e:  # a missing or unusable file: the message names it
        p.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
