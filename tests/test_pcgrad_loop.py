"""PCGrad through the training loop: one mixed step of `Stepper` on a tiny random BERT.

The gradients the optimizer sees are captured at `optimizer.step` (max_grad_norm=0: no
clipping) and compared with surgery recomputed here, from per-task gradients taken with
torch.autograd.grad and a projection written independently of training.methods.pcgrad. All dropout is
off (model config, head_dropout=0), so every forward is deterministic.
"""
import pytest
import torch

from data.batching import encode_task
from data.loaders import Example
from heads import task_loss
from training.config.train_config import TrainConfig
from training.methods.stepper import Stepper
from training.run.build import build_model, schedule_for_epoch

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s"]
WORDS = ["the", "cat", "sat", "on", "mat", "cats", "mats"]
CPU = torch.device("cpu")
T64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")




def _sentence(rng) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(int(rng.integers(2, 9))))


def _train_data(tokenizer, n=6, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    data = {}
    for task in ("sst", "para", "sts"):
        exs = []
        for i in range(n):
            label = {"sst": int(rng.integers(0, 5)), "para": int(rng.integers(0, 2)),
                     "sts": float(rng.uniform(0, 5))}[task]
            exs.append(Example(f"{task}{i}", _sentence(rng), None if task == "sst" else _sentence(rng), label))
        data[task] = encode_task(task, exs, tokenizer)
    return data


def _setup(ckpt, device=CPU, **kw):
    """The model, its Stepper and one mixed step's three task batches, on `device` (test_cuda.py: cuda)."""
    cfg = TrainConfig(model=str(ckpt), head_dropout=0.0, device=str(device), precision="fp32", max_grad_norm=0.0,
                      task_sampling="mixed", batch_size=18, lr=1e-3, warmup_ratio=0.0, seed=3, **kw)
    model, tok, _ = build_model(cfg)
    model.to(device)
    stepper = Stepper.build(model, cfg, 10, device)
    from data.batching import make_batch
    train = _train_data(tok)
    tbs = schedule_for_epoch(cfg, train, 0)[0]
    batches = [make_batch(train[tb.task], tb.indices, tok).to(device) for tb in tbs]
    assert [b.task for b in batches] == ["sst", "para", "sts"]  # one mixed step, three task groups
    return cfg, model, stepper, batches


def _capture(stepper):
    """Record every parameter's .grad as the optimizer step begins (a step pre-hook)."""
    seen = {}

    def hook(opt, args, kwargs):
        for n, p in stepper.model.named_parameters():
            seen[n] = None if p.grad is None else p.grad.detach().clone()

    stepper.optimizer.register_step_pre_hook(hook)
    return seen


def _task_grads(model, batches):
    """Per task: {param name: gradient of that task's loss alone} over trainable params."""
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    out = {}
    for b in batches:
        loss = task_loss(b.task, model(b.task, b.inputs), b.labels)
        used = [(n, p) for n, p in named if not n.startswith("heads.") or n.startswith(f"heads.{b.task}.")]
        grads = torch.autograd.grad(loss, [p for _, p in used])
        out[b.task] = {n: g.detach() for (n, _), g in zip(used, grads)}
    return out


def _shared_names(model):
    return [n for n, p in model.named_parameters() if n.startswith("encoder.") and p.requires_grad]


def _flat(task_grads, names):
    return torch.stack([torch.cat([task_grads[t][n].reshape(-1).to(T64) for n in names]) for t in task_grads])


# --------------------------------------------------------------- reference surgery (independent)

def ref_pcgrad(G, orders):
    """Yu et al. Algorithm 1: each g_i projected, in orders[i], off the ORIGINAL g_j it conflicts with."""
    out = []
    for i in range(G.shape[0]):
        gi = G[i].clone()
        for j in orders[i]:
            if j == i or not G[j].abs().sum() > 0:
                continue
            c = torch.dot(gi, G[j])
            if c < 0:
                gi = gi - c / torch.dot(G[j], G[j]) * G[j]
        out.append(gi)
    return torch.stack(out).sum(0)


def ref_dominant(G):
    norms = G.norm(dim=1)
    d = int(norms.argmax())
    total = G[d].clone()
    for i in range(G.shape[0]):
        if i == d:
            continue
        c = torch.dot(G[i], G[d])
        total += G[i] - c / torch.dot(G[d], G[d]) * G[d] if c < 0 else G[i]
    return total


def _conflicts(G):
    dots = G @ G.T
    return int((dots.triu(1) < 0).sum())


def _check_heads(seen, ref, model):
    for t in ("sst", "para", "sts"):
        for n, _ in model.heads[t].named_parameters():
            torch.testing.assert_close(seen[f"heads.{t}.{n}"], ref[t][f"heads.{t}.{n}"], rtol=1e-5, atol=1e-7)


def _check_shared(seen, names, want):
    got = torch.cat([seen[n].reshape(-1).to(T64) for n in names])
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale)


# --------------------------------------------------------------- tests

@pytest.mark.parametrize("variant", ["pcgrad", "dominant"])
def test_mixed_step_grads_are_the_surgery_of_task_grads(tiny_ckpt, variant):
    check_surgery(variant, *_setup(tiny_ckpt, pcgrad=True, pcgrad_variant=variant))


