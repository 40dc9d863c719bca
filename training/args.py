"""What every command's command line shares: the parser (one-line errors, the nearest flag suggested),
TrainConfig's fields as flags, and the argument groups of the commands that run a trained model, so that a
flag means one thing in every command. Commands import this; the library never does.
"""
from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import Iterable, NoReturn

from data.folder import data_folder, folder_problem, origin
from data.loaders import COURSE_FILES, TASKS
from training.config.freeze_spec import freeze_error
from training.config.train_config import TrainConfig, default_of, dir_problem, flag_of, options


@functools.cache  # one function per kind and words: parsers built from the same fields compare equal
def optional(kind: type, none_words: tuple[str, ...] = ()):
    """A flag's type that also takes none/off (and the words --help shows for its default, e.g. all) for None."""
    words = {"none", "off", *none_words}

    def parse(s: str):
        if s.lower() in words:
            return None
        try:
            return kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {s!r} (or one of "
                                             f"{', '.join(sorted(words))})") from None
    return parse


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


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line naming the command (not the 40-line usage), exit status 2, and an
    unknown flag is answered with the nearest real one, or with what replaces it for the flags in `hints`
    (run_multitask.py's: the course's starter-code flags). Every command's parser is one."""

    def __init__(self, *args, hints: dict[str, str] | None = None, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        # argparse would take --epoch for --epochs silently: a prefix is refused with the nearest flag instead
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.hints = hints or {}

    def fail(self, message: str) -> NoReturn:
        """A problem found after parsing (a missing file, a bad value): the same one line, no usage hint."""
        self.exit(2, f"{self.prog}: error: {message}\n")

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            hints = [h for h in (self.nearest(w) for w in message.split(":", 1)[1].split()) if h]
            message += f" (did you mean {'; '.join(hints)}?)" if hints else ""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def nearest(self, word: str) -> str | None:
        import difflib

        name = word.split("=", 1)[0]
        if not name.startswith("-"):
            return None
        if name in self.hints:
            return self.hints[name]
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        hyphens = name.replace("_", "-")
        if hyphens in flags:
            return hyphens
        close = difflib.get_close_matches(hyphens, flags, n=1, cutoff=0.6)
        return close[0] if close else None


class OptionsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None: "(default: None)" says nothing; those flags' help says what unset means.
    Nor a switch's: "--no-bucket ... (default: True)" would read as if the flag were on, and a switch is off
    until given."""

    def __init__(self, prog, indent_increment=2, max_help_position=26, width=None):
        # room for the flags whose short metavar fits beside them: one line less each
        super().__init__(prog, indent_increment, max_help_position, width)

    def _get_help_string(self, action):
        said = "(default: " in (action.help or "")  # a default_text (add_option) says it in words
        if said or action.default is None or isinstance(action, (argparse._StoreFalseAction,
                                                                 argparse._StoreTrueAction)):
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
        group.add_argument(flag, choices=["off", "on"], default="on" if default else "off", help=text,
                           metavar=meta["metavar"])
    elif kind == "bool":  # the switch --help lists, then its opposite, unlisted: it undoes a --config file's
        on, off = flag, f"--no-{flag[2:]}"
        listed, opposite = (off, on) if default else (on, off)
        group.add_argument(listed, dest=f.name, action="store_false" if default else "store_true", help=text)
        group.add_argument(opposite, dest=f.name, action="store_true" if default else "store_false",
                           help=argparse.SUPPRESS)
    elif f.name == "tasks":
        group.add_argument(flag, nargs="+", choices=meta["choices"], default=list(default), help=text,
                           metavar=meta["metavar"])
    else:
        words = ("all",) if meta.get("default_text") == "all" else ()  # --help's word for the default
        parse = {"int": int, "float": float, "int | None": optional(int, words), "float | None": optional(float, words),
                 "int | str | None": depth_or_share}.get(kind, str)
        group.add_argument(flag, type=parse, choices=meta["choices"], default=default, metavar=meta["metavar"],
                           help=text)


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


# --------------------------------------------------------------------------- the commands that run a trained model

def add_model_source(p: argparse.ArgumentParser, what: str = "the model") -> None:
    """The trained model a command reads: RUN (a run directory, its best.pt), a checkpoint file, or a folder
    written by the export command; and the options of reading it."""
    p.add_argument("source", metavar="RUN", type=existing_path,
                   help=f"{what}: a run directory (its best.pt), a checkpoint file (best.pt, checkpoints/step-N.pt) "
                        "or a folder written by the export command")
    add_reading_flags(p)


def add_reading_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--raw-weights", action="store_true",
                   help="a training checkpoint of an --ema-decay run: its raw weights instead of their average, "
                        "the weights the run evaluates (default: the average)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the run's tokenizer/)")


def add_inference_flags(p: argparse.ArgumentParser, whose: str = "the training run's") -> None:
    """--eval-batch-size, --device, --precision, --predict-both-orders, named and meaning as in training;
    `whose` says where the last two default from."""
    p.add_argument("--eval-batch-size", dest="batch_size", type=positive_int, default=256,
                   help="examples per inference batch (default: %(default)s)")
    p.add_argument("--eval-tokens", type=non_negative_int, default=None, metavar="N",
                   help="padded tokens (examples x longest) at most per batch, which --eval-batch-size also caps; 0: "
                        "no budget (default: 1024 on CPU, none on CUDA; docs/training.md)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    precisions = TrainConfig.__dataclass_fields__["precision"].metadata["choices"]
    p.add_argument("--precision", choices=precisions, default=None,
                   help=f"autocast for inference (default: {whose} --precision)")
    p.add_argument("--predict-both-orders", dest="both_orders", action=argparse.BooleanOptionalAction, default=None,
                   help=f"cross encoding: predict each paraphrase/similarity pair as (a, b) and (b, a) and average "
                        f"(default: {whose} --predict-both-orders)")


def course_data(p: Parser, given: str | None) -> str:
    """The data folder by the one rule of every command (data.folder: the flag, else $MINBERT_DATA_DIR, else
    data), refused in one line naming where its path came from when it holds none of the dev files."""
    folder = data_folder(given)
    problem = folder_problem(folder, origin(folder, given=bool(given)), [COURSE_FILES[t]["dev"] for t in TASKS])
    if problem:
        p.fail(problem)
    return folder


def load_model(args: argparse.Namespace, source=None):
    """The model named by add_model_source's and add_inference_flags' arguments (training.api.load;
    LoadError when it cannot be read)."""
    from training.api import load

    return load(source or args.source, device=args.device, precision=args.precision, batch_size=args.batch_size,
                eval_tokens=args.eval_tokens, both_orders=args.both_orders, raw_weights=args.raw_weights,
                tokenizer=args.tokenizer)


def existing_path(s: str) -> str:
    """A file or folder that exists, checked as the command line is read: a mistyped RUN is refused before
    the command imports torch."""
    if not os.path.exists(s):
        raise argparse.ArgumentTypeError(f"{s} does not exist")
    return s


def non_negative_int(s: str) -> int:
    value = int(s)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def positive_int(s: str) -> int:
    value = int(s)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


# --------------------------------------------------------------------------- the paths a command writes

def output_folder_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be, or be made, a folder to write in (a file there or above it, not writable); None
    when it can. The trainer's own check of its output folders (dir_problem), for every command's."""
    return dir_problem(Path(path), writable=True)


def output_file_problem(path: str | os.PathLike) -> str | None:
    """Why a file cannot be written at `path`: a directory there, or a folder for it that cannot be (a file
    there or above it, not writable); None when it can."""
    path = Path(path)
    if path.is_dir():
        return "is a directory, not a file"
    problem = dir_problem(path.parent, writable=True)
    if problem is None or not problem.startswith(("is ", "not ")):
        return problem  # None, or a message naming the file above the folder
    return f"{path.parent} {'' if problem.startswith('is ') else 'is '}{problem}"  # its subject: the folder


def check_outputs(p: Parser, files: dict[str, str | os.PathLike | None] | None = None,
                  folders: dict[str, str | os.PathLike | None] | None = None, overwrite: bool = False) -> None:
    """Refuse (p.fail) the first output that cannot be written, before the command's work: found after it, a
    bad path would cost that work, or (a file where a folder goes) its traceback. A file named in `files` that
    exists is replaced only with `overwrite` (the command's --overwrite): it may be what an earlier command
    wrote, or anything else. Keys say where a path came from ("--json"); None values (an output not asked
    for) are skipped."""
    named = [(k, v, lambda f: output_file_problem(f) or existing_file_problem(f, overwrite))
             for k, v in (files or {}).items()]
    named += [(k, v, output_folder_problem) for k, v in (folders or {}).items()]
    for where, path, problem_of in named:
        problem = problem_of(path) if path is not None else None
        if problem:
            p.fail(f"{where} {path}: {problem}")


def existing_file_problem(path: str | os.PathLike, overwrite: bool, name: str = "file") -> str | None:
    """Why `path` may not be written: it exists and `overwrite` (the command's --overwrite) was not given."""
    if os.path.lexists(path) and not overwrite:
        return f"exists; pass --overwrite to replace it, or name another {name}"
    return None


def prediction_out_problem(out: str | os.PathLike, inputs: Iterable[str | os.PathLike],
                           overwrite: bool) -> str | None:
    """output_file_problem, and: OUT is never one of the command's input files (the predictions would be
    written over what they are made from) and, unless `overwrite`, not a file already there."""
    problem = output_file_problem(out)
    if problem:
        return problem
    if any(same_file(out, f) for f in inputs):
        return "is an input of this command too: the predictions would be written over it; name another OUT"
    return existing_file_problem(out, overwrite, "OUT")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """One file under two names: the same path once links and `..` are resolved, or (a hard link) the same
    inode."""
    if Path(a).resolve() == Path(b).resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): not the same file
        return False
