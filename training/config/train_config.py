"""Everything a training run is configured by, as one dataclass: the single source of every option.

Each field carries its metadata (help, group, choices, range, whether a resumed run may change it, the
feature it belongs to). From it come the command line (training/train.py builds the parser), the
sweep's flags, the validation that `train()` itself runs, and the saved `config.json` from which
`--config FILE` reruns a run. Adding an option is adding one field here.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from data.folder import HELP as DATA_HELP
from data.folder import data_folder, folder_error, origin
from data.loaders import COURSE_FILES, SPLITS, TASKS
from training.common.errors import ConfigError
from training.common.places import output_folder
from training.config.freeze_spec import freeze_error, parse_schedule
from training.config.peft_spec import parse_peft

if TYPE_CHECKING:
    from data.batching import EvalBatching

log = logging.getLogger(__name__)

GROUPS = ("model", "data", "schedule", "optimisation", "PCGrad", "SMART (Jiang et al. 2020)", "run")


@dataclass(frozen=True)
class Range:
    """An allowed interval; NaN is never inside, and neither is an infinite bound unless allowed."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""  # said after the interval, e.g. "(0: no clipping)"
    text: str = ""  # the interval in words, where numbers would read badly (2**32)

    def holds(self, v: float) -> bool:
        if isinstance(v, float) and math.isnan(v):
            return False
        above = self.low is None or (v > self.low if self.low_open else v >= self.low)
        below = self.high is None or (v < self.high if self.high_open else v <= self.high)
        return above and below

    def describe(self) -> str:
        if self.text:
            return self.text
        if self.high is None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        return f"{text} {self.note}".rstrip()


