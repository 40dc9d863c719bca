"""Gradient surgery: hand-computed cases, properties, and end to end on a tiny multi-task model.

Expected values are worked out by hand (comments show the arithmetic) or with the small
reference projections below, written independently of training.methods.pcgrad.
"""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from training.methods.pcgrad import DOMINANT_RTOL, PCGrad, dominant_task, gram_matrix, surgery, surgery_coefficients

T64 = torch.float64


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=T64)


def project(g: torch.Tensor, variant: str = "pcgrad", order=None) -> torch.Tensor:
    """The per-task projected gradients (T, P) whose sum surgery() returns: its coefficients times g."""
    return surgery_coefficients(gram_matrix(g), variant, order=order).to(g.dtype) @ g


# ---------------------------------------------------------------- hand-computed cases

def test_pcgrad_2d_by_hand():
    g = t([[1.0, 0.0], [-1.0, 1.0]])
    before = g.clone()
    out, stats = surgery(g, "pcgrad")
    # g1.g2 = -1.  g1 - (-1/2) g2 = (1,0) + (-0.5,0.5) = (0.5,0.5)
    #              g2 - (-1/1) g1 = (-1,1) + (1,0)     = (0,1)       sum = (0.5,1.5)
    torch.testing.assert_close(out, t([0.5, 1.5]))
    assert torch.equal(g, before)  # pure
    assert (stats.pairs, stats.conflicting) == (1, 1)
    assert stats.mean_conflict_cosine == pytest.approx(-1 / math.sqrt(2))
    assert stats.conflict_fraction == 1.0


def test_dominant_2d_by_hand():
    g = t([[1.0, 0.0], [-1.0, 1.0]])
    out, _ = surgery(g, "dominant")
    # ||g2|| = sqrt2 > 1 so d = 2.  g1 - (-1/2) g2 = (0.5,0.5); update = (0.5,0.5) + (-1,1)
    torch.testing.assert_close(out, t([-0.5, 1.5]))


def test_dominant_3d_term_by_term():
    g = t([[1.0, 2.0, 0.0], [3.0, 0.0, 4.0], [-1.0, 0.0, -2.0]])
    rows = project(g, "dominant")
    # norms sqrt5, 5, sqrt5 -> d = 1 (g_d = (3,0,4), ||g_d||^2 = 25)
    # g0.g_d = 3 >= 0 -> untouched
    # g2.g_d = -3 - 8 = -11 -> g2 + 11/25 (3,0,4) = (-1 + 33/25, 0, -2 + 44/25) = (8/25, 0, -6/25)
    torch.testing.assert_close(rows, t([[1, 2, 0], [3, 0, 4], [8 / 25, 0, -6 / 25]]))
    out, stats = surgery(g, "dominant")
    torch.testing.assert_close(out, t([1 + 3 + 8 / 25, 2, 4 - 6 / 25]))
    # pair dots: 01 = 3, 02 = -1, 12 = -11; cosines -1/(sqrt5 sqrt5) = -0.2, -11/(5 sqrt5)
    assert (stats.pairs, stats.conflicting) == (3, 2)
    assert stats.conflict_fraction == pytest.approx(2 / 3)
    assert stats.mean_conflict_cosine == pytest.approx((-0.2 - 11 / (5 * math.sqrt(5))) / 2)


# g0 = (1,0), g1 = (-1,1), g2 = (0,-1): the order of the others matters for g0 and g2.
ORDER_G = [[1.0, 0.0], [-1.0, 1.0], [0.0, -1.0]]


def test_pcgrad_3_tasks_fixed_order_by_hand():
    g = t(ORDER_G)
    # g0 vs [1,2]: g0.g1=-1 -> (1,0)+1/2(-1,1) = (.5,.5); .(0,-1) = -.5 -> (.5,.5)+.5(0,-1) = (.5,0)
    # g1 vs [0,2]: g1.g0=-1 -> (0,1); .(0,-1) = -1 -> (0,1)+(0,-1) = (0,0)
    # g2 vs [1,0]: g2.g1=-1 -> (0,-1)+1/2(-1,1) = (-.5,-.5); .(1,0) = -.5 -> (0,-.5)
    rows = project(g, "pcgrad", order=[[1, 2], [0, 2], [1, 0]])
    torch.testing.assert_close(rows, t([[0.5, 0.0], [0.0, 0.0], [0.0, -0.5]]))
    # g0 vs [2,1]: g0.g2=0 no-op; g0.g1=-1 -> (.5,.5)
    # g1 vs [2,0]: g1.g2=-1 -> (-1,0); .(1,0)=-1 -> (0,0)
    # g2 vs [0,1]: g2.g0=0 no-op; g2.g1=-1 -> (-.5,-.5)
    rows = project(g, "pcgrad", order=[[2, 1], [2, 0], [0, 1]])
    torch.testing.assert_close(rows, t([[0.5, 0.5], [0.0, 0.0], [-0.5, -0.5]]))


