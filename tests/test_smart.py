"""SMART: divergences vs scipy, the eps ball, the ascent direction vs finite differences, gradient
isolation, the EMA teacher vs hand computation, and the whole objective vs a numpy closed form."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats
from torch import nn

from training.methods.smart import (
    EMATeacher,
    SmartConfig,
    adversarial_loss,
    bregman_loss,
    dropout_disabled,
    perturb,
    smoothness_loss,
    symmetric_kl,
)

D64 = torch.float64


def _sym_kl_scipy(p: np.ndarray, q: np.ndarray) -> float:
    return float(stats.entropy(p, q) + stats.entropy(q, p))


# ----------------------------------------------------------------------------- divergences


def test_symmetric_kl_categorical_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 5)) * 3, rng.normal(size=(6, 5)) * 3
    want = np.mean([_sym_kl_scipy(special.softmax(x), special.softmax(y)) for x, y in zip(a, b)])
    got = symmetric_kl(torch.tensor(a), torch.tensor(b), "categorical").item()
    assert got == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("shape", [(7,), (7, 1)])
def test_symmetric_kl_bernoulli_matches_scipy(shape):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=7) * 4, rng.normal(size=7) * 4
    pa, pb = special.expit(a), special.expit(b)
    want = np.mean([_sym_kl_scipy([x, 1 - x], [y, 1 - y]) for x, y in zip(pa, pb)])
    got = symmetric_kl(torch.tensor(a).view(shape), torch.tensor(b).view(shape), "bernoulli").item()
    assert got == pytest.approx(want, rel=1e-10)


def test_symmetric_kl_stable_for_extreme_logits():
    # Closed forms: Bernoulli symKL = (sigmoid(a) - sigmoid(b)) * (a - b); a two-class softmax is
    # a Bernoulli of the logit difference.
    a = torch.tensor([60.0, -80.0, 30.0], dtype=D64)
    b = torch.tensor([-70.0, 90.0, 29.0], dtype=D64)
    want = ((torch.sigmoid(a) - torch.sigmoid(b)) * (a - b)).mean().item()
    assert symmetric_kl(a, b, "bernoulli").item() == pytest.approx(want, rel=1e-12)
    za, zb = torch.stack([a, torch.zeros_like(a)], -1), torch.stack([b, torch.zeros_like(b)], -1)
    assert symmetric_kl(za, zb, "categorical").item() == pytest.approx(want, rel=1e-12)
    big = torch.tensor([[1e4, -1e4, 0.0]]), torch.tensor([[-1e4, 1e4, 0.0]])
    assert torch.isfinite(symmetric_kl(*big, "categorical"))


logit_rows = st.lists(st.floats(-30, 30), min_size=4, max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(logit_rows, logit_rows), min_size=1, max_size=4))
def test_symmetric_kl_properties(rows):
    a = torch.tensor([r[0] for r in rows], dtype=D64)
    b = torch.tensor([r[1] for r in rows], dtype=D64)
    for kind, x, y in [("categorical", a, b), ("bernoulli", a[:, 0], b[:, 0])]:
        ab, ba = symmetric_kl(x, y, kind), symmetric_kl(y, x, kind)
        assert ab.item() >= 0.0
        assert ab.item() == ba.item()
        assert symmetric_kl(x, x, kind).item() == 0.0


def test_smoothness_loss_regression_is_mse():
    a, b = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.5, 2.0, 1.0])
    assert smoothness_loss(a, b, "regression").item() == pytest.approx((0.25 + 0 + 9) / 3)


def test_bad_kind_and_config_rejected():
    with pytest.raises(ValueError):
        symmetric_kl(torch.zeros(2, 3), torch.zeros(2, 3), "regression")
    with pytest.raises(ValueError):
        SmartConfig(norm="l1")
    with pytest.raises(ValueError):
        SmartConfig(steps=0)


# ----------------------------------------------------------------------------- toy models


class TanhNet(nn.Module):
    """Hand-set linear+tanh+linear on a flattened (T=3, H=2) input: 3 logits."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(6, 4, dtype=D64), nn.Linear(4, 3, dtype=D64)
        with torch.no_grad():
            self.l1.weight.copy_(torch.linspace(-1.5, 1.3, 24, dtype=D64).view(4, 6).sin() * 2)
            self.l1.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
            self.l2.weight.copy_(torch.linspace(-2.0, 2.2, 12, dtype=D64).view(3, 4).cos() * 1.5)
            self.l2.bias.copy_(torch.tensor([0.0, 0.5, -0.5]))

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x.flatten(1))))


