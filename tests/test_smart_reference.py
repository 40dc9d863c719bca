"""SMART's "reference" perturbation mode against the MT-DNN code's algorithm written out here from
its formulas (mt_dnn/perturbation.py SmartPerturbation.forward, mt_dnn/loss.py stable_kl and
SymKlCriterion), never through training/methods/smart.py:

- a torch transcription on a small tanh network (autograd for the ascent gradient), every output
  kind, both norms, K = 1 and 2, two inputs, a padding mask;
- a numpy closed form on a linear model: the ascent gradient, the per-token normalisation, R_s and
  its parameter gradient derived by hand;
- R_s against its second-order expansion (quadratic in the perturbation), and the size of R_s in
  the two modes.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import special
from torch import nn

from training.methods.smart import SmartConfig, adversarial_loss, perturb, reference_divergence

D64 = torch.float64
GUARD = 1e-6  # stable_kl's epsilon in mt_dnn/loss.py

pytestmark = pytest.mark.usefixtures("one_thread")


class TokenNet(nn.Module):
    """(B, T=3, H=4) -> linear -> tanh -> linear: 3 outputs; hand-set weights."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.l1, self.l2 = nn.Linear(12, 5, dtype=D64), nn.Linear(5, 3, dtype=D64)
        with torch.no_grad():
            self.l1.weight.copy_(torch.linspace(-2.0, 1.7, 60, dtype=D64).view(5, 12).sin() * scale)
            self.l1.bias.copy_(torch.linspace(-0.3, 0.4, 5, dtype=D64))
            self.l2.weight.copy_(torch.linspace(-1.0, 2.5, 15, dtype=D64).view(3, 5).cos() * 2)
            self.l2.bias.copy_(torch.tensor([0.2, -0.1, 0.0], dtype=D64))

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x.flatten(1))))


def _x(seed: int, b: int = 4) -> torch.Tensor:
    return torch.randn(b, 3, 4, generator=torch.Generator().manual_seed(seed), dtype=D64)


OUTPUTS = {  # kind -> the model's output for that kind, from the 3 logits
    "categorical": lambda z: z,
    "bernoulli": lambda z: z[:, 0],
    "regression": lambda z: z[:, 1],
}


# ----------------------------------------------------------------------------- the transcription


def _two_class(out: torch.Tensor, kind: str) -> torch.Tensor:
    """A Bernoulli logit z as the logits (z, 0) of a two-class softmax head (MT-DNN's heads are softmax)."""
    return torch.stack([out, torch.zeros_like(out)], -1) if kind == "bernoulli" else out


def _mtdnn_ascent_loss(adv, clean, kind):
    if kind == "regression":  # F.mse_loss(adv, clean.detach(), reduction="sum")
        return ((adv - clean.detach()) ** 2).sum()
    p = torch.softmax(_two_class(adv, kind), -1)
    y = torch.softmax(_two_class(clean.detach(), kind), -1)

    def log_odds(q):  # -log(1 / (q + e) - 1 + e), held constant
        return -torch.log(1 / (q.detach() + GUARD) - 1 + GUARD)

    return 2 * (p * (log_odds(p) - log_odds(y))).sum()  # stable_kl(..., reduce=False): a sum, times 2


def _mtdnn_final_loss(adv, clean, kind):
    if kind == "regression":  # MseCriterion(clean, adv), the shapes lined up
        return F.mse_loss(clean, adv)
    a, c = _two_class(adv, kind), _two_class(clean, kind)
    # SymKlCriterion(input=clean, target=adv): each kl_div's target side detached, "batchmean"
    return (F.kl_div(F.log_softmax(c, -1), F.softmax(a.detach(), -1), reduction="batchmean")
            + F.kl_div(F.log_softmax(a, -1), F.softmax(c.detach(), -1), reduction="batchmean"))


