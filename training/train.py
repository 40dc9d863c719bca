"""Train one model: run_multitask.py's command line (`minbert train`), built from TrainConfig's fields:
flags -> TrainConfig, checked before any heavy work.

    python run_multitask.py --freeze-upto 3 --smart
    python run_multitask.py --config runs/default/config.json --seed 2   # rerun a run, one flag changed
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from data.folder import origin
from training.args import OptionsHelpFormatter, Parser, add_option, config_from_args, defaults_from
from training.common.errors import ConfigError, NonFiniteLossError, TrainingInterrupted, WriteError
from training.common.progress import setup_logging
from training.config.train_config import GROUPS, TrainConfig, field_errors, options, read_config_file, validate_once

PROG = "run_multitask.py"
log = logging.getLogger(__name__)


# The CS224N starter code's flags (multitask_classifier.py) -> ours, for its users' first try
# (docs/api.md, "Coming from the starter code"; 2023's --option and Spring 2024's --fine-tune-mode)
STARTER_FLAGS = {"--use_gpu": "--device cuda", "--option": "--freeze-upto N (pretrain: N = the number of layers; "
                 "finetune: leave it out)", "--fine-tune-mode": "--freeze-upto N (last-linear-layer: N = the "
                 "number of layers; full-model: leave it out)", "--hidden_dropout_prob": "--head-dropout",
                 "--batch_size": "--batch-size",
                 **{f"--{t}_{s}_out": "--predictions-dir DIR" for t in ("sst", "para", "sts") for s in ("dev", "test")}}


def build_parser(prog: str = PROG) -> Parser:
    p = Parser(
        prog=prog, usage="%(prog)s [--config FILE] [options]",  # the options are listed below, once
        hints={name: f"{ours} for the starter code's {name}" for name, ours in STARTER_FLAGS.items()},
        description="Train one BERT on SST-5 sentiment, Quora paraphrase and STS-B similarity, evaluate on "
                    "the dev sets each epoch, keep the best checkpoint and write the course's prediction files. "
                    "Each option in full: docs/options.md.",
        formatter_class=OptionsHelpFormatter)
    p.add_argument("--config", metavar="FILE", default=None,
                   help="start from FILE's options (a run's config.json, or a recipe); flags override them")
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    for f in options():
        add_option(groups[f.metadata["group"]], f)
    groups["run"].add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def parse(argv: list[str] | None = None, prog: str = PROG) -> tuple[argparse.Namespace, TrainConfig]:
    """The command line -> (args, config): --config FILE's options first, every flag given over them."""
    parser = build_parser(prog)
    first, _ = parser.parse_known_args(argv)  # only to find --config; errors come from the full parse
    if first.config is not None:
        try:
            values = read_config_file(first.config)
        except ConfigError as e:
            parser.fail(str(e))
        # checked before argparse sees them: it would run a string default through the flag's type
        errors = field_errors(TrainConfig.from_dict(values), given=values)
        if errors:
            parser.exit(2, "".join(f"{prog}: error: --config {first.config}: {e}\n" for e in errors))
        parser.set_defaults(**defaults_from(values))
    args = parser.parse_args(argv)
    given = any(a == "--data-dir" or a.startswith("--data-dir=") for a in (sys.argv[1:] if argv is None else argv))
    config_file = first.config if first.config is not None and "data_dir" in values else None
    args.data_dir_from = origin(args.data_dir, given, config_file)  # for the line of a missing folder
    return args, config_from_args(args)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args, cfg = parse(argv, prog)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    errors = validate_once(cfg, args.data_dir_from)  # the run's one validation: train() reads its mark
    if errors:
        for e in errors:
            print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    # heavy imports only after the flags are known to be good
    import torch

    from data.loaders import DataError
    from minbert import CheckpointError
    from training.run.trainer import train

    try:
        export = export_to(cfg)
        train(cfg)
        if export is not None:  # the encoder in the Hugging Face layout, the heads and a model card
            from training.results.export import export as export_model
            export_model(Path(cfg.out_dir) / "best.pt", export, overwrite=True)  # checked before training
            log.info("exported the model to %s", export)
    except (ConfigError, CheckpointError, DataError) as e:  # found once the model / data / checkpoint are read
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except TrainingInterrupted as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 130 if e.signal_name == "SIGINT" else 143
    except (NonFiniteLossError, torch.OutOfMemoryError, WriteError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file the run reads or writes, found unusable mid-way (not a bug: no traceback)
        where = f"{e.filename}: " if e.filename else ""
        print(f"{prog}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def export_to(cfg: TrainConfig) -> Path | None:
    """--export-hf DIR, found unusable before training, not after it: the folder this process exports the
    best model to once the run is trained, or None (no --export-hf, a rank other than torchrun's rank 0, or
    a finished run that --resume auto leaves as it is, its export written)."""
    from training.results.export import ExportError, check_out_dir
    from training.run.rundir import finished_run

    if not cfg.export_hf or os.environ.get("RANK", "0") != "0" or finished_run(cfg, Path(cfg.out_dir)) is not None:
        return None
    try:
        check_out_dir(Path(cfg.export_hf), cfg.overwrite)
    except ExportError as e:
        raise ConfigError(f"--export-hf {e}") from None
    return Path(cfg.export_hf)


if __name__ == "__main__":
    sys.exit(main())
