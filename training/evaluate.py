"""Dev metrics, the course's prediction files, and predictions for any file.

    python -m training.evaluate runs/default     # dev metrics, runs/default/predictions/ from $MINBERT_DATA_DIR or data
    python -m training.evaluate runs/default --data-dir ../cs224n --predictions-dir predictions-copy
    python -m training.evaluate runs/default/best.pt --score sts my-sts.csv --predict sst new.csv out.csv
    python -m training.evaluate runs/default --predict-text sst reviews.txt reviews.tsv --probabilities

RUN is a run directory (its best.pt), a checkpoint file (best.pt, checkpoints/step-N.pt) or a folder
written by python -m training.export.

The course's files are evaluated and predicted (from the data folder: --data-dir, else $MINBERT_DATA_DIR,
else data) when --data-dir is given or nothing else is asked; their predictions go to RUN/predictions (or
--predictions-dir), with a manifest.json, as one set replacing the folder's earlier set whole
(training/inference/predictions.py; python -m training.submit checks it).

Course format (those files, --predict): a header `id \t Predicted_Sentiment` (`Predicted_Is_Paraphrase`,
`Predicted_Similiary` -- the course's spelling), then one `id , prediction` row per example.

Plain text (--predict-text TASK FILE OUT): one sentence per line for sst, one `sentence1<TAB>sentence2`
pair per line for para and sts; blank lines skipped; ids are line numbers. Its output, and --predict's
with --probabilities, is our TSV format, not the course's: id, the sentence(s), the label (sst 0..4,
para 0/1) or the score (sts), and with --probabilities the class probabilities (prob_0..prob_4 for sst,
prob_paraphrase for para) -- training/inference/formats.py describes it.

Every OUT is checked before the model loads: one that exists is refused unless --overwrite, and one that is
an input of the command (FILE, or a course file) or another OUT always is.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from data.loaders import COURSE_FILES, TASKS, DataError, load_task_file
from training.args import (
    Parser,
    add_inference_flags,
    add_model_source,
    check_outputs,
    course_data,
    load_model,
    prediction_out_problem,
    same_file,
)
from training.common.errors import LoadError
from training.common.places import output_folder
from training.common.progress import setup_logging
from training.inference.metrics import METRIC, score
from training.inference.predictions import lost_test_outputs, predict_file, write_all_predictions

log = logging.getLogger(__name__)

PROG = "python -m training.evaluate"

def build_parser(prog: str = PROG) -> Parser:
    p = Parser(prog=prog, description=__doc__)
    add_model_source(p)
    p.add_argument("--data-dir", default=None, help="evaluate the course's dev files and predict its test files from "
                   "this folder (done without --data-dir too when no --score, --predict or --predict-text is given: "
                   "$MINBERT_DATA_DIR if set, else data)")
    p.add_argument("--predictions-dir", default=None,
                   help="where the course's prediction files go, with their manifest.json, replacing an earlier set "
                        "of the same run (default: RUN/predictions)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the OUT files of --predict and --predict-text that exist (refused without it), and "
                        "let --data-dir replace a --predictions-dir holding another run's set (or files of no run), "
                        "or test predictions that --data-dir lacks the test files to write again")
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
    add_inference_flags(p)
    return p


def main(argv=None, prog: str = PROG) -> int:
    p = build_parser(prog)
    args = p.parse_args(argv)
    setup_logging()
    for task, *_ in args.score + args.predict + args.predict_text:
        if task not in TASKS:
            p.error(f"unknown task {task!r}; one of {', '.join(TASKS)}")
    if args.probabilities and not (args.predict or args.predict_text):
        p.error("--probabilities applies to --predict and --predict-text")
    # the course's files, asked for or nothing else is: from the one data folder of every command
    asked = args.data_dir or not (args.score or args.predict or args.predict_text)
    args.course = course_data(p, args.data_dir) if asked else None
    check_paths(p, args)
    try:
        model = load_model(args)
    except LoadError as e:
        p.fail(str(e))
    try:
        run_commands(args, model)
    except (DataError, ValueError) as e:  # a missing or unusable file, an untrained task, another run's folder
        p.fail(str(e))
    return 0


def check_paths(p: Parser, args) -> None:
    """What evaluate writes, refused in one line before the model loads: found after the predictions, a bad
    path costs them, and an OUT that is an input (the course's files too), or is given twice, loses what
    was there."""
    inputs = [f for _, f in args.score] + [f for _, f, _ in args.predict + args.predict_text]
    if args.course:
        folder = output_folder(args.predictions_dir, args.source, "predictions")
        check_outputs(p, folders={"--predictions-dir": folder})
        lost = None if args.overwrite else lost_test_outputs(folder, args.course)
        if lost:
            p.fail(lost)
        inputs += [Path(args.course) / COURSE_FILES[t][s] for t in TASKS for s in ("dev", "test")]
    outs = [("--predict", out) for *_, out in args.predict] + [("--predict-text", out) for *_, out in args.predict_text]
    for i, (flag, out) in enumerate(outs):
        problem = prediction_out_problem(out, inputs, args.overwrite)
        if any(same_file(out, earlier) for _, earlier in outs[:i]):
            problem = "is given as OUT twice: the second predictions would be written over the first"
        if problem:
            p.fail(f"{flag} OUT {out}: {problem}")


def run_commands(args, model) -> None:
    from data.batching import encode_task  # torch, which the loaded model has brought in already
    from heads import predict

    cfg = model.config

    def encoded(task, path, labelled):
        examples = load_task_file(path, task, labelled=labelled).examples
        return encode_task(task, examples, model.tokenizer, cfg.pair_encoding, cfg.max_length, model.both_orders)

    if args.course:
        from training.run.build import Splits
        splits = Splits({}, {}, {})
        for task in cfg.tasks:
            splits.dev[task] = encoded(task, Path(args.course) / COURSE_FILES[task]["dev"], True)
            test = Path(args.course) / COURSE_FILES[task]["test"]
            if test.is_file():
                splits.test[task] = encoded(task, test, False)
        folder = output_folder(args.predictions_dir, args.source, "predictions")
        write_all_predictions(model, splits, folder, args.overwrite, source=str(args.source))
    for task, path in args.score:
        examples = load_task_file(path, task, labelled=True).examples
        preds = predict(task, model.outputs(task, examples)).double().numpy()
        value = score(task, preds, [e.label for e in examples])
        print(f"{path}: {METRIC[task]} {value:.4f} ({len(examples)} examples)")
    inputs = [(t, f, o, False) for t, f, o in args.predict] + [(t, f, o, True) for t, f, o in args.predict_text]
    for task, path, out, plain in inputs:
        n = predict_file(model, task, path, out, plain, args.probabilities, f"--predict-text {task} FILE OUT")
        print(f"{path}: wrote {n} {task} predictions to {out}")


if __name__ == "__main__":
    sys.exit(main())