def _mtdnn_perturbation(fn, xs, clean, kind, noise_std, step_size, guard, norm, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    noise = [torch.randn(x.shape, generator=gen, dtype=x.dtype) * noise_std for x in xs]  # every position
    for _ in range(steps):
        noise = [n.detach().requires_grad_() for n in noise]
        grads = torch.autograd.grad(_mtdnn_ascent_loss(fn([x + n for x, n in zip(xs, noise)]), clean, kind), noise)
        stepped = [n.detach() + step_size * g for n, g in zip(noise, grads)]
        sizes = [s.abs().max(-1, keepdim=True).values if norm == "inf" else s.norm(dim=-1, keepdim=True)
                 for s in stepped]
        noise = [s / (size + guard) for s, size in zip(stepped, sizes)]  # per token; never projected
    return noise


@pytest.mark.parametrize("kind", ["categorical", "bernoulli", "regression"])
@pytest.mark.parametrize("norm", ["inf", "l2"])
@pytest.mark.parametrize("steps", [1, 2])
def test_reference_mode_matches_transcribed_algorithm(kind, norm, steps):
    net = TokenNet()
    out = OUTPUTS[kind]
    fn = lambda xs: out(net(xs[0]) - 0.5 * net(xs[1]))  # a pair: two perturbed inputs
    emb = nn.Parameter(torch.randn(4, 3, 4, generator=torch.Generator().manual_seed(9), dtype=D64))
    x1 = _x(1) * 0.8
    inputs = lambda: (emb * 1.0, x1)  # the first input comes from a "lower layer" that must get a gradient
    xs = inputs()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
    # step_size large enough that the ascent visibly moves the noise (checked below)
    cfg = SmartConfig(perturbation="reference", noise_std=1e-2, step_size=0.5, norm=norm, steps=steps,
                      norm_eps=1e-3)

    want = _mtdnn_perturbation(fn, [x.detach() for x in xs], fn(xs), kind, cfg.noise_std, cfg.step_size,
                               cfg.norm_eps, norm, steps, seed=5)
    got = perturb(fn, xs, fn(xs), kind, cfg, masks=(mask, mask), generator=torch.Generator().manual_seed(5))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.detach(), rtol=1e-11, atol=1e-14)
        assert (g[mask == 0] != 0).all()  # padding is perturbed, as in the reference
    raw = torch.randn(4, 3, 4, generator=torch.Generator().manual_seed(5), dtype=D64) * cfg.noise_std
    assert not torch.allclose(got[0] / got[0].abs().amax(-1, keepdim=True), raw / raw.abs().amax(-1, keepdim=True),
                              rtol=1e-3)  # the gradient step mattered

    # R_s and its gradients, the clean output carrying a graph
    r_s = adversarial_loss(fn, xs, fn(xs), kind, cfg, masks=(mask, mask), generator=torch.Generator().manual_seed(5))
    params = [*net.parameters(), emb]
    got_grads = torch.autograd.grad(r_s, params)
    xs = inputs()
    want_r_s = _mtdnn_final_loss(fn([x + n.detach() for x, n in zip(xs, want)]), fn(xs), kind)
    want_grads = torch.autograd.grad(want_r_s, params)
    torch.testing.assert_close(r_s, want_r_s, rtol=1e-11, atol=0)
    assert r_s.item() > 1e-3
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-13)


# ----------------------------------------------------------------------------- closed form, linear model


def _log_odds(q):
    return -np.log(1 / (q + GUARD) - 1 + GUARD)


def _np_reference(x, W, b, d0, step_size, guard, steps):
    """K steps of the reference on z = W flat(x) + b (l_inf), gradients derived by hand."""
    B = x.shape[0]
    y = special.softmax(x.reshape(B, -1) @ W.T + b, -1)
    d = d0
    for _ in range(steps):
        p = special.softmax((x + d).reshape(B, -1) @ W.T + b, -1)
        r = _log_odds(p) - _log_odds(y)
        # L = 2 sum_n sum_c p_nc r_nc, r constant: dL/dz_nk = 2 p_nk (r_nk - sum_c p_nc r_nc)
        gz = 2 * p * (r - (p * r).sum(-1, keepdims=True))
        v = d + step_size * (gz @ W).reshape(x.shape)
        d = v / (np.abs(v).max(-1, keepdims=True) + guard)
    return d


