"""Where a trained model is right and wrong on the dev sets.

    python -m training.analyze runs/default                   # writes runs/default/analysis/
    python -m training.analyze runs/default/best.pt --data-dir ../cs224n --out analysis-best

The dev files come from the data folder (--data-dir, else $MINBERT_DATA_DIR, else data), as in training.

OUT then holds
    analysis.md          the summary below, with the figures
    analysis.json        the same numbers, for scripts
    {task}-dev.tsv       the predictions they come from (training/inference/formats.py's TSV format,
                         with the gold label)
    sst_confusion.png    SST-5: confusion matrix (rows: gold, columns: predicted; shaded by row)
    para_confusion.png   Quora: the 2 x 2 confusion matrix
    sts_scatter.png      STS-B: predicted against gold scores, with Pearson's and Spearman's correlations
SST-5: accuracy, per-class precision / recall / F1 / support and their macro average. Quora: accuracy and
precision / recall / F1 of the paraphrase class. STS-B: Pearson's r, Spearman's rho (average ranks for
ties) and the mean absolute error. A class never predicted has precision 0 (as sklearn's zero_division=0).
The figures need matplotlib (pip install matplotlib, or the `plots` extra); without it the markdown, JSON
and TSV files are still written, and the command ends with a one-line error (exit 2).
"""
from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from data.folder import HELP as DATA_HELP
from data.loaders import COURSE_FILES, SENTIMENTS, DataError, load_task_file
from training.args import Parser, add_inference_flags, add_model_source, check_outputs, course_data, load_model
from training.common.errors import LoadError
from training.common.places import output_folder
from training.common.progress import setup_logging
from training.inference.formats import write_tsv_predictions

if TYPE_CHECKING:
    from training.api import Model

log = logging.getLogger(__name__)

PROG = "python -m training.analyze"
DPI = 100
FIGURES = {"sst": "sst_confusion.png", "para": "para_confusion.png", "sts": "sts_scatter.png"}


# The files an analysis writes in OUT (its {task}-dev.tsv too).
WRITTEN = ("analysis.json", "analysis.md", *FIGURES.values(), *(f"{task}-dev.tsv" for task in FIGURES))


def earlier_analysis_problem(out: Path, source: str, overwrite: bool) -> str | None:
    """Why OUT's files may not be replaced: they are an analysis of another model (a run's best.pt and one of
    its checkpoints share RUN/analysis), or files whose model no analysis.json names; unless --overwrite.
    The analysis of this model is written again."""
    found = [name for name in WRITTEN if (out / name).exists()]
    if overwrite or not found:
        return None
    try:
        earlier = json.loads((out / "analysis.json").read_text())["source"]
    except (OSError, ValueError, KeyError, TypeError):
        earlier = None
    if isinstance(earlier, str) and Path(earlier).resolve() in (Path(source).resolve(),
                                                                (Path(source) / "best.pt").resolve()):
        return None
    whose = f"the analysis of {earlier}" if isinstance(earlier, str) else ", ".join(found)
    return f"holds {whose}; pass --overwrite to replace it, or another --out"


# --------------------------------------------------------------------------- the numbers

