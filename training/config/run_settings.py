"""A run's flags worked out once on its model: --freeze-upto as a number of layers (a share P% rounded on the
model's layer count), --peft and --unfreeze-schedule parsed. Set-up builds one RunSettings from the validated
config (training.run.preflight.settle) and hands it to each component that needs it, so that no two parts of a
run can work a flag out differently. No model, no torch: the layer count comes from the caller."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from training.config.freeze_spec import ScheduleSpec, freeze_depth, parse_schedule
from training.config.peft_spec import PeftSpec, parse_peft

if TYPE_CHECKING:
    from training.config.train_config import TrainConfig


@dataclass(frozen=True)
class RunSettings:
    num_layers: int  # the encoder's layers, which a share P% is taken of
    freeze_depth: int | None  # --freeze-upto in layers: None nothing frozen, -1 / 0 the embeddings alone
    peft: PeftSpec
    schedule: ScheduleSpec

    @property
    def first_trainable_layer(self) -> int:
        """The first layer above the frozen prefix: where LoRA's factors and trained biases begin."""
        return max(self.freeze_depth or 0, 0)


def resolve_settings(cfg: TrainConfig, num_layers: int) -> RunSettings:
    """cfg's settings on a model of num_layers. cfg must be valid (validate()): a bad flag raises ValueError."""
    return RunSettings(num_layers, freeze_depth(cfg.freeze_upto, num_layers), parse_peft(cfg.peft),
                       parse_schedule(cfg.unfreeze_schedule))
