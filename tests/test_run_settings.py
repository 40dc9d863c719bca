"""One flag, one place (training/config/run_settings.py): a run validates its config once, works --freeze-upto
and --peft out once on its model and hands the result on, and the heads are told which parameters LoRA added
rather than guessing them from names. Each part working a flag out again is a place where two could disagree."""
import copy
import sys
from collections import Counter

import pytest
import tiny_runs

import training.config.freeze_spec
import training.config.peft_spec
import training.config.train_config
from heads import MultitaskBert
from minbert import load_bert
from training.common.errors import ConfigError
from training.run.trainer import Run
from training.train import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread")


def count_calls(monkeypatch, *functions) -> Counter:
    """Wrap each function wherever a training module holds it (a `from ... import` binds it in the importer):
    the counter gets (name, first argument: a flag's value, or the type of anything else) for each call."""
    calls = Counter()
    for f in functions:
        def counted(*args, f=f, **kw):
            first = args[0] if args else None
            calls[f.__name__, first if isinstance(first, (str, int, type(None))) else type(first).__name__] += 1
            return f(*args, **kw)
        for module in [m for name, m in sys.modules.items() if name.startswith("training")]:
            if getattr(module, f.__name__, None) is f:
                monkeypatch.setattr(module, f.__name__, counted)
    return calls


def test_a_run_validates_once_and_works_its_flags_out_once(tmp_path, monkeypatch):
    """The command line's run, up to its first step: one validation (the command line's, before any work), one
    --freeze-upto share turned into layers, one --peft parse beside validation's check of the text."""
    cfg = tiny_runs.tiny_config(tmp_path)
    calls = count_calls(monkeypatch, training.config.train_config.validate, training.config.freeze_spec.freeze_depth,
                        training.config.peft_spec.parse_peft)
    seen = {}
    monkeypatch.setattr(Run, "fit", lambda run: seen.setdefault("run", run))  # set-up is what is counted
    monkeypatch.setattr(Run, "finish", lambda run: {})
    rc = cli_main(["--model", cfg.model, "--data-dir", cfg.data_dir, "--freeze-upto", "50%", "--peft", "lora:r=2",
                   "--epochs", "1", "--device", "cpu", "--precision", "fp32", "--out-dir", cfg.out_dir])
    assert rc == 0
    validations = sum(n for (name, _), n in calls.items() if name == "validate")
    assert validations == 1, calls
    assert calls["freeze_depth", "50%"] == 1, calls
    assert calls["parse_peft", "lora:r=2"] == 2, calls  # validation's check, then the run's settings
    run = seen["run"]
    assert run.settings.freeze_depth == 1 and run.settings.peft.r == 2  # 50% of 2 layers
    assert run.model.frozen_upto == 1 and run.schedule.start == 1
    lora = {n for n, p in run.model.encoder.named_parameters() if p.requires_grad and not n.startswith("pooler.")}
    assert lora and all(n.startswith("layers.1.") and ".lora_" in n for n in lora)


def test_a_changed_config_is_validated_again(tmp_path):
    """The mark validation leaves holds the values it checked: a config changed since is checked afresh."""
    from training.config.train_config import validate_once

    cfg = tiny_runs.tiny_config(tmp_path)
    assert validate_once(cfg) == []
    cfg.epochs = 0
    assert "--epochs must be >= 1, not 0" in validate_once(cfg)
    with pytest.raises(ConfigError, match="--epochs must be >= 1"):
        Run(cfg)


def test_the_heads_train_the_factors_they_are_told_of(tmp_path):
    """Under lora the encoder trains the factors apply_peft hands the model (and the pooler): not whatever is
    named like one. A deep copy (SMART's teacher, the weight average) keeps its own."""
    from training.methods.peft import apply_peft

    _, enc = tiny_runs.inputs(tmp_path)
    model = MultitaskBert(load_bert(enc))
    apply_peft(model, "lora:r=2", 0, seed=0)
    factors = [n for n, p in model.encoder.named_parameters() if p.requires_grad and not n.startswith("pooler.")]
    assert factors and len(factors) == len(model.peft_factors)
    model.use_peft("lora", model.peft_factors[:2])  # told of two: those two train, the other factors not
    model.freeze(None)
    trained = {id(p) for p in model.encoder.parameters() if p.requires_grad}
    assert {id(p) for p in model.peft_factors} <= trained
    assert sum(p.requires_grad for n, p in model.encoder.named_parameters() if ".lora_" in n) == 2
    twin = copy.deepcopy(model)
    twin.freeze(None)
    assert [n for n, p in twin.encoder.named_parameters() if p.requires_grad] == \
        [n for n, p in model.encoder.named_parameters() if p.requires_grad]
    with pytest.raises(ValueError):
        model.use_peft("bitfit", model.peft_factors)
