"""SMART through the training loop: `Stepper` with smart=True on a tiny random BERT.

The objective is recomputed here from the public pieces (perturb with a cloned generator, the
teacher's own forward); the EMA teacher is checked against beta * t + (1 - beta) * theta; the
perturbation point is read off the inputs handed to adversarial_loss. Dropout is off everywhere
(model config and head_dropout=0), so every forward is deterministic.
"""
import numpy as np
import pytest
import torch

import training.methods.smart as smart_mod
import training.methods.stepper as stepper_mod
from data.batching import encode_task, make_batch
from data.loaders import Example
from heads import KIND, task_loss
from training.config.train_config import TrainConfig
from training.methods.smart import perturb, smoothness_loss
from training.methods.stepper import Stepper
from training.run.build import build_model

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s"]
WORDS = ["the", "cat", "sat", "on", "mat", "cats", "mats"]
CPU = torch.device("cpu")
# A big ball, so R_s is far above float32 rounding of the task loss and the check can see it.
BIG_BALL = dict(smart_eps=0.5, smart_step_size=0.5, smart_noise_var=0.05)


pytestmark = pytest.mark.usefixtures("one_thread")




def _batches(tokenizer, n=5, seed=0):
    """One batch per task (sst, para, sts), with padding."""
    rng = np.random.default_rng(seed)
    sent = lambda: " ".join(rng.choice(WORDS) for _ in range(int(rng.integers(2, 9))))  # noqa: E731
    out = []
    for task in ("sst", "para", "sts"):
        exs = [Example(f"{task}{i}", sent(), None if task == "sst" else sent(),
                       {"sst": int(rng.integers(0, 5)), "para": int(rng.integers(0, 2)),
                        "sts": float(rng.uniform(0, 5))}[task]) for i in range(n)]
        out.append(make_batch(encode_task(task, exs, tokenizer), list(range(n)), tokenizer))
    return out


def _setup(ckpt, total_steps=1000, device=CPU, **kw):
    """The model, its Stepper and one batch per task, all on `device` (test_cuda.py passes cuda)."""
    base = dict(model=str(ckpt), head_dropout=0.0, device=str(device), precision="fp32", max_grad_norm=0.0,
                lr=1e-2, warmup_ratio=0.0, seed=5)
    cfg = TrainConfig(**{**base, **kw})
    model, tok, _ = build_model(cfg)
    model.to(device)
    stepper = Stepper.build(model, cfg, total_steps, device)
    return cfg, model, stepper, [b.to(device) for b in _batches(tok)]


def _capture_grads(stepper):
    seen = {}

    def hook(opt, args, kwargs):
        seen.clear()
        seen.update({n: None if p.grad is None else p.grad.detach().clone()
                     for n, p in stepper.model.named_parameters()})

    stepper.optimizer.register_step_pre_hook(hook)
    return seen


def _record_losses(stepper):
    """Wrap Stepper.task_loss to keep the loss tensors the step backpropagates."""
    losses = []
    orig = stepper.task_loss

    def wrapped(batch):
        loss, parts = orig(batch)
        losses.append((batch.task, loss.detach().clone(), parts))
        return loss, parts

    stepper.task_loss = wrapped
    return losses


def test_step_loss_is_task_plus_lambda_rs_plus_mu_breg(tiny_ckpt):
    check_step_objective(*_setup(tiny_ckpt, smart=True, smart_lambda=3.0, smart_mu=2.0, **BIG_BALL))


