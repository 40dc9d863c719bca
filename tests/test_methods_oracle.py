"""The training methods against independent references, never against the project's own output:

- the optimiser: torch.optim.AdamW (plain, not fused) over parameter groups written out from the names
  (no decay on biases and LayerNorm weights), the layer-wise rates from docs/options.md's formula;
- the schedule: transformers.get_linear_schedule_with_warmup;
- a whole Stepper update: forward, the summed task losses' backward, torch.nn.utils.clip_grad_norm_,
  the reference AdamW and schedule, step by step;
- gradient accumulation over several tasks: k micro-batches against one batch of k*b per task;
- PCGrad: Yu et al. 2020 Algorithm 1 written out in numpy, every order of the other tasks enumerated;
- LoRA: the `peft` library with alpha != r and dropout on, the dropout mask made deterministic in both;
- BitFit and freezing: exactly the biases (LayerNorm beta included) train; frozen ones get no gradient,
  no optimiser state and do not move under weight decay;
- SMART's Bregman teacher: t <- beta t + (1 - beta) theta with the paper's beta switch, in a loop.
"""
import copy
import itertools
import math

import numpy as np
import pytest
import tiny_runs
import torch

from data.batching import Batch
from heads import MultitaskBert, task_loss
from minbert import Bert, BertConfig
from training.config.train_config import TrainConfig
from training.methods.pcgrad import surgery
from training.methods.stepper import Stepper, build_optimizer, linear_warmup_decay

pytestmark = pytest.mark.usefixtures("one_thread")

L, V, H = 2, 12, 16


def tiny_model(seed: int = 0, pair_encoding: str = "cross") -> MultitaskBert:
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = MultitaskBert(Bert(cfg), pair_encoding, dropout=0.0)
    with torch.no_grad():  # wider than BERT's init, so that gradients are not tiny
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.3)
    return model


def _seq(g, B, T, pair=False):
    return tiny_runs.random_batch(g, B, T, V, padded=2, pair=pair)


def task_batches(seed: int = 0, B: int = 4, T: int = 7) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    ids, idx = [str(i) for i in range(B)], list(range(B))
    return [Batch("sst", [_seq(g, B, T)], torch.randint(0, 5, (B,), generator=g), ids, idx),
            Batch("para", [_seq(g, B, T, pair=True)], torch.randint(0, 2, (B,), generator=g).float(), ids, idx),
            Batch("sts", [_seq(g, B, T, pair=True)], torch.rand(B, generator=g) * 5, ids, idx)]


def cat_batches(parts: list[Batch]) -> Batch:
    """One batch holding the examples of `parts` (all of one task and one padded length)."""
    inputs = [{k: torch.cat([p.inputs[s][k] for p in parts]) for k in parts[0].inputs[s]}
              for s in range(len(parts[0].inputs))]
    n = sum(p.size for p in parts)
    return Batch(parts[0].task, inputs, torch.cat([p.labels for p in parts]), [str(i) for i in range(n)],
                 list(range(n)))


def ref_loss(model: MultitaskBert, b: Batch) -> torch.Tensor:
    """The model's plain forward from layer 0 and the task's loss (what the methods act on)."""
    masks = [s["attention_mask"] for s in b.inputs]
    return task_loss(b.task, model.from_hidden(b.task, model.hidden_at(b.inputs, 0), masks, 0), b.labels)


def is_no_decay(name: str) -> bool:
    """Biases and LayerNorm weights, from the names (docs/options.md: --weight-decay)."""
    return name.endswith(".bias") or name.split(".")[-2].endswith("norm")


def ref_depth(name: str) -> int:
    if name.startswith("encoder.embeddings."):
        return 0
    if name.startswith("encoder.layers."):
        return int(name.split(".")[2]) + 1
    return L + 1


