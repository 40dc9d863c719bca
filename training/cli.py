"""Command line of run_multitask.py, built from TrainConfig's fields: flags -> TrainConfig, checked
before any heavy work.

    python run_multitask.py --freeze-upto 3 --smart
    python run_multitask.py --config runs/default/config.json --seed 2   # rerun a run, one flag changed
"""
from __future__ import annotations

import argparse
import logging
import sys

from data.loaders import COURSE_FILES, TASKS

from .config import (GROUPS, TrainConfig, data_dir_origin, default_of, field_errors, flag_of, freeze_error, options,
                     read_config_file, validate)
from .errors import ConfigError, NonFiniteLossError, TrainingInterrupted, WriteError
from .progress import setup_logging

PROG = "run_multitask.py"


def _opt_int(s: str) -> int | None:
    return None if s.lower() in ("none", "off") else int(s)


def _opt_float(s: str) -> float | None:
    return None if s.lower() in ("none", "off") else float(s)


def depth_or_share(s: str) -> int | str | None:
    """--freeze-upto: none, a number of layers, or a share of them (P%)."""
    if s.lower() in ("none", "off"):
        return None
    value = s.strip() if s.strip().endswith("%") else _int_or_text(s)
    if isinstance(value, int) and freeze_error(value):
        raise argparse.ArgumentTypeError(f"must be >= -1 (-1: the embeddings only), not {value}")
    if freeze_error(value):
        raise argparse.ArgumentTypeError(f"{s!r} is neither a number of layers (an integer >= -1) nor a share of "
                                         f"the layers (P% with 0 <= P <= 100, e.g. 75%)")
    return value


def _int_or_text(s: str) -> int | str:
    try:
        return int(s)
    except ValueError:
        return s


# The CS224N starter code's flags (multitask_classifier.py) -> ours, for its users' first try
# (docs/api.md, "Coming from the starter code"; 2023's --option and Spring 2024's --fine-tune-mode)
STARTER_FLAGS = {"--use_gpu": "--device cuda", "--option": "--freeze-upto N (pretrain: N = the number of layers; "
                 "finetune: leave it out)", "--fine-tune-mode": "--freeze-upto N (last-linear-layer: N = the "
                 "number of layers; full-model: leave it out)", "--hidden_dropout_prob": "--head-dropout",
                 "--batch_size": "--batch-size",
                 **{f"--{t}_{s}_out": "--predictions-dir DIR" for t in ("sst", "para", "sts") for s in ("dev", "test")}}


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line (not the 40-line usage), and an unknown flag is answered with
    the nearest real one, or its name in this trainer for the course's starter-code flags."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            hints = [h for h in (self.nearest(w) for w in message.split(":", 1)[1].split()) if h]
            message += f" (did you mean {'; '.join(hints)}?)" if hints else ""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def nearest(self, word: str) -> str | None:
        import difflib

        name = word.split("=", 1)[0]
        if not name.startswith("-"):
            return None
        if name in STARTER_FLAGS:
            return f"{STARTER_FLAGS[name]} for the starter code's {name}"
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        hyphens = name.replace("_", "-")
        if hyphens in flags:
            return hyphens
        close = difflib.get_close_matches(hyphens, flags, n=1, cutoff=0.6)
        return close[0] if close else None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None: "(default: None)" says nothing; those flags' help says what unset means."""

    def _get_help_string(self, action):
        # "--no-bucket ... (default: True)" would read as if the flag were on: an off-switch's help says it
        if action.default is None or isinstance(action, argparse._StoreFalseAction):
            return action.help
        return super()._get_help_string(action)