def test_pcgrad_random_order_uses_generator():
    g = t(ORDER_G)
    # g0 -> (.5,0) or (.5,.5); g1 -> (0,0); g2 -> (0,-.5) or (-.5,-.5)  (see the test above)
    possible = {(0.5, -0.5), (0.0, -0.5), (0.5, 0.0), (0.0, 0.0)}
    seen = set()
    for seed in range(40):
        out, _ = surgery(g, "pcgrad", torch.Generator().manual_seed(seed))
        seen.add(tuple(out.tolist()))
    assert seen == possible
    a, _ = surgery(g, "pcgrad", torch.Generator().manual_seed(3))
    b, _ = surgery(g, "pcgrad", torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("variant", ["pcgrad", "dominant"])
def test_zero_gradient_task(variant):
    g = t([[1.0, 0.0], [0.0, 0.0], [-1.0, 1.0]])
    rows = project(g, variant)
    assert torch.isfinite(rows).all()
    assert torch.equal(rows[1], t([0.0, 0.0]))
    out, stats = surgery(g, variant)
    expected = {"pcgrad": [0.5, 1.5], "dominant": [-0.5, 1.5]}[variant]  # the 2-D cases above
    torch.testing.assert_close(out, t(expected))
    assert (stats.pairs, stats.conflicting) == (3, 1)
    out, stats = surgery(torch.zeros(2, 3, dtype=T64), variant)
    assert torch.equal(out, torch.zeros(3, dtype=T64)) and math.isnan(stats.mean_conflict_cosine)


def test_single_task_and_bad_variant():
    out, stats = surgery(t([[1.0, -2.0]]))
    torch.testing.assert_close(out, t([1.0, -2.0]))
    assert stats.pairs == 0 and math.isnan(stats.conflict_fraction)
    with pytest.raises(ValueError):
        surgery(t([[1.0]]), "mgda")


def test_non_finite_stays_non_finite():
    # GradScaler must still see the overflow and skip the step.
    g = t([[math.inf, 0.0], [-1.0, 1.0]])
    for variant in ("pcgrad", "dominant"):
        out, _ = surgery(g, variant)
        assert not torch.isfinite(out).all()


def test_half_precision_keeps_dtype():
    g = torch.tensor([[1.0, 0.0], [-1.0, 1.0]], dtype=torch.bfloat16)
    out, _ = surgery(g, "pcgrad")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), t([0.5, 1.5]))


# ---------------------------------------------------------------- dominant: ties


def test_dominant_near_tie_goes_to_the_first_task():
    # norms 5 and 5 (1 + 1e-13): equal up to rounding, so task 0 (first in order) is g_d
    g = t([[3.0, 4.0, 0.0], [0.0, 0.0, 5.0 * (1 + 1e-13)], [-1.0, 0.0, -1.0]])
    out, _ = surgery(g, "dominant")
    # g1 . g0 = 0: untouched. g2 . g0 = -3: g2 + 3/25 (3, 4, 0) = (-16/25, 12/25, -1)
    want = t([3 - 16 / 25, 4 + 12 / 25, 5.0 * (1 + 1e-13) - 1])
    torch.testing.assert_close(out, want, rtol=1e-14, atol=1e-14)
    # with g1 as g_d (the larger by float error), g2 + (5/25) (0, 0, 5) = (-1, 0, 0): another update
    assert not torch.allclose(out, t([2.0, 4.0, 5.0 * (1 + 1e-13)]), rtol=1e-3)
    # a real difference still wins, wherever it is in the order
    g[1, 2] = 5.0 * (1 + 1e-4)
    assert torch.equal(project(g, "dominant")[1], g[1])
    assert not torch.equal(project(g, "dominant")[2], g[2])


def test_dominant_task_rule():
    assert DOMINANT_RTOL == 1e-5
    sq = lambda *v: torch.tensor(v, dtype=T64)
    assert dominant_task(sq(1.0, 1.0 + 1e-7, 0.5)) == 0
    assert dominant_task(sq(0.5, 1.0, 1.0 - 1e-6)) == 1
    assert dominant_task(sq(0.5, 1.0 - 5e-6, 1.0)) == 1  # within 1e-5 of the largest, and first
    assert dominant_task(sq(0.5, 1.0 - 2e-5, 1.0)) == 2
    assert dominant_task(sq(0.0, 0.0)) == 0