def opt(default, help: str, group: str, *, choices: tuple | None = None, range: Range | None = None,
        metavar: str | None = None, resume_may_differ: bool = False, feature: str | None = None,
        onoff: bool = False, default_text: str | None = None, where: str | None = None):
    """A TrainConfig field with what the CLI, the sweep, validation and resume need to know of it.
    default: a value, or a function giving it when a config is made.
    feature: the bool field this option belongs to (refused when given while that one is off).
    onoff: a bool shown on the command line as a {off,on} choice (its default may be either).
    where: "data" (what a run reads) or "output" (where it writes, and how: never what it trains) for the
    options that are locations rather than choices of training; recipes, model cards and comparisons of
    runs leave them out (see locations())."""
    meta = dict(help=help, group=group, choices=choices, range=range, metavar=metavar,
                resume_may_differ=resume_may_differ, feature=feature, onoff=onoff, default_text=default_text,
                where=where)
    if callable(default):  # read when a config is made (the data folder: the environment then)
        return field(default_factory=default, metadata=meta)
    if isinstance(default, (dict, list, tuple)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _at_least(n: float) -> Range:
    return Range(low=n)


UNIT = Range(0, 1, high_open=True)  # [0, 1)


@dataclass
class TrainConfig:
    # Each help is at most two lines of `--help` (tests/test_cli.py), with no measured figures: the docs
    # page it names says more (docs/options.md: every option in full), with the figures' commands and dates.
    # ------------------------------------------------------------------ model
    model: str = opt("minilm-l6", "minilm-l6 (6 layers), mpnet-base (12 layers; docs/mpnet.md), a Hugging Face "
                     "folder or a hub id", "model",
                     metavar="MODEL")
    pair_encoding: str = opt("cross", "cross: both sentences in one sequence; siamese: apart", "model",
                             choices=("cross", "siamese"), metavar="MODE")
    siamese_init: str = opt("random", "random or identity: the siamese head's projections at first", "model",
                            choices=("random", "identity"), metavar="INIT")
    pooling: str = opt("cls", "cls: BERT's pooler on [CLS]; mean: the tokens averaged", "model",
                       choices=("cls", "mean"))
    max_length: int = opt(128, "truncate sequences to N tokens", "model", range=_at_least(1), metavar="N")
    head_dropout: float = opt(0.1, "dropout before the task heads", "model", range=UNIT, metavar="P")
    attn_impl: str = opt("auto", "sdpa, matmul, or auto: sdpa on CUDA, matmul on CPU", "model",
                         choices=("auto", "sdpa", "matmul"), metavar="KERNEL")
    # ------------------------------------------------------------------ data
    data_dir: str = opt(data_folder, DATA_HELP, "data", resume_may_differ=True, where="data", metavar="DIR")
    # "sst_train" -> path: one flag per task and split (--sst-train PATH ...), overriding DATA_DIR's file
    files: dict = opt({}, "override DATA_DIR/{file}", "data", metavar="PATH", resume_may_differ=True, where="data")
    tasks: tuple = opt(TASKS, "some of sst, para, sts", "data", choices=TASKS, metavar="TASK", default_text="all")
    max_train_examples: int | None = opt(None, "at most N training examples per task, a seeded subset", "data",
                                         metavar="N", range=_at_least(1), default_text="all")
    pair_swap: bool = opt(False, "cross encoding: also train on every pair swapped", "data")
    predict_both_orders: bool = opt(False, "cross encoding: predict pairs both ways, averaged", "data")
    strict: bool = opt(False, "a bad data row is an error, not skipped and reported", "data")
    # ------------------------------------------------------------------ schedule
    epochs: int = opt(3, "passes over the training data", "schedule", range=_at_least(1), metavar="N")
    batch_size: int = opt(32, "examples per step: one task's, or a mixed batch (global under torchrun)",
                          "schedule", range=_at_least(1), metavar="N")
    pad_multiple: int = opt(1, "pad batches to a multiple of N tokens (docs/training.md)", "schedule", metavar="N",
                            range=_at_least(1))
    eval_batch_size: int = opt(256, "examples per evaluation batch", "schedule", range=_at_least(1),
                               resume_may_differ=True, metavar="N")
    eval_tokens: int | None = opt(None, "padded tokens per evaluation batch at most; 0: no cap", "schedule",
                                  metavar="N", range=_at_least(0), resume_may_differ=True,
                                  default_text="1024 on CPU, none on CUDA")
    grad_accum_steps: int = opt(1, "batches accumulated per update (steps count updates)", "schedule", metavar="K",
                                range=_at_least(1))
    early_stop_patience: int | None = opt(None, "stop after P evals with no new best", "schedule", metavar="P",
                                          range=_at_least(1), resume_may_differ=True, default_text="off")
    max_eval_examples: int | None = opt(None, "at most N examples per dev set, a seeded subset", "schedule",
                                        metavar="N", range=_at_least(1), resume_may_differ=True, default_text="all")
    test_predictions: bool = opt(True, "write no test-set prediction files", "run", resume_may_differ=True)
    evals_per_epoch: int = opt(1, "evaluations per epoch, evenly spaced", "schedule", metavar="K",
                               range=_at_least(1), resume_may_differ=True)
    # None: mixed with --pcgrad (it needs every task in a step), else mtdnn; resolved in __post_init__
    task_sampling: str | None = opt(None, "mtdnn, proportional, round-robin, annealed or mixed (docs/sampling.md)",
                                    "schedule", default_text="mtdnn; --pcgrad: mixed", metavar="HOW",
                                    choices=("mtdnn", "proportional", "round-robin", "annealed", "mixed"))
    max_batches_per_task: int | None = opt(None, "each task's batches per epoch at most", "schedule", metavar="N",
                                           range=_at_least(1), default_text="all")
    bucket: bool = opt(True, "random batches, not length-bucketed (more padding)", "schedule")
    # ------------------------------------------------------------------ optimisation
    lr: float = opt(1e-4, "peak learning rate of AdamW", "optimisation", range=Range(low=0, low_open=True),
                    metavar="LR")
    scale_lr_with_batch: int | None = opt(None, "--lr is for batch B: scale it by sqrt(batch / B) "
                                          "(docs/training.md)",
                                          "optimisation", metavar="B", range=_at_least(1), default_text="off")
    weight_decay: float = opt(0.01, "AdamW's weight decay (not on biases and LayerNorm)", "optimisation",
                              range=_at_least(0), metavar="W")
    warmup_ratio: float = opt(0.1, "share of steps of linear warm-up, then decay to 0", "optimisation", range=UNIT,
                              metavar="R")
    max_grad_norm: float = opt(1.0, "clip gradient norm to C; 0: off", "optimisation",
                               range=Range(low=0, note="(0: no clipping)"), metavar="C")
    layer_lr_decay: float = opt(1.0, "each layer's rate G times the one above's (docs/training.md)",
                                "optimisation", metavar="G", range=Range(0, 1, low_open=True))
    ema_decay: float | None = opt(None, "evaluate and keep an average of the weights (docs/training.md)",
                                  "optimisation", metavar="D", range=UNIT, default_text="off")
    freeze_upto: int | str | None = opt(None, "freeze embeddings and layers below N, or P%% of them "
                                        "(docs/freezing.md)", "optimisation", metavar="N|P%", default_text="none")
    unfreeze_schedule: str = opt("fixed", "fixed, lp-ft:K, gradual:K or adaptive:K (docs/freezing.md)",
                                 "optimisation", metavar="SCHEDULE")
    peft: str = opt("none", "none, bitfit or lora:r=R[,...] (docs/peft.md)", "optimisation", metavar="METHOD")
    frozen_cache: str = opt("auto", "with --freeze-upto: auto, memory, disk or off (docs/freezing.md)",
                            "optimisation", choices=("auto", "memory", "disk", "off"), metavar="WHERE",
                            resume_may_differ=True)  # but not between off and on: see rundir.find_resume_checkpoint
    frozen_dropout: bool = opt(False, "keep dropout in frozen layers (no frozen cache then)", "optimisation")
    cache_dir: str = opt(".cache/frozen", "frozen cache's folder", "optimisation",
                         resume_may_differ=True, where="output", metavar="DIR")
    # ------------------------------------------------------------------ PCGrad
    pcgrad: bool = opt(False, "gradient surgery between tasks (docs/training.md)", "PCGrad")
    pcgrad_variant: str = opt("pcgrad", "pcgrad (Yu et al. 2020) or dominant (docs/training.md)", "PCGrad",
                              choices=("pcgrad", "dominant"), feature="pcgrad", metavar="NAME")
    # ------------------------------------------------------------------ SMART
    smart: bool = opt(False, "add SMART's smoothness and Bregman terms to the loss (docs/smart.md)",
                      "SMART (Jiang et al. 2020)")
    smart_lambda: float = opt(1.0, "smoothness weight; 0: Bregman alone",
                              "SMART (Jiang et al. 2020)", feature="smart", metavar="X")
    smart_mu: float = opt(1.0, "Bregman weight; 0: no teacher pass", "SMART (Jiang et al. 2020)",
                          feature="smart", metavar="X")
    smart_eps: float = opt(1e-5, "radius of the perturbation ball", "SMART (Jiang et al. 2020)", feature="smart",
                           range=_at_least(0), metavar="X")
    smart_step_size: float = opt(1e-3, "ascent step size eta", "SMART (Jiang et al. 2020)", feature="smart",
                                 range=Range(low=0, low_open=True), metavar="X")
    smart_noise_var: float = opt(1e-5, "initial noise's standard deviation", "SMART (Jiang et al. 2020)",
                                 feature="smart", range=_at_least(0), metavar="X")
    smart_steps: int = opt(1, "ascent steps per update", "SMART (Jiang et al. 2020)", feature="smart",
                           range=_at_least(1), metavar="K")
    smart_norm: str = opt("inf", "inf or l2, of the step and ball", "SMART (Jiang et al. 2020)",
                          choices=("inf", "l2"), feature="smart", metavar="NORM")
    smart_beta: float = opt(0.99, "the teacher's momentum; 0.999 after 10%% of updates", "SMART (Jiang et al. 2020)",
                            feature="smart", range=UNIT, metavar="X")
    smart_adv_dropout: bool = opt(False, "dropout in the adversarial passes", "SMART (Jiang et al. 2020)",
                                  feature="smart", onoff=True)
    smart_perturb_at: str = opt("embeddings", "embeddings or first-trainable", "SMART (Jiang et al. 2020)",
                                choices=("embeddings", "first-trainable"), feature="smart", metavar="WHERE")
    smart_perturbation: str = opt("reference", "reference (MT-DNN's noise) or paper (Algorithm 1); "
                                  "docs/smart.md",
                                  "SMART (Jiang et al. 2020)", choices=("paper", "reference"), feature="smart",
                                  metavar="MODE")
    # ------------------------------------------------------------------ run
    seed: int = opt(11711, "seed of every random draw", "run", metavar="N",
                    range=Range(0, 2**32, high_open=True, text="in [0, 2**32), as numpy's seeds are"))
    device: str = opt("auto", "cpu, cuda, cuda:N or auto", "run", resume_may_differ=True, metavar="DEV")
    precision: str = opt("auto", "auto, fp32 (TF32 matmuls on Ampere+ GPUs), fp32-strict, bf16 or fp16 "
                         "(docs/training.md)", "run", choices=("auto", "fp32", "fp32-strict", "bf16", "fp16"),
                         metavar="P")
    compile: bool = opt(False, "compile each layer, for CUDA (docs/training.md)", "run",
                        resume_may_differ=True)
    compile_mode: str = opt("default", "default or reduce-overhead (docs/training.md)", "run",
                            choices=("default", "reduce-overhead"), feature="compile", resume_may_differ=True,
                            metavar="MODE")
    step_graphs: bool = opt(False, "replay each batch shape's forward and backward as one CUDA graph "
                            "(docs/training.md)", "run", resume_may_differ=True)
    out_dir: str = opt("runs/default", "run directory", "run", resume_may_differ=True, where="output",
                       metavar="DIR")
    predictions_dir: str | None = opt(None, "the course's prediction files", "run", resume_may_differ=True,
                                      default_text="OUT_DIR/predictions", where="output", metavar="DIR")
    export_hf: str | None = opt(None, "also write a Hugging Face encoder to DIR", "run", metavar="DIR",
                                resume_may_differ=True, where="output")
    log_every: int = opt(50, "log running losses every N steps", "run", range=_at_least(1), resume_may_differ=True,
                         metavar="N")
    report_to: str = opt("none", "none, or tensorboard: OUT_DIR/tensorboard too", "run",
                         choices=("none", "tensorboard"), resume_may_differ=True, metavar="WHERE")
    save_every: int = opt(500, "checkpoint every N steps and epoch end; 0: epochs only", "run", metavar="N",
                          range=_at_least(0), resume_may_differ=True)
    keep_last: int = opt(2, "training checkpoints kept", "run", metavar="K", range=_at_least(1),
                         resume_may_differ=True)
    resume: str | None = opt(None, "a checkpoint to go on from, or auto: the newest", "run", metavar="PATH|auto",
                             resume_may_differ=True, default_text="a new run", where="output")
    overwrite: bool = opt(False, "replace an earlier run in --out-dir", "run", resume_may_differ=True,
                          where="output")
    max_bad_steps: int = opt(10, "stop after N non-finite steps in a row", "run", range=_at_least(1),
                             resume_may_differ=True, metavar="N")

    def __post_init__(self) -> None:
        if isinstance(self.tasks, list):  # from JSON; anything else stays for field_errors to name
            self.tasks = tuple(self.tasks)
        if self.task_sampling is None:
            self.task_sampling = "mixed" if self.pcgrad else "mtdnn"

    def peak_lr(self) -> float:
        """The peak learning rate a run trains at: --lr, or with --scale-lr-with-batch B the square-root
        rule's lr * sqrt(examples per update / B) (docs/training.md says why square root for AdamW)."""
        if self.scale_lr_with_batch is None:
            return self.lr
        return self.lr * math.sqrt(self.batch_size * self.grad_accum_steps / self.scale_lr_with_batch)

    def perturbs_embeddings(self) -> bool:
        """SMART's adversarial term perturbs the embedding output: the frozen layers then need a graph
        every step (Bregman-only SMART, --smart-lambda 0, perturbs nothing)."""
        return self.smart and self.smart_lambda > 0 and self.smart_perturb_at == "embeddings"

    def eval_batching(self) -> EvalBatching:
        """How evaluation and prediction cut their batches: --eval-batch-size, --eval-tokens ("auto": the device's
        measured budget; 0: none) and the training batches' padding (--pad-multiple, --max-length)."""
        from data.batching import EvalBatching  # here: it imports torch, which --help must not wait for

        budget = "auto" if self.eval_tokens is None else (self.eval_tokens or None)
        return EvalBatching(self.eval_batch_size, budget, self.pad_multiple, self.max_length)

    def predictions_folder(self) -> str:
        return str(output_folder(self.predictions_dir, self.out_dir, "predictions"))

    @property
    def cross_pairs(self) -> bool:
        """Whether a pair task trains with both sentences in one sequence (the length rules depend on it)."""
        return self.pair_encoding == "cross" and any(t in self.tasks for t in ("para", "sts"))

    def file(self, task: str, split: str) -> str:
        """Path of a task's split: the per-file override, else data_dir/<course file name>."""
        return self.files.get(f"{task}_{split}") or os.path.join(self.data_dir, COURSE_FILES[task][split])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tasks"] = list(self.tasks)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def options() -> list:
    """TrainConfig's fields, in order, each with its metadata (`f.metadata`)."""
    return list(fields(TrainConfig))


def locations(*kinds: str) -> tuple[str, ...]:
    """The options that say where a run reads ("data") or writes ("output"), not how it trains."""
    kinds = kinds or ("data", "output")
    return tuple(f.name for f in options() if f.metadata["where"] in kinds)


def default_of(f):
    return f.default_factory() if f.default is MISSING else f.default


def flag_of(name: str) -> str:
    """A field's flag, as errors name it; `files` is the --sst-train ... flags' dict, named as in config.json."""
    return "files" if name == "files" else "--" + name.replace("_", "-")


def resume_may_differ() -> set[str]:
    """Fields a resumed run may change; any other difference would change the trajectory."""
    return {f.name for f in options() if f.metadata["resume_may_differ"]}


def read_json_object(path: Path, label: str, missing: str = "no such file") -> dict:
    """A JSON file holding one object; anything else is a ConfigError, '<label>: why'."""
    try:
        values = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{label}: {missing}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{label}: not a readable JSON file ({e})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{label}: expected a JSON object, got {type(values).__name__}")
    return values


def options_problem(options: dict, reserved=(), why: str = "") -> str | None:
    """The first problem of a set of training options given by name (a recipe's, a search space's):
    unknown names, names in `reserved` (which its caller sets itself: `why` says so), bad values."""
    if not isinstance(options, dict):
        return "expected an object of training options"
    unknown = sorted(k for k in options if k not in TrainConfig.__dataclass_fields__)
    if unknown:
        return f"unknown training option(s) {', '.join(unknown)}"
    taken = sorted(k for k in options if k in reserved)
    if taken:
        return f"{', '.join(taken)}: {why}"
    try:
        errors = field_errors(TrainConfig(**options), given=options)
    except TypeError as e:
        return str(e)
    return errors[0] if errors else None


def read_config_file(path: str | os.PathLike) -> dict:
    """A saved run's config.json (or a recipe file of some of its fields) -> its fields, checked by name."""
    path = Path(path)
    values = read_json_object(path, f"--config {path}")
    unknown = sorted(set(values) - set(TrainConfig.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"--config {path}: unknown option(s) {', '.join(unknown)}")
    if values.get("smart") and "smart_perturbation" not in values and "smart_perturb_at" in values:
        # a run's config.json from before the option (its SMART ran paper mode): not silently another recipe
        log.warning("--config %s: a SMART run's config from before --smart-perturbation, whose default is now "
                    "'reference'; that run used 'paper' (add --smart-perturbation paper to repeat it)", path)
    return values


# --------------------------------------------------------------------------- validation

def validate(cfg: TrainConfig, data_dir_from: str | None = None) -> list[str]:
    """Problems found without loading anything heavy; each is one line for the user. data_dir_from: where
    --data-dir's value came from, for the line of a missing folder (default: data.folder.origin's guess)."""
    errors = field_errors(cfg)
    if not errors:  # the rules between fields assume each field is of its type and in range
        errors += (_feature_errors(cfg) + _combination_errors(cfg) + _device_errors(cfg.device)
                   + _missing_packages(cfg))
    if all(_type_error(TrainConfig.__dataclass_fields__[n], getattr(cfg, n)) is None
           for n in ("tasks", "files", "data_dir")):
        errors += _missing_files(cfg, data_dir_from or origin(cfg.data_dir))
    return errors + path_errors(cfg)


def validate_once(cfg: TrainConfig, data_dir_from: str | None = None) -> list[str]:
    """validate(cfg), run once per run: a config found valid keeps the values it was found valid with, and
    the later steps of the run (train(), Run(), after the command line's validation) read that mark instead
    of validating again. A config changed since it was marked is validated afresh."""
    values = asdict(cfg)
    if cfg.__dict__.get(_VALID_AS) == values:
        return []
    errors = validate(cfg, data_dir_from)
    if not errors:
        cfg.__dict__[_VALID_AS] = values  # not a field: equality, asdict and config.json never see it
    return errors


_VALID_AS = "_valid_as"  # where validate_once leaves its mark on a config


def seed_error(seed, flag: str) -> str | None:
    """The message for a seed numpy cannot take (the sweep's --seeds too), else None."""
    seeds = TrainConfig.__dataclass_fields__["seed"].metadata["range"]
    if isinstance(seed, int) and not isinstance(seed, bool) and seeds.holds(seed):
        return None
    return f"{flag} must be {seeds.describe()}, not {seed}"


def _type_error(f, value) -> str | None:
    """A value of the wrong type (from a --config file or a Python caller; the CLI parses its flags)."""
    kind = str(f.type).split(" | ")[0]
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "bool": isinstance(value, bool), "str": isinstance(value, str),
          "dict": isinstance(value, dict), "tuple": isinstance(value, (tuple, list))}.get(kind, True)
    return None if ok else f"{_named(f)} must be {_kind(kind)}, not {value!r}"


def _named(f) -> str:
    """A field as a refusal of its value names it: its flag, or, for an option on by default (whose flag is
    the off-switch --no-X), its name with that switch."""
    if str(f.type) == "bool" and default_of(f) is True:
        return f"{f.name} (--no-{flag_of(f.name)[2:]})"
    return flag_of(f.name)


def _kind(type_name: str) -> str:
    """A field's type as a --config file's author reads it: an int, a float | None, a list (of tasks)."""
    shown = "list" if type_name == "tuple" else type_name
    return f"{'an' if shown == 'int' else 'a'} {shown}"


def field_errors(cfg: TrainConfig, given=()) -> list[str]:
    """Each field's own type, choices and range: a feature's options while the feature is on, and those
    named in `given` (a --config file's, a recipe's: a flag may turn the feature on later)."""
    errors = []
    for f in options():
        value, meta = getattr(cfg, f.name), f.metadata
        if meta["feature"] and not getattr(cfg, meta["feature"]) and f.name not in given:
            continue
        if value is None:  # "none" where the option has one; a --config file's null elsewhere
            if "None" not in str(f.type).split(" | "):
                errors.append(f"{_named(f)} must be {_kind(str(f.type))}, not None")
            continue
        if f.name == "freeze_upto":
            errors += [e for e in (freeze_error(value),) if e]
        elif f.name == "files" and isinstance(value, dict):
            errors += _files_errors(value)
        elif _type_error(f, value):
            errors.append(_type_error(f, value))
        elif meta["choices"] and f.name != "tasks" and value not in meta["choices"]:
            errors.append(f"{flag_of(f.name)} must be one of {', '.join(meta['choices'])}, not {value!r}")
        elif f.name == "tasks" and (not value or any(t not in TASKS for t in value)):
            errors.append(f"--tasks must be some of {', '.join(TASKS)}, not {' '.join(map(str, value)) or 'none'}")
        elif f.name == "tasks" and len(set(value)) < len(value):
            errors.append(f"--tasks names a task more than once: {' '.join(value)}")
        elif meta["range"] is not None and not meta["range"].holds(value):
            errors.append(f"{flag_of(f.name)} must be {meta['range'].describe()}, not {value}")
        elif isinstance(value, float) and not math.isfinite(value):  # ranged or not (--smart-lambda)
            errors.append(f"{flag_of(f.name)} must be finite, not {value}")
    return errors


def _files_errors(files: dict) -> list[str]:
    """`files`, from a --config file or a caller: keys of the --sst-train ... flags, each a path (a key
    mistyped would leave the course's file in its place without a word)."""
    known = [f"{task}_{split}" for task in TASKS for split in SPLITS]
    unknown = sorted(set(files) - set(known))
    if unknown:
        return [f"files: unknown key(s) {', '.join(unknown)} (the keys: {', '.join(known)})"]
    return [f"files: {key} must be a path, not {path!r}" for key, path in files.items()
            if path is not None and not isinstance(path, str)]


def _feature_errors(cfg: TrainConfig) -> list[str]:
    """A feature's options while the feature is off would be ignored without a word."""
    errors = []
    for feature in dict.fromkeys(f.metadata["feature"] for f in options() if f.metadata["feature"]):
        given = [flag_of(f.name) for f in options() if f.metadata["feature"] == feature
                 and getattr(cfg, f.name) != default_of(f)]
        if given and not getattr(cfg, feature):
            errors.append(f"{', '.join(given)}: {'is' if len(given) == 1 else 'are'} for {flag_of(feature)}, "
                          f"which is off")
    return errors


def _combination_errors(cfg: TrainConfig) -> list[str]:
    """Rules between fields."""
    errors = []
    if 1 <= cfg.max_length < (5 if cfg.cross_pairs else 3):
        errors.append("--max-length must leave room for [CLS] and [SEP] around a token of text: at least 3, "
                      "and 5 for cross-encoded pairs ([CLS] a [SEP] b [SEP])")
    if cfg.siamese_init != "random" and cfg.pair_encoding != "siamese":
        errors.append("--siamese-init is for --pair-encoding siamese")
    if cfg.pair_swap and cfg.pair_encoding != "cross":
        errors.append("--pair-swap is for --pair-encoding cross")
    if cfg.predict_both_orders and cfg.pair_encoding != "cross":
        errors.append("--predict-both-orders is for --pair-encoding cross")
    if cfg.task_sampling == "mixed" and cfg.max_batches_per_task is not None:
        errors.append("--max-batches-per-task applies to the per-task samplers, not --task-sampling mixed")
    if cfg.pcgrad and cfg.task_sampling != "mixed":
        errors.append("--pcgrad needs batches holding several tasks: use --task-sampling mixed (its default)")
    if cfg.pcgrad and cfg.grad_accum_steps > 1:
        errors.append("--grad-accum-steps is not supported with --pcgrad (its surgery needs each task's whole "
                      "gradient of a step at once): raise --batch-size instead")
    if cfg.pcgrad and len(cfg.tasks) < 2:
        errors.append("--pcgrad needs at least two --tasks")
    if cfg.step_graphs and cfg.compile and cfg.compile_mode == "reduce-overhead":
        errors.append("--step-graphs records the whole step as a CUDA graph, --compile-mode reduce-overhead each "
                      "layer: use one of them")
    errors += _schedule_errors(cfg) + _peft_errors(cfg)
    if cfg.frozen_dropout and cfg.frozen_cache in ("memory", "disk"):
        errors.append(f"--frozen-dropout cannot use --frozen-cache {cfg.frozen_cache}: with dropout the frozen layers' "
                      f"output changes every step, so there is nothing to cache (use auto or off)")
    if cfg.smart:
        if cfg.smart_lambda < 0 or cfg.smart_mu < 0 or math.isnan(cfg.smart_lambda) or math.isnan(cfg.smart_mu):
            errors.append(f"--smart-lambda and --smart-mu must be >= 0, not {cfg.smart_lambda} and {cfg.smart_mu}")
        elif cfg.smart_lambda == 0 and cfg.smart_mu == 0:
            errors.append("--smart-lambda 0 and --smart-mu 0 leave nothing of SMART: drop --smart")
    return errors


def _schedule_errors(cfg: TrainConfig) -> list[str]:
    """--unfreeze-schedule on its own and beside the options it cannot work with (its depths against the
    model's layers are checked with the model: training.run.preflight)."""
    try:
        spec = parse_schedule(cfg.unfreeze_schedule)
    except ValueError as e:
        return [str(e)]
    kind = spec.kind
    if kind != "fixed" and spec.unit == "epochs" and spec.every >= cfg.epochs:
        return [f"--unfreeze-schedule {cfg.unfreeze_schedule}: its first "
                f"{'test' if kind == 'adaptive' else 'unfreezing'} would come after epoch {spec.every}, and the "
                f"run has {cfg.epochs} (--epochs): shorten the interval or train longer"]
    if kind == "adaptive" and cfg.ema_decay is not None:
        return ["--unfreeze-schedule adaptive cannot be used with --ema-decay: the weight average of a layer "
                "frozen mid-run is not the frozen weights the layers above it train on (and the cache serves)"]
    return []


def _peft_errors(cfg: TrainConfig) -> list[str]:
    """--peft on its own, and beside a freezing schedule: a schedule moves the frozen depth mid-run, and
    the LoRA factors or biases above it (made for one depth at the start) would then not be the ones a
    cached prefix or a newly unfrozen layer needs."""
    try:
        spec = parse_peft(cfg.peft)
    except ValueError as e:
        return [str(e)]
    if spec.kind != "none" and cfg.unfreeze_schedule.partition(":")[0].strip() != "fixed":
        return [f"--peft {cfg.peft} cannot be used with --unfreeze-schedule {cfg.unfreeze_schedule}: LoRA and BitFit "
                f"train a fixed part of the layers above --freeze-upto N (use --unfreeze-schedule fixed)"]
    return []


def _missing_packages(cfg: TrainConfig) -> list[str]:
    """Optional extras a flag needs, looked up without importing them."""
    import importlib.util
    if cfg.report_to == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        return ["--report-to tensorboard needs the tensorboard package: pip install -e '.[tensorboard]' "
                "(or pip install tensorboard)"]
    return []


def _device_errors(name: str) -> list[str]:
    if name == "auto":
        return []
    import torch  # only for a named device: --help and most checks stay torch-free

    try:
        device = torch.device(name)
    except RuntimeError as e:
        return [f"--device {name}: {e}"]
    if device.type == "cuda" and not torch.cuda.is_available():
        return [f"--device {name}: CUDA is not available on this machine (use --device cpu)"]
    if device.type not in ("cpu", "cuda"):
        return [f"--device {name}: only cpu and cuda are supported"]
    return []


def _missing_files(cfg: TrainConfig, data_dir_from: str) -> list[str]:
    """The training and dev files the run reads. A data folder that is missing, or holds none of them,
    is one line naming the folder and where its path came from (not one line per file)."""
    needed = [(t, s) for t in cfg.tasks if t in TASKS for s in ("train", "dev")]
    missing = [(t, s) for t, s in needed if not os.path.isfile(cfg.file(t, s))]
    in_folder = [(t, s) for t, s in needed if not cfg.files.get(f"{t}_{s}")]
    errors = []
    if in_folder and all(x in missing for x in in_folder):
        errors.append(folder_error(cfg.data_dir, data_dir_from, [COURSE_FILES[t][s] for t, s in in_folder]))
        missing = [x for x in missing if x not in in_folder]
    for task, split in missing:
        errors.append(f"{cfg.file(task, split)}: no such file ({task} {split}); run `python -m data.download` "
                      f"or pass --data-dir / --{task}-{split}")
    return errors


# --------------------------------------------------------------------------- output paths

# What a run writes in OUT_DIR, by kind: a file or directory already there of the other kind would
# stop the run at its first step, checkpoint or evaluation.
OUT_DIR_FILES = ("train.log", "metrics.jsonl", "config.json", "best.pt")
OUT_DIR_DIRS = ("checkpoints", "tokenizer")


def path_errors(cfg: TrainConfig) -> list[str]:
    """The output directories, each one that exists (or the nearest folder above it that does) of the
    right kind and writable. Nothing is created: a bad path is refused before anything is written."""
    writable = {"out_dir": True, "predictions_dir": True, "export_hf": True,
                "cache_dir": cfg.frozen_cache == "disk"}  # else the cache may never touch the disk
    errors = []
    for name, must_write in writable.items():
        value = getattr(cfg, name)
        if not isinstance(value, str) or not value:
            continue  # None (no export), or a type error field_errors reports
        problem = dir_problem(Path(value), must_write)
        if problem:
            errors.append(f"{flag_of(name)} {value}: {problem}")
    if isinstance(cfg.out_dir, str) and Path(cfg.out_dir).is_dir():
        out = Path(cfg.out_dir)
        errors += [f"--out-dir {out}: {out / n} is a directory, where the run writes a file" for n in OUT_DIR_FILES
                   if (out / n).is_dir()]
        appended = ("train.log", "metrics.jsonl", "config.json") + OUT_DIR_DIRS  # best.pt is renamed over
        errors += [f"--out-dir {out}: {out / n} is not writable" for n in appended
                   if (out / n).exists() and not os.access(out / n, os.W_OK)]
        errors += [f"--out-dir {out}: {out / n} is a file, where the run keeps a directory" for n in OUT_DIR_DIRS
                   if (out / n).exists() and not (out / n).is_dir()]
    return errors


def dir_problem(path: Path, writable: bool) -> str | None:
    """Why `path` cannot be, or be made, a directory to write in; None when it can."""
    if path.is_symlink() and not path.exists():
        return "is a dangling symbolic link"
    if path.exists() and not path.is_dir():
        return "is a file, not a directory"
    existing = path
    while not existing.exists():  # the part of the path already there (Path('.') and '/' always are)
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    # os.access also says no for root on a read-only mount or an immutable directory
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f" ({existing}, where it would be created)"
        return f"not writable{where}"
    return None
