"""The three task heads, their losses and predictions, and the multi-task model that shares one
encoder between them.

Pair tasks come in two encodings (`pair_encoding`):
  cross    both sentences in one sequence, [CLS] a [SEP] b [SEP] with token type ids; one pooled y.
  siamese  each sentence encoded alone; pooled y1, y2. The heads are the "Freeze Your Layers"
           paper's: paraphrase logit (W1 y1 + b1)^T (W2 y2 + b2); similarity 5 max(0, cos(z1, z2))
           with z_i = W_i y_i + b_i. W_i start random (nn.Linear's initialisation), or, for the
           similarity head, as the identity (`siamese_init="identity"`), so that it starts as the
           plain cosine of the encoder's vectors. (Not the paraphrase head: its logit would start as
           the raw dot product y1 . y2, tens for MiniLM's vectors, and measured here it then
           predicted "paraphrase" for everything after an epoch.)

What y is (`pooling`):
  cls   BERT's pooler, tanh(W h[CLS] + b) on the last layer (the course's and the paper's choice);
  mean  the mean of the last layer's states over the real tokens, without the pooler: how
        sentence-transformers checkpoints such as all-MiniLM-L6-v2 were trained (their pooler
        weights were never trained).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from minbert import Bert

# The kind of output each task has (the tasks of data.loaders.TASKS): what its loss, prediction and
# SMART's smoothness loss use.
KIND = {"sst": "categorical", "para": "bernoulli", "sts": "regression"}
NUM_SENTIMENTS = 5
MAX_SIMILARITY = 5.0


class SentimentHead(nn.Module):
    """pooled [CLS] -> MLP -> 5 logits."""

    def __init__(self, hidden: int, dropout: float):
        super().__init__()
        self.mlp = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Dropout(dropout), nn.Linear(hidden, NUM_SENTIMENTS))

    def forward(self, y):  # (B, H) -> (B, 5)
        return self.mlp(y)


class _PairHead(nn.Module):
    """A head over a cross-encoded pair (one pooled y -> linear) or a siamese pair (y1, y2 ->
    z_i = W_i y_i + b_i)."""

    def __init__(self, hidden: int, dropout: float, siamese: bool, identity_init: bool = False):
        super().__init__()
        self.siamese = siamese
        self.drop = nn.Dropout(dropout)
        if siamese:
            self.w1, self.w2 = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
            if identity_init:  # z_i = y_i at the start: the heads begin from the encoder's own geometry
                for w in (self.w1, self.w2):
                    nn.init.eye_(w.weight)
                    nn.init.zeros_(w.bias)
        else:
            self.out = nn.Linear(hidden, 1)

    def projections(self, y1, y2):  # siamese: (B, H), (B, H) -> z1, z2
        return self.w1(self.drop(y1)), self.w2(self.drop(y2))

    def linear(self, y):  # cross: (B, H) -> (B,)
        return self.out(self.drop(y)).squeeze(-1)


class ParaphraseHead(_PairHead):
    """One logit: linear on the cross-encoded pair, or z1 . z2 siamese."""

    def forward(self, y1, y2=None):  # -> (B,)
        if self.siamese:
            z1, z2 = self.projections(y1, y2)
            return (z1 * z2).sum(-1)
        return self.linear(y1)


class SimilarityHead(_PairHead):
    """A score in [0, 5]: 5 sigmoid(w.y + b) cross-encoded, 5 max(0, cos(z1, z2)) siamese."""

    def forward(self, y1, y2=None):  # -> (B,)
        if self.siamese:
            return MAX_SIMILARITY * F.cosine_similarity(*self.projections(y1, y2), dim=-1).clamp(min=0)
        return MAX_SIMILARITY * torch.sigmoid(self.linear(y1))


def task_loss(task: str, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean loss over the batch: cross-entropy, binary cross-entropy on the logit, MSE on the score."""
    output = output.float()  # losses in fp32 under autocast
    if task == "sst":
        return F.cross_entropy(output, labels.long())
    if task == "para":
        return F.binary_cross_entropy_with_logits(output, labels.float())
    return F.mse_loss(output, labels.float())


def predict(task: str, output: torch.Tensor) -> torch.Tensor:
    """Class index, 0/1 at probability 0.5, or the similarity score."""
    if task == "sst":
        return output.argmax(-1)
    if task == "para":
        return (output > 0).long()  # sigmoid(logit) > 0.5
    return output.float().clamp(0.0, MAX_SIMILARITY)


def probabilities(task: str, output: torch.Tensor) -> torch.Tensor:
    """What `predict` decides from, as numbers a user reads: the five class probabilities (softmax of
    the logits, (B, 5)), P(paraphrase) (sigmoid of the logit, (B,)), or the similarity score (B,)."""
    output = output.float()
    if task == "sst":
        return output.softmax(-1)
    if task == "para":
        return torch.sigmoid(output)
    return output.clamp(0.0, MAX_SIMILARITY)