def check_step_objective(cfg, model, stepper, batches):
    """Each task's loss in a SMART step is L + 3 R_s + 2 D_Breg, every term recomputed here from the
    public pieces. `_setup(..., smart_lambda=3.0, smart_mu=2.0, **BIG_BALL)` on any device."""
    assert stepper.step(batches, 0) is not None  # one update, so the teacher differs from the model
    scfg = stepper.smart
    assert (scfg.lambda_s, scfg.mu, scfg.eps) == (3.0, 2.0, 0.5)

    gen = torch.Generator(device=stepper.generator.device).set_state(stepper.generator.get_state().clone())
    want = []
    model.train()
    for b in batches:  # the step consumes the generator in batch order
        masks = [s["attention_mask"] for s in b.inputs]
        f = lambda xs, b=b, masks=masks: model.from_hidden(b.task, list(xs), masks, 0)  # noqa: E731
        hs = tuple(model.hidden_at(b.inputs, 0))
        clean = f(hs)
        L = task_loss(b.task, clean, b.labels).item()
        deltas = perturb(f, hs, clean, KIND[b.task], scfg, masks=tuple(masks), generator=gen)
        with torch.no_grad():
            r_s = smoothness_loss(f(tuple(h + d for h, d in zip(hs, deltas))), clean, KIND[b.task]).item()
            d_breg = smoothness_loss(clean, stepper.teacher.module(b.task, b.inputs), KIND[b.task]).item()
        want.append((b.task, L, r_s, d_breg))

    losses = _record_losses(stepper)
    assert stepper.step(batches, 1) is not None
    assert [t for t, _, _ in losses] == ["sst", "para", "sts"]
    for (task, loss, parts), (_, L, r_s, d_breg) in zip(losses, want):
        assert r_s > 1e-5 and d_breg > 1e-5, task  # both terms are well above float32 rounding of L
        assert parts["loss"] == pytest.approx(L, rel=1e-6)
        assert parts["r_s"] == pytest.approx(r_s, rel=1e-3, abs=1e-9)
        assert parts["d_breg"] == pytest.approx(d_breg, rel=1e-3, abs=1e-9)
        assert loss.item() == pytest.approx(L + 3.0 * r_s + 2.0 * d_breg, rel=1e-6)
        # the regularisers' share alone, so a wrong weight (or a missing term) cannot hide in L
        assert loss.item() - parts["loss"] == pytest.approx(3.0 * r_s + 2.0 * d_breg, rel=2e-2)


def test_teacher_is_ema_after_each_step_and_gets_no_grads(tiny_ckpt):
    # total_steps=10: updates 0 uses beta (0.9 here), later ones beta_late (0.999) after 10% of 10
    cfg, model, stepper, batches = _setup(tiny_ckpt, total_steps=10, smart=True, smart_beta=0.9)
    teacher = stepper.teacher.module
    names = ["heads.sst.mlp.1.weight", "encoder.layers.1.qkv.weight"]
    for step, beta in ((0, 0.9), (1, 0.999)):
        before = {n: dict(teacher.named_parameters())[n].detach().clone() for n in names}
        stepper.step(batches, step)
        after_model = dict(model.named_parameters())
        for n in names:
            got = dict(teacher.named_parameters())[n]
            want = beta * before[n] + (1 - beta) * after_model[n].detach()
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
            assert not torch.equal(got, before[n])  # it really moved
    assert stepper.teacher.num_updates == 2
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    opt_ids = {id(p) for g in stepper.optimizer.param_groups for p in g["params"]}
    assert not opt_ids & {id(p) for p in teacher.parameters()}


@pytest.mark.parametrize("where, layer", [("first-trainable", 1), ("embeddings", 0)])
def test_perturbation_point(tiny_ckpt, monkeypatch, where, layer):
    cfg, model, stepper, batches = _setup(tiny_ckpt, smart=True, freeze_upto=1, smart_perturb_at=where)
    assert model.first_trainable_layer == 1
    model.train()
    with torch.no_grad():
        expected = [model.hidden_at(b.inputs, layer) for b in batches]
    seen = []
    orig = smart_mod.adversarial_loss

    def spy(fn, inputs, clean, kind, cfg, masks=None, generator=None):
        seen.append([x.detach().clone() for x in inputs])
        return orig(fn, inputs, clean, kind, cfg, masks=masks, generator=generator)

    monkeypatch.setattr(stepper_mod, "adversarial_loss", spy)
    grads = _capture_grads(stepper)
    assert stepper.step(batches, 0) is not None
    assert len(seen) == len(batches)
    for got, want in zip(seen, expected):
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    # the other layer's input is a different tensor: the check above tells the two apart
    other = model.hidden_at(batches[0].inputs, 1 - layer)[0]
    assert not torch.allclose(seen[0][0], other, atol=1e-3)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(grads[n] is None for n in frozen)