def check_surgery(variant, cfg, model, stepper, batches):
    """The gradients the optimizer sees after one mixed PCGrad step are the surgery, recomputed here,
    of the per-task gradients; the heads keep their own. `_setup(..., pcgrad=True)` on any device."""
    ref = _task_grads(model, batches)  # before the step changes the weights
    names = _shared_names(model)
    G = _flat(ref, names)
    assert _conflicts(G) >= 1, "the fixture must have conflicting task gradients, or surgery is a no-op"
    if variant == "pcgrad":
        gen = torch.Generator().manual_seed(cfg.seed)  # PCGrad's own seeded order, drawn per task
        want = ref_pcgrad(G, [torch.randperm(3, generator=gen).tolist() for _ in range(3)])
    else:
        want = ref_dominant(G)
    assert (want - G.sum(0)).abs().max() > 1e-3 * want.abs().max()  # surgery really changed something

    seen = _capture(stepper)
    parts = stepper.step(batches, 0)
    assert parts is not None and set(parts) == {"sst", "para", "sts"}
    assert parts["sst"]["pcgrad_conflict"] == pytest.approx(_conflicts(G) / 3)
    _check_shared(seen, names, want)
    _check_heads(seen, ref, model)


def test_two_tasks_pcgrad_order_free(tiny_ckpt):
    """With two tasks the order cannot matter: (g1 - proj_g2 g1) + (g2 - proj_g1 g2), written out."""
    cfg, model, stepper, batches = _setup(tiny_ckpt, pcgrad=True)
    batches = [b for b in batches if b.task != "para"]
    ref = _task_grads(model, batches)
    names = _shared_names(model)
    g1, g2 = _flat(ref, names)
    c = torch.dot(g1, g2)
    assert c < 0  # sst and sts conflict in this fixture
    want = (g1 - c / torch.dot(g2, g2) * g2) + (g2 - c / torch.dot(g1, g1) * g1)
    seen = _capture(stepper)
    parts = stepper.step(batches, 0)
    assert parts["sst"]["pcgrad_conflict"] == 1.0
    _check_shared(seen, names, want)
    for t in ("sst", "sts"):
        for n, _ in model.heads[t].named_parameters():
            torch.testing.assert_close(seen[f"heads.{t}.{n}"], ref[t][f"heads.{t}.{n}"], rtol=1e-5, atol=1e-7)
    assert all(seen[f"heads.para.{n}"] is None for n, _ in model.heads["para"].named_parameters())


@pytest.mark.parametrize("variant", ["pcgrad", "dominant"])
def test_frozen_params_excluded(tiny_ckpt, variant):
    cfg, model, stepper, batches = _setup(tiny_ckpt, pcgrad=True, pcgrad_variant=variant, freeze_upto=1)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith(("encoder.embeddings.", "encoder.layers.0.")) for n in frozen)
    names = _shared_names(model)
    assert [id(p) for p in stepper.pcgrad.params] == [id(p) for n, p in model.named_parameters() if n in names]
    ref = _task_grads(model, batches)
    G = _flat(ref, names)
    assert _conflicts(G) == 3
    if variant == "pcgrad":
        gen = torch.Generator().manual_seed(cfg.seed)
        want = ref_pcgrad(G, [torch.randperm(3, generator=gen).tolist() for _ in range(3)])
        # here the order matters: Algorithm 1 with every task in index order gives another update
        other = ref_pcgrad(G, [[0, 1, 2]] * 3)
        assert (other - want).abs().max() > 1e-2 * want.abs().max()
    else:
        want = ref_dominant(G)
    seen = _capture(stepper)
    stepper.step(batches, 0)
    assert all(seen[n] is None for n in frozen)
    _check_shared(seen, names, want)
    _check_heads(seen, ref, model)


def test_without_pcgrad_mixed_step_is_plain_sum(tiny_ckpt):
    cfg, model, stepper, batches = _setup(tiny_ckpt, pcgrad=False)
    assert stepper.pcgrad is None
    ref = _task_grads(model, batches)
    names = _shared_names(model)
    seen = _capture(stepper)
    stepper.step(batches, 0)
    _check_shared(seen, names, _flat(ref, names).sum(0))
    _check_heads(seen, ref, model)


def test_the_trainers_mixed_steps_are_length_bucketed(course_data_dir):
    """--pcgrad's mixed steps, as the trainer builds them from the course files: every task in every
    step, and little padding (0.53 of the tokens were real before the steps were bucketed)."""
    from data.sampler import padding_efficiency
    from minbert import Tokenizer, resolve_checkpoint
    from training.run.build import load_data

    cfg = TrainConfig(data_dir=str(course_data_dir), pcgrad=True, max_train_examples=2000, seed=3)
    assert cfg.task_sampling == "mixed"
    train = load_data(cfg, Tokenizer.from_checkpoint(resolve_checkpoint(cfg.model))).train
    lengths = {t: d.lengths for t, d in train.items()}
    bucketed = schedule_for_epoch(cfg, train, 0)
    assert all([tb.task for tb in step] == ["sst", "para", "sts"] for step in bucketed)
    assert padding_efficiency([tb for step in bucketed for tb in step], lengths) >= 0.9
    unbucketed = schedule_for_epoch(TrainConfig(**{**cfg.to_dict(), "bucket": False}), train, 0)
    assert padding_efficiency([tb for step in unbucketed for tb in step], lengths) < 0.7