def add_option(group, f, default=None, help_suffix: str = "") -> None:
    """One TrainConfig field as a flag (or, for `files`, one flag per task and split)."""
    meta, flag, kind = f.metadata, flag_of(f.name), str(f.type)
    default = default_of(f) if default is None else default
    text = meta["help"] + help_suffix
    if meta["default_text"]:
        text += f" (default: {meta['default_text']})"
    if f.name == "files":
        for task in TASKS:
            for split in ("train", "dev", "test"):
                group.add_argument(f"--{task}-{split}", metavar=meta["metavar"], default=None,
                                   help=meta["help"].format(file=COURSE_FILES[task][split]))
    elif meta["onoff"]:
        group.add_argument(flag, choices=["off", "on"], default="on" if default else "off", help=text)
    elif kind == "bool":
        if default:  # an off-switch
            group.add_argument(f"--no-{flag[2:]}", dest=f.name, action="store_false", help=text)
        else:
            group.add_argument(flag, action="store_true", help=text)
    elif f.name == "tasks":
        group.add_argument(flag, nargs="+", choices=meta["choices"], default=list(default), help=text)
    else:
        parse = {"int": int, "float": float, "int | None": _opt_int, "float | None": _opt_float,
                 "int | str | None": depth_or_share}.get(kind, str)
        group.add_argument(flag, type=parse, choices=meta["choices"], default=default, metavar=meta["metavar"],
                           help=text)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Train one BERT on SST-5 sentiment, Quora paraphrase and STS-B similarity, evaluate on "
                    "the dev sets each epoch, keep the best checkpoint and write the course's prediction files.",
        formatter_class=_HelpFormatter)
    p.add_argument("--config", metavar="FILE", default=None,
                   help="start from the options in FILE (a run's config.json, or a JSON recipe of some options); "
                        "flags given on the command line override it")
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    for f in options():
        add_option(groups[f.metadata["group"]], f)
    groups["run"].add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def config_from_args(args: argparse.Namespace, base: TrainConfig | None = None) -> TrainConfig:
    """The parsed flags over `base` (default: TrainConfig's defaults); options the parser lacks (the
    sweep's subset) keep base's values."""
    values = (base or TrainConfig()).to_dict()
    for f in options():
        if f.name == "files":
            files = {f"{t}_{s}": getattr(args, f"{t}_{s}", None) for t in TASKS for s in ("train", "dev", "test")}
            values["files"] = {**values["files"], **{k: v for k, v in files.items() if v}}
        elif hasattr(args, f.name):
            value = getattr(args, f.name)
            values[f.name] = (value == "on") if f.metadata["onoff"] else value
    return TrainConfig.from_dict(values)


def defaults_from(values: dict) -> dict:
    """A saved config's values as parser defaults (dest -> default), so that flags typed after
    --config override them and the rest keep them."""
    out = {}
    for f in options():
        if f.name not in values:
            continue
        value = values[f.name]
        if f.name == "files":
            out.update(value or {})
        elif f.metadata["onoff"]:
            out[f.name] = "on" if value else "off"
        else:
            out[f.name] = value
    # a saved sampler that is just --pcgrad's own default stays a default: --pcgrad given over the
    # file (or removed from it) then picks its sampler as on the plain command line
    if values.get("task_sampling") == ("mixed" if values.get("pcgrad") else "mtdnn"):
        out["task_sampling"] = None
    return out


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, TrainConfig]:
    """The command line -> (args, config): --config FILE's options first, every flag given over them."""
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)  # only to find --config; errors come from the full parse
    if first.config is not None:
        try:
            values = read_config_file(first.config)
        except ConfigError as e:
            parser.exit(2, f"{PROG}: error: {e}\n")
        # checked before argparse sees them: it would run a string default through the flag's type
        errors = field_errors(TrainConfig.from_dict(values))
        if errors:
            parser.exit(2, "".join(f"{PROG}: error: --config {first.config}: {e}\n" for e in errors))
        parser.set_defaults(**defaults_from(values))
    args = parser.parse_args(argv)
    typed = any(a == "--data-dir" or a.startswith("--data-dir=") for a in (sys.argv[1:] if argv is None else argv))
    given = typed or args.data_dir != parser.get_default("data_dir")  # an abbreviation, --data-d X, too
    config_file = first.config if first.config is not None and "data_dir" in values else None
    args.data_dir_from = data_dir_origin(args.data_dir, given, config_file)  # for the line of a missing folder
    return args, config_from_args(args)


def main(argv: list[str] | None = None) -> int:
    args, cfg = parse(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    errors = validate(cfg, args.data_dir_from)
    if errors:
        for e in errors:
            print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    # heavy imports only after the flags are known to be good
    import torch

    from data.loaders import DataError
    from minbert import CheckpointError

    from .trainer import train

    try:
        train(cfg)
    except (ConfigError, CheckpointError, DataError) as e:  # found once the model / data / checkpoint are read
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except TrainingInterrupted as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 130 if e.signal_name == "SIGINT" else 143
    except (NonFiniteLossError, torch.OutOfMemoryError, WriteError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file the run reads or writes, found unusable mid-way (not a bug: no traceback)
        where = f"{e.filename}: " if e.filename else ""
        print(f"{PROG}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    return 0
