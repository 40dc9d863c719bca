"""Everything a training run is configured by, as one plain dataclass.

The CLI (training/cli.py) fills it from flags; tests build it directly. It is saved in every
checkpoint and run directory, so a run can always be told apart from another.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from data.loaders import COURSE_FILES, TASKS


# The values of the fields that take one of a few, for every command line that sets them.
CHOICES = {
    "pair_encoding": ("cross", "siamese"),
    "pooling": ("cls", "mean"),
    "siamese_init": ("random", "identity"),
    "task_sampling": ("mtdnn", "proportional", "round-robin", "annealed", "mixed"),
    "frozen_cache": ("auto", "memory", "disk", "off"),
    "precision": ("auto", "fp32", "bf16"),  # auto: bf16 where the hardware computes it natively
}


@dataclass
class TrainConfig:
    # model
    model: str = "minilm-l6"             # local dir, alias, or hub id
    pair_encoding: str = "cross"         # cross | siamese
    siamese_init: str = "random"         # random | identity: the siamese similarity head's W_i
    pooling: str = "cls"                 # cls (BERT's pooler) | mean (over the real tokens)
    max_length: int = 128
    head_dropout: float = 0.1
    attn_impl: str = "auto"              # auto | sdpa | matmul
    # data
    data_dir: str = "data"
    files: dict[str, str] = field(default_factory=dict)  # "sst_train" -> path, overrides data_dir
    tasks: tuple[str, ...] = TASKS
    max_train_examples: int | None = None  # per task: first N of a seeded shuffle (quick runs)
    pair_swap: bool = False              # cross: also train on every para/sts pair in the other order
    predict_both_orders: bool = False    # cross: dev/test pairs predicted as (a, b) and (b, a), averaged
    strict: bool = False
    # schedule
    epochs: int = 3
    batch_size: int = 32
    eval_batch_size: int = 256
    evals_per_epoch: int = 1             # dev evaluations per epoch, evenly spaced, the last at its end
    task_sampling: str = "mtdnn"         # mtdnn | proportional | round-robin | annealed | mixed
    max_batches_per_task: int | None = None
    bucket: bool = True                  # length-aware batching
    # optimisation
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    layer_lr_decay: float = 1.0          # lr * g^(depth from the top) per layer (1: one rate)
    ema_decay: float | None = None       # evaluate/keep an EMA of the weights (None: the raw weights)
    freeze_upto: int | None = None
    frozen_cache: str = "auto"           # auto | memory | disk | off
    cache_dir: str = ".cache/frozen"
    # multi-task tricks
    pcgrad: bool = False
    pcgrad_variant: str = "pcgrad"       # pcgrad | dominant
    smart: bool = False
    smart_lambda: float = 1.0
    smart_mu: float = 1.0
    smart_eps: float = 1e-5
    smart_step_size: float = 1e-3
    smart_noise_var: float = 1e-5
    smart_steps: int = 1
    smart_norm: str = "inf"
    smart_beta: float = 0.99
    smart_adv_dropout: bool = False
    smart_perturb_at: str = "embeddings"  # embeddings | first-trainable
    # machinery
    seed: int = 11711
    device: str = "auto"                 # auto | cpu | cuda | cuda:N
    precision: str = "auto"              # auto (bf16 where native: CUDA, AMX CPUs) | fp32 | bf16
    compile: bool = False                # torch.compile each encoder layer (eager fallback)
    out_dir: str = "runs/default"
    predictions_dir: str = "predictions"
    export_hf: str | None = None
    log_every: int = 50
    save_every: int = 500                # steps between training checkpoints (0: epoch ends only)
    keep_last: int = 2                   # training checkpoints kept in OUT_DIR/checkpoints
    resume: str | None = None            # auto | PATH
    overwrite: bool = False              # a new run may replace an earlier run's files in out_dir
    max_bad_steps: int = 10

    def file(self, task: str, split: str) -> str:
        """Path of a task's split: the per-file override, else data_dir/<course file name>."""
        import os

        return self.files.get(f"{task}_{split}") or os.path.join(self.data_dir, COURSE_FILES[task][split])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tasks"] = list(self.tasks)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "tasks" in known:
            known["tasks"] = tuple(known["tasks"])
        return cls(**known)