def test_dominant_permuted_gradients_pick_the_first_task():
    """A gradient and a permutation of it have the same norm; float32 Gram products round them
    apart. Find a seed where the second rounds larger (so argmax would pick it) and check that the
    update is the one with the first task dominant, computed here in float64."""
    P = 4096
    for seed in range(50):
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(P, generator=gen)
        b = a[torch.randperm(P, generator=gen)]
        c = -0.6 * b + 0.2 * torch.randn(P, generator=gen)  # conflicts with b
        g = torch.stack([a, b, c])
        sq = gram_matrix(g).diagonal()
        if sq[1] > sq[0] and float(c.double() @ a.double()) * float(c.double() @ b.double()) != 0:
            break
    else:
        pytest.fail("no seed in 0..49 where the permuted row's squared norm rounds larger")
    gs = [r.double() for r in g]
    want = gs[0] + sum(ref_proj(x, gs[0]) for x in gs[1:])  # task 0 dominant
    other = gs[1] + sum(ref_proj(x, gs[1]) for i, x in enumerate(gs) if i != 1)  # what argmax picked
    out, _ = surgery(g, "dominant")
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)
    assert (want - other).abs().max() > 1.0  # the choice matters here


# ---------------------------------------------------------------- properties

TOL = 1e-9
floats = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@st.composite
def task_grads(draw, T=st.integers(2, 3)):
    n_tasks, P = draw(T), draw(st.integers(1, 6))
    g = t(draw(st.lists(st.lists(floats, min_size=P, max_size=P), min_size=n_tasks, max_size=n_tasks)))
    assume(bool((g.norm(dim=1) > 1e-3).all()))
    return g


@settings(max_examples=60, deadline=None)
@given(task_grads())
def test_dominant_projected_never_conflict_and_dominant_untouched(g):
    rows = project(g, "dominant")
    norms, sq = g.norm(dim=1), (g * g).sum(1)
    # the documented tie-break: the first row whose squared norm is within DOMINANT_RTOL of the largest
    d = next(i for i in range(len(g)) if sq[i] >= sq.max() * (1 - 1e-5))
    assert torch.equal(rows[d], g[d])
    assert all(rows[i] @ g[d] >= -TOL * (1 + norms[i] * norms[d]) for i in range(len(g)) if i != d)
    out, _ = surgery(g, "dominant")
    torch.testing.assert_close(out, rows.sum(0))


@settings(max_examples=60, deadline=None)
@given(task_grads(T=st.just(2)))
def test_pcgrad_two_tasks_never_conflict(g):
    rows = project(g, "pcgrad")
    scale = 1 + g[0].norm() * g[1].norm()
    assert rows[0] @ g[1] >= -TOL * scale
    assert rows[1] @ g[0] >= -TOL * scale


@settings(max_examples=60, deadline=None)
@given(task_grads(), st.lists(st.sampled_from([-1.0, 1.0]), min_size=6, max_size=6),
       st.sampled_from(["pcgrad", "dominant"]))
def test_non_conflicting_is_plain_sum(g, signs, variant):
    # |g| flipped by one sign pattern shared by all rows: every pairwise dot is >= 0.
    g = g.abs() * t(signs[: g.shape[1]])
    rows = project(g, variant)
    assert torch.equal(rows, g)
    out, stats = surgery(g, variant)
    torch.testing.assert_close(out, g.sum(0))
    assert stats.conflicting == 0


@settings(max_examples=60, deadline=None)
@given(task_grads(), st.integers(-12, 12), st.sampled_from(["pcgrad", "dominant"]))
def test_positively_homogeneous_power_of_two(g, k, variant):
    # GradScaler scales are powers of two, which scale floats exactly: results must match.
    c = 2.0 ** k
    a, _ = surgery(g, variant, torch.Generator().manual_seed(0))
    b, _ = surgery(c * g, variant, torch.Generator().manual_seed(0))
    torch.testing.assert_close(b, c * a, rtol=1e-12, atol=0.0)


@settings(max_examples=60, deadline=None)
@given(task_grads(T=st.just(2)), st.floats(1e-3, 1e3), st.sampled_from(["pcgrad", "dominant"]))
def test_positively_homogeneous_any_c(g, c, variant):
    # Away from dot == 0, where rounding could flip a conflict decision.
    assume(abs(float(g[0] @ g[1])) > 1e-6 * float(g[0].norm() * g[1].norm()))
    a, _ = surgery(g, variant)
    b, _ = surgery(c * g, variant)
    torch.testing.assert_close(b, c * a, rtol=1e-9, atol=1e-9 * c)


