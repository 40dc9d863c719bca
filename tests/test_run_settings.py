"""One flag, one place: the heads are told which parameters LoRA added rather than guessing them from names."""
import copy

import pytest
import tiny_runs

from heads import MultitaskBert
from minbert import load_bert

pytestmark = pytest.mark.usefixtures("one_thread")


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
