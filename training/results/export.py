"""A trained model written in the Hugging Face layout, the task heads beside it, and a model card: what
`python -m training.export` and a run's --export-hf write (the command's --help shows the folder).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import torch

from data.loaders import SENTIMENTS
from minbert.checkpoint import TRAINED_PART, VOCAB_FILES, WEIGHT_FILES, copy_tokenizer_files
from training.api import HEADS_FILE, HEADS_WEIGHTS, Model, load
from training.config.freeze_spec import freeze_depth
from training.inference.metrics import METRIC
from training.methods.peft import share, trainable_counts
from training.run.flags import changed_options, command_line

log = logging.getLogger(__name__)

CARD = "README.md"
TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")
EXPORT_FILES = ("config.json", HEADS_FILE, HEADS_WEIGHTS, TRAINED_PART, CARD, *WEIGHT_FILES, *VOCAB_FILES,
                *TOKENIZER_EXTRAS)
TASK_NAMES = {"sst": "SST-5 sentiment", "para": "Quora paraphrase", "sts": "STS-B similarity"}


class ExportError(ValueError):
    """An export that cannot be written where asked; one line naming the folder."""


def export(source: str | Path, out_dir: str | Path, overwrite: bool = False, raw_weights: bool = False,
           tokenizer: str | Path | None = None, trained_only: bool = False) -> Path:
    """Write the model at `source` (anything training.api.load takes) to `out_dir`; returns out_dir.
    trained_only: the encoder's trained part alone, to be loaded onto its pretrained base (trained_part)."""
    out = Path(out_dir)
    check_out_dir(out, overwrite)
    model = load(source, device="cpu", raw_weights=raw_weights, tokenizer=tokenizer)
    part = trained_part(model) if trained_only else None  # refused before anything is written
    staging = out.parent / f".{out.name}.export-{os.getpid()}"  # mkdir, not mkdtemp: modes follow the umask
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        write_export(model, staging, out.name, part)
        _move_into(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    log.info("exported %s to %s", model.source, out)
    return out


def check_out_dir(out: Path, overwrite: bool) -> None:
    """An export folder we may write: none yet, an empty one, or (with overwrite) an earlier export."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out}: exists and is not empty; pass --overwrite to replace the export there, or "
                          f"name another OUT_DIR")


def _move_into(staging: Path, out: Path) -> None:
    """The finished export into `out`: a new folder by rename; an existing one loses its earlier export's
    files (an old pytorch_model.bin or tokenizer.json would shadow the new weights or vocabulary)."""
    if not out.exists():
        os.replace(staging, out)
        return
    for name in EXPORT_FILES:
        if (out / name).is_file():
            (out / name).unlink()
    for p in staging.iterdir():
        os.replace(p, out / p.name)
    others = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_FILES)
    if others:
        log.warning("%s: left alone files that are not part of an export: %s", out, ", ".join(others))


def write_export(model: Model, folder: Path, name: str, part: tuple[dict, dict] | None = None) -> None:
    """The export's files into `folder`: the whole encoder, or with `part` (trained_part's) its trained
    tensors alone; `name` is how the model card calls the folder."""
    from safetensors.torch import save

    from minbert import save_hf

    if part is None:
        save_hf(model.network.encoder, folder)
    else:
        (folder / TRAINED_PART).write_bytes(save(part[0], metadata={"format": "pt"}))
    copy_tokenizer_files(model.tokenizer_dir, folder)
    heads = {f"{task}.{k}": v.detach().cpu().contiguous()
             for task in model.tasks for k, v in model.network.heads[task].state_dict().items()}
    (folder / HEADS_WEIGHTS).write_bytes(save(heads, metadata={"format": "pt"}))  # save_file would make it 0600
    meta = heads_meta(model)
    if part is not None:
        meta["encoder"] = part[1]
    (folder / HEADS_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    (folder / CARD).write_text(model_card(model, meta, name))


def trained_part(model: Model) -> tuple[dict, dict]:
    """The encoder tensors training changed, and what heads.json says of the rest. Changed: every tensor
    that differs from the run's pretrained base (--model) in a single bit (the layers above a frozen
    prefix, BitFit's biases, the pooler), and LoRA's factors, which the base lacks. The rest is the base's
    own, recorded by its name and a fingerprint that loading checks. ExportError when the base cannot be
    loaded here, or when training changed every tensor (full fine-tuning: nothing would be saved)."""
    from minbert import CheckpointError, load_bert
    from minbert.checkpoint import fingerprint

    base_name = model.config.model
    try:
        base = load_bert(base_name).state_dict()
    except (OSError, ValueError, CheckpointError) as e:
        raise ExportError(f"--trained-only: the run's pretrained model {base_name} cannot be loaded here: "
                          f"{e}") from None
    ours = {k: v.detach().cpu().contiguous() for k, v in model.network.encoder.state_dict().items()}
    kept = sorted(k for k, v in ours.items() if k in base and base[k].shape == v.shape and torch.equal(v, base[k]))
    if not kept:
        raise ExportError(f"--trained-only: {model.source} changed every tensor of its encoder (full fine-tuning): "
                          f"its trained part is the whole model; export it without --trained-only")
    changed = {k: v for k, v in ours.items() if k not in kept}
    mb = [sum(v.numel() * v.element_size() for v in tensors.values()) / 1e6 for tensors in (changed, base)]
    log.info("the trained part: %d of the encoder's %d tensors, %.2f MB (the whole encoder %.1f MB)",
             len(changed), len(ours), *mb)
    return changed, {"stored": "trained part", "file": TRAINED_PART, "base": base_name,
                     "base_fingerprint": fingerprint(ours, kept), "base_tensors": len(kept)}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def heads_meta(model: Model) -> dict:
    cfg = model.config
    source = model.source
    if (source / HEADS_FILE).is_file():  # an export of an export keeps the original's provenance
        earlier = json.loads((source / HEADS_FILE).read_text())
        checkpoint, trained = earlier.get("checkpoint"), earlier.get("trained")
        parameters = earlier.get("trained_parameters")
    else:
        checkpoint, trained = str(source), _iso(source.stat().st_mtime)
        parameters = trained_parameters(model)
    return {"format": "minbert-mt-heads", "version": 1, "tasks": list(model.tasks),
            "pair_encoding": cfg.pair_encoding, "pooling": cfg.pooling, "max_length": cfg.max_length,
            "predict_both_orders": model.both_orders, "precision": cfg.precision,
            "labels": {"sst": list(SENTIMENTS), "para": ["not a paraphrase", "paraphrase"], "sts": "score in [0, 5]"},
            "checkpoint": checkpoint, "epoch": model.epoch, "step": model.step, "trained": trained,
            "exported": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "dev_metrics": model.metrics, "trained_parameters": parameters, "training_config": cfg.to_dict()}


def trained_parameters(model: Model) -> dict:
    """What the run trained of the network, as its config sets it up (at the start of a freezing schedule):
    {"trainable", "total" (LoRA's factors counted in both), "share"}. Sets the network's requires_grad as
    the run's were (an exported model is not trained further)."""
    network = model.network
    network.freeze(freeze_depth(model.config.freeze_upto, network.encoder.num_layers))
    trainable, total = trainable_counts(network)
    return {"trainable": trainable, "total": total, "share": share(trainable, total)}


def model_card(model: Model, meta: dict, name: str) -> str:
    cfg = {**model.config.to_dict(), "model": shown(model.config.model)}  # the recipe, not the machine's folders
    changed = changed_options(cfg)
    lines = [f"# {name}", "",
             f"A multi-task BERT trained with minBERT-MT on {', '.join(TASK_NAMES[t] for t in model.tasks)} "
             f"(the Stanford CS224N multitask-BERT tasks), from `{cfg['model']}`: "
             f"{model.network.encoder.num_layers} layers, hidden {model.network.encoder.config.hidden_size}, "
             f"{cfg['pair_encoding']}-encoded pairs, {cfg['pooling']} pooling.", "",
             "## Data", "", _data_line(model), "",
             "## Recipe", "",
             "The options set away from their defaults" + (" (none: the defaults)" if not changed else "")
             + ", as the command that trains the same recipe:", "", "```bash", command_line(cfg), "```", ""]
    lines += _trained_lines(cfg, meta.get("trained_parameters"))
    lines += ["## Dev metrics", ""]
    if model.metrics:
        lines += ["| metric | value |", "|---|---:|"] + [f"| {k} | {v:.4f} |" for k, v in model.metrics.items()]
        lines += ["", "overall: the course's score, the mean of SST accuracy, paraphrase accuracy and "
                      "(Pearson + 1) / 2 over the trained tasks."]
    else:
        lines += ["Not recorded with this checkpoint (no dev evaluation at its step): score it with "
                  "`python -m training.evaluate DIR --data-dir DATA`."]
    step = f", step {meta['step']}" if meta.get("step") is not None else ""
    lines += ["", "## Dates", "", f"- trained: {meta['trained']} (`{shown(meta['checkpoint'])}`{step})",
              f"- exported: {meta['exported']}", "", "## How to load", "",
              "With minBERT-MT (the encoder and the heads):", "", "```python",
              "from training.api import load", "", f'model = load("{name}")']
    examples = {"sst": 'model.sentiment(["a gripping, beautifully shot film"]).probabilities  # (1, 5)',
                "para": 'model.paraphrase([("How old are you?", "What is your age?")]).labels',
                "sts": 'model.similarity([("A man is cooking.", "A man cooks.")]).scores  # in [0, 5]'}
    lines += [examples[t] for t in model.tasks] + ["```", ""] + _encoder_lines(meta.get("encoder"), name)
    lines += [f"Metric names: {', '.join(f'{METRIC[t]} ({TASK_NAMES[t]})' for t in model.tasks)}.", ""]
    return "\n".join(lines)


def _data_line(model: Model) -> str:
    """The model card's data: the files' names, never the folder they were in on the training machine."""
    cfg = model.config
    names = [Path(cfg.file(t, s)).name for t in model.tasks for s in ("train", "dev")]
    apart = [Path(v).name for v in cfg.files.values()]
    return (f"The course's CSV files ({', '.join(f'`{n}`' for n in names)})"
            + (f", at most {cfg.max_train_examples} training examples per task" if cfg.max_train_examples else "")
            + (f"; given apart from the data folder: {', '.join(f'`{n}`' for n in apart)}" if apart else "")
            + ". Dev metrics are on the course's dev files.")


def shown(path: str) -> str:
    """A path as the model card shows it: an absolute one (of the machine that trained or exported the
    model, meaningless elsewhere and telling of it) cut to its run-relative tail -- best.pt with its run's
    folder, a step checkpoint with checkpoints/ too, a model folder alone; relative paths and hub ids as they
    are. heads.json keeps the whole paths, which loading needs."""
    p = Path(str(path))
    if not p.is_absolute():
        return str(path)
    keep = 3 if p.parent.name == "checkpoints" else 2 if p.suffix == ".pt" else 1
    return str(Path(*p.parts[-keep:]))


def _encoder_lines(part: dict | None, name: str) -> list[str]:
    """The model card on reading the encoder: with transformers, or (a trained-part export) onto its base."""
    if part is None:
        return ["The encoder alone, with `transformers` (the heads need minBERT-MT):", "", "```python",
                "from transformers import AutoTokenizer, BertModel", "",
                f'encoder = BertModel.from_pretrained("{name}")',
                f'tokenizer = AutoTokenizer.from_pretrained("{name}")', "```", ""]
    return [f"This folder holds the encoder's trained part alone (`{part['file']}`: the tensors training changed, "
            f"LoRA's factors unmerged); the other {part['base_tensors']} tensors are those of `{shown(part['base'])}`, "
            f"which loading reads (installed, in the Hugging Face cache, or at that path) and checks against "
            f"their fingerprint. `transformers` cannot read this folder; for one it reads, export it whole:", "",
            "```bash", f"python -m training.export {name} {name}-whole", "```", ""]


def _trained_lines(cfg: dict, parameters: dict | None) -> list[str]:
    """The model card's sentence on how much of the model trained, and how (--peft, --freeze-upto)."""
    if not parameters:
        return []
    how = {"none": "all of the encoder that --freeze-upto left trainable",
           "bitfit": "BitFit: the encoder's bias terms alone (LayerNorm's beta included)"}.get(
        cfg.get("peft", "none"), f"LoRA (`--peft {cfg.get('peft')}`): low-rank updates of the encoder's linear maps, "
                                 f"merged into the exported weights, so that the folder holds a plain BERT")
    frozen = (f", above a frozen prefix (`--freeze-upto {cfg['freeze_upto']}`)"
              if cfg.get("freeze_upto") is not None else "")
    pooler = ", the pooler" if cfg.get("pooling") == "cls" else ""
    return [f"Trained: {parameters['trainable']:,} of {parameters['total']:,} parameters "
            f"({100 * parameters['share']:.3g}%): the heads{pooler} and {how}{frozen}.", ""]
