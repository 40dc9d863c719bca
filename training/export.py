"""Export a trained model: the encoder in the Hugging Face layout, the task heads beside it, a model card.

    python -m training.export runs/default                     # writes runs/default/export/
    python -m training.export runs/default/checkpoints/step-0001250.pt exports/step1250 --overwrite

OUT_DIR (default: RUN/export, in the run's folder) then holds
    config.json, model.safetensors    the encoder: transformers.BertModel.from_pretrained(OUT_DIR) loads it
    vocab.txt / tokenizer.json, ...   the run's tokenizer files
    heads.safetensors                 the trained tasks' heads ({task}.{parameter} -> tensor)
    heads.json                        what the heads need: tasks, pair encoding, pooling, max length, both
                                      orders, precision, the run's whole config, its dev metrics
    README.md                         the model card: data, recipe, dev metrics, dates, how to load it
With --trained-only, the encoder's trained part alone replaces config.json and model.safetensors:
    encoder-trained.safetensors       the tensors training changed (LoRA's factors, BitFit's biases, the
                                      layers above a frozen prefix, the pooler), a few MB where the whole
                                      encoder is tens; heads.json names the pretrained base the rest comes
                                      from, which loading reads and checks by its fingerprint
`training.api.load(OUT_DIR)` gives the checkpoint's predictions. An existing non-empty OUT_DIR is refused
unless --overwrite, which replaces the export's files there (and any other weights or vocabulary that
would shadow them) and leaves other files alone.
"""
from __future__ import annotations

import sys

from training.args import Parser, add_model_source, check_outputs
from training.common.errors import LoadError
from training.common.places import output_folder
from training.common.progress import setup_logging

PROG = "python -m training.export"


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    p = Parser(prog=prog, description=__doc__)
    add_model_source(p, "the model to export")
    p.add_argument("out", metavar="OUT_DIR", nargs="?", help="the folder to write, refused when it exists and is "
                   "not empty (default: RUN/export, in the run's folder)")
    p.add_argument("--overwrite", action="store_true", help="replace the export files in a non-empty OUT_DIR")
    p.add_argument("--trained-only", action="store_true",
                   help="write only the encoder tensors training changed (LoRA, BitFit, freezing), to be loaded "
                        "onto the run's pretrained model; refused for full fine-tuning, which changes them all")
    args = p.parse_args(argv)
    setup_logging()
    out = output_folder(args.out, args.source, "export")
    check_outputs(p, folders={"OUT_DIR": out})  # before the seconds of torch and the model
    from training.results.export import ExportError, export  # torch, once the flags are known

    try:
        out = export(args.source, out, args.overwrite, args.raw_weights, args.tokenizer, args.trained_only)
    except (ExportError, LoadError) as e:
        p.fail(str(e))
    print(f"wrote {out} (load it with training.api.load({str(out)!r}))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