class MultitaskBert(nn.Module):
    """One shared encoder, one head per task.

    The forward pass is split where training tricks cut in:
        hs  = model.hidden_at(inputs, layer)         # hidden states entering `layer`, one per sequence
        out = model.from_hidden(task, hs, masks, layer)
    `forward(task, inputs)` does both from layer 0. `inputs` is a list of one padded sequence
    (single sentence, or a cross-encoded pair) or two (siamese pair), each a dict with
    input_ids, token_type_ids and attention_mask (B, T) -- or, from the frozen-prefix cache,
    `hidden` (B, T, H) entering layer `cache_layer` and attention_mask.
    """

    def __init__(self, encoder: Bert, pair_encoding: str = "cross", dropout: float = 0.1, pooling: str = "cls",
                 siamese_init: str = "random"):
        super().__init__()
        if pair_encoding not in ("cross", "siamese"):
            raise ValueError(f"pair_encoding must be cross or siamese, not {pair_encoding!r}")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be cls or mean, not {pooling!r}")
        if siamese_init not in ("random", "identity"):
            raise ValueError(f"siamese_init must be random or identity, not {siamese_init!r}")
        H = encoder.config.hidden_size
        self.encoder = encoder
        self.pair_encoding, self.pooling = pair_encoding, pooling
        siamese, eye = pair_encoding == "siamese", siamese_init == "identity"
        self.heads = nn.ModuleDict({"sst": SentimentHead(H, dropout), "para": ParaphraseHead(H, dropout, siamese),
                                    "sts": SimilarityHead(H, dropout, siamese, eye)})
        self.frozen_upto: int | None = None  # see freeze()
        self.frozen_dropout = False  # keep dropout in the frozen modules (a confound arm of the freezing study)
        self.peft = "none"  # none, bitfit or lora: what of the encoder may train (use_peft)
        self.peft_factors: list[nn.Parameter] = []  # lora: the factors it added, the encoder's weights that train
        self.freeze(None)

    # ------------------------------------------------------------------ freezing
    def freeze(self, upto: int | None) -> None:
        """Freeze the embeddings and layers 0..upto-1 (upto=-1: embeddings only; upto=L: everything
        but pooler and heads). Frozen modules get no grads and always run in eval mode, so their
        dropout is off and their output is a fixed function of the input (the frozen cache needs that)."""
        L = self.encoder.num_layers
        factors = {id(f) for f in self.peft_factors}  # this model's own (a deep copy's list holds the copy's)
        if upto is not None and not -1 <= upto <= L:
            raise ValueError(f"--freeze-upto {upto} is out of range: the model has {L} layers, "
                             f"so it must be between -1 (embeddings only) and {L} (all layers)")
        self.frozen_upto = upto
        for name, p in self.encoder.named_parameters():
            p.requires_grad_(self.peft_trains(name, p, factors))
        for m in self.frozen_modules():
            m.requires_grad_(False)
        if self.pooling == "mean":  # unused: no gradient, not in the optimiser
            self.encoder.pooler.requires_grad_(False)
        self.train(self.training)

    def use_peft(self, mode: str, factors: list[nn.Parameter] = ()) -> None:
        """Train the encoder under PEFT `mode` (none, bitfit or lora) from the next freeze() on; factors: the
        parameters LoRA added (training/methods/peft.py passes them), told rather than guessed from names."""
        if mode not in ("none", "bitfit", "lora") or (factors and mode != "lora"):
            raise ValueError(f"PEFT mode must be none, bitfit or lora (factors with lora alone), not {mode!r}")
        self.peft, self.peft_factors = mode, list(factors)

    def peft_trains(self, name: str, param: nn.Parameter, factors: set[int]) -> bool:
        """Whether the encoder's parameter `name` may train under self.peft: BitFit's bias terms (LayerNorm's
        beta too), LoRA's factors (ids in `factors`), and the pooler, which trains like the heads."""
        if self.peft == "none" or name.startswith("pooler."):
            return True
        return name.endswith(".bias") if self.peft == "bitfit" else id(param) in factors

    def frozen_modules(self) -> list[nn.Module]:
        if self.frozen_upto is None:
            return []
        return [self.encoder.embeddings, *self.encoder.layers[: max(self.frozen_upto, 0)]]

    @property
    def first_trainable_layer(self) -> int:
        return max(self.frozen_upto or 0, 0)

    def train(self, mode: bool = True):
        super().train(mode)
        if not self.frozen_dropout:
            for m in self.frozen_modules():
                m.eval()
        return self

    # ------------------------------------------------------------------ forward
    def hidden_at(self, inputs: list[dict], layer: int) -> list[torch.Tensor]:
        """The hidden states entering `layer` for each input sequence."""
        hs = []
        for seq in inputs:
            if "hidden" in seq:
                if seq["cache_layer"] != layer:
                    raise ValueError(f"cached hidden states enter layer {seq['cache_layer']}, not {layer}")
                hs.append(seq["hidden"])
            else:
                h = self.encoder.embed(seq["input_ids"], seq.get("token_type_ids"))
                hs.append(self.encoder.encode(h, seq["attention_mask"], start=0, end=layer))
        return hs

    def from_hidden(self, task: str, hs: list[torch.Tensor], masks: list[torch.Tensor], layer: int) -> torch.Tensor:
        ys = [self.pool(h, m, layer) for h, m in zip(hs, masks)]
        # The heads run in fp32 whatever the encoder's autocast: their outputs are what users read and
        # rank (a bf16 similarity score moves in steps of 1/32 between 4 and 5), and they are a tiny
        # share of the compute.
        with torch.autocast(ys[0].device.type, enabled=False):
            return self.heads[task](*[y.float() for y in ys])

    def pool(self, h: torch.Tensor, mask: torch.Tensor, layer: int) -> torch.Tensor:
        """y of one sequence from the states entering `layer`: (B, T, H) -> (B, H); the mean in fp32."""
        if self.pooling == "cls":  # only [CLS] is read: the last layer computes it alone
            return self.encoder.pool(self.encoder.encode(h, mask, start=layer, first_only=True))
        h = self.encoder.encode(h, mask, start=layer).float()
        m = mask.unsqueeze(-1).float()
        return (h * m).sum(1) / m.sum(1).clamp(min=1)

    def forward(self, task: str, inputs: list[dict], layer: int = 0) -> torch.Tensor:
        masks = [seq["attention_mask"] for seq in inputs]
        return self.from_hidden(task, self.hidden_at(inputs, layer), masks, layer)
