"""Use a trained model from Python.

    from training.api import load

    model = load("runs/default")                   # a run directory, a best.pt, a checkpoints/step-N.pt,
                                                    # or a folder written by python -m training.export
    model.sentiment(["a great film", "dull"]).labels           # e.g. array([4, 1]): 0 negative .. 4 positive
    model.sentiment(["a great film"]).probabilities            # (1, 5), rows sum to 1
    model.paraphrase([("How old are you?", "What is your age?")]).probabilities   # P(paraphrase), (1,)
    model.similarity([("A man is cooking.", "A man cooks.")]).scores             # in [0, 5], (1,)

Inputs go through the model in batches of `batch_size`, sorted by length (as in training.evaluate, whose
predictions these are). Pairs are predicted in both orders and averaged where the run did so
(--predict-both-orders); `load(..., both_orders=True/False)` overrides it. The precision is the run's
(--precision; auto: bf16 where the device computes it natively, fp16 on a GPU without) unless `precision=`
says otherwise.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from data.batching import EvalBatching, encode_task
from data.loaders import SENTIMENTS, TASKS, Example
from heads import MultitaskBert, predict, probabilities
from training.common import device as _device
from training.common.errors import LoadError
from training.config.train_config import TrainConfig
from training.run.metrics_file import read_metrics

log = logging.getLogger(__name__)

HEADS_FILE, HEADS_WEIGHTS = "heads.json", "heads.safetensors"  # what training.export writes beside the encoder


# --------------------------------------------------------------------------- results

@dataclass(frozen=True)
class SentimentPredictions:
    labels: np.ndarray  # (N,) int64, 0 (negative) .. 4 (positive)
    probabilities: np.ndarray  # (N, 5) float64: softmax of the logits; labels is its argmax

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def names(self) -> list[str]:
        """The labels in words (SENTIMENTS)."""
        return [SENTIMENTS[i] for i in self.labels]


@dataclass(frozen=True)
class ParaphrasePredictions:
    labels: np.ndarray  # (N,) int64, 1 = paraphrase
    probabilities: np.ndarray  # (N,) float64, P(paraphrase); labels is (probabilities > 0.5)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class SimilarityPredictions:
    scores: np.ndarray  # (N,) float64 in [0, 5]

    def __len__(self) -> int:
        return len(self.scores)


# --------------------------------------------------------------------------- the model

class Model:
    """A trained multi-task model with its tokenizer, on one device. Made by `load`."""

    def __init__(self, network: MultitaskBert, tokenizer, config: TrainConfig, device: torch.device,
                 dtype: torch.dtype | None, *, source: Path, tokenizer_dir: Path | None = None,
                 metrics: dict | None = None, step: int | None = None, epoch: int | None = None,
                 both_orders: bool = False, batch_size: int = 64, eval_tokens: int | None = None):
        self.network, self.tokenizer, self.config = network.to(device).eval(), tokenizer, config
        self.device, self.dtype, self.source = device, dtype, Path(source)
        self.metrics = dict(metrics or {})  # dev metrics recorded with the checkpoint ({} where none were)
        self.step, self.epoch = step, epoch  # where in training the weights are from, where known
        self.tokenizer_dir = tokenizer_dir  # the folder the tokenizer was read from (an export copies its files)
        self.both_orders, self.batch_size = both_orders, batch_size
        self.max_tokens = "auto" if eval_tokens is None else (eval_tokens or None)  # see inference.raw_outputs

    @property
    def tasks(self) -> tuple[str, ...]:
        """The tasks the run trained (the others' heads are untrained and refused)."""
        return tuple(self.config.tasks)

    def __repr__(self) -> str:
        names = {dtype: name for name, dtype in _device.DTYPES.items()}
        precision = f"{names[self.dtype]} autocast" if self.dtype else "fp32"
        return (f"Model({self.source}: tasks {', '.join(self.tasks)}; {self.config.pair_encoding} pairs, "
                f"{self.config.pooling} pooling; {self.device}, {precision})")

    def autocast(self):
        return _device.autocast(self.device, self.dtype)

    def sentiment(self, sentences: Sequence[str], batch_size: int | None = None) -> SentimentPredictions:
        out = self.outputs("sst", _examples("sst", sentences), batch_size)
        return SentimentPredictions(predict("sst", out).numpy(), probabilities("sst", out).double().numpy())

    def paraphrase(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> ParaphrasePredictions:
        out = self.outputs("para", _examples("para", pairs), batch_size)
        return ParaphrasePredictions(predict("para", out).numpy(), probabilities("para", out).double().numpy())

    def similarity(self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None) -> SimilarityPredictions:
        out = self.outputs("sts", _examples("sts", pairs), batch_size)
        return SimilarityPredictions(predict("sts", out).double().numpy())

    def outputs(self, task: str, examples: list[Example], batch_size: int | None = None) -> torch.Tensor:
        """The head's outputs for `examples`, in their order, fp32 on the CPU: logits (N, 5) for sst, the
        paraphrase logit (N,), the similarity score (N,); pairs averaged over both orders where set."""
        from training.inference.outputs import task_outputs

        if task not in self.tasks:
            raise ValueError(f"{self.source}: the model was not trained on {task} (its tasks: {', '.join(self.tasks)})")
        if not examples:
            return torch.empty((0, 5) if task == "sst" else (0,))
        data = encode_task(task, examples, self.tokenizer, self.config.pair_encoding, self.config.max_length,
                           self.both_orders)
        return task_outputs(self.network, data, self.tokenizer, self.batching(batch_size), self.device,
                            self.autocast)

    def batching(self, batch_size: int | None = None) -> EvalBatching:
        """How the model's inputs are cut into batches: `batch_size` examples at most (else the model's own),
        within its padded-token budget."""
        if batch_size is not None and (problem := _count_problem(batch_size, 1)):
            raise ValueError(f"batch_size {problem}")
        return EvalBatching(batch_size or self.batch_size, self.max_tokens)


def _examples(task: str, items) -> list[Example]:
    """Sentences (sst) or (a, b) pairs -> unlabelled Examples, ids 0..N-1."""
    if isinstance(items, (str, bytes)):
        raise TypeError(f"pass a list of {'sentences' if task == 'sst' else '(a, b) pairs'}, not one string "
                        f"(for one input: [{'text' if task == 'sst' else '(a, b)'}])")
    out = []
    for i, item in enumerate(items):
        if task == "sst":
            if not isinstance(item, str):
                raise TypeError(f"sentence {i}: expected a str, got {type(item).__name__}")
            out.append(Example(str(i), item, None, None))
        else:
            if isinstance(item, str) or len(item) != 2 or not all(isinstance(s, str) for s in item):
                raise TypeError(f"pair {i}: expected two strings (a, b), got {item!r:.80}")
            out.append(Example(str(i), item[0], item[1], None))
    return out


# --------------------------------------------------------------------------- loading

def _reading_problem(precision, batch_size, eval_tokens) -> str | None:
    """load()'s own arguments checked as the commands check their flags (a wrong precision was a KeyError, a
    batch size of 0 or a negative token budget went through)."""
    choices = TrainConfig.__dataclass_fields__["precision"].metadata["choices"]
    if precision is not None and precision not in choices:
        return f"precision must be one of {', '.join(choices)} or None (the run's), not {precision!r}"
    if problem := _count_problem(batch_size, 1):
        return f"batch_size {problem}"
    if eval_tokens is not None and (problem := _count_problem(eval_tokens, 0)):
        return f"eval_tokens {problem} (0: no budget; None: the device's default)"
    return None


def _count_problem(value, least: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        return f"must be an int >= {least}, not {value!r}"
    return None


def load(path: str | Path, device: str = "auto", precision: str | None = None, batch_size: int = 64,
         both_orders: bool | None = None, raw_weights: bool = False, tokenizer: str | Path | None = None,
         eval_tokens: int | None = None) -> Model:
    """A trained model from a run directory (its best.pt), a checkpoint file (best.pt or a training
    checkpoint RUN/checkpoints/step-N.pt: the weight average of an --ema-decay run unless
    `raw_weights`), or an export folder (python -m training.export).

    device: auto (cuda if available), cpu, cuda, cuda:N. precision: auto / fp32 / bf16 / fp16, default
    the run's. both_orders: average each pair's two orders (cross encoding only), default the run's.
    tokenizer: a tokenizer folder for a checkpoint file away from its run directory. eval_tokens: padded
    tokens at most per batch (None: 1024 on CPU, no budget on CUDA; 0: no budget)."""
    problem = _reading_problem(precision, batch_size, eval_tokens)
    if problem:  # before the seconds of reading the weights
        raise LoadError(problem)
    path = Path(path)
    if path.is_dir() and (path / HEADS_FILE).is_file():
        network, tok, cfg, info = _from_export(path)
    else:
        if path.is_dir():
            path = _best_of_run(path)
        network, tok, cfg, info = _from_checkpoint(path, raw_weights, tokenizer)
    both = cfg.predict_both_orders if both_orders is None else both_orders
    if both and cfg.pair_encoding != "cross":
        raise LoadError(f"--predict-both-orders is for cross-encoded pairs; this model is {cfg.pair_encoding}")
    try:
        dev = _device.pick_device(device)
    except RuntimeError as e:  # torch's own message for a device name it does not know
        raise LoadError(f"device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LoadError(f"device {device!r}: CUDA is not available on this machine (use device='cpu')")
    dtype = _device.autocast_dtype(precision or cfg.precision, dev)
    return Model(network, tok, cfg, dev, dtype, source=path, tokenizer_dir=info["tokenizer_dir"],
                 metrics=info["metrics"], step=info["step"], epoch=info["epoch"], both_orders=both,
                 batch_size=batch_size, eval_tokens=eval_tokens)


def _best_of_run(run: Path) -> Path:
    if (run / "best.pt").is_file():
        return run / "best.pt"
    steps = sorted((run / "checkpoints").glob("step-*.pt")) if (run / "checkpoints").is_dir() else []
    hint = f"; pass a training checkpoint instead, e.g. {steps[-1]}" if steps else ""
    raise LoadError(f"{run}: no best.pt (a run directory) and no {HEADS_FILE} (an export folder){hint}")


def _from_checkpoint(path: Path, raw_weights: bool, tokenizer_dir) -> tuple:
    from minbert import Tokenizer
    from training.inference.outputs import run_tokenizer_dir
    from training.run.checkpointing import model_from_checkpoint

    try:
        network, cfg, ckpt = model_from_checkpoint(path, raw_weights=raw_weights)
        tokenizer_dir = run_tokenizer_dir(path, tokenizer_dir)
        tok = Tokenizer.from_checkpoint(tokenizer_dir)
    except (FileNotFoundError, RuntimeError, ValueError) as e:  # missing, unreadable, not one of ours, no average
        raise LoadError(str(e)) from None
    except KeyError as e:
        raise LoadError(f"{path}: not a checkpoint written by run_multitask.py (no {e})") from None
    # best.pt records its step and epoch; a training checkpoint its step (run_state's epoch is the next one)
    step = ckpt.get("step", ckpt.get("run_state", {}).get("global_step"))
    return network, tok, cfg, {"metrics": checkpoint_metrics(path, ckpt, raw_weights), "step": step,
                                "epoch": ckpt.get("epoch"), "tokenizer_dir": Path(tokenizer_dir)}


def checkpoint_metrics(path: Path, ckpt: dict, raw_weights: bool = False) -> dict:
    """The dev metrics of the weights in a checkpoint: best.pt records them; for a training checkpoint,
    the run's metrics.jsonl record of an evaluation at the checkpoint's step, if one was made there
    (the weight average's scores, or with `raw_weights` the raw ones); else {}."""
    if "metrics" in ckpt:
        return dict(ckpt["metrics"])
    step = ckpt.get("run_state", {}).get("global_step")
    records = Path(path).parent.parent / "metrics.jsonl"
    if step is None or not records.is_file():
        return {}
    prefix = "dev_raw_" if raw_weights and "ema" in ckpt else "dev_"
    for r in read_metrics(records):
        if r.get("step") == step and f"{prefix}overall" in r:
            return {k[len(prefix):]: v for k, v in r.items()
                    if k.startswith(prefix) and (prefix == "dev_raw_" or not k.startswith("dev_raw_"))}
    return {}


def _from_export(folder: Path) -> tuple:
    """An export: the encoder in the Hugging Face layout (or its trained part alone), the heads beside it
    (training/export.py)."""
    from safetensors.torch import load_file

    from minbert import CheckpointError, Tokenizer, load_bert

    part = None
    try:
        meta = json.loads((folder / HEADS_FILE).read_text())
        cfg = TrainConfig.from_dict(meta["training_config"])
        part = meta.get("encoder")
        encoder = load_bert(part["base"] if part else folder, attn_impl=cfg.attn_impl)
        network = MultitaskBert(encoder, cfg.pair_encoding, cfg.head_dropout, cfg.pooling)
        if part:
            _onto_base(network, cfg, folder, part)
        weights = load_file(str(folder / HEADS_WEIGHTS))
        tok = Tokenizer.from_checkpoint(folder)
    except LoadError:
        raise
    except (OSError, ValueError, CheckpointError) as e:  # unreadable JSON or weights, no tokenizer, bad encoder
        onto = f" onto its pretrained base {part['base']}" if isinstance(part, dict) and "base" in part else ""
        raise LoadError(f"{folder}: cannot load the export{onto}: {e}") from None
    except KeyError as e:
        raise LoadError(f"{folder / HEADS_FILE}: lacks {e}; was it written by python -m training.export?") from None
    for task in cfg.tasks:
        own = {k[len(task) + 1:]: v for k, v in weights.items() if k.startswith(f"{task}.")}
        try:
            network.heads[task].load_state_dict(own)
        except RuntimeError as e:  # missing or misshapen tensors: say which file
            raise LoadError(f"{folder / HEADS_WEIGHTS}: the {task} head does not fit: "
                            f"{' '.join(str(e).split())}") from None
    return network, tok, cfg, {"metrics": dict(meta.get("dev_metrics") or {}), "step": meta.get("step"),
                                "epoch": meta.get("epoch"), "tokenizer_dir": folder}


def _onto_base(network: MultitaskBert, cfg: TrainConfig, folder: Path, part: dict) -> None:
    """A --trained-only export's encoder: its base (in `network` already) set up as the run was (LoRA's
    factors), checked to be the base it was trained from, then the trained tensors put in."""
    from safetensors.torch import load_file

    from minbert.checkpoint import fingerprint
    from training.run.checkpointing import apply_run_peft

    apply_run_peft(network, cfg)
    ours = network.encoder.state_dict()
    trained = load_file(str(folder / part["file"]))
    kept = [k for k in ours if k not in trained]
    if set(trained) - set(ours) or fingerprint(ours, kept) != part["base_fingerprint"]:
        raise LoadError(f"{folder}: holds the trained part of an encoder, but {part['base']} here is not the "
                        f"pretrained model it was trained from (its {len(kept)} other tensors differ from the "
                        f"{part['base_tensors']} recorded in {HEADS_FILE})")
    try:
        network.encoder.load_state_dict(trained, strict=False)
    except RuntimeError as e:  # a tensor of the wrong shape
        raise LoadError(f"{folder / part['file']}: does not fit {part['base']}: {' '.join(str(e).split())}") from None


__all__ = ["LoadError", "Model", "ParaphrasePredictions", "SENTIMENTS", "SentimentPredictions",
           "SimilarityPredictions", "TASKS", "load"]
