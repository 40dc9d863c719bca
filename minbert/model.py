"""BERT, written out by hand. Read top to bottom: config, embeddings, one layer, the model.

Numerically the same function as Hugging Face's `BertModel` (tests/test_parity.py checks this
against `transformers` to 1e-5). Names differ: Q, K and V live in one fused `qkv` Linear (one
GEMM instead of three), and `minbert.checkpoint` maps the Hugging Face keys onto ours.

The forward pass is split into three public steps so that training tricks can cut in:
    h = bert.embed(input_ids, token_type_ids)         # (B, T, H): input to layer 0
    h = bert.encode(h, attention_mask, start=N)       # run layers N..L-1 only
    pooled = bert.pool(h)                             # tanh(W h[:, 0])
The frozen-prefix cache stores `h` entering layer N; SMART perturbs the `h` it starts from.

MPNet (all-mpnet-base-v2; `transformers.MPNetModel`, tests/test_mpnet.py) is this encoder with four
changes, all switched on by its config (model_type "mpnet"): a relative position bias, one table
shared by every layer and added to each layer's attention scores (Embeddings.relative_bias); absolute
positions counted from pad_token_id + 1, padding at pad_token_id, as in RoBERTa; no token-type
embeddings; and its own values (LayerNorm eps 1e-5). The same three steps run it: encode() computes
the relative bias from the length of the h it is handed, so a cached or perturbed h needs nothing more.
Its tokenizer's pair template, `<s> A </s></s> B </s>`, is in minbert/tokenizer.py.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    model_type: str = "bert"  # or "mpnet": the changes in the module's docstring
    relative_attention_num_buckets: int = 0  # MPNet's relative position bias: 32; 0 = none (BERT)

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every value of the wrong type or out of range, one short phrase each naming the key: a
        config.json is written by hand or by other tools, and a bad value must not reach an allocation
        (vocab_size 1e10) or the first training step (layer_norm_eps "abc")."""
        out = [f"{k} {getattr(self, k)!r}: must be a positive integer" for k in _SIZES
               if not _is_int(getattr(self, k)) or getattr(self, k) < 1]
        out += [f"{k} {getattr(self, k)!r}: must be a probability in [0, 1)" for k in _PROBABILITIES
                if not _is_real(getattr(self, k)) or not 0 <= getattr(self, k) < 1]
        if not _is_real(self.layer_norm_eps) or not 0 < self.layer_norm_eps < math.inf:
            out.append(f"layer_norm_eps {self.layer_norm_eps!r}: must be a positive finite number")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in _ACTIVATIONS:
            out.append(f"hidden_act {self.hidden_act!r} is not supported (one of {sorted(_ACTIVATIONS)})")
        if self.model_type not in _MODEL_TYPES:
            out.append(f"model_type {self.model_type!r} is not supported (one of {', '.join(_MODEL_TYPES)})")
        out += [f"{k} {getattr(self, k)!r}: must be an integer >= 0" for k in _COUNTS
                if not _is_int(getattr(self, k)) or getattr(self, k) < 0]
        if out:  # the rules below assume the sizes are numbers
            return out
        if self.hidden_size % self.num_attention_heads:
            out.append(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                       f"{self.num_attention_heads}")
        if self.pad_token_id is not None and (not _is_int(self.pad_token_id)
                                              or not 0 <= self.pad_token_id < self.vocab_size):
            out.append(f"pad_token_id {self.pad_token_id!r}: must be a token of the vocabulary, in "
                       f"[0, vocab_size {self.vocab_size})")
        return out + (self._mpnet_problems() if self.model_type == "mpnet" else self._bert_problems())

    def _bert_problems(self) -> list[str]:
        out = []
        if self.type_vocab_size < 1:
            out.append(f"type_vocab_size {self.type_vocab_size}: BERT needs at least one token type")
        if self.relative_attention_num_buckets:
            out.append(f"relative_attention_num_buckets {self.relative_attention_num_buckets}: BERT has no "
                       "relative position bias (0)")
        return out

    def _mpnet_problems(self) -> list[str]:
        """transformers' MPNetModel fixes what its config may say otherwise: padding_idx 1, and 32 buckets
        in its bucketing whatever the size of the table. Other values would load to another function."""
        out = []
        if self.type_vocab_size:
            out.append(f"type_vocab_size {self.type_vocab_size}: MPNet has no token-type embeddings (0)")
        if self.relative_attention_num_buckets != MPNET_BUCKETS:
            out.append(f"relative_attention_num_buckets {self.relative_attention_num_buckets}: MPNet buckets "
                       f"relative positions into {MPNET_BUCKETS}")
        if self.pad_token_id != 1:
            out.append(f"pad_token_id {self.pad_token_id!r}: MPNet's padding token is 1 (its positions count "
                       "from it)")
        elif self.max_position_embeddings < 3:
            out.append(f"max_position_embeddings {self.max_position_embeddings}: MPNet's positions start at "
                       "pad_token_id + 1 = 2, so at least 3")
        return out

    @property
    def max_sequence_length(self) -> int:
        """The longest input the position table serves: MPNet's positions start at pad_token_id + 1
        (all-mpnet-base-v2: 514 positions, 512 tokens)."""
        return self.max_position_embeddings - (self.pad_token_id + 1 if self.model_type == "mpnet" else 0)

    def num_parameters(self) -> int:
        """Parameters of Bert(self), counted from the shapes alone (nothing is allocated)."""
        H, I = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * H + 2 * H
        embeddings += self.relative_attention_num_buckets * self.num_attention_heads  # MPNet's bias table
        layer = 4 * H * H + 2 * H * I + 9 * H + I  # qkv, attn_out, ffn_in, ffn_out, two LayerNorms
        return embeddings + self.num_hidden_layers * layer + H * H + H  # + the pooler

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        """Read a Hugging Face config.json of a BERT or an MPNet, ignoring the keys the forward pass does
        not use. Every problem is a ValueError of one line naming the file and the key."""
        path = Path(path)
        try:
            raw = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read the model config: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: must hold a JSON object of the model's settings, not "
                             f"{json.dumps(raw)[:40]}")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: position_embedding_type {raw['position_embedding_type']!r} "
                             "is not supported (only 'absolute', as in BERT)")
        if raw.get("model_type") == "mpnet":  # MPNetConfig's defaults where the file is silent; no token types
            raw = {"pad_token_id": 1, "relative_attention_num_buckets": MPNET_BUCKETS, **raw, "type_vocab_size": 0}
        elif raw.get("model_type", "bert") != "bert":  # e.g. RoBERTa's positions: it would load, to other numbers
            raise ValueError(f"{path}: model_type {raw['model_type']!r} is not supported (one of "
                             f"{', '.join(_MODEL_TYPES)})")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def to_hf_dict(self) -> dict:
        """The config.json of transformers' BertModel or MPNetModel (each reads only its own keys)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.model_type == "mpnet":
            del d["type_vocab_size"]
            return {"architectures": ["MPNetModel"], **d}
        del d["model_type"], d["relative_attention_num_buckets"]
        return {"architectures": ["BertModel"], "model_type": "bert",
                "position_embedding_type": "absolute", **d}


_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "max_position_embeddings")
_COUNTS = ("type_vocab_size", "relative_attention_num_buckets")  # 0: no such table (MPNet's types, BERT's bias)
_MODEL_TYPES = ("bert", "mpnet")
MPNET_BUCKETS, MPNET_MAX_DISTANCE = 32, 128  # transformers' MPNetEncoder.relative_position_bucket
_PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v) -> bool:  # NaN fails every comparison, so the range checks refuse it
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# "gelu" is the exact erf GELU (as in BERT); the tanh form is what some checkpoints ask for.
_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class Dropout(nn.Dropout):
    """nn.Dropout with the keep mask drawn as uniform >= p on CPU, the uniforms in float32 whatever x's
    dtype: the same Bernoulli(1 - p) mask (to float32's 2**-24) in fp32 and under bf16 autocast (where
    the same seed then drops the same units), scaled by 1 / (1 - p) in x's dtype as nn.Dropout does, in
    0.6x of F.dropout's time in fp32 and about 0.3x in bf16 (its CPU Bernoulli sampler is the slow part,
    slower still in bf16). On other devices and for p = 1, nn.Dropout itself. Still an nn.Dropout: code
    that finds dropout modules finds it."""

    def forward(self, x):
        if not self.training or self.p in (0.0, 1.0) or x.device.type != "cpu":
            return super().forward(x)
        keep = torch.rand(x.shape, dtype=torch.float32).ge_(self.p)  # 1 where kept, same shape as x
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))  # 0 or 1 / (1 - p)


class Embeddings(nn.Module):
    """Word + position + token-type embeddings, normalised. MPNet's have no token types, number positions
    as RoBERTa does, and hold the table of its relative position bias (relative_bias)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        H = cfg.hidden_size
        self.mpnet = cfg.model_type == "mpnet"
        self.max_length = cfg.max_sequence_length
        self.word = nn.Embedding(cfg.vocab_size, H, padding_idx=cfg.pad_token_id)
        self.position = nn.Embedding(cfg.max_position_embeddings, H,
                                     padding_idx=cfg.pad_token_id if self.mpnet else None)  # MPNet: padding's
        self.token_type = nn.Embedding(cfg.type_vocab_size, H) if cfg.type_vocab_size else None
        # MPNet's bias table, a score per head for each bucket of key-query distance, read by every layer. It
        # lives here rather than beside the layers so that it freezes with the embeddings: training it under
        # frozen layers would change their outputs, which the frozen-prefix cache holds fixed.
        n_buckets = cfg.relative_attention_num_buckets
        self.relative = nn.Embedding(n_buckets, cfg.num_attention_heads) if n_buckets else None
        self._buckets: dict[torch.device, torch.Tensor] = {}  # relative_bias's bucket ids, per device (buckets)
        self.norm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids=None):  # (B, T) -> (B, T, H)
        T = input_ids.shape[1]
        if self.mpnet:  # token_type_ids unused
            return self.drop(self.norm(self.word(input_ids) + self.position(self.positions(input_ids))))
        if T > self.position.num_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                             f"{self.position.num_embeddings}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        pos = torch.arange(T, device=input_ids.device)
        x = self.word(input_ids) + self.token_type(token_type_ids) + self.position(pos)
        return self.drop(self.norm(x))

    def positions(self, input_ids):  # (B, T) -> (B, T)
        """MPNet's (and RoBERTa's) position ids: pad + 1, pad + 2, ... over the tokens, pad on padding."""
        if input_ids.shape[1] > self.max_length:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the {self.max_length} positions "
                             f"of max_position_embeddings {self.position.num_embeddings} (MPNet's count from "
                             f"pad_token_id + 1)")
        pad = self.word.padding_idx
        real = input_ids.ne(pad).long()  # (B, T) 1 for tokens
        return real.cumsum(1) * real + pad

    def relative_bias(self, T: int, device) -> torch.Tensor:  # -> (1, nh, T, T): query i, key j
        """MPNet's relative position bias: each head's score for the bucket of j - i. A function of T alone,
        as in transformers (positions 0..T-1, padding included). The lookup stays in the graph: the table
        trains."""
        return self.relative(self.buckets(T, device)).permute(2, 0, 1).unsqueeze(0)

    def buckets(self, T: int, device) -> torch.Tensor:  # -> (T, T) int64: query i, key j
        """The bucket ids of relative_bias, computed once rather than at every forward (some 15 small
        kernels): an id depends on j - i alone, so T's are the top-left corner of any longer length's. One
        table per device, for the longest length yet met (512 tokens: 2 MiB), sliced. While torch.compile
        traces or a CUDA graph records, computed afresh instead, as transformers does: nothing made there
        is kept. The table is made outside inference mode, so a model that met a length first under
        torch.inference_mode() still trains on it."""
        device = torch.device(device)
        if torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return bucket_grid(T, device)
        table = self._buckets.get(device)
        if table is None or table.shape[0] < T:
            with torch.inference_mode(False):
                table = self._buckets[device] = bucket_grid(T, device)
        return table[:T, :T]