def ref_adamw(model: MultitaskBert, lr: float, wd: float, g: float = 1.0) -> torch.optim.AdamW:
    """torch's AdamW (no fused kernel, no foreach) over one group per trainable parameter, its rate and decay
    written from the docs: lr * g^(L + 1 - depth), weight decay wd but for biases and LayerNorm weights."""
    groups = [{"params": [p], "lr": lr * g ** (L + 1 - ref_depth(n)), "weight_decay": 0.0 if is_no_decay(n) else wd}
              for n, p in model.named_parameters() if p.requires_grad]
    return torch.optim.AdamW(groups, lr=lr, foreach=False, fused=False)


def hf_lambda(total: int, warmup: int):
    transformers = pytest.importorskip("transformers")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
    return sched.lr_lambdas[0]


def config(**kw) -> TrainConfig:
    base = dict(lr=1e-2, weight_decay=0.1, warmup_ratio=0.0, max_grad_norm=0.0, seed=0, device="cpu",
                head_dropout=0.0, pair_encoding="cross")
    return TrainConfig(**{**base, **kw})


# ----------------------------------------------------------------------------- the optimiser


@pytest.mark.parametrize("upto, decay", [(None, 1.0), (1, 1.0), (None, 0.7)])
def test_optimizer_is_adamw_on_the_documented_groups(upto, decay):
    """build_optimizer against torch's AdamW on groups written from the names: the same trainable parameters
    (none frozen), the same weights after three steps on the same random gradients (weight decay 0.1 at
    lr 1e-2 moves every decayed weight measurably), and each parameter's rate lr * g^(L + 1 - depth)."""
    ours_model, ref_model = tiny_model(), tiny_model()
    ours_model.freeze(upto)
    ref_model.freeze(upto)
    cfg = config(layer_lr_decay=decay)
    ours = build_optimizer(ours_model, cfg, torch.device("cpu"))
    ref = ref_adamw(ref_model, cfg.lr, cfg.weight_decay, decay)
    in_ours = {id(p) for grp in ours.param_groups for p in grp["params"]}
    names = dict((id(p), n) for n, p in ours_model.named_parameters())
    want = {n for n, p in ours_model.named_parameters() if p.requires_grad}
    assert {names[i] for i in in_ours} == want
    if upto is not None:
        assert not any(n.startswith(("encoder.embeddings.", "encoder.layers.0.")) for n in want)
    rates = {names[id(p)]: (grp["lr"], grp["weight_decay"]) for grp in ours.param_groups for p in grp["params"]}
    for n in want:
        assert rates[n][0] == pytest.approx(cfg.lr * decay ** (L + 1 - ref_depth(n)), rel=1e-12), n
        assert rates[n][1] == (0.0 if is_no_decay(n) else cfg.weight_decay), n
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for (n, p), (_, q) in zip(ours_model.named_parameters(), ref_model.named_parameters()):
            if p.requires_grad:
                p.grad = torch.randn(p.shape, generator=g)
                q.grad = p.grad.clone()
        ours.step()
        ref.step()
    for (n, p), (_, q) in zip(ours_model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    frozen = [p for p in ours_model.parameters() if not p.requires_grad]
    assert all(p not in ours.state for p in frozen)


def test_schedule_against_transformers_linear_schedule():
    """linear_warmup_decay against transformers.get_linear_schedule_with_warmup. From the end of the warm-up
    on they are equal (linear decay to 0 at total_steps). During the warm-up ours is one step ahead:
    (s + 1) / W where transformers has s / W, so the first update runs at lr / W, not 0, and the peak rate is
    held for two updates (W - 1 and W): the convention docs/options.md states, pinned here."""
    for total, ratio in ((20, 0.25), (37, 0.1), (10, 0.0), (9, 0.5)):
        warmup = int(total * ratio)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
        sched = linear_warmup_decay(opt, total, ratio)
        hf = hf_lambda(total, warmup)
        got = []
        for _ in range(total):
            got.append(opt.param_groups[0]["lr"] / 2.0)
            opt.step()
            sched.step()
        for s in range(total):
            want = hf(s + 1) if s < warmup else hf(s)
            assert got[s] == pytest.approx(want, abs=1e-12), (total, ratio, s)
        assert opt.param_groups[0]["lr"] == 0.0  # at total_steps: decayed to 0


# ----------------------------------------------------------------------------- a whole update


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_stepper_updates_are_loss_sum_clip_adamw_and_schedule(clip):
    """Four mixed steps of Stepper.step against the algorithm written out: the gradient of the SUM of the
    task losses, clip_grad_norm_ on it (the global norm over every trainable parameter, heads included),
    torch's AdamW on the documented groups, the rate of transformers' linear schedule (no warm-up)."""
    total = 6
    cfg = config(max_grad_norm=clip, weight_decay=0.1, lr=5e-3)
    ours_model, ref_model = tiny_model(), tiny_model()
    stepper = Stepper.build(ours_model, cfg, total)
    ref = ref_adamw(ref_model, cfg.lr, cfg.weight_decay)
    hf = hf_lambda(total, 0)
    sched = torch.optim.lr_scheduler.LambdaLR(ref, hf)
    norms = []
    for s in range(4):
        bs = task_batches(seed=s)
        assert stepper.step(bs, s) is not None
        ref.zero_grad(set_to_none=True)
        sum(ref_loss(ref_model, b) for b in bs).backward()
        params = [p for p in ref_model.parameters() if p.requires_grad]
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)))
        ref.step()
        sched.step()
        for (n, p), (_, q) in zip(ours_model.named_parameters(), ref_model.named_parameters()):
            if n.endswith("qkv.bias"):  # the key bias cancels in the softmax: its gradient is rounding noise,
                p, q = torch.cat([p[:H], p[2 * H:]]), torch.cat([q[:H], q[2 * H:]])  # which Adam amplifies
            torch.testing.assert_close(p, q, rtol=1e-4, atol=2e-6, msg=f"step {s}: {n}")
        assert stepper.lr == pytest.approx(cfg.lr * hf(s), rel=1e-12)  # the rate this update ran at
    if clip:
        assert all(n > clip for n in norms)  # clipping was active on every step