def _toy_x(b=4, seed=0):
    return torch.randn(b, 3, 2, generator=torch.Generator().manual_seed(seed), dtype=D64)


def _noise(shape, std, seed):
    """delta_0 as the module draws it: one randn per input from a fresh seeded generator."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=D64) * std


# ----------------------------------------------------------------------------- eps ball


@pytest.mark.parametrize("norm", ["inf", "l2"])
@pytest.mark.parametrize("steps", [1, 2, 5])
@pytest.mark.parametrize("step_size", [1e-3, 0.1, 3.0])
@pytest.mark.parametrize("eps", [1e-5, 0.05])
def test_perturbation_stays_in_eps_ball(norm, steps, step_size, eps):
    net, x = TanhNet(), _toy_x()
    x2 = _toy_x(seed=1)
    fn = lambda xs: net(xs[0]) + net(xs[1])  # a siamese pair: two perturbed inputs
    cfg = SmartConfig(eps=eps, step_size=step_size, noise_std=0.1, steps=steps, norm=norm)
    deltas = perturb(fn, (x, x2), fn((x, x2)), "categorical", cfg, generator=torch.Generator().manual_seed(3))
    assert len(deltas) == 2
    for d in deltas:
        flat = d.flatten(1)
        size = flat.abs().amax(1) if norm == "inf" else flat.norm(dim=1)
        assert (size <= eps * (1 + 1e-12)).all()
        if step_size >= 0.1:  # big steps must actually reach the boundary
            assert torch.allclose(size, torch.full_like(size, eps), rtol=1e-9)


@pytest.mark.parametrize("norm", ["inf", "l2"])
def test_padding_positions_not_perturbed(norm):
    net, x = TanhNet(), _toy_x()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
    cfg = SmartConfig(eps=0.1, step_size=0.05, noise_std=0.1, steps=3, norm=norm)
    fn = lambda xs: net(xs[0])
    (d,) = perturb(fn, (x,), fn((x,)), "categorical", cfg, masks=(mask,), generator=torch.Generator().manual_seed(0))
    assert (d[mask == 0] == 0).all()
    assert (d[mask == 1] != 0).all()


@pytest.mark.parametrize("kind", ["categorical", "bernoulli", "regression"])
@pytest.mark.parametrize("norm", ["inf", "l2"])
def test_zero_ball_gives_zero_regulariser(kind, norm):
    net, x = TanhNet(), _toy_x()
    fn = {"categorical": lambda xs: net(xs[0]), "bernoulli": lambda xs: net(xs[0])[:, :1],
          "regression": lambda xs: net(xs[0])[:, 0]}[kind]
    cfg = SmartConfig(eps=0.0, noise_std=0.0, step_size=0.1, steps=2, norm=norm)
    assert adversarial_loss(fn, (x,), fn((x,)), kind, cfg).item() == 0.0


# ----------------------------------------------------------------------------- ascent direction


def _central_fd_grad(f, x0: np.ndarray, h=1e-6) -> np.ndarray:
    g = np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        e = np.zeros_like(x0)
        e[i] = h
        g[i] = (f(x0 + e) - f(x0 - e)) / (2 * h)
    return g


@pytest.mark.parametrize("norm", ["inf", "l2"])
def test_ascent_step_follows_fd_gradient_and_increases_ls(norm):
    net, x = TanhNet(), _toy_x(b=3)
    fn = lambda xs: net(xs[0])
    clean = fn((x,)).detach()
    cfg = SmartConfig(eps=10.0, step_size=1e-2, noise_std=0.05, steps=1, norm=norm)
    (d1,) = perturb(fn, (x,), clean, "categorical", cfg, generator=torch.Generator().manual_seed(7))
    d0 = _noise(x.shape, 0.05, 7)

    def ls(delta: np.ndarray) -> float:
        with torch.no_grad():
            return symmetric_kl(net(x + torch.from_numpy(delta)), clean, "categorical").item()

    g = _central_fd_grad(ls, d0.numpy())
    step = (d1 - d0).numpy()
    for b in range(x.shape[0]):  # the normalisation is per example, so compare per example
        cos = (step[b] * g[b]).sum() / (np.linalg.norm(step[b]) * np.linalg.norm(g[b]))
        assert cos > 1 - 1e-6
    size = np.abs(step).reshape(3, -1).max(1) if norm == "inf" else np.linalg.norm(step.reshape(3, -1), axis=1)
    np.testing.assert_allclose(size, cfg.step_size, rtol=1e-9)
    assert ls(d1.numpy()) > ls(d0.numpy())


# ----------------------------------------------------------------------------- gradient isolation


def test_no_param_grads_during_ascent_and_rs_backpropagates():
    torch.manual_seed(0)
    emb, net = nn.Embedding(10, 2, dtype=D64), TanhNet()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    h = emb(ids)  # lower layer: R_s must reach it through x
    fn = lambda xs: net(xs[0])
    clean = fn((h,))
    cfg = SmartConfig(eps=0.1, step_size=0.05, noise_std=0.05, steps=3)
    perturb(fn, (h,), clean, "categorical", cfg)
    params = [*net.parameters(), *emb.parameters()]
    assert all(p.grad is None for p in params)
    r_s = adversarial_loss(fn, (h,), clean, "categorical", cfg)
    r_s.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)


# ----------------------------------------------------------------------------- dropout


def test_dropout_disabled_restores_modes():
    m = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.Sequential(nn.Dropout(0.3), nn.BatchNorm1d(2)))
    m.train()
    m[2][0].eval()  # mixed modes must come back as they were
    before = [mod.training for mod in m.modules()]
    with dropout_disabled(m):
        assert not m[1].training and not m[2][0].training
        assert m.training and m[0].training and m[2][1].training  # non-dropout modules untouched
        x = torch.randn(4, 2)
        assert torch.equal(m[1](x), x)
    assert [mod.training for mod in m.modules()] == before
    with pytest.raises(RuntimeError), dropout_disabled(m):
        raise RuntimeError
    assert [mod.training for mod in m.modules()] == before


# ----------------------------------------------------------------------------- EMA teacher


def test_teacher_gets_no_grads_and_runs_in_eval():
    student = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.9), nn.Linear(3, 2)).train()
    teacher = EMATeacher(student, SmartConfig())
    assert all(not p.requires_grad for p in teacher.module.parameters())
    x = torch.randn(5, 3)
    t_out = teacher(x)
    assert not t_out.requires_grad and torch.equal(t_out, teacher(x))  # no dropout
    assert student.training
    bregman_loss(student(x), t_out, "categorical").backward()
    assert all(p.grad is None for p in teacher.module.parameters())
    assert all(p.grad is not None for p in student.parameters())


def test_teacher_update_is_exact_ema_and_copies_buffers():
    student = nn.Sequential(nn.Linear(2, 3, dtype=D64), nn.BatchNorm1d(3, dtype=D64))
    cfg = SmartConfig(beta=0.9)
    teacher = EMATeacher(student, cfg)
    old = {k: v.detach().numpy().copy() for k, v in teacher.module.named_parameters()}
    with torch.no_grad():
        for i, p in enumerate(student.parameters()):
            p.add_(0.5 + i)
    student.train()(torch.randn(8, 2, dtype=D64))  # moves BatchNorm's running stats
    teacher.update(student)
    for k, p in student.named_parameters():
        want = 0.9 * old[k] + 0.1 * p.detach().numpy()
        np.testing.assert_allclose(dict(teacher.module.named_parameters())[k].numpy(), want, rtol=1e-14)
    for (k, b), (_, tb) in zip(student.named_buffers(), teacher.module.named_buffers()):
        assert torch.equal(b, tb), k


def test_teacher_beta_switch_and_state_dict():
    student = nn.Linear(1, 1, bias=False, dtype=D64)
    with torch.no_grad():
        student.weight.fill_(0.0)
    cfg = SmartConfig(beta=0.9, beta_late=0.99, beta_switch_frac=0.1)
    teacher = EMATeacher(student, cfg, total_steps=50)  # switch after 5 updates
    with torch.no_grad():
        teacher.module.weight.fill_(1.0)
    betas = []
    for _ in range(8):
        before = teacher.module.weight.item()
        teacher.update(student)  # student sits at 0, so t_new = beta * t_old
        betas.append(teacher.module.weight.item() / before)
    np.testing.assert_allclose(betas, [0.9] * 5 + [0.99] * 3, rtol=1e-12)

    fresh = EMATeacher(student, cfg, total_steps=50)
    fresh.load_state_dict(teacher.state_dict())
    assert fresh.num_updates == 8 and fresh.beta == 0.99
    assert fresh.module.weight.item() == teacher.module.weight.item()
    assert EMATeacher(student, cfg).beta == 0.9  # no total_steps: never switches
    never = EMATeacher(student, cfg)
    for _ in range(20):
        never.update(student)
    assert never.beta == 0.9


def test_teacher_holds_the_frozen_parameters_themselves_and_refuses_to_go_on_if_they_train():
    student = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    student[0].requires_grad_(False)
    teacher = EMATeacher(student, SmartConfig(beta=0.5))
    assert teacher.module[0].weight is student[0].weight and teacher.module[0].bias is student[0].bias
    assert teacher.module[1].weight.data_ptr() != student[1].weight.data_ptr()  # a copy of what trains
    assert not teacher.module[1].weight.requires_grad and student[1].weight.requires_grad
    assert teacher.shared == ["0.weight", "0.bias"]
    teacher.update(student)
    student[0].weight.requires_grad_(True)  # a schedule the teacher was not made for
    with pytest.raises(RuntimeError, match="shares 0.weight with the model"):
        teacher.update(student)


def test_teacher_state_names_the_tensors_it_shares_with_its_student_and_stores_the_rest():
    torch.manual_seed(0)
    student = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    student[0].requires_grad_(False)  # a frozen layer: the teacher holds the student's own tensors
    teacher = EMATeacher(student, SmartConfig(beta=0.5))
    with torch.no_grad():
        student[1].weight.add_(1.0)
        student[1].bias.zero_()
    teacher.update(student)
    with torch.no_grad():
        teacher.module[1].bias.fill_(-0.0)  # equal to the student's 0.0 for torch.equal, not in its bits
    assert torch.equal(teacher.module[1].bias, student[1].bias)

    state = teacher.state_dict(student)
    assert sorted(state["same_as_student"]) == ["0.bias", "0.weight"]
    assert sorted(state["module"]) == ["1.bias", "1.weight"]  # moved away, or -0.0 against 0.0

    other = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))  # another initialisation: nothing left from it
    fresh = EMATeacher(other, SmartConfig(beta=0.5))
    fresh.load_state_dict(state, student)
    for (name, a), b in zip(teacher.module.state_dict().items(), fresh.module.state_dict().values()):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name
    assert fresh.num_updates == 1
    with pytest.raises(ValueError, match="load it with the student"):
        EMATeacher(other, SmartConfig()).load_state_dict(state)
    whole = EMATeacher(other, SmartConfig())  # a checkpoint written before the teacher named shared tensors
    whole.load_state_dict(teacher.state_dict())
    assert torch.equal(whole.module[0].weight, student[0].weight)


# ----------------------------------------------------------------------------- whole objective


def _np_log_softmax(z):
    return z - special.logsumexp(z, axis=-1, keepdims=True)


def _np_sym_kl(z1, z2):
    l1, l2 = _np_log_softmax(z1), _np_log_softmax(z2)
    return float(np.mean(np.sum((np.exp(l1) - np.exp(l2)) * (l1 - l2), -1)))


def _np_expected_delta(x, W, b, z_clean, d0, cfg):
    """Algorithm 1 with K = 1, by hand: gradient of symKL(f(x + d), clean) w.r.t. d in closed form,
    normalised step, projection. f(x) = W flat(x) + b."""
    B = x.shape[0]
    z = (x + d0).reshape(B, -1) @ W.T + b
    lp, lq = _np_log_softmax(z), _np_log_softmax(z_clean)
    p, q = np.exp(lp), np.exp(lq)
    s = lp - lq
    # d KL(p||q)/dz = p*s - p (p.s); d KL(q||p)/dz = p - q; the batch mean divides by B.
    gz = (p * s - p * np.sum(p * s, -1, keepdims=True) + p - q) / B
    g = (gz @ W).reshape(x.shape)
    gf = g.reshape(B, -1)
    if cfg.norm == "inf":
        step = gf / np.abs(gf).max(1, keepdims=True)
        d1 = d0.reshape(B, -1) + cfg.step_size * step
        assert (np.abs(d1) > cfg.eps).any()  # the projection is exercised
        d1 = np.clip(d1, -cfg.eps, cfg.eps)
    else:
        step = gf / np.linalg.norm(gf, axis=1, keepdims=True)
        d1 = d0.reshape(B, -1) + cfg.step_size * step
        n = np.linalg.norm(d1, axis=1, keepdims=True)
        assert (n > cfg.eps).any()
        d1 = d1 * np.minimum(1.0, cfg.eps / n)
    return d1.reshape(x.shape)


@pytest.mark.parametrize("norm", ["inf", "l2"])
def test_smart_objective_matches_closed_form_and_fd_gradient(norm):
    # 1-layer linear classifier on a 2-token, 2-dim "embedding", 3 classes, batch of 2.
    x = np.array([[[0.5, -1.0], [1.5, 0.2]], [[-0.3, 0.8], [0.1, -1.2]]])
    y = np.array([2, 0])
    W = np.array([[0.4, -0.7, 1.1, 0.2], [-0.5, 0.3, 0.6, -0.9], [0.8, 0.1, -0.4, 0.5]])
    b = np.array([0.1, -0.2, 0.05])
    Wt, bt = W + np.array([[0.3], [0.0], [-0.4]]) * x[0].ravel(), b + np.array([0.1, 0.0, -0.1])  # teacher
    cfg = SmartConfig(lambda_s=3.0, mu=0.7, eps=0.4, step_size=0.5, noise_std=0.3, steps=1, norm=norm)
    seed = 11

    f = lambda Wm, bm, xx: xx.reshape(2, -1) @ Wm.T + bm
    z_clean, z_teacher = f(W, b, x), f(Wt, bt, x)  # constants inside the loss, as in the module
    delta = _np_expected_delta(x, W, b, z_clean, _noise(x.shape, cfg.noise_std, seed).numpy(), cfg)

    def terms(Wm, bm):
        z = f(Wm, bm, x)
        task = -np.mean(_np_log_softmax(z)[np.arange(2), y])
        return task, _np_sym_kl(f(Wm, bm, x + delta), z_clean), _np_sym_kl(z, z_teacher)

    def total(Wm, bm):
        task, r_s, d = terms(Wm, bm)
        return task + cfg.lambda_s * r_s + cfg.mu * d

    # the module
    model = nn.Sequential(nn.Flatten(1), nn.Linear(4, 3, dtype=D64))
    teacher = EMATeacher(model, cfg)
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor(W))
        model[1].bias.copy_(torch.tensor(b))
        teacher.module[1].weight.copy_(torch.tensor(Wt))
        teacher.module[1].bias.copy_(torch.tensor(bt))
    xt = torch.tensor(x)
    fn = lambda xs: model(xs[0])
    clean = fn((xt,))
    task = nn.functional.cross_entropy(clean, torch.tensor(y))
    gen = torch.Generator().manual_seed(seed)
    (d_mod,) = perturb(fn, (xt,), clean, "categorical", cfg, generator=gen)
    np.testing.assert_allclose(d_mod.numpy(), delta, rtol=1e-10, atol=1e-14)
    r_s = adversarial_loss(fn, (xt,), clean, "categorical", cfg, generator=torch.Generator().manual_seed(seed))
    d_breg = bregman_loss(clean, teacher(xt), "categorical")
    loss = task + cfg.lambda_s * r_s + cfg.mu * d_breg  # the objective, as the stepper adds it up

    want_terms = terms(W, b)
    np.testing.assert_allclose([task.item(), r_s.item(), d_breg.item()], want_terms, rtol=1e-10)
    assert loss.item() == pytest.approx(total(W, b), rel=1e-12)
    assert all(t > 1e-3 for t in want_terms)  # every term contributes

    loss.backward()
    h = 1e-6
    fd = lambda g: (_central_fd_grad(lambda w: g(w, b), W, h), _central_fd_grad(lambda bb: g(W, bb), b, h))
    parts = [fd(lambda Wm, bm, i=i: terms(Wm, bm)[i]) for i in range(3)]
    coef = [1.0, cfg.lambda_s, cfg.mu]
    gW = sum(c * p[0] for c, p in zip(coef, parts))
    gb = sum(c * p[1] for c, p in zip(coef, parts))
    np.testing.assert_allclose(model[1].weight.grad.numpy(), gW, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(model[1].bias.grad.numpy(), gb, rtol=1e-6, atol=1e-8)
    gW_total, gb_total = fd(total)
    np.testing.assert_allclose(model[1].weight.grad.numpy(), gW_total, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(model[1].bias.grad.numpy(), gb_total, rtol=1e-6, atol=1e-8)
    assert all(p.grad is None for p in teacher.module.parameters())