def confusion_matrix(gold: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    """(k, k) counts: row = gold class, column = predicted class."""
    cm = np.zeros((k, k), dtype=np.int64)
    np.add.at(cm, (gold.astype(int), pred.astype(int)), 1)
    return cm


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b else 0.0


def class_scores(cm: np.ndarray) -> list[dict]:
    """Per class: precision (of the predictions of it), recall (of its gold examples), F1, support."""
    out = []
    for c in range(len(cm)):
        tp, predicted, support = cm[c, c], cm[:, c].sum(), cm[c, :].sum()
        p, r = _ratio(tp, predicted), _ratio(tp, support)
        out.append({"precision": p, "recall": r, "f1": _ratio(2 * p * r, p + r), "support": int(support)})
    return out


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of the ranks they span."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    start = 0
    for end in range(1, len(x) + 1):
        if end == len(x) or sorted_x[end] != sorted_x[start]:
            ranks[order[start:end]] = (start + 1 + end) / 2  # mean of ranks start+1 .. end
            start = end
    return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """None where undefined (fewer than two points, or a constant side: ptp, as a constant's deviations from
    its mean are rounding, not 0)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    return float((dx * dy).sum() / math.sqrt(float((dx * dx).sum() * (dy * dy).sum())))


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    return pearson(average_ranks(x), average_ranks(y))


def sst_numbers(gold: np.ndarray, pred: np.ndarray) -> dict:
    cm = confusion_matrix(gold, pred, len(SENTIMENTS))
    classes = class_scores(cm)
    return {"n": len(gold), "accuracy": float(np.mean(gold == pred)),
            "macro_precision": float(np.mean([c["precision"] for c in classes])),
            "macro_recall": float(np.mean([c["recall"] for c in classes])),
            "macro_f1": float(np.mean([c["f1"] for c in classes])),
            "classes": [{"label": i, "name": SENTIMENTS[i], **c} for i, c in enumerate(classes)],
            "confusion": cm.tolist()}


def para_numbers(gold: np.ndarray, pred: np.ndarray) -> dict:
    cm = confusion_matrix(gold, pred, 2)
    positive = class_scores(cm)[1]  # the paraphrase class
    return {"n": len(gold), "accuracy": float(np.mean(gold == pred)), "precision": positive["precision"],
            "recall": positive["recall"], "f1": positive["f1"], "positives": positive["support"],
            "confusion": cm.tolist()}


def sts_numbers(gold: np.ndarray, pred: np.ndarray) -> dict:
    return {"n": len(gold), "pearson": pearson(pred, gold), "spearman": spearman(pred, gold),
            "mean_absolute_error": float(np.mean(np.abs(pred - gold)))}


NUMBERS = {"sst": sst_numbers, "para": para_numbers, "sts": sts_numbers}


# --------------------------------------------------------------------------- predictions

def dev_predictions(model: Model, task: str, path: Path, out: Path) -> tuple[np.ndarray, np.ndarray]:
    """(gold, predicted) on a labelled file; the predictions also go to OUT/{task}-dev.tsv."""
    from heads import predict, probabilities  # torch, which the loaded model has brought in already

    examples = load_task_file(path, task, labelled=True).examples
    log.info("%s: predicting %d %s examples", path, len(examples), task)
    outputs = model.outputs(task, examples)
    pred = predict(task, outputs).double().numpy()
    probs = probabilities(task, outputs).double().numpy() if task != "sts" else None
    write_tsv_predictions(out / f"{task}-dev.tsv", task, examples, pred, probs, with_gold=True)
    return np.array([e.label for e in examples], dtype=np.float64), pred


def analyze(model: Model, dev_files: dict[str, Path], out: Path) -> dict:
    """The numbers of every task, with the predictions they come from written to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    results = {"source": str(model.source), "step": model.step, "tasks": {}}
    for task, path in dev_files.items():
        gold, pred = dev_predictions(model, task, path, out)
        results["tasks"][task] = {"file": str(path), **NUMBERS[task](gold, pred)}
        if task == "sts":  # kept for the scatter plot, not for the JSON
            results.setdefault("_points", {})[task] = (gold, pred)
    return results


# --------------------------------------------------------------------------- markdown

def _f(x) -> str:
    return "undefined" if x is None else f"{x:.4f}"


def markdown(results: dict, figures: bool) -> str:
    lines = [f"# Dev-set analysis of `{results['source']}`", ""]
    if results["step"] is not None:
        lines += [f"Weights of training step {results['step']}.", ""]
    tasks = results["tasks"]
    if "sst" in tasks:
        r = tasks["sst"]
        lines += ["## SST-5 sentiment", "", f"{r['n']} examples (`{r['file']}`); accuracy {_f(r['accuracy'])}, "
                  f"macro F1 {_f(r['macro_f1'])}.", "",
                  "| class | precision | recall | F1 | support |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {c['label']} {c['name']} | {_f(c['precision'])} | {_f(c['recall'])} | {_f(c['f1'])} | "
                  f"{c['support']} |" for c in r["classes"]]
        lines += [f"| macro average | {_f(r['macro_precision'])} | {_f(r['macro_recall'])} | {_f(r['macro_f1'])} | "
                  f"{r['n']} |", "", "Confusion matrix (rows: gold, columns: predicted):", "",
                  "| gold \\ predicted | " + " | ".join(map(str, range(5))) + " |", "|---|" + "---:|" * 5]
        lines += [f"| {i} | " + " | ".join(map(str, row)) + " |" for i, row in enumerate(r["confusion"])]
        lines += [""] + ([f"![SST-5 confusion matrix]({FIGURES['sst']})", ""] if figures else [])
    if "para" in tasks:
        r = tasks["para"]
        (tn, fp), (fn, tp) = r["confusion"]
        lines += ["## Quora paraphrase", "", f"{r['n']} pairs (`{r['file']}`), {r['positives']} of them paraphrases.",
                  "", "| accuracy | precision | recall | F1 |", "|---:|---:|---:|---:|",
                  f"| {_f(r['accuracy'])} | {_f(r['precision'])} | {_f(r['recall'])} | {_f(r['f1'])} |", "",
                  f"Precision, recall and F1 of the paraphrase class: {tp} true positives, {fp} false positives, "
                  f"{fn} false negatives, {tn} true negatives.", ""]
        lines += [f"![Quora confusion matrix]({FIGURES['para']})", ""] if figures else []
    if "sts" in tasks:
        r = tasks["sts"]
        lines += ["## STS-B similarity", "", f"{r['n']} pairs (`{r['file']}`).", "",
                  "| Pearson | Spearman | mean absolute error |", "|---:|---:|---:|",
                  f"| {_f(r['pearson'])} | {_f(r['spearman'])} | {_f(r['mean_absolute_error'])} |", ""]
        lines += [f"![STS-B predicted against gold]({FIGURES['sts']})", ""] if figures else []
    if not figures:
        lines += ["(No figures: matplotlib is not installed.)", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- figures

def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _confusion_figure(plt, cm: np.ndarray, labels: list[str], title: str, path: Path) -> None:
    cm = np.asarray(cm)
    shade = cm / np.maximum(cm.sum(1, keepdims=True), 1)  # by row: the share of each gold class
    size = 1.0 + 1.0 * len(cm)
    fig, ax = plt.subplots(figsize=(size + 1.5, size), dpi=DPI)
    im = ax.imshow(shade, cmap="Blues", vmin=0, vmax=1)
    for (i, j), n in np.ndenumerate(cm):
        ax.text(j, i, str(n), ha="center", va="center", color="white" if shade[i, j] > 0.5 else "black")
    ax.set_xticks(range(len(cm)), labels, rotation=30, ha="right")
    ax.set_yticks(range(len(cm)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="share of the gold class")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _scatter_figure(plt, gold: np.ndarray, pred: np.ndarray, r: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 5.0), dpi=DPI)
    ax.scatter(gold, pred, s=10, alpha=0.5)
    ax.plot([0, 5], [0, 5], color="grey", linestyle="--", linewidth=1, label="predicted = gold")
    ax.set_xlim(-0.2, 5.2)
    ax.set_ylim(-0.2, 5.2)
    ax.set_xlabel("gold similarity")
    ax.set_ylabel("predicted similarity")
    ax.set_title(f"STS-B dev: Pearson {_f(r['pearson'])}, Spearman {_f(r['spearman'])}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def draw_figures(plt, results: dict, out: Path) -> list[Path]:
    tasks, written = results["tasks"], []
    if "sst" in tasks:
        _confusion_figure(plt, tasks["sst"]["confusion"], [f"{i} {n}" for i, n in enumerate(SENTIMENTS)],
                          "SST-5 dev: confusion matrix", out / FIGURES["sst"])
        written.append(out / FIGURES["sst"])
    if "para" in tasks:
        _confusion_figure(plt, tasks["para"]["confusion"], ["not paraphrase", "paraphrase"],
                          "Quora dev: confusion matrix", out / FIGURES["para"])
        written.append(out / FIGURES["para"])
    if "sts" in tasks:
        gold, pred = results["_points"]["sts"]
        _scatter_figure(plt, gold, pred, tasks["sts"], out / FIGURES["sts"])
        written.append(out / FIGURES["sts"])
    return written


# --------------------------------------------------------------------------- command line

def dev_files(model: Model, data_dir: str) -> dict[str, Path]:
    """Each trained task's dev file in the data folder."""
    return {t: Path(data_dir) / COURSE_FILES[t]["dev"] for t in model.tasks}


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    p = Parser(prog=prog, description=__doc__)
    add_model_source(p, "the model to analyse")
    p.add_argument("--data-dir", default=None, help=DATA_HELP)
    p.add_argument("--out", default=None, help="where to write (default: RUN/analysis, in the run's folder)")
    p.add_argument("--overwrite", action="store_true", help="replace an analysis of another model in --out")
    add_inference_flags(p, "the run's")
    args = p.parse_args(argv)
    setup_logging()
    out = output_folder(args.out, args.source, "analysis")
    check_outputs(p, folders={"--out": out})  # before the model loads and predicts every dev set
    problem = earlier_analysis_problem(out, args.source, args.overwrite)
    if problem:
        p.fail(f"--out {out}: {problem}")
    data_dir = course_data(p, args.data_dir)
    try:
        model = load_model(args)
        results = analyze(model, dev_files(model, data_dir), out)
    except (LoadError, DataError) as e:
        p.fail(str(e))
    plt = _pyplot()
    (out / "analysis.json").write_text(json.dumps({k: v for k, v in results.items() if not k.startswith("_")},
                                                  indent=2) + "\n")
    (out / "analysis.md").write_text(markdown(results, figures=plt is not None))
    if plt is None:
        p.fail(f"the figures need matplotlib: pip install matplotlib (or pip install -e '.[plots]'); wrote "
               f"{out / 'analysis.md'} and the numbers without them")
    draw_figures(plt, results, out)
    print(f"wrote {out / 'analysis.md'} and its figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