def test_accumulation_of_mixed_steps_is_one_batch_k_times_larger():
    """--grad-accum-steps k over mixed steps (each a batch of every task) against one step whose task batches
    hold all k*b examples: the gradient the optimiser steps on (clipped, global) and the reported losses."""
    k = 3
    micro = [task_batches(seed=10 + i, B=3) for i in range(k)]
    big = [cat_batches([m[t] for m in micro]) for t in range(3)]
    grads, parts = [], []
    for run in ("accum", "big"):
        model = tiny_model(seed=2)
        stepper = Stepper.build(model, config(max_grad_norm=0.3, grad_accum_steps=k if run == "accum" else 1), 10)
        seen = []
        step = stepper.optimizer.step
        stepper.optimizer.step = lambda: seen.append([p.grad.clone() for p in model.parameters()]) or step()
        parts.append(stepper.accumulated_step(micro, 0) if run == "accum" else stepper.step(big, 0))
        grads.append(seen[0])
    for g, h in zip(*grads):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-7)
    for task in ("sst", "para", "sts"):
        assert parts[0][task]["loss"] == pytest.approx(parts[1][task]["loss"], rel=1e-5)


# ----------------------------------------------------------------------------- PCGrad


def pcgrad_paper(G: np.ndarray, orders: list[list[int]]) -> np.ndarray:
    """Yu et al. 2020, Algorithm 1: g_i^PC starts at g_i; for each j != i in order, if g_i^PC . g_j < 0 (g_j the
    ORIGINAL gradient) subtract (g_i^PC . g_j / ||g_j||^2) g_j; the update is sum_i g_i^PC."""
    out = np.zeros(G.shape[1])
    for i, order in enumerate(orders):
        gi = G[i].copy()
        for j in order:
            d = gi @ G[j]
            if d < 0 and G[j] @ G[j] > 0:
                gi -= d / (G[j] @ G[j]) * G[j]
        out += gi
    return out