def bucket_grid(T: int, device) -> torch.Tensor:  # -> (T, T): the bucket of key j - query i
    pos = torch.arange(T, device=device)
    return relative_buckets(pos[None, :] - pos[:, None])


def relative_buckets(rel, n_buckets: int = MPNET_BUCKETS, max_distance: int = MPNET_MAX_DISTANCE):
    """Key - query distances -> bucket ids, T5's bucketing as MPNet uses it: half the buckets for keys before
    the query, half for keys after; in each half, distances 0..n/4-1 one bucket each, then buckets spaced
    logarithmically up to max_distance, the last holding every distance beyond. The same integer arithmetic
    as transformers' MPNetEncoder.relative_position_bucket (the log of a float, truncated)."""
    half = n_buckets // 2
    exact = half // 2
    n = -rel  # query - key: > 0 for keys before the query
    side = (n < 0).long() * half  # keys after the query: the upper half
    n = n.abs()
    far = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    return side + torch.where(n < exact, n, far.clamp(max=half - 1))  # (log 0 = -inf: n = 0 takes n)


class Layer(nn.Module):
    """Post-LN transformer block: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: BertConfig, attn_impl: str = "auto"):
        super().__init__()
        H = cfg.hidden_size
        self.n_head = cfg.num_attention_heads
        self.attn_impl = attn_impl
        self.qkv = nn.Linear(H, 3 * H)
        self.attn_out = nn.Linear(H, H)
        self.attn_norm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.attn_drop = Dropout(cfg.attention_probs_dropout_prob)
        self.ffn_in = nn.Linear(H, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, H)
        self.ffn_norm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.hidden_dropout_prob)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def attention(self, x, bias, n_out=None):  # x (B, T, H), bias additive (B, 1, 1, T) or (B|1, nh, T, T), or None
        B, T, H = x.shape
        nh, hd = self.n_head, H // self.n_head
        if n_out is not None and bias is not None and bias.shape[-2] > 1:  # MPNet's: a row per query
            bias = bias[..., :n_out, :]
        if n_out is None:
            q, k, v = self.qkv(x).view(B, T, 3, nh, hd).permute(2, 0, 3, 1, 4)  # 3 x (B, nh, T, hd)
        else:  # outputs wanted for the first n_out positions only: their queries alone
            q = linear_rows(self.qkv, x[:, :n_out], 0, H).view(B, n_out, nh, hd).transpose(1, 2)  # (B, nh, n_out, hd)
            k, v = linear_rows(self.qkv, x, H, 3 * H).view(B, T, 2, nh, hd).permute(2, 0, 3, 1, 4)  # 2 x (B, nh, T, hd)
        p = self.attn_drop.p if self.attn_drop.training else 0.0
        if _use_sdpa(self.attn_impl, x.device, p, B * nh * q.shape[2] * T):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)
        else:  # plain matmul path: faster than sdpa on CPU for small scores and under dropout
            # Scale and mask in place: matmul's backward does not read its output, so neither
            # needs a copy of the scores (an out-of-place scale and masked_fill copied them
            # forward and backward). Same rounding as the reference's (q @ k^T) * scale + mask;
            # scaling q first measured no faster and moved padded positions' outputs by 2e-5.
            att = (q @ k.transpose(-2, -1)).mul_(1.0 / math.sqrt(hd))  # (B, nh, n_out or T, T)
            if bias is not None:
                att += bias
            y = self.attn_drop(att.softmax(dim=-1)) @ v
        return y.transpose(1, 2).reshape(B, -1, H)  # (B, n_out or T, H)

    def forward(self, x, bias, n_out=None):  # (B, T, H) -> (B, n_out or T, H)
        a = self.attention(x, bias, n_out)
        x = x if n_out is None else x[:, :n_out]
        x = self.attn_norm(x + self.drop(self.attn_out(a)))
        return self.ffn_norm(x + self.drop(self.ffn_out(self.act(self.ffn_in(x)))))


def linear_rows(m: nn.Linear, x, lo: int, hi: int):
    """Output features lo..hi-1 of the Linear m on x, without computing the others; a LoRA-adapted one
    (minbert/lora.py) adds its update's rows."""
    if hasattr(m, "rows"):
        return m.rows(x, lo, hi)
    return F.linear(x, m.weight[lo:hi], None if m.bias is None else m.bias[lo:hi])


