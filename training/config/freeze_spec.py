"""The values of --unfreeze-schedule and --freeze-upto, parsed and checked on their own (no model, no torch),
and --freeze-upto against a model's layer count (depth_error): what the config validates and
methods/freezing.py runs. The schedules themselves: methods/freezing.py."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from fractions import Fraction

FLAG = "--unfreeze-schedule"
KINDS = ("fixed", "lp-ft", "gradual", "adaptive")
KEYS = {"lp-ft": {"warmup", "probe-lr"}, "gradual": {"layers", "floor", "warmup"},
        "adaptive": {"threshold", "percentile", "ceiling"}, "fixed": set()}
_INTERVAL = re.compile(r"^(\d+)\s*(steps?|epochs?)$")


@dataclass(frozen=True)
class ScheduleSpec:
    """A --unfreeze-schedule as written; depths that may be shares (P%) are resolved on a model."""
    kind: str = "fixed"
    every: int = 0  # the interval K ...
    unit: str = "steps"  # ... in steps or epochs
    layers: int = 1  # gradual: layers unfrozen at each interval
    floor: int | str | None = None  # gradual: the last depth (None: nothing frozen)
    warmup: int | None = None  # lp-ft, gradual: warm-up steps of a newly unfrozen layer (None: the run's)
    threshold: float = 0.1  # adaptive: relative change of a layer's gradient norm under which it freezes
    ceiling: int | str | None = None  # adaptive: the deepest depth it may reach (None: all layers)
    probe_lr: float | None = None  # lp-ft: the peak rate of what trains in the first phase (None: --lr)
    percentile: float | None = None  # adaptive: T is this percentile of each test's changes instead


def parse_schedule(text: str) -> ScheduleSpec:
    """The spec of a --unfreeze-schedule value; ValueError with the one line naming the flag."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{FLAG} must be one of {', '.join(KINDS)} (see --help), not {text!r}")
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"{FLAG} {text}: the schedule must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind == "fixed":
        if rest:
            raise ValueError(f"{FLAG} {text}: fixed takes nothing after it (--freeze-upto N says the depth)")
        return ScheduleSpec()
    parts = [p.strip() for p in rest.split(",")] if rest else []
    if not parts or "=" in parts[0]:
        raise ValueError(f"{FLAG} {text}: {kind} needs an interval first, e.g. {kind}:1epoch or {kind}:200steps")
    match = _INTERVAL.match(parts[0])
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"{FLAG} {text}: the interval must be a whole number >= 1 of steps or epochs "
                         f"(e.g. 200steps, 1epoch), not {parts[0]!r}")
    spec = ScheduleSpec(kind, int(match.group(1)), "epochs" if match.group(2).startswith("epoch") else "steps")
    given = set()
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if not eq or key not in KEYS[kind]:
            allowed = ", ".join(sorted(KEYS[kind])) or "nothing"
            raise ValueError(f"{FLAG} {text}: {part!r} is not a setting of {kind} (it takes {allowed})")
        spec = replace(spec, **{key.replace("-", "_"): _setting(text, key, value.strip())})
        given.add(key)
    if {"threshold", "percentile"} <= given:
        raise ValueError(f"{FLAG} {text}: threshold and percentile are two tests: give one")
    return spec


def _setting(text: str, key: str, value: str):
    """One key=value of a schedule, checked on its own."""
    where = f"{FLAG} {text}: {key}"
    if key in ("threshold", "probe-lr", "percentile"):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if key == "percentile" and not 0 < number < 100:
            raise ValueError(f"{where} must be a number between 0 and 100 (50: the median), not {value!r}")
        if not 0 < number < math.inf:
            what = "a relative change, e.g. 0.1" if key == "threshold" else "a learning rate, e.g. 1e-3"
            raise ValueError(f"{where} must be a number > 0 ({what}), not {value!r}")
        return number
    if key in ("floor", "ceiling") and (value == "all" or parse_share(value) is not None):
        return None if value == "all" else value
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{where} must be a whole number{' or P% or all' if key in ('floor', 'ceiling') else ''}, "
                         f"not {value!r}") from None
    if key == "layers" and number < 1:
        raise ValueError(f"{where} must be >= 1 (layers unfrozen at each interval), not {number}")
    if key == "warmup" and number < 0:
        raise ValueError(f"{where} must be >= 0 steps, not {number}")
    if key in ("floor", "ceiling") and number < 0:
        raise ValueError(f"{where} {number} is below the embeddings: 0 freezes the embeddings alone, "
                         f"{'all' if key == 'floor' else '1'} is the least")
    return number


def parse_share(value) -> Fraction | None:
    """"75%" -> Fraction(3, 4); None for anything that is not P% with P a number in [0, 100]."""
    if not isinstance(value, str) or not value.endswith("%"):
        return None
    try:
        share = Fraction(value[:-1].strip()) / 100
    except (ValueError, ZeroDivisionError):
        return None
    return share if 0 <= share <= 1 else None


def freeze_depth(value: int | str | None, num_layers: int) -> int | None:
    """--freeze-upto as a number of frozen layers on a model of num_layers: a share P% is P% of the
    layers rounded to the nearest whole layer, halves down (exact arithmetic: 75% of 6 = 4.5 -> 4)."""
    share = parse_share(value)
    if share is None:
        return value
    return math.ceil(share * num_layers - Fraction(1, 2))


def freeze_error(value, flag: str = "--freeze-upto") -> str | None:
    """Why a --freeze-upto value is neither a depth (an integer >= -1) nor a share P% (0 <= P <= 100)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if value >= -1 else f"{flag} must be >= -1 (-1: embeddings only), not {value}"
    if parse_share(value) is not None:
        return None
    return (f"{flag} must be a number of layers (an integer >= -1) or a share of the layers (P% with "
            f"0 <= P <= 100, e.g. 75%), not {value!r}")


def depth_error(value: int | str | None, num_layers: int, model: str) -> str | None:
    """The one line for a --freeze-upto value past the model's layers, naming what to run instead."""
    return range_error(value, freeze_depth(value, num_layers), num_layers, model)


def range_error(value: int | str | None, depth: int | None, num_layers: int, model: str) -> str | None:
    """depth_error for a value already resolved to `depth` (a run's settings hold it: run_settings.py)."""
    if depth is None or -1 <= depth <= num_layers:
        return None
    line = (f"--freeze-upto {value} is out of range: {model} has {num_layers} layers, so N is between -1 "
            f"(embeddings only) and {num_layers} (only the pooler and heads train)")
    # a 12-layer model that installs offline first (mpnet-base), then the hub's BERTs
    for names, layers in (("mpnet-base (or bert-base-uncased)", 12), ("bert-large-uncased", 24)):
        if depth <= layers:
            pct = Fraction(100 * depth, layers)
            pct_text = f"{float(pct):g}%" if pct.denominator == 1 else f"{float(pct):.1f}%"
            same = freeze_depth(pct_text, num_layers)
            return (f"{line}. {depth} of {layers} layers is a {layers}-layer recipe: run it there with --model "
                    f"{names}, or freeze the same share of this model with --freeze-upto {pct_text} ({same} of "
                    f"{num_layers} layers)")
    return line