def test_pcgrad_surgery_is_algorithm_1_in_some_random_order():
    """surgery() on 3 conflicting task gradients equals Algorithm 1 for one choice of order per task (all 8
    enumerated, our transcription), and across generator seeds more than one choice occurs (the order is
    random, not fixed)."""
    G = np.array([[1.0, 0.2, -0.5, 0.3], [-0.8, 1.0, 0.4, -0.2], [0.3, -1.1, 0.9, 0.5]])
    assert sum((G[i] @ G[j]) < 0 for i in range(3) for j in range(i + 1, 3)) >= 2
    perms = [list(itertools.permutations([j for j in range(3) if j != i])) for i in range(3)]
    candidates = {choice: pcgrad_paper(G, [list(o) for o in choice]) for choice in itertools.product(*perms)}
    distinct = {tuple(np.round(v, 9)) for v in candidates.values()}
    assert len(distinct) > 1  # the order matters for this G
    hits = set()
    for seed in range(12):
        got, _ = surgery(torch.tensor(G), "pcgrad", torch.Generator().manual_seed(seed))
        match = [c for c, v in candidates.items() if np.allclose(got.numpy(), v, rtol=0, atol=1e-12)]
        assert match, f"seed {seed}: {got.numpy()} is Algorithm 1 in no order"
        hits.add(tuple(np.round(candidates[match[0]], 9)))
    assert len(hits) > 1


# ----------------------------------------------------------------------------- LoRA against peft


class _FixedMask(torch.nn.Module):
    """A dropout with a fixed mask (scaled by 1 / (1 - p)), the same in both implementations."""

    def __init__(self, mask: torch.Tensor, p: float):
        super().__init__()
        self.mask, self.p = mask, p

    def forward(self, x):
        return x * self.mask / (1 - self.p) if self.training else x


