"""A run's prediction files as one set: {sst,para,sts}-{dev,test}-output.csv plus manifest.json saying
which run, checkpoint and config made them. A folder is replaced as a whole, never mixed: the files
are written into a fresh folder beside it, which then takes its place.

    manifest.json  {"run": abs OUT_DIR, "checkpoint": abs best.pt, "epoch", "step", "config_digest",
                    "dev_metrics", "files": [...], "sha256": {file: digest}, "written": ISO time}

`check_prediction_set` is what `python -m training.submit` trusts: the folder holds exactly the files its
manifest lists, each as written.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from data.loaders import COURSE_FILES, TASKS, load_task_file
from training.common.errors import ConfigError, WriteError, write_error
from training.common.places import current_umask, run_folder
from training.inference.formats import read_text_examples, write_predictions, write_tsv_predictions
from training.inference.metrics import metrics_of

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PREDICTION_FILE = re.compile(r"^(sst|para|sts)-(dev|test)-output\.csv$")  # the course's names


class PredictionSetError(ValueError):
    """A folder whose files cannot be shown to be one set; one line naming the folder and files."""


def config_digest(config: dict) -> str:
    """A short hash of a run's options, to tell two runs' files apart."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def read_manifest(folder: str | os.PathLike) -> dict | None:
    path = Path(folder) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check_predictions_dir(folder: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool) -> None:
    """Before any work: a folder outside OUT_DIR holding another run's files (or files no run of ours
    wrote) is refused unless --overwrite; this run's own folder is replaced at the end."""
    folder = Path(folder)
    if not folder.is_dir() or not any(folder.iterdir()) or overwrite:
        return
    if folder.resolve().is_relative_to(Path(out_dir).resolve()):
        return  # the run directory's own: whose run it holds is the out-dir's business (resume, --overwrite)
    manifest = read_manifest(folder)
    if manifest is not None and manifest.get("run") == str(Path(out_dir).resolve()):
        return
    owner = f"the run in {manifest.get('run')}" if manifest else "files no run of this out-dir wrote"
    raise ConfigError(f"--predictions-dir {folder} holds {owner}: this run would replace them as a whole; pass "
                      f"--overwrite, or another --predictions-dir (default: OUT_DIR/predictions)")


def lost_test_outputs(folder: str | os.PathLike, data_dir: str | os.PathLike) -> str | None:
    """Why a set written from `data_dir` must not replace `folder`'s: the test prediction files there whose test
    set `data_dir` lacks (a set is replaced as a whole, so they would go). None when there are none. evaluate
    and ensemble refuse this unless --overwrite."""
    lost = test_outputs_in(folder, [t for t in TASKS if not (Path(data_dir) / COURSE_FILES[t]["test"]).is_file()])
    if not lost:
        return None
    one = len(lost) == 1
    return (f"--predictions-dir {folder} holds {', '.join(lost)}, and {data_dir} lacks the test file behind "
            f"{'it' if one else 'each'}: the new set would lose {'it' if one else 'them'}; pass --overwrite, or "
            f"another --predictions-dir")


def test_outputs_in(folder: str | os.PathLike, tasks) -> list[str]:
    """The test prediction files of `tasks` that `folder` holds (the course's names)."""
    return [f"{task}-test-output.csv" for task in tasks if (Path(folder) / f"{task}-test-output.csv").is_file()]