@pytest.mark.parametrize("steps", [1, 3])
def test_reference_mode_closed_form_on_linear_model(steps):
    x = np.array([[[0.5, -1.0, 0.3], [1.5, 0.2, -0.4]], [[-0.3, 0.8, 0.0], [0.1, -1.2, 0.9]]])  # (B=2, T=2, H=3)
    W = np.array([[0.4, -0.7, 1.1, 0.2, 0.3, -0.2], [-0.5, 0.3, 0.6, -0.9, 0.1, 0.4],
                  [0.8, 0.1, -0.4, 0.5, -0.6, 0.2]])
    b = np.array([0.1, -0.2, 0.05])
    cfg = SmartConfig(perturbation="reference", noise_std=0.05, step_size=0.3, steps=steps, norm_eps=1e-3)
    d0 = (torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=D64) * cfg.noise_std).numpy()
    delta = _np_reference(x, W, b, d0, cfg.step_size, cfg.norm_eps, steps)

    model = nn.Sequential(nn.Flatten(1), nn.Linear(6, 3, dtype=D64))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor(W))
        model[1].bias.copy_(torch.tensor(b))
    fn = lambda xs: model(xs[0])
    xt = torch.tensor(x)
    (got,) = perturb(fn, (xt,), fn((xt,)), "categorical", cfg, generator=torch.Generator().manual_seed(2))
    np.testing.assert_allclose(got.numpy(), delta, rtol=1e-10, atol=1e-14)
    m = np.abs(delta).max(-1)
    assert ((m > 0.9) & (m < 1)).all()  # per token norm ||v|| / (||v|| + norm_eps): near 1, no eps ball

    pa = special.softmax((x + delta).reshape(2, -1) @ W.T + b, -1)
    pc = special.softmax(x.reshape(2, -1) @ W.T + b, -1)
    r_s = adversarial_loss(fn, (xt,), fn((xt,)), "categorical", cfg, generator=torch.Generator().manual_seed(2))
    assert r_s.item() == pytest.approx(np.mean(np.sum((pa - pc) * (np.log(pa) - np.log(pc)), -1)), rel=1e-10)
    r_s.backward()
    # d/dz_clean = (p_c - p_a) / B, d/dz_adv = (p_a - p_c) / B; z_adv - z_clean = W flat(delta), so
    # dR_s/dW = sum_n (p_a - p_c)_n flat(delta_n)^T / B and dR_s/db = 0.
    np.testing.assert_allclose(model[1].weight.grad.numpy(), (pa - pc).T @ delta.reshape(2, -1) / 2, rtol=1e-9)
    np.testing.assert_allclose(model[1].bias.grad.numpy(), 0.0, atol=1e-15)


def test_reference_regression_closed_form():
    x = np.array([[[0.5, -1.0], [1.5, 0.2]], [[-0.3, 0.8], [0.1, -1.2]], [[0.7, 0.7], [-0.2, 0.0]]])  # (3, 2, 2)
    w, b = np.array([0.4, -0.7, 1.1, 0.2]), 0.3
    cfg = SmartConfig(perturbation="reference", noise_std=0.1, step_size=0.2, steps=1, norm="l2", norm_eps=1e-2)
    d0 = (torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=D64) * cfg.noise_std).numpy()
    z = lambda xx: xx.reshape(3, -1) @ w + b
    g = (2 * (z(x + d0) - z(x)))[:, None] * w  # d/d delta of sum (z_adv - z_clean)^2
    v = d0 + cfg.step_size * g.reshape(x.shape)
    delta = v / (np.linalg.norm(v, axis=-1, keepdims=True) + cfg.norm_eps)

    model = nn.Sequential(nn.Flatten(1), nn.Linear(4, 1, dtype=D64))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor(w).view(1, 4))
        model[1].bias.fill_(b)
    fn = lambda xs: model(xs[0])[:, 0]
    xt = torch.tensor(x)
    (got,) = perturb(fn, (xt,), fn((xt,)), "regression", cfg, generator=torch.Generator().manual_seed(4))
    np.testing.assert_allclose(got.numpy(), delta, rtol=1e-10)
    r_s = adversarial_loss(fn, (xt,), fn((xt,)), "regression", cfg, generator=torch.Generator().manual_seed(4))
    gap = z(x + delta) - z(x)
    assert r_s.item() == pytest.approx(np.mean(gap ** 2), rel=1e-10)
    r_s.backward()  # both sides differentiated: dR/dw = mean 2 gap (flat(x + delta) - flat(x))
    np.testing.assert_allclose(model[1].weight.grad.numpy()[0], 2 * (gap @ delta.reshape(3, -1)) / 3, rtol=1e-9)


# ----------------------------------------------------------------------------- divergence


def test_reference_divergence_value_is_symmetric_kl_but_gradient_is_not():
    a = torch.tensor([[0.3, -1.2, 2.0], [1.0, 0.5, -0.7]], dtype=D64, requires_grad=True)
    c = torch.tensor([[0.1, 0.4, 1.1], [-0.2, 0.9, 0.3]], dtype=D64, requires_grad=True)
    pa, pc = torch.softmax(a, -1).detach(), torch.softmax(c, -1).detach()
    r = reference_divergence(a, c, "categorical")
    want = ((pa - pc) * (pa.log() - pc.log())).sum(-1).mean()
    assert r.item() == pytest.approx(want.item(), rel=1e-12)
    ga, gc = torch.autograd.grad(r, (a, c))
    # each side as a soft-label cross-entropy towards the other: d/da = (p_a - p_c) / B
    torch.testing.assert_close(ga, (pa - pc) / 2, rtol=1e-12, atol=0)
    torch.testing.assert_close(gc, (pc - pa) / 2, rtol=1e-12, atol=0)
    full_ga = torch.autograd.grad(((torch.softmax(a, -1) - pc) * (torch.log_softmax(a, -1) - pc.log())).sum(-1).mean(),
                                  a)[0]
    assert not torch.allclose(full_ga, ga, rtol=1e-3)  # the symmetric KL's own gradient differs