def test_lora_with_alpha_and_dropout_equals_peft_and_its_merge():
    """One adapted Linear against peft.LoraConfig(r=4, lora_alpha=12, lora_dropout=0.3) on the same base and
    factors: the scale alpha / r = 3, the dropout on the LoRA input only (the base path sees x undropped),
    in train mode with one fixed mask in both; the gradients of A and B; and the merged weight against
    peft's merge_and_unload."""
    peft = pytest.importorskip("peft")
    from minbert.lora import LoRALinear

    torch.manual_seed(0)
    base = torch.nn.Linear(6, 5)
    holder = torch.nn.Sequential(copy.deepcopy(base))
    ours = LoRALinear(base, [(0, 5)], r=4, alpha=12.0, dropout=0.3)
    with torch.no_grad():
        ours.lora_B[0].normal_()
    wrapped = peft.get_peft_model(holder, peft.LoraConfig(r=4, lora_alpha=12, lora_dropout=0.3, target_modules=["0"]))
    theirs = wrapped.get_submodule("base_model.model.0")
    with torch.no_grad():
        theirs.lora_A["default"].weight.copy_(ours.lora_A[0])
        theirs.lora_B["default"].weight.copy_(ours.lora_B[0])
    x = torch.randn(3, 6)
    mask = (torch.rand(3, 6, generator=torch.Generator().manual_seed(5)) > 0.3).float()
    ours.lora_drop = _FixedMask(mask, 0.3)
    theirs.lora_dropout["default"] = _FixedMask(mask, 0.3)
    ours.train()
    wrapped.train()
    y_ours, y_theirs = ours(x), wrapped(x)
    torch.testing.assert_close(y_ours, y_theirs, rtol=0, atol=1e-6)
    w = torch.randn(3, 5)
    (y_ours * w).sum().backward()
    (y_theirs * w).sum().backward()
    torch.testing.assert_close(ours.lora_A[0].grad, theirs.lora_A["default"].weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.lora_B[0].grad, theirs.lora_B["default"].weight.grad, rtol=1e-5, atol=1e-6)
    merged = wrapped.merge_and_unload()[0].weight
    torch.testing.assert_close(ours.weight + ours.delta(), merged, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- BitFit and freezing


@pytest.mark.parametrize("upto", [None, 1])
def test_bitfit_trains_exactly_the_biases_and_frozen_ones_stay(upto):
    """--peft bitfit: the trainable set is, written from the definition, every encoder bias (LayerNorm's beta
    included, not its gamma) above the frozen prefix, plus the pooler and the heads. After three steps at
    weight decay 0.1 nothing else moved (bit for bit), has a gradient or has optimiser state."""
    from training.methods.peft import apply_peft

    model = tiny_model()
    model.freeze(upto)
    apply_peft(model, "bitfit", model.first_trainable_layer, 0)
    frozen_prefix = ("encoder.embeddings.",) + tuple(f"encoder.layers.{i}." for i in range(max(upto or 0, 0)))
    frozen_prefix = frozen_prefix if upto is not None else ()
    want = {n for n, _ in model.named_parameters()
            if n.startswith(("heads.", "encoder.pooler."))
            or (n.endswith(".bias") and not (frozen_prefix and n.startswith(frozen_prefix)))}
    got = {n for n, p in model.named_parameters() if p.requires_grad}
    assert got == want
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stepper = Stepper.build(model, config(weight_decay=0.1, max_grad_norm=1.0), 5)
    for s in range(3):
        assert stepper.step(task_batches(seed=s), s) is not None
        for n, p in model.named_parameters():
            assert (p.grad is None) or n in want, n
    for n, p in model.named_parameters():
        if n not in want:  # frozen: bit-identical, no optimiser state
            assert torch.equal(p, before[n]) and p not in stepper.optimizer.state, n
        else:
            assert p in stepper.optimizer.state, n
    assert sum(not torch.equal(p, before[n]) for n, p in model.named_parameters()) >= len(want) - 2


# ----------------------------------------------------------------------------- SMART's teacher in the loop


def test_smart_teacher_is_momentum_average_with_the_beta_switch_in_the_loop():
    """Stepper with --smart (mu only, lambda 0): after each update the teacher equals
    t <- beta t + (1 - beta) theta over the student's weights as they were after that update, beta 0.99 for
    the first 10% of the total updates and 0.999 after, recomputed here from snapshots of the student."""
    total = 20
    model = tiny_model()
    stepper = Stepper.build(model, config(smart=True, smart_lambda=0.0, smart_mu=1.0, lr=5e-2), total)
    ref = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    for s in range(4):
        assert stepper.step(task_batches(seed=s)[:1], s) is not None
        beta = 0.99 if s < 0.1 * total else 0.999
        for n, p in model.named_parameters():
            ref[n] = beta * ref[n] + (1 - beta) * p.detach().double()
    teacher = dict(stepper.teacher.module.named_parameters())
    moved = 0
    for n, p in model.named_parameters():
        torch.testing.assert_close(teacher[n].double(), ref[n], rtol=0, atol=1e-6, msg=n)
        moved += not torch.equal(teacher[n], p)
    assert moved > 0


def test_smart_reference_mode_differentiates_the_clean_side_in_the_stepper(monkeypatch):
    """MT-DNN's final SymKlCriterion(clean, adv) takes the gradient through the clean logits too
    (mt_dnn/model.py passes the training forward's logits). With the trainer's defaults (reference mode,
    --smart-adv-dropout off) the Stepper's clean target carries a graph, as there. (docs/smart.md still says
    this target is computed under torch.no_grad() and gets no gradient: that sentence is stale.)"""
    import training.methods.smart as smart

    seen = []
    original = smart.reference_divergence
    monkeypatch.setattr(smart, "reference_divergence",
                        lambda adv, clean, kind: seen.append(clean.requires_grad) or original(adv, clean, kind))
    stepper = Stepper.build(tiny_model(), config(smart=True, smart_mu=0.0), 5)
    assert stepper.smart.perturbation == "reference" and not stepper.smart.adv_dropout
    stepper.loss_terms(task_batches()[0])
    assert seen == [True]