def write_prediction_set(folder: str | os.PathLike, preds: dict[tuple[str, str], tuple[list[str], np.ndarray]],
                         manifest: dict) -> Path:
    """Write {task}-{split}-output.csv for each (task, split) -> (ids, predictions) and the manifest into
    a new folder, then put it in place of `folder` (whose old files go in one piece)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():  # a user's file, not an earlier set: never moved aside
        raise WriteError(f"{folder}: is a file, not a directory (the file is unchanged)")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{folder.name}.{os.getpid()}.", suffix=".tmp", dir=folder.parent))
    except OSError as e:
        raise write_error(e, folder) from e
    name = MANIFEST  # the file being written, for the message of a failed write
    try:
        names = []
        for (task, split), (ids, values) in preds.items():
            name = f"{task}-{split}-output.csv"
            write_predictions(fresh / name, task, ids, values)
            names.append(name)
        name = MANIFEST
        record = {**manifest, "files": sorted(names), "sha256": {n: sha256_of(fresh / n) for n in sorted(names)},
                  "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (fresh / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
        os.chmod(fresh, 0o777 & ~current_umask())  # mkdtemp makes it owner-only
        _swap_in(fresh, folder)
    except BaseException as e:
        shutil.rmtree(fresh, ignore_errors=True)
        error = write_error(e, folder / name) if isinstance(e, OSError) else None
        if error is not None:  # a full disk: one line naming the file; the folder keeps its earlier set
            raise error from e
        raise
    log.info("wrote %d prediction files and %s to %s", len(names), MANIFEST, folder)
    return folder


def _swap_in(fresh: Path, folder: Path) -> None:
    """fresh takes folder's place; between the two renames neither set is mixed with the other."""
    old = None
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        os.replace(folder, old)
    os.replace(fresh, folder)
    if old is not None:
        shutil.rmtree(old)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_prediction_set(folder: str | os.PathLike) -> tuple[dict, list[Path]]:
    """The folder's manifest and prediction files, when they are exactly the manifest's set: none missing,
    no course-named file it does not list, none changed since (where it records sha256s)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise PredictionSetError(f"{folder}: no {MANIFEST}, so nothing says that its files come from one run")
    manifest = read_manifest(folder)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise PredictionSetError(f"{folder / MANIFEST}: not a prediction set's manifest (no list of files)")
    listed = set(manifest["files"])
    present = {p.name for p in folder.iterdir() if PREDICTION_FILE.match(p.name)}
    missing, extra = sorted(listed - present), sorted(present - listed)
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                ([f"not from its manifest: {', '.join(extra)}"] if extra else [])
        raise PredictionSetError(f"{folder}: the files are not one run's set ({'; '.join(parts)})")
    digests = manifest.get("sha256") or {}
    changed = [n for n in sorted(listed) if n in digests and sha256_of(folder / n) != digests[n]]
    if changed:
        raise PredictionSetError(f"{folder}: {', '.join(changed)} changed since {MANIFEST} was written (another "
                                 f"run or an edit wrote over them)")
    return manifest, [folder / n for n in sorted(listed)]


def write_all_predictions(model, splits, folder, overwrite: bool = False, source: str | None = None) -> dict:
    """The dev metrics of `model` (a training.api.Model) printed, and the course's files of every set in
    `splits` written to `folder` with their manifest, as one set replacing the folder's earlier one whole
    (training/inference/predictions.py). A folder holding another run's set is refused unless `overwrite`."""
    from training.inference.outputs import predict_sets  # torch, which the loaded model has brought in already

    run = run_folder(model.source)
    check_predictions_dir(folder, run, overwrite)

    def predict(sets):
        return predict_sets(model.network, sets, model.tokenizer, model.batching(), model.device, model.autocast)

    dev, test = predict(splits.dev), predict(splits.test)
    metrics = metrics_of(splits.dev, dev) if dev else {}
    if metrics:
        print(f"dev metrics of {source or model.source}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    write_run_predictions(folder, splits, dev, test, run, model.source, model.config.to_dict(), metrics,
                          epoch=model.epoch, step=model.step)
    return metrics


def write_run_predictions(folder, splits, dev: dict, test: dict, run: Path, checkpoint: Path, config: dict,
                          metrics: dict, epoch: int | None = None, step: int | None = None) -> Path:
    """One checkpoint's prediction set: the course's file of every task predicted in `dev` and `test`
    (task -> predictions, in the order of splits.dev and splits.test), with the manifest naming the run,
    the checkpoint, where in training its weights are from, its config's digest and its dev metrics."""
    files = {(task, split): ([e.id for e in sets[task].examples], preds[task])
             for split, sets, preds in (("dev", splits.dev, dev), ("test", splits.test, test)) for task in preds}
    manifest = {"run": str(Path(run).resolve()), "checkpoint": str(Path(checkpoint).resolve()), "epoch": epoch,
                "step": step, "config_digest": config_digest(config), "dev_metrics": metrics}
    return write_prediction_set(folder, files, manifest)


def predict_file(model, task: str, path, out, plain: bool = False, with_probabilities: bool = False,
                 text_flag: str = "--text") -> int:
    """`model`'s predictions for a course-format file (or, `plain`, a plain-text one) written to `out`: in
    the course's format, or in our TSV format for plain text and with the class probabilities. Returns
    the number of examples. text_flag: the command's flag for plain text, which the line of a file that is
    not in the course's format names."""
    from heads import predict, probabilities  # torch, which the loaded model has brought in already

    hint = f"for plain text (a sentence, or sentence1<TAB>sentence2, per line), pass {text_flag}"
    examples = (read_text_examples(path, task) if plain
                else load_task_file(path, task, labelled=None, hint=hint).examples)
    outputs = model.outputs(task, examples)
    preds = predict(task, outputs).double().numpy()
    if plain or with_probabilities:
        probs = probabilities(task, outputs).double().numpy() if with_probabilities and task != "sts" else None
        write_tsv_predictions(out, task, examples, preds, probs)
    else:
        write_predictions(out, task, [e.id for e in examples], preds)
    return len(examples)