# On CPU, sdpa's tiled (flash) kernel beats the matmul path once a layer's scores (B x heads x
# queries x keys) outgrow the caches: 0.3-0.85x of its time from 1.5M scores, 0.82-1.04x between
# 0.1M and 0.8M. Under dropout sdpa falls back to unfused math like ours: 0.98-1.24x, never a gain.
# `python bench/encoder_grid.py --attn-core` (docs/benchmarks.md).
SDPA_MIN_SCORES_CPU = 2 ** 18


def _use_sdpa(impl: str, device: torch.device, dropout: float, scores: int) -> bool:
    if impl != "auto":
        return impl == "sdpa"
    return device.type != "cpu" or (dropout == 0.0 and scores >= SDPA_MIN_SCORES_CPU)


def padding_bias(attention_mask, dtype: torch.dtype):
    """(B, T) 1 = token, 0 = padding -> (B, 1, 1, T) additive bias: 0 for tokens, dtype's most
    negative value for padding (exp underflows to 0 in the softmax); None when nothing is padded,
    so that unpadded batches do no mask work (and sdpa may take its mask-free kernels). The answer
    comes from the mask's `.unpadded` where the batch's maker put it (data.batching, on the host);
    asking the mask itself costs a host sync per forward on CUDA."""
    if attention_mask is None:
        return None
    unpadded = getattr(attention_mask, "unpadded", None)
    if unpadded is None:  # a mask nobody marked: ask it
        unpadded = bool(attention_mask.all())
    if unpadded:
        return None
    pad = (attention_mask == 0)[:, None, None, :]  # (B, 1, 1, T)
    return torch.zeros(pad.shape, dtype=dtype, device=pad.device).masked_fill_(pad, torch.finfo(dtype).min)