def test_zero_weights_give_the_plain_gradients(tiny_ckpt):
    _, _, plain, batches = _setup(tiny_ckpt, smart=False)
    _, _, smart, _ = _setup(tiny_ckpt, smart=True, smart_lambda=0.0, smart_mu=0.0, **BIG_BALL)
    g_plain, g_smart = _capture_grads(plain), _capture_grads(smart)
    for step in range(2):  # the second step also compares the updated weights' gradients
        plain.step(batches, step)
        smart.step(batches, step)
        assert g_plain.keys() == g_smart.keys()
        for n in g_plain:
            if g_plain[n] is None:
                assert g_smart[n] is None, n
            else:
                torch.testing.assert_close(g_smart[n], g_plain[n], rtol=1e-5, atol=1e-7, msg=n)


def test_lambda_zero_skips_the_adversarial_passes(tiny_ckpt, monkeypatch):
    """--smart-lambda 0 is the Bregman term alone: its loss is L + mu * D_Breg, with no R_s pass run."""
    calls = []
    monkeypatch.setattr(stepper_mod, "adversarial_loss", lambda *a, **k: calls.append(1))
    _, _, stepper, batches = _setup(tiny_ckpt, smart=True, smart_lambda=0.0, smart_mu=2.0, **BIG_BALL)
    losses = _record_losses(stepper)
    for step in range(2):  # at step 0 the teacher is the student and D_Breg is 0
        parts = stepper.step(batches, step)
    assert calls == []
    for task, loss, p in losses[-3:]:
        assert "r_s" not in p and p["d_breg"] > 0, (task, p)
        assert loss.item() == pytest.approx(p["loss"] + 2.0 * p["d_breg"], rel=1e-6)
    assert set(parts) == {"sst", "para", "sts"}


def test_mu_zero_skips_the_teacher(tiny_ckpt):
    _, _, stepper, batches = _setup(tiny_ckpt, smart=True, smart_lambda=1.0, smart_mu=0.0, **BIG_BALL)
    calls = []
    stepper.teacher.module.register_forward_pre_hook(lambda *a: calls.append(1))
    for step in range(2):
        parts = stepper.step(batches, step)
    assert calls == []
    assert all("d_breg" not in p and p["r_s"] > 0 for p in parts.values()), parts


def test_zero_ball_gives_zero_rs_with_dropout_on(tiny_ckpt):
    """delta == 0 (eps = step = noise = 0): f(x + delta) is f(x), so R_s must be exactly 0."""
    _, _, stepper, batches = _setup(tiny_ckpt, smart=True, head_dropout=0.3, smart_eps=0.0, smart_step_size=0.0,
                                    smart_noise_var=0.0)
    parts = stepper.step(batches, 0)
    assert all(parts[t]["r_s"] == 0.0 for t in parts), {t: parts[t]["r_s"] for t in parts}


@pytest.mark.parametrize("task_index", [0, 1, 2])
def test_rs_under_bf16_autocast_is_the_fp32_value(tiny_ckpt, task_index):
    """The paper mode's ball (noise 1e-5, step 1e-3) is far below bf16's resolution: under bf16 autocast
    R_s must still be computed in fp32, or it measures rounding flips (1e-6 where fp32 gives 1e-12)."""
    rs = {}
    for dtype in (None, torch.bfloat16):
        torch.manual_seed(0)
        _, model, stepper, batches = _setup(tiny_ckpt, smart=True, smart_perturbation="paper")
        stepper.amp_dtype = dtype
        with stepper.autocast():
            _, parts = stepper.task_loss(batches[task_index])
        rs[dtype] = parts["r_s"]
    assert 0 < rs[None] < 1e-6  # tiny, as it should be
    assert rs[torch.bfloat16] == pytest.approx(rs[None], rel=0.2, abs=0)