def test_reference_divergence_bernoulli_is_two_class_softmax():
    z = torch.tensor([2.5, -0.3, 40.0, -1.0], dtype=D64, requires_grad=True)
    w = torch.tensor([-1.0, 0.2, 39.0, -1.0], dtype=D64, requires_grad=True)
    r = reference_divergence(z, w, "bernoulli")
    pair = lambda t: torch.stack([t, torch.zeros_like(t)], -1)
    r2 = reference_divergence(pair(z), pair(w), "categorical")
    torch.testing.assert_close(r, r2, rtol=1e-12, atol=0)
    for g1, g2 in zip(torch.autograd.grad(r, (z, w)), torch.autograd.grad(r2, (z, w))):
        torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- size of R_s


def _quadratic_form(p_clean: np.ndarray, dz: np.ndarray) -> float:
    """Second-order expansion of symKL(z + dz, z): mean_n dz_n^T (diag p_n - p_n p_n^T) dz_n."""
    cov = np.einsum("nc,cd->ncd", p_clean, np.eye(p_clean.shape[1])) - np.einsum("nc,nd->ncd", p_clean, p_clean)
    return float(np.mean(np.einsum("nc,ncd,nd->n", dz, cov, dz)))


def test_reference_rs_grows_quadratically_with_perturbation_size():
    """On a linear model with small weights, R_s = dz^T Cov dz (1 + O(|dz|)) with dz = W delta. The
    perturbation's size is set through norm_eps: for norm_eps >> ||v|| each token's delta is about
    v / norm_eps, the same direction at a size ~ 1 / norm_eps, so R_s ~ 1 / norm_eps^2."""
    model = nn.Sequential(nn.Flatten(1), nn.Linear(12, 3, dtype=D64))
    with torch.no_grad():
        model[1].weight.copy_(torch.linspace(-1.0, 1.0, 36, dtype=D64).view(3, 12).sin() * 0.03)
        model[1].bias.copy_(torch.tensor([0.5, -0.2, 0.1]))
    fn = lambda xs: model(xs[0])
    x = _x(3)
    W = model[1].weight.detach().numpy()
    p_clean = torch.softmax(fn((x,)), -1).detach().numpy()
    sizes, r_s = [], []
    for norm_eps in (1e-6, 1e-2, 1e-1, 1.0):
        cfg = SmartConfig(perturbation="reference", noise_std=1e-5, step_size=1e-3, norm_eps=norm_eps)
        gen = lambda: torch.Generator().manual_seed(8)
        (d,) = perturb(fn, (x,), fn((x,)), "categorical", cfg, generator=gen())
        r = adversarial_loss(fn, (x,), fn((x,)), "categorical", cfg, generator=gen()).item()
        quad = _quadratic_form(p_clean, d.flatten(1).numpy() @ W.T)
        assert r == pytest.approx(quad, rel=0.03)  # |dz| <= 0.1 at size 1: the expansion holds
        sizes.append(d.abs().amax(-1).mean().item())
        r_s.append(r)
    assert sizes[0] > 0.9  # the default guard: per-token l_inf norm about 1
    for k in range(1, 3):  # R_s ratio = (size ratio)^2 where the direction is fixed
        assert r_s[k] / r_s[k + 1] == pytest.approx((sizes[k] / sizes[k + 1]) ** 2, rel=0.01)
        assert sizes[k] / sizes[k + 1] == pytest.approx(10.0, rel=0.02)


def test_reference_rs_is_orders_of_magnitude_above_paper():
    """The issue's observation: the paper's eps = 1e-5 ball keeps R_s ~ eps^2 * |W|^2, the reference's
    unit per-token perturbation does not."""
    net = TokenNet()
    fn = lambda xs: net(xs[0])
    x = _x(6)
    r = {}
    for mode in ("paper", "reference"):
        cfg = SmartConfig(perturbation=mode)  # the defaults: eps 1e-5, step 1e-3, noise 1e-5
        r[mode] = adversarial_loss(fn, (x,), fn((x,)), "categorical", cfg, generator=torch.Generator().manual_seed(0))
    assert 0 < r["paper"].item() < 1e-8
    assert r["reference"].item() > 1e-2
    assert r["reference"].item() / r["paper"].item() > 1e6