# ---------------------------------------------------------------- end to end

def ref_proj(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dot = a @ b
    return a - dot / (b @ b) * b if dot < 0 and b @ b > 0 else a


def ref_dominant(gs: list[torch.Tensor]) -> torch.Tensor:
    d = max(range(len(gs)), key=lambda i: float(gs[i].norm()))
    return gs[d] + sum(ref_proj(g, gs[d]) for i, g in enumerate(gs) if i != d)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(4, 4)  # frozen, like a frozen embedding layer
        self.embed.requires_grad_(False)
        self.trunk = nn.Linear(4, 3)
        self.unused = nn.Parameter(torch.ones(2))  # shared but reached by no task
        self.heads = nn.ModuleDict({"sst": nn.Linear(3, 5), "para": nn.Linear(3, 1), "sts": nn.Linear(3, 1)})
        g = torch.Generator().manual_seed(7)  # data seed where sst-para and para-sts conflict, sst-sts do not
        self.x = {k: torch.randn(6, 4, generator=g, dtype=torch.float64) for k in self.heads}
        self.y_sst = torch.randint(0, 5, (6,), generator=g)
        self.y_para = torch.randint(0, 2, (6,), generator=g).double()
        self.y_sts = torch.rand(6, generator=g, dtype=torch.float64) * 5
        self.double()

    def shared(self) -> list[nn.Parameter]:
        return [*self.embed.parameters(), *self.trunk.parameters(), self.unused]

    def losses(self, tasks=("sst", "para", "sts"), sts_through_trunk=True) -> dict[str, torch.Tensor]:
        """Fresh graphs each call: one forward per task over its own sub-batch."""
        enc = lambda k: torch.tanh(self.trunk(self.embed(self.x[k])))
        out = {}
        if "sst" in tasks:
            out["sst"] = F.cross_entropy(self.heads["sst"](enc("sst")), self.y_sst)
        if "para" in tasks:
            out["para"] = F.binary_cross_entropy_with_logits(self.heads["para"](enc("para")).squeeze(-1), self.y_para)
        if "sts" in tasks:
            h = enc("sts") if sts_through_trunk else self.x["sts"][:, :3]  # else: trunk-free loss
            out["sts"] = F.mse_loss(self.heads["sts"](h).squeeze(-1), self.y_sts)
        return out


def trunk_grads(m: Tiny, loss: torch.Tensor) -> torch.Tensor:
    gs = torch.autograd.grad(loss, list(m.trunk.parameters()), allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(gs, m.trunk.parameters())])


def head_grads(m: Tiny, task: str) -> list[torch.Tensor]:
    return list(torch.autograd.grad(m.losses((task,))[task], list(m.heads[task].parameters())))


def trunk_dot_grad(m: Tiny) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in m.trunk.parameters()])


def check_frozen_and_heads(m: Tiny, tasks, refs):
    assert all(p.grad is None for p in m.embed.parameters())
    assert m.unused.grad is None
    for task in tasks:
        for p, r in zip(m.heads[task].parameters(), refs[task]):
            torch.testing.assert_close(p.grad, r, rtol=1e-12, atol=1e-15)


def test_end_to_end_two_tasks_pcgrad():
    m = Tiny()
    ref = {k: trunk_grads(m, loss) for k, loss in m.losses(("sst", "para")).items()}
    g1, g2 = ref["sst"], ref["para"]
    assert g1 @ g2 < 0, "fixture must conflict for the projection to be exercised"
    expected = ref_proj(g1, g2) + ref_proj(g2, g1)
    heads = {k: head_grads(m, k) for k in ("sst", "para")}

    pc = PCGrad(m.shared(), "pcgrad")
    assert len(pc.params) == 3  # trunk weight, trunk bias, unused; the frozen embed is out
    stats = pc.backward(m.losses(("sst", "para")))
    torch.testing.assert_close(trunk_dot_grad(m), expected, rtol=1e-12, atol=1e-15)
    assert not torch.allclose(expected, g1 + g2)  # surgery did something
    check_frozen_and_heads(m, ("sst", "para"), heads)
    assert m.heads["sts"].weight.grad is None
    assert (stats.pairs, stats.conflicting) == (1, 1)
    assert stats.mean_conflict_cosine == pytest.approx(float(F.cosine_similarity(g1, g2, dim=0)))


