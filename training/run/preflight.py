"""What a run will need against what the machine has, checked before anything is allocated, deleted or
trained: the model folder (every config.json value, the vocabulary), the memory of training that model,
and the disk space of its checkpoints. Each refusal is one line naming the file, key or flag.

The sizes are estimates from the parameter count alone (fp32 weights, gradients, AdamW's two moments and
the optional copies of the trainable ones: the weight EMA, SMART's teacher, which holds the frozen weights
themselves); activations come on top, so a run refused here could never have fitted, and one let through
may still run out of memory on long batches.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from minbert import BertConfig, Tokenizer, resolve_checkpoint
from minbert.checkpoint import human_bytes, machine_ram, read_bert_config, refuse_if_too_big
from training.common.errors import ConfigError
from training.config.freeze_spec import range_error
from training.config.run_settings import RunSettings, resolve_settings
from training.config.train_config import TrainConfig
from training.methods.freezing import optimised_depth, schedule_error

log = logging.getLogger(__name__)

FP32 = 4  # bytes per parameter in every copy below


@dataclass(frozen=True)
class Footprint:
    """Bytes of one run's model state, from the parameter counts."""
    params: int
    trainable: int
    ema: bool
    teacher: bool

    @property
    def training_memory(self) -> int:
        """Weights, gradients and AdamW's two moments of the trainable ones, and the optional copies of
        them (the weight EMA, SMART's teacher, which holds the frozen weights themselves)."""
        return FP32 * (self.params + (3 + self.ema + self.teacher) * self.trainable)

    @property
    def checkpoint(self) -> int:
        """A training checkpoint: the weights, the moments, the optional copies (no gradients)."""
        return self.training_memory - FP32 * self.trainable

    @property
    def best(self) -> int:
        """best.pt: the weights alone."""
        return FP32 * self.params

    def parts(self) -> str:
        extra = [name for name, on in (("the weight EMA", self.ema), ("SMART's teacher", self.teacher)) if on]
        return "weights, gradients, AdamW's two moments" + "".join(f", {e}" for e in extra)


def footprint(bert: BertConfig, cfg: TrainConfig, settings: RunSettings | None = None) -> Footprint:
    """settings: the run's (settle()); worked out here for a caller without them."""
    params = bert.num_parameters()
    H, L = bert.hidden_size, bert.num_hidden_layers
    settings = settings or resolve_settings(cfg, L)
    embeddings = (bert.vocab_size + bert.max_position_embeddings + bert.type_vocab_size) * H + 2 * H
    per_layer = (params - embeddings - H * H - H) // L
    depth = optimised_depth(settings.schedule, settings.freeze_depth, L)
    frozen = 0 if depth is None else embeddings + max(0, min(depth, L)) * per_layer
    spec = settings.peft
    if spec.kind == "none":
        return Footprint(params, params - frozen, cfg.ema_decay is not None, cfg.smart)
    # --peft: the pooler, and in each layer above the prefix LoRA's factors r x (in + out) per target (added
    # to the weights too) or BitFit's biases (qkv, attn_out, ffn_in, ffn_out, two LayerNorms' beta)
    I, above = bert.intermediate_size, L - max(0, min(depth or 0, L))
    sizes = {"q": 2 * H, "k": 2 * H, "v": 2 * H, "attn_out": 2 * H, "ffn_in": H + I, "ffn_out": I + H}
    lora = above * spec.r * sum(sizes[t] for t in spec.targets) if spec.kind == "lora" else 0
    biases = 0 if spec.kind == "lora" else above * (7 * H + I) + (H if depth is None else 0)
    return Footprint(params + lora, H * H + H + lora + biases, cfg.ema_decay is not None, cfg.smart)


def settle(cfg: TrainConfig) -> RunSettings:
    """The run's settings (--freeze-upto in layers, --peft and --unfreeze-schedule parsed) on the layer count
    of its model's config.json, read without building the model, and checked against it: the one place a
    run works these flags out (ConfigError / CheckpointError naming the culprit). cfg: validated."""
    L = read_bert_config(resolve_checkpoint(cfg.model)).num_hidden_layers
    settings = resolve_settings(cfg, L)
    problem = (range_error(cfg.freeze_upto, settings.freeze_depth, L, cfg.model)
               or schedule_error(cfg.unfreeze_schedule, settings.freeze_depth, L))
    if problem:
        raise ConfigError(problem)
    return settings


def check_model(cfg: TrainConfig, device: torch.device, settings: RunSettings | None = None) -> Footprint:
    """The model folder read and checked without building the model, and its training memory against
    the machine's (RAM; on CUDA the GPU's too). ConfigError / CheckpointError naming the culprit.
    settings: the run's (settle()); settled here for a caller without them."""
    settings = settings or settle(cfg)
    path = resolve_checkpoint(cfg.model)
    bert = read_bert_config(path)
    try:
        Tokenizer.from_checkpoint(path)  # the vocabulary: UTF-8, BERT's special tokens
    except ValueError as e:
        raise ConfigError(str(e)) from None
    need = footprint(bert, cfg, settings)
    config_file = path / "config.json"
    what = f"training it ({need.parts()})"
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        refuse_if_too_big(bert, config_file, need.training_memory, what, total, f"the GPU's memory on {device}")
        refuse_if_too_big(bert, config_file, 2 * need.best, "loading it", machine_ram(), "this machine's memory")
    else:
        refuse_if_too_big(bert, config_file, max(need.training_memory, 2 * need.best), what, machine_ram(),
                          "this machine's memory")
    return need


def check_disk(out_dir: Path, need: Footprint, keep_last: int, reclaimable: int = 0) -> None:
    """Room on OUT_DIR's disk for a training checkpoint and best.pt (with the replacement of each being
    written beside it): refused below that, a warning below the rolling window of `keep_last`.
    reclaimable: bytes the run frees before its first checkpoint (the earlier run --overwrite replaces)."""
    existing = Path(out_dir)
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free + reclaimable
    least = need.checkpoint + 2 * need.best
    counted = " (counting the earlier run's files it replaces)" if reclaimable else ""
    if free < least:
        raise ConfigError(f"--out-dir {out_dir}: {human_bytes(free)} free on its disk{counted}, but a training "
                          f"checkpoint of this model takes about {human_bytes(need.checkpoint)} ({need.parts()} "
                          f"but the gradients) and best.pt {human_bytes(need.best)}: free some space or choose "
                          f"another --out-dir")
    window = (keep_last + 1) * need.checkpoint + 2 * need.best
    if free < window:
        log.warning("--out-dir %s: %s free on its disk%s; the %d checkpoints kept (--keep-last) and the one being "
                    "written take about %s: the run may stop with a full disk", out_dir, human_bytes(free), counted,
                    keep_last, human_bytes(window))