# ----------------------------------------------------------------------------- config


def test_perturbation_mode_validated():
    assert SmartConfig().perturbation == "paper"
    with pytest.raises(ValueError, match="perturbation"):
        SmartConfig(perturbation="mtdnn")
    with pytest.raises(ValueError, match="norm_eps"):
        SmartConfig(norm_eps=0.0)


def test_paper_mode_ignores_reference_fields():
    """norm_eps only acts in reference mode: the paper's deltas are bit-identical whatever it is."""
    net = TokenNet()
    fn = lambda xs: net(xs[0])
    x = _x(7)
    outs = []
    for norm_eps in (1e-6, 0.5):
        cfg = SmartConfig(eps=0.05, step_size=0.02, noise_std=0.01, norm_eps=norm_eps)
        outs.append(perturb(fn, (x,), fn((x,)), "categorical", cfg, generator=torch.Generator().manual_seed(1))[0])
    assert torch.equal(*outs)
    assert outs[0].abs().max().item() <= 0.05


# ----------------------------------------------------------------------------- through the trainer


def test_reference_mode_through_the_stepper(tiny_ckpt):
    """The trainer's call (Stepper._smoothness -> adversarial_loss) with a reference-mode config, as
    the trainer will build it from a --smart-perturbation flag: the logged R_s is the reference
    divergence at the reference perturbation, the padding's perturbation changes nothing (the
    model masks padding), and R_s is far above the paper mode's."""
    import dataclasses

    from data.batching import encode_task, make_batch
    from data.loaders import Example
    from heads import KIND
    from training.config.train_config import TrainConfig
    from training.methods.smart import dropout_disabled
    from training.methods.stepper import Stepper
    from training.run.build import build_model

    cfg = TrainConfig(model=str(tiny_ckpt), head_dropout=0.0, device="cpu", precision="fp32", max_grad_norm=0.0,
                      lr=1e-2, warmup_ratio=0.0, seed=5, smart=True, smart_perturbation="reference")
    model, tok, _ = build_model(cfg)
    stepper = Stepper.build(model, cfg, 100)
    assert stepper.smart.perturbation == "reference"  # --smart-perturbation reaches SmartConfig
    paper = dataclasses.replace(stepper.smart, perturbation="paper")
    words = ["the", "cat", "sat", "on", "mat", "cats"]
    rng = np.random.default_rng(0)
    sent = lambda: " ".join(rng.choice(words) for _ in range(int(rng.integers(2, 8))))  # noqa: E731
    batches = []
    for task, label in (("sst", lambda: int(rng.integers(0, 5))), ("para", lambda: int(rng.integers(0, 2))),
                        ("sts", lambda: float(rng.uniform(0, 5)))):
        exs = [Example(f"{task}{i}", sent(), None if task == "sst" else sent(), label()) for i in range(5)]
        batches.append(make_batch(encode_task(task, exs, tok), list(range(5)), tok))

    gen = torch.Generator().set_state(stepper.generator.get_state().clone())
    want = {}
    model.train()
    for b in batches:  # the step draws from the generator in batch order
        masks = [s["attention_mask"] for s in b.inputs]
        assert any((m == 0).any() for m in masks)  # there is padding to perturb
        f = lambda xs, b=b, masks=masks: model.from_hidden(b.task, list(xs), masks, 0)  # noqa: E731
        with dropout_disabled(model):
            hs = tuple(h.detach() for h in model.hidden_at(b.inputs, 0))
            with torch.no_grad():
                clean = f(hs)
            deltas = perturb(f, hs, clean, KIND[b.task], stepper.smart, tuple(masks), gen)
            with torch.no_grad():
                r = reference_divergence(f(tuple(h + d for h, d in zip(hs, deltas))), clean, KIND[b.task]).item()
                unpadded = tuple(d * m.unsqueeze(-1) for d, m in zip(deltas, masks))
                r_unpadded = reference_divergence(f(tuple(h + d for h, d in zip(hs, unpadded))), clean,
                                                  KIND[b.task]).item()
            r_paper = adversarial_loss(f, hs, clean, KIND[b.task], paper, tuple(masks),
                                       torch.Generator().manual_seed(0)).item()
        assert r_unpadded == pytest.approx(r, rel=1e-5)
        assert r > 1e4 * r_paper
        want[b.task] = r
    parts = stepper.step(batches, 0)
    for task, r in want.items():
        assert parts[task]["r_s"] == pytest.approx(r, rel=1e-4), task