@pytest.mark.parametrize("variant", ["pcgrad", "dominant"])
def test_end_to_end_three_tasks(variant):
    m = Tiny()
    gs = [trunk_grads(m, loss) for loss in m.losses().values()]
    heads = {k: head_grads(m, k) for k in m.heads}
    if variant == "dominant":
        candidates = [ref_dominant(gs)]
    else:  # every combination of per-task orders of the others (Algorithm 1)
        def one(i, order):
            g = gs[i]
            for j in order:
                g = ref_proj(g, gs[j])
            return g
        per_task = [[one(i, o) for o in itertools.permutations([j for j in range(3) if j != i])] for i in range(3)]
        candidates = [sum(c) for c in itertools.product(*per_task)]

    pc = PCGrad(m.shared(), variant, seed=0)
    stats = pc.backward(m.losses())
    got = trunk_dot_grad(m)
    assert any(torch.allclose(got, c, rtol=1e-12, atol=1e-15) for c in candidates)
    check_frozen_and_heads(m, m.heads, heads)
    assert not any(torch.allclose(sum(gs), c) for c in candidates)  # surgery must matter here
    assert (stats.pairs, stats.conflicting) == (3, 2)
    assert stats.conflicting == sum(float(gs[i] @ gs[j]) < 0 for i, j in [(0, 1), (0, 2), (1, 2)])


class FakeScaler:
    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * 1024

    def get_scale(self) -> float:
        return 1024.0


@pytest.mark.parametrize("variant", ["pcgrad", "dominant"])
def test_scaler_gives_scaled_result(variant):
    m = Tiny()
    pc = PCGrad(m.shared(), variant, seed=5)
    pc.backward(m.losses(("sst", "para")))
    plain = trunk_dot_grad(m).clone()
    head_plain = m.heads["sst"].weight.grad.clone()
    m.zero_grad(set_to_none=True)
    pc = PCGrad(m.shared(), variant, seed=5)
    pc.backward(m.losses(("sst", "para")), scaler=FakeScaler())
    torch.testing.assert_close(trunk_dot_grad(m), 1024 * plain, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(m.heads["sst"].weight.grad, 1024 * head_plain, rtol=1e-12, atol=0.0)


def test_trunk_free_task_is_zero_row():
    m = Tiny()
    ref = {k: trunk_grads(m, loss) for k, loss in m.losses(sts_through_trunk=False).items()}
    assert torch.equal(ref["sts"], torch.zeros_like(ref["sts"]))
    g1, g2 = ref["sst"], ref["para"]
    heads = {k: head_grads(m, k) for k in ("sst", "para")}
    heads["sts"] = list(torch.autograd.grad(m.losses(("sts",), sts_through_trunk=False)["sts"],
                                            list(m.heads["sts"].parameters())))
    for variant in ("pcgrad", "dominant"):
        m.zero_grad(set_to_none=True)
        stats = PCGrad(m.shared(), variant).backward(m.losses(sts_through_trunk=False))
        got = trunk_dot_grad(m)
        assert torch.isfinite(got).all()
        expected = ref_proj(g1, g2) + ref_proj(g2, g1) if variant == "pcgrad" else ref_dominant([g1, g2])
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15)
        check_frozen_and_heads(m, m.heads, heads)
        assert (stats.pairs, stats.conflicting) == (3, 1)


def test_reduce_sees_buffer_and_buffer_is_reused():
    """reduce() gets the tasks' flattened shared gradients in one buffer, and the same buffer (no new
    allocation) at every step; what it does to it is what the parameters' gradients then hold."""
    m = Tiny()
    seen = []

    def halve(buf: torch.Tensor) -> None:  # stands in for an all-reduce average
        seen.append((tuple(buf.shape), buf.data_ptr()))
        buf.mul_(0.5)

    pc = PCGrad(m.shared(), "dominant")
    pc.backward(m.losses(("sst", "para")))
    full = trunk_dot_grad(m).clone()
    m.zero_grad(set_to_none=True)
    pc.backward(m.losses(("sst", "para")), reduce=halve)
    n_shared = sum(p.numel() for p in m.trunk.parameters()) + m.unused.numel()
    assert [shape for shape, _ in seen] == [(2, n_shared)]
    torch.testing.assert_close(trunk_dot_grad(m), 0.5 * full, rtol=1e-12, atol=0.0)
    m.zero_grad(set_to_none=True)
    pc.backward(m.losses(("sst", "para")), reduce=halve)
    assert seen[1] == seen[0]  # the same storage again


def test_refuses_stale_shared_grads():
    m = Tiny()
    pc = PCGrad(m.shared())
    pc.backward(m.losses())
    with pytest.raises(RuntimeError, match="zero_grad"):
        pc.backward(m.losses())