def compute_dtype(h: torch.Tensor) -> torch.dtype:
    """The dtype the attention scores come out in: autocast's, when it is on for h's device."""
    dev = h.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype


class BertOutput(NamedTuple):
    last_hidden_state: torch.Tensor          # (B, T, H)
    pooler_output: torch.Tensor              # (B, H)
    hidden_states: tuple[torch.Tensor, ...] | None  # embeddings + each layer's output, if asked


class Bert(nn.Module):
    def __init__(self, cfg: BertConfig, attn_impl: str = "auto"):
        super().__init__()
        if attn_impl not in ("auto", "sdpa", "matmul"):
            raise ValueError(f"attn_impl must be auto, sdpa or matmul, not {attn_impl!r}")
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg, attn_impl) for _ in range(cfg.num_hidden_layers))
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        # BERT's own initialisation; loading a checkpoint overwrites every tensor.
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.Embedding) and m.padding_idx is not None:
            nn.init.zeros_(m.weight[m.padding_idx])

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def embed(self, input_ids, token_type_ids=None):  # (B, T) -> (B, T, H), the input of layer 0
        return self.embeddings(input_ids, token_type_ids)

    def encode(self, h, attention_mask=None, start: int = 0, end: int | None = None,
               output_hidden_states: bool = False, first_only: bool = False):
        """Run layers start..end-1 (end defaults to all) on h, the hidden states entering layer
        `start`. attention_mask (B, T): 1 for real tokens, 0 for padding.

        first_only: return only position 0 ([CLS]), (B, 1, H). The last layer then computes one
        query and one FFN row per sequence instead of T, the same numbers for [CLS] at a fraction
        of the layer's cost, for callers that read nothing else (the pooler, --pooling cls)."""
        end = self.num_layers if end is None else end
        if not 0 <= start <= end <= self.num_layers:
            raise ValueError(f"layers {start}..{end} out of range: the model has {self.num_layers} layers")
        if first_only and output_hidden_states:
            raise ValueError("first_only and output_hidden_states exclude each other")
        bias = self.attention_bias(h, attention_mask) if start < end else None  # once for all layers
        states = [h]
        for i in range(start, end):
            h = self.layers[i](h, bias, 1 if first_only and i == end - 1 else None)
            states.append(h)
        if first_only:
            return h[:, :1]  # also when no layer ran (start == end)
        return (h, tuple(states)) if output_hidden_states else h

    def attention_bias(self, h, attention_mask):
        """What every layer adds to its attention scores: the padding bias (B, 1, 1, T), and for MPNet
        the relative position bias (1, nh, T, T) with it, (B, nh, T, T); None when there is neither. In
        the scores' dtype (autocast's, when on), as sdpa takes a float mask; in bf16, half the memory."""
        dtype = compute_dtype(h)
        pad = padding_bias(attention_mask, dtype)
        if self.embeddings.relative is None:
            return pad
        rel = self.embeddings.relative_bias(h.shape[1], h.device).to(dtype)
        return rel if pad is None else rel + pad

    def pool(self, h):  # (B, T, H) -> (B, H)
        return torch.tanh(self.pooler(h[:, 0]))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None,
                output_hidden_states: bool = False) -> BertOutput:
        h = self.embed(input_ids, token_type_ids)
        if output_hidden_states:
            h, states = self.encode(h, attention_mask, output_hidden_states=True)
        else:
            h, states = self.encode(h, attention_mask), None
        return BertOutput(h, self.pool(h), states)
