"""Predictions of a trained model for one file: the course's CSV format, or plain text with --text.

    python -m training.predict runs/default sst reviews.csv reviews-out.csv
    python -m training.predict runs/default sst reviews.txt reviews.tsv --text --probabilities

The same predictions as `python -m training.evaluate RUN --predict TASK FILE OUT` (and --predict-text),
one file at a time. Formats: training/inference/formats.py. An OUT that exists is refused unless --overwrite,
and OUT can never be FILE itself; both are checked before the model loads.
"""
from __future__ import annotations

import sys

from data.loaders import TASKS, DataError
from training.args import Parser, add_inference_flags, add_model_source, load_model, prediction_out_problem
from training.common.errors import LoadError
from training.common.progress import setup_logging
from training.inference.predictions import predict_file

PROG = "python -m training.predict"


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    p = Parser(prog=prog, description=__doc__)
    add_model_source(p, "the model")
    p.add_argument("task", choices=TASKS, help="which head predicts")
    p.add_argument("file", metavar="FILE", help="the input: a course-format CSV file, or plain text with --text")
    p.add_argument("out", metavar="OUT", help="the predictions file to write (not FILE; refused if it exists, "
                   "unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.add_argument("--text", action="store_true", help="FILE is plain text: one sentence per line (sst), one "
                   "sentence1<TAB>sentence2 pair per line (para, sts); OUT is in the TSV format")
    p.add_argument("--probabilities", action="store_true", help="write the TSV format with the class "
                   "probabilities as extra columns (prob_0..prob_4 for sst, prob_paraphrase for para)")
    add_inference_flags(p)
    args = p.parse_args(argv)
    setup_logging()
    problem = prediction_out_problem(args.out, [args.file], args.overwrite)
    if problem:  # before the model loads, and before OUT = FILE could lose the input
        p.fail(f"OUT {args.out}: {problem}")
    try:
        model = load_model(args)
        n = predict_file(model, args.task, args.file, args.out, args.text, args.probabilities)
    except (LoadError, DataError, ValueError) as e:
        p.fail(str(e))
    print(f"{args.file}: wrote {n} {args.task} predictions to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
