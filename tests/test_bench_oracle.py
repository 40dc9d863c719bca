"""The benchmark scripts' arithmetic and protocol against independent references.

Every timed function or clock of a script is replaced by a fake that advances a fake clock by durations given
here (each arm's k-th call takes its k-th duration), so that what a script prints or returns can be set beside
what numpy computes from those same durations: the median of the per-round paired ratios and its
interquartile range (numpy's linear percentiles 25 and 75), medians and minima of the timed rounds only (the
warm-up rounds are given durations far off the timed ones, so that counting one shows), the order of the arms
within each round (as each script's docstring says: alternating, reversed or rotated), FLOP counts written out
from the architecture (and the parameters of torch's own transformer layer), and the figures another script
reads back. No real timing runs here, and no model is built: each script's main() runs on fakes.

Eight faults this check found (2026-11-30) are fixed; their tests say what was wrong.
"""
from __future__ import annotations

import collections
import json
import re
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bench_scripts import bench_script

pytestmark = pytest.mark.usefixtures("one_thread")

# ----------------------------------------------------------------------------- the references


def ref_paired(num, den) -> tuple[float, float, float]:
    """Median and first and third quartile (numpy, linear) of the per-round ratios num[i] / den[i]."""
    r = np.asarray(num, float) / np.asarray(den, float)
    q1, q3 = np.percentile(r, [25, 75])
    return float(np.median(r)), float(q1), float(q3)


def ref_quartiles(xs) -> tuple[float, float, float]:
    q1, med, q3 = np.percentile(np.asarray(xs, float), [25, 50, 75])
    return float(med), float(q1), float(q3)


def palm_train_flops(L: int, H: int, F: int, B: int, T: int) -> float:
    """PaLM (Chowdhery et al. 2022, appendix B) for a BERT-style encoder with its pooler: 6 N per token for
    the N non-embedding weights, plus 12 L H T per token for the attention (scores and values, forward and
    backward; H = heads x head size). Per layer: the query, key, value and output projections (4 H x H), the
    feed-forward's two (H x F and F x H); the pooler one H x H."""
    q, k, v, o = H * H, H * H, H * H, H * H
    ffn_in, ffn_out = H * F, F * H
    n = L * (q + k + v + o + ffn_in + ffn_out) + H * H
    tokens = B * T
    return 6.0 * n * tokens + 12.0 * L * H * T * tokens


def matmul_step_flops(L: int, H: int, F: int, B: int, T: int) -> float:
    """cpu_step's documented count written out: every product of the encoder's forward at 2 FLOPs per
    multiply-add (the four projections and the FFN's two, on B x T tokens; Q K^T and A V, each B x T x T x H),
    and the backward twice the forward (an input gradient and a weight gradient per product)."""
    tokens = B * T
    linears = 2 * tokens * (H * 3 * H + H * H + H * F + F * H)
    attention = 2 * (B * T * T * H) + 2 * (B * T * T * H)
    return 3.0 * L * (linears + attention)


# ----------------------------------------------------------------------------- the fakes


class Script:
    """Durations fed to the timed code. take(arm) advances the fake clock by the arm's next duration (split over
    `parts` calls where a round times several calls of the arm: one step per task batch) and records the order
    in which the arms ran. Calls past the given durations take no time (code run after the timing)."""

    def __init__(self, durations: dict):
        self.now = 0.0
        self.durations = {k: list(v) for k, v in durations.items()}
        self.calls = collections.Counter()
        self.order: list = []

    def clock(self) -> float:
        return self.now

    def take(self, arm, parts: int = 1) -> float:
        k = self.calls[arm]
        self.calls[arm] += 1
        if k % parts == 0:
            self.order.append(arm)
        seq = self.durations[arm]
        d = seq[k // parts] / parts if k // parts < len(seq) else 0.0
        self.now += d
        return d


def rounds_order(names: list, n_rounds: int, how: str) -> list:
    """The documented order of the arms over the rounds: "alternate" (as listed, then reversed, ...) or
    "rotate" (round r starts at the arm r mod n)."""
    out = []
    for r in range(n_rounds):
        if how == "alternate":
            out += names if r % 2 == 0 else names[::-1]
        else:
            k = r % len(names)
            out += names[k:] + names[:k]
    return out


class FakeData:
    """A task's examples as the scripts read them: the task, its length and its token lengths."""

    def __init__(self, task: str, lengths):
        self.task, self.lengths = task, np.asarray(lengths)

    def __len__(self):
        return len(self.lengths)


class FakeBatch:
    def __init__(self, task: str, n: int = 4, T: int = 8, cached: bool = False):
        self.task, self.size = task, n
        self.inputs = [{("hidden" if cached else "input_ids"): torch.zeros(n, T)}]
        self.labels = torch.zeros(n)

    def to(self, device):
        return self


class FakeStepper:
    """Stepper.step on one arm: each call one of the arm's task steps in the round."""

    def __init__(self, script: Script, arm, parts: int = 3, layers: int = 6, losses=None):
        self.script, self.arm, self.parts, self.losses = script, arm, parts, losses
        self.model = SimpleNamespace(encoder=SimpleNamespace(num_layers=layers))
        self.cfg = SimpleNamespace()

    def step(self, batches, i):
        self.script.take(self.arm, self.parts)
        if self.losses is None:
            return None
        return {b.task: {"loss": self.losses[self.arm][i]} for b in batches}


def numbers(line: str) -> list[float]:
    """The numbers in a printed line; a sign only where it starts a number ("[0.8-0.9]" is 0.8 and 0.9)."""
    return [float(x) for x in re.findall(r"(?:(?<![\w.)\]])[-+])?\d+\.?\d*(?:e[-+]?\d+)?", line.replace(",", ""))]


def line_of(out: str, start: str) -> str:
    got = [x for x in out.splitlines() if x.lstrip().startswith(start)]
    assert got, f"no line starting {start!r} in:\n{out}"
    return got[0]


TOL2 = 0.0051  # a figure printed with two decimals: half a unit, and the rounding of an exact half

# A pattern of durations for two arms over 2 warm-up and 5 timed rounds: the paired median (0.80) is not the
# ratio of the medians (0.9 / 1.0), and the warm-up rounds are far off (0.001 s and 9 s) so that counting one
# moves the minimum and the medians.
A_TIMED = [0.8, 0.9, 1.0, 1.2, 0.7]
B_TIMED = [1.0, 1.0, 1.25, 1.0, 1.0]
A_WARM, B_WARM = [0.001, 0.001], [9.0, 9.0]


# ----------------------------------------------------------------------------- common.py


@pytest.fixture(scope="module")
def common():
    return bench_script("common")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 30])
def test_paired_ratios_are_numpys_median_and_quartiles_of_the_per_round_ratios(common, n):
    rng = np.random.default_rng(n)
    num, den = rng.uniform(0.5, 2.0, n).tolist(), rng.uniform(0.5, 2.0, n).tolist()
    assert common.paired_ratios(num, den) == pytest.approx(ref_paired(num, den), rel=1e-12)


def test_paired_ratios_pair_by_round_not_ratio_of_medians(common):
    med, q1, q3 = common.paired_ratios(A_TIMED, B_TIMED)
    assert (med, q1, q3) == pytest.approx((0.8, 0.8, 0.9))
    assert statistics.median(A_TIMED) / statistics.median(B_TIMED) == pytest.approx(0.9)  # what it is not


def test_three_rounds_quartiles_are_the_middles_of_the_lower_and_upper_pairs(common):
    """docs/benchmarks.md: "with 3 rounds: the middle of the lower and upper pairs"."""
    med, q1, q3 = common.paired_ratios([3.0, 1.0, 2.0], [1.0, 1.0, 1.0])
    assert (med, q1, q3) == pytest.approx((2.0, 1.5, 2.5))


def test_the_clock_is_cpu_time_with_one_thread_else_wall(common):
    import time
    assert common.pick_clock("auto", 1)[0] is time.process_time
    assert common.pick_clock("auto", 2)[0] is time.perf_counter
    assert common.pick_clock("auto", None)[0] is time.perf_counter
    assert common.pick_clock("cpu", 4)[0] is time.process_time
    assert common.pick_clock("wall", 1)[0] is time.perf_counter


# ----------------------------------------------------------------------------- encoder_vs_hf.py


@pytest.fixture(scope="module")
def evh():
    return bench_script("encoder_vs_hf")


MINILM = dict(L=6, H=384, F=1536)
BERT_BASE = dict(L=12, H=768, F=3072)


def _cfg(L, H, F, heads=12, model_type="bert"):
    return SimpleNamespace(num_hidden_layers=L, hidden_size=H, intermediate_size=F, num_attention_heads=heads,
                           model_type=model_type, vocab_size=2000, pad_token_id=0)


@pytest.mark.parametrize("shape", [MINILM, BERT_BASE, dict(L=2, H=32, F=64)])
@pytest.mark.parametrize("B,T", [(32, 128), (8, 32), (1, 7)])
def test_train_flops_is_palms_count(evh, shape, B, T):
    assert evh.train_flops(_cfg(**shape), B, T) == pytest.approx(palm_train_flops(**shape, B=B, T=T), rel=1e-12)


def test_train_flops_counts_every_matrix_of_a_transformer_encoder_and_the_pooler(evh):
    """The N of 6N against torch's own transformer layer (nn.TransformerEncoderLayer: the same projections and
    feed-forward as a BERT layer) and a pooler (nn.Linear), counting their parameters with two dimensions
    (biases and LayerNorms, about 0.3% of MiniLM's non-embedding parameters, are left out, as the code says)."""
    L, H, F, heads = 2, 32, 64, 4
    layers = torch.nn.ModuleList(torch.nn.TransformerEncoderLayer(H, heads, F) for _ in range(L))
    pooler = torch.nn.Linear(H, H)
    n = sum(p.numel() for m in (layers, pooler) for p in m.parameters() if p.ndim == 2)
    tokens = 3 * 5
    assert evh.train_flops(_cfg(L, H, F), 3, 5) == 6 * n * tokens + 12 * L * H * 5 * tokens


@pytest.mark.parametrize("shape,ms,tflops,mfu", [(BERT_BASE, 24.7, 87, 0.088), (MINILM, 15.8, None, 0.018)])
def test_the_h200_rows_mfu_follows_from_their_step_times(shape, ms, tflops, mfu):
    """docs/benchmarks.md's H200 rows (32 x 128, 989 TFLOP/s): bert-base shape 24.7 ms, "MFU 8.8% (87
    TFLOP/s)"; MiniLM 15.8 ms, "MFU 1.8%" — recomputed from the step time with PaLM's count."""
    got = palm_train_flops(**shape, B=32, T=128) / (ms / 1e3) / 1e12
    if tflops is not None:
        assert round(got) == tflops
    assert round(got / 989, 3) == pytest.approx(mfu)


def test_peak_tflops_is_the_sxm_parts_dense_bf16_peak_or_none(evh, monkeypatch):
    """989 TFLOP/s is the H100/H200 SXM dense bf16 peak (NVIDIA's datasheet: 1979 with sparsity); PCIe and NVL
    parts are slower and get none; a CPU gets none; --peak-tflops wins."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    bf16 = SimpleNamespace(peak_tflops=None, precision="bf16")
    for name, want in [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("NVIDIA H100 PCIe", None),
                       ("NVIDIA H100 NVL", None), ("NVIDIA A100-SXM4-80GB", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, name=name: name)
        assert evh.peak_tflops(bf16, cuda) == want, name
    assert evh.peak_tflops(bf16, cpu) is None
    assert evh.peak_tflops(SimpleNamespace(peak_tflops=312.0, precision="bf16"), cpu) == 312.0


def _train_step(script):
    return lambda model, opt, batch, device, bf16: script.take(model)


def test_encoder_steps_alternate_and_leave_the_warmup_out(evh, monkeypatch):
    """"A B, then B A, ...": each round both arms, the order reversed every other round; only rounds after
    --warmup are timed."""
    warm = 3
    script = Script({"A": [0.001] * warm + A_TIMED, "B": [9.0] * warm + B_TIMED})
    monkeypatch.setattr(evh, "train_step", _train_step(script))
    runs = {"minbert": ("A", None, "fused", "matmul"), "transformers": ("B", None, "fused", "sdpa")}
    times, peak = evh.time_interleaved(runs, {}, torch.device("cpu"), SimpleNamespace(seed=0, warmup=warm, steps=5,
                                                                                        precision="fp32"))
    assert script.order == rounds_order(["A", "B"], warm + 5, "alternate")
    assert times == {"minbert": A_TIMED, "transformers": B_TIMED}
    assert peak == {"minbert": 0, "transformers": 0}


def test_encoder_peak_memory_is_the_timed_steps_largest_rise_above_what_was_allocated(evh, monkeypatch):
    """On CUDA: per step, the allocator's peak minus what was allocated before the step; per arm the largest
    over the timed steps (a warm-up step's larger rise left out)."""
    mem = {"alloc": 1000 * 2**20, "peak": 0}
    rises = {"A": [9000, 100, 300, 200], "B": [9000, 400, 250, 500]}  # MiB; round 0 is the warm-up
    calls = collections.Counter()

    def step(model, opt, batch, device, bf16):
        mem["peak"] = max(mem["peak"], mem["alloc"] + rises[model][calls[model]] * 2**20)
        calls[model] += 1
        return 1.0

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: mem.update(peak=mem["alloc"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: mem["alloc"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: mem["peak"])
    monkeypatch.setattr(evh, "train_step", step)
    runs = {"minbert": ("A", None, "fused", "sdpa"), "transformers": ("B", None, "fused", "sdpa")}
    _, peak = evh.time_interleaved(runs, {}, torch.device("cuda"),
                                   SimpleNamespace(seed=0, warmup=1, steps=3, precision="bf16"))
    assert peak == {"minbert": 300 * 2**20, "transformers": 500 * 2**20}


class FakeEncoder:
    def __init__(self, cfg):
        self.config = cfg

    def to(self, device):
        return self

    def train(self):
        return self

    def eval(self):
        return self

    def __call__(self, **batch):
        return SimpleNamespace(pooler_output=torch.zeros(2, 3))


def run_encoder_vs_hf(evh, monkeypatch, capsys, a, b, extra=()) -> str:
    """encoder_vs_hf.main on a MiniLM-shaped fake, batch 32 x 64, with the given per-round seconds."""
    script = Script({"A": a, "B": b})
    cfg = _cfg(**MINILM)
    ours, ref = FakeEncoder(cfg), FakeEncoder(cfg)
    monkeypatch.setattr(evh, "checkpoint_dir", lambda args, tmp: Path(tmp))
    monkeypatch.setattr(evh, "load_bert", lambda path, attn_impl: ours)
    monkeypatch.setattr(evh, "load_reference", lambda path, attn: (ref, "sdpa"))
    monkeypatch.setattr(evh, "make_batch", lambda args, cfg, dev: {"attention_mask": torch.ones(2, 4)})
    monkeypatch.setattr(evh, "make_optimizer", lambda model, dev: (None, "fused"))
    monkeypatch.setattr(evh, "train_step", lambda model, *r: script.take("A" if model is ours else "B"))
    capsys.readouterr()
    evh.main(["--device", "cpu", "--precision", "fp32", "--batch-size", "32", "--seq-len", "64",
              "--warmup", "2", "--steps", str(len(a) - 2), *extra])
    return capsys.readouterr().out


def test_encoder_table_medians_minima_tflops_mfu_and_ratio(evh, monkeypatch, capsys):
    a = [x / 100 for x in A_WARM + A_TIMED]  # steps of about 10 ms: TFLOP/s with digits to compare
    b = [x / 100 for x in B_WARM + B_TIMED]
    out = run_encoder_vs_hf(evh, monkeypatch, capsys, a, b, ["--peak-tflops", "100"])
    flops = palm_train_flops(**MINILM, B=32, T=64)
    for name, timed in (("minbert", a[2:]), ("transformers", b[2:])):
        f = line_of(out, name + " ").split()
        med = float(np.median(timed))
        assert float(f[2]) == pytest.approx(med, abs=5.1e-5) and float(f[3]) == pytest.approx(min(timed), abs=5.1e-5)
        assert float(f[4]) == pytest.approx(flops / med / 1e12, abs=TOL2)
        assert float(f[5].rstrip("%")) == pytest.approx(100 * (flops / med / 1e12) / 100, abs=0.051)  # % of 100
    ratio = re.search(r"ratio minbert / transformers: ([\d.]+)x \(median of 5 paired steps, IQR ([\d.]+)-([\d.]+)\)",
                      out)
    assert ratio, out
    assert [float(x) for x in ratio.groups()] == pytest.approx(ref_paired(a[2:], b[2:]), abs=TOL2)

    # and the GPU summary reads the same figures back from that table
    rows = bench_script("gpu_summary").encoder_rows(out)
    assert rows["minbert"]["median_s"] == pytest.approx(np.median(a[2:]), abs=5.1e-5)
    assert rows["minbert"]["mfu"] == pytest.approx(flops / np.median(a[2:]) / 1e12 / 100, abs=5.1e-4)
    assert rows["minbert"]["ratio"] == pytest.approx(ref_paired(a[2:], b[2:])[0], abs=TOL2)
    assert rows["transformers"]["median_s"] == pytest.approx(np.median(b[2:]), abs=5.1e-5)


def test_gpu_summary_judges_the_step_ratio_target_on_the_measured_figure(evh, monkeypatch, capsys, tmp_path):
    """gpu_summary.py sets the step-time target (<= 0.9) against the ratio as encoder_vs_hf.py prints it: to
    3 decimals now, so that a measured paired median of 0.904 is over the target (printed to 2 decimals it
    read 0.90x and was reported "met"; the MFU, now to 0.01%, likewise). Ours 9.04 ms and transformers
    10 ms every step."""
    out = run_encoder_vs_hf(evh, monkeypatch, capsys, [0.00904] * 7, [0.01] * 7)
    assert "ratio minbert / transformers: 0.904x" in out
    res = tmp_path / "res"
    res.mkdir()
    (res / "status.tsv").write_text("bench-encoder-bert-base\t0\t20.0\t2026-12-01T10:00:00\n")
    (res / "bench-encoder-bert-base.log").write_text(out)
    text = bench_script("gpu_summary").write_summary(res).read_text()
    assert "(target <= 0.9: **missed**)" in text, [x for x in text.splitlines() if "step time" in x]


# ----------------------------------------------------------------------------- encoder_grid.py


@pytest.fixture(scope="module")
def grid():
    return bench_script("encoder_grid")


def test_grid_cells_rotate_the_arms_and_leave_the_warmup_out(grid, monkeypatch):
    script = Script({"x": [9.0, 1, 2, 3, 4], "y": [9.0, 5, 6, 7, 8], "z": [9.0, 9, 10, 11, 12]})
    monkeypatch.setattr(grid, "step_seconds", lambda model, opt, fwd, batch, clock: script.take(model))
    arms = {n: (n, None, None) for n in "xyz"}
    times = grid.time_cell(arms, {}, 1, 4, None)
    assert script.order == rounds_order(["x", "y", "z"], 5, "rotate")
    assert times == {"x": [1, 2, 3, 4], "y": [5, 6, 7, 8], "z": [9, 10, 11, 12]}


def test_grid_padded_batches_draw_lengths_in_a_quarter_to_all_with_one_full(grid):
    """Padded cells: each length uniform in [T/4, T], one sequence T long; the mask a prefix of ones."""
    cfg = _cfg(**MINILM)
    for B, T in [(8, 32), (64, 256), (3, 5)]:
        mask = grid.make_batch(B, T, True, cfg, 7)["attention_mask"]
        lengths = mask.sum(1)
        assert lengths[0] == T and bool(((lengths >= max(1, T // 4)) & (lengths <= T)).all())
        assert torch.equal(mask, (torch.arange(T)[None, :] < lengths[:, None]).long())
        assert int(grid.make_batch(B, T, False, cfg, 7)["attention_mask"].sum()) == B * T


def test_grid_table_gives_each_arms_median_ms_and_paired_ratios_against_the_reference(grid, monkeypatch, capsys):
    durations = {"ours": [0.05, 0.8, 0.9, 1.0, 1.2, 0.7], "ours-cls": [0.05, 0.6, 0.7, 0.75, 0.9, 0.5],
                 "hf-sdpa": [5.0, 1.0, 1.0, 1.25, 1.0, 1.0]}
    script = Script(durations)
    model = FakeEncoder(_cfg(**MINILM))
    arms = {name: (name if name != "ours" else model, None, None) for name in durations}
    monkeypatch.setattr(grid, "checkpoint_dir", lambda args, tmp: Path(tmp))
    monkeypatch.setattr(grid, "build_arms", lambda args, path: arms)
    monkeypatch.setattr(grid, "step_seconds",
                        lambda m, opt, fwd, batch, clock: script.take("ours" if m is model else m))
    args = grid.parse_args(["--batch-sizes", "2", "--lengths", "8", "--padding", "unpadded", "--repeats", "5",
                            "--warmup", "1"])
    capsys.readouterr()
    grid.run_grid(args)
    out = capsys.readouterr().out
    header = line_of(out, "| batch")
    assert "| ours ms | ours-cls ms | hf-sdpa ms | ours / hf-sdpa median [IQR] | ours-cls / hf-sdpa median [IQR] |" \
        in header
    cells = [c.strip() for c in line_of(out, "| 2 | 8 |").strip("|").split("|")]
    assert cells[:4] == ["2", "8", "no", "16"]
    for cell, name in zip(cells[4:7], durations):
        assert float(cell) == pytest.approx(np.median(durations[name][1:]) * 1e3, abs=0.51)
    for cell, name in zip(cells[7:], ["ours", "ours-cls"]):
        assert numbers(cell) == pytest.approx(ref_paired(durations[name][1:], durations["hf-sdpa"][1:]), abs=TOL2)


def test_attention_core_alternates_paths_and_prints_sdpa_over_matmul(grid, monkeypatch, capsys):
    """--attn-core: per round each path's three calls timed together, matmul first in even rounds, sdpa in
    odd ones, after --warmup rounds; each cell sdpa / matmul, the median of paired rounds [IQR]; the training
    cell (dropout 0.1, forward and backward) and the evaluation one (no dropout) apart."""
    table = {("matmul", 0.1): [50.0, 1.0, 2.0, 4.0, 1.0], ("sdpa", 0.1): [0.01, 1.5, 2.0, 2.0, 3.0],
             ("matmul", 0.0): [50.0, 2.0, 2.0, 2.0, 2.0], ("sdpa", 0.0): [0.01, 1.0, 3.0, 1.0, 0.5]}
    script = Script(table)

    def core(q, k, v, bias, p, impl):
        script.take((impl, p), parts=3)
        return q * 1.0

    monkeypatch.setattr(grid, "attention_core", core)
    monkeypatch.setattr(grid, "pick_clock", lambda kind, threads: (script.clock, "fake"))
    args = grid.parse_args(["--attn-core", "--batch-sizes", "1", "--lengths", "4", "--padding", "unpadded",
                            "--repeats", "4", "--warmup", "1"])
    capsys.readouterr()
    grid.run_attn_core(args)
    out = capsys.readouterr().out
    want = []
    for p in (0.1, 0.0):
        want += [(impl, p) for r in range(5) for impl in (("sdpa", "matmul") if r % 2 else ("matmul", "sdpa"))]
    assert script.order == want
    cells = [c.strip() for c in line_of(out, "| 1 | 4 |").strip("|").split("|")]
    for cell, p in zip(cells[4:], (0.1, 0.0)):
        assert numbers(cell) == pytest.approx(ref_paired(table[("sdpa", p)][1:], table[("matmul", p)][1:]), abs=TOL2)


# ----------------------------------------------------------------------------- cpu_step.py


@pytest.fixture(scope="module")
def cpu_step():
    return bench_script("cpu_step")


@pytest.mark.parametrize("shape", [MINILM, BERT_BASE, dict(L=2, H=32, F=64)])
def test_cpu_step_flops_are_the_matmuls_written_out(cpu_step, shape):
    assert cpu_step.step_flops(_cfg(**shape), 32, 128) == pytest.approx(matmul_step_flops(**shape, B=32, T=128))


def test_cpu_step_docs_275_gflop_for_minilm_32_by_128():
    assert round(matmul_step_flops(**MINILM, B=32, T=128) / 1e9) == 275


def test_cpu_step_gemm_rate_times_the_steps_own_products(cpu_step, monkeypatch):
    """The GEMM rate's FLOPs are one layer's share of the step's (the same products: forward, input gradient
    and weight gradient of every linear, the attention's two batched products three times): with every
    product timed at 1 ms, the rate is that layer's FLOPs over 18 ms (4 linears x 3 + 2 products x 3)."""
    monkeypatch.setattr(cpu_step, "_timed", lambda f, a, b: 1e-3)
    L, H, F, B, T = 3, 8, 16, 2, 4
    rate = cpu_step.gemm_rate(_cfg(L, H, F, heads=2), B, T, None, repeats=1)
    assert rate == pytest.approx(matmul_step_flops(L, H, F, B, T) / L / 18e-3)


def test_cpu_step_table_rates_and_paired_ratios(cpu_step, monkeypatch, capsys):
    durations = {"ours": [0.1, 3.0, 4.0, 3.5, 3.8, 4.4], "ours, nn.Dropout": [60.0, 3.3, 4.4, 3.5, 4.0, 4.4],
                 "transformers": [60.0, 4.0, 4.0, 4.5, 4.0, 4.6]}
    script = Script(durations)
    cfg = _cfg(**MINILM)
    monkeypatch.setattr(cpu_step, "arms", lambda args: {n: SimpleNamespace(config=cfg) for n in durations})
    monkeypatch.setattr(cpu_step, "run_step", lambda name, model, ids, dtype: script.take(name))
    monkeypatch.setattr(cpu_step, "time", SimpleNamespace(perf_counter=script.clock))
    monkeypatch.setattr(cpu_step, "gemm_rate", lambda cfg, B, T, dtype: 100e9)
    capsys.readouterr()
    cpu_step.main(["--steps", "5", "--warmup", "1", "--precisions", "fp32", "--batch-size", "32", "--length", "128"])
    out = capsys.readouterr().out
    assert script.order == rounds_order(list(durations), 6, "alternate")
    flops = matmul_step_flops(**MINILM, B=32, T=128)
    assert f"{flops / 1e9:.0f} GFLOP a step" in out
    for name, ts in durations.items():
        line = line_of(out, name + " ")
        med = float(np.median(ts[1:]))
        ms, gflops, share = numbers(line.split(name, 1)[1])[:3]
        assert ms == pytest.approx(med * 1e3, abs=0.51)
        assert gflops == pytest.approx(flops / med / 1e9, abs=0.51)
        assert share == pytest.approx(100 * flops / med / 100e9, abs=0.51)
        for other in ("transformers", "ours, nn.Dropout"):
            if other != name:
                got = re.search(rf"x([\d.]+) of {re.escape(other)} \[([\d.]+)-([\d.]+)\]", line)
                assert got, line
                assert [float(g) for g in got.groups()] == pytest.approx(ref_paired(ts[1:], durations[other][1:]),
                                                                         abs=TOL2)


# ----------------------------------------------------------------------------- peft_cost.py


@pytest.fixture(scope="module")
def peft():
    return bench_script("peft_cost")


def test_peft_rounds_alternate_and_a_step_is_the_rounds_mean_task_step(peft, monkeypatch):
    script = Script({"full": [9.0, 0.3, 0.6, 0.9], "lora": [0.001, 0.15, 0.3, 0.6]})
    monkeypatch.setattr(peft, "pick_clock", lambda kind, threads: (script.clock, "fake"))
    arms = {n: (FakeStepper(script, n), [FakeBatch(t) for t in ("sst", "para", "sts")]) for n in ("full", "lora")}
    times, _ = peft.time_arms(arms, SimpleNamespace(clock="auto", threads=1, warmup=1, steps=3),
                              torch.device("cpu"))
    assert script.order == rounds_order(["full", "lora"], 4, "alternate")
    assert times["full"] == pytest.approx([0.1, 0.2, 0.3]) and times["lora"] == pytest.approx([0.05, 0.1, 0.2])


def _fake_cuda_peaks(monkeypatch, script: Script, peaks_mib: dict):
    """torch.cuda's allocator peak as the fake steps leave it: each arm's round r peaks at peaks_mib[arm][r]."""
    state = {"peak": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: state.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: state["peak"])

    class Stepper(FakeStepper):
        def step(self, batches, i):
            state["peak"] = max(state["peak"], peaks_mib[self.arm][i] * 2**20)
            return super().step(batches, i)
    return Stepper


def test_peft_cost_cuda_peak_memory_is_the_timed_rounds(peft, monkeypatch):
    """Fixed 2026-11-30, what was wrong: peft_cost.py's docstring says "on CUDA the allocator's peak over the arm's
    timed steps", but time_arms() takes the maximum over every round, the --warmup rounds included (`peaks[name] =
    max(...)` runs before `if i >= args.warmup`), so a warm-up step's one-time transients (a first step's workspaces,
    the optimiser's state being created, the allocator's first blocks) can set the arm's figure. Reproduction: an arm
    whose warm-up round peaks at 3000 MiB and whose timed rounds peak at 1000 MiB is reported at 3000 MiB
    (encoder_vs_hf.py, for comparison, reads the peak inside its `if i >= args.warmup`)."""
    script = Script({"full": [0.3] * 3, "bitfit": [0.2] * 3})
    Stepper = _fake_cuda_peaks(monkeypatch, script, {"full": [3000, 1000, 1000], "bitfit": [800, 700, 750]})
    monkeypatch.setattr(peft, "pick_clock", lambda kind, threads: (script.clock, "fake"))
    arms = {n: (Stepper(script, n), [FakeBatch(t) for t in ("sst", "para", "sts")]) for n in ("full", "bitfit")}
    _, peaks = peft.time_arms(arms, SimpleNamespace(clock="auto", threads=1, warmup=1, steps=2),
                              torch.device("cuda"))
    assert peaks == {"full": 1000, "bitfit": 750}


def test_peft_table_seconds_quartiles_speedups_and_shares(peft, monkeypatch, capsys):
    durations = {"full": [9.0, 0.18, 0.20, 0.17, 0.19, 0.25], "freeze 2": [0.001, 0.09, 0.11, 0.10, 0.08, 0.1],
                 "bitfit": [9.0, 0.12, 0.11, 0.13, 0.10, 0.2], "lora r8": [0.001, 0.15, 0.16, 0.14, 0.20, 0.15]}
    script = Script(durations)
    counts = {"full": (22_863_751, 22_863_751), "freeze 2": (7_396_231, 22_863_751),
              "bitfit": (324_103, 22_863_751), "lora r8": (630_151, 23_493_902)}

    def name_of(options: dict) -> str:
        if not options:
            return "full"
        if "freeze_upto" in options:
            return f"freeze {options['freeze_upto']}"
        return "bitfit" if options["peft"] == "bitfit" else "lora r" + options["peft"].split("=")[1]

    def build_arm(base, options, batches, tokenizer, dev, amp):
        stepper = FakeStepper(script, name_of(options))
        stepper.model.counts = counts[name_of(options)]
        return stepper, [FakeBatch(t) for t in ("sst", "para", "sts")]

    monkeypatch.setattr(peft, "build_model", lambda cfg: (None, "tok", None))
    monkeypatch.setattr(peft, "task_batches", lambda cfg, tok: [FakeData(t, [5, 9]) for t in ("sst", "para", "sts")])
    monkeypatch.setattr(peft, "build_arm", build_arm)
    monkeypatch.setattr(peft, "trainable_counts", lambda model: model.counts)
    monkeypatch.setattr(peft, "pick_clock", lambda kind, threads: (script.clock, "fake"))
    capsys.readouterr()
    peft.main(["--steps", "5", "--warmup", "1", "--depths", "2", "--ranks", "8", "--memory-steps", "0"])
    out = capsys.readouterr().out
    for name, ts in durations.items():
        f = numbers(line_of(out, name + " ").split(name, 1)[1] if name != "lora r8" else
                    line_of(out, "lora r8").split("lora r8", 1)[1])
        trainable, share, med, q1, q3, ratio, r1, r3 = f[:8]
        assert trainable == counts[name][0]
        assert share == pytest.approx(100 * counts[name][0] / counts[name][1], abs=TOL2)
        m, a, b = ref_quartiles([t / 3 for t in ts[1:]])  # a step: the round's mean over its three task steps
        assert (med, q1, q3) == pytest.approx((m, a, b), abs=5.1e-4)
        assert (ratio, r1, r3) == pytest.approx(ref_paired(durations["full"][1:], ts[1:]), abs=TOL2)


# ----------------------------------------------------------------------------- smart_cost.py


def test_smart_cost_ratios_to_the_plain_arm_of_the_same_freezing_and_their_verdicts(monkeypatch, capsys):
    smart = bench_script("smart_cost")
    plain = [1.0, 2.0, 1.0, 1.5, 1.0]
    factor = {"plain": [1, 1, 1, 1, 1], "smart@embeddings": [3.0, 4.0, 3.6, 3.7, 3.0],
              "smart@first-trainable": [3.0, 3.2, 3.6, 2.0, 3.4], "reference@embeddings": [4, 4, 4, 4, 4],
              "bregman-only": [1.1, 1.3, 1.25, 1.0, 1.3]}
    durations = {}
    for freeze, scale in ((None, 1.0), (3, 0.5)):
        for arm, fs in factor.items():
            durations[(freeze, arm)] = [50.0] + [scale * p * f for p, f in zip(plain, fs)]
    durations[(3, "bregman-only")][1:] = [0.5 * p * 1.1 for p in plain]
    script = Script(durations)

    def add_arms(arms, base, freeze, batches, tok, dev, amp):
        for arm in factor:
            cached = freeze is not None and arm in ("plain", "smart@first-trainable", "bregman-only")
            arms[(freeze, arm)] = (FakeStepper(script, (freeze, arm)), [FakeBatch(t, cached=cached)
                                                                        for t in ("sst", "para", "sts")])

    monkeypatch.setattr(smart, "build_model", lambda cfg: (None, "tok", None))
    monkeypatch.setattr(smart, "task_batches", lambda cfg, tok: [FakeData(t, [5, 9]) for t in ("sst", "para", "sts")])
    monkeypatch.setattr(smart, "add_arms", add_arms)
    monkeypatch.setattr(smart, "pick_clock", lambda kind, threads: (script.clock, "fake"))
    capsys.readouterr()
    smart.main(["--steps", "5", "--warmup", "1", "--freeze-upto", "3"])
    out = capsys.readouterr().out
    assert script.order == rounds_order(list(durations), 6, "alternate")
    for (freeze, arm), ts in durations.items():
        line = next(x for x in out.splitlines() if x.startswith(f"{str(freeze):<13}{arm} "))
        med, mn, ratio, q1, q3 = numbers(line[13 + len(arm):])[:5]
        assert (med, mn) == pytest.approx((np.median(ts[1:]) / 3, min(ts[1:]) / 3), abs=5.1e-4)
        want = ref_paired(ts[1:], durations[(freeze, "plain")][1:])
        assert (ratio, q1, q3) == pytest.approx(want, abs=TOL2)
        assert ("yes" if freeze is not None and arm in ("plain", "smart@first-trainable", "bregman-only")
                else "no") in line.split()
        if arm != "plain":
            limit = 1.2 if arm == "bregman-only" else 3.5
            assert line.rstrip().endswith(f"<= {limit}x {'OK' if want[0] <= limit else 'OVER'}"), line


# ----------------------------------------------------------------------------- precision_compile.py


def run_precision_compile(monkeypatch, capsys, durations: dict, losses: dict, argv: list) -> tuple[str, Script]:
    pc = bench_script("precision_compile")
    script = Script(durations)

    def make_arm(args, precision, compiled):
        return FakeStepper(script, f"{precision}{'+compile' if compiled else ''}", losses=losses)

    monkeypatch.setattr(pc, "make_arm", make_arm)
    monkeypatch.setattr(pc, "Tokenizer", SimpleNamespace(from_checkpoint=lambda path: "tok"))
    monkeypatch.setattr(pc, "resolve_checkpoint", lambda model: "ckpt")
    monkeypatch.setattr(pc, "pick_device", lambda d: torch.device("cpu"))
    monkeypatch.setattr(pc, "task_batches", lambda cfg, tok: [FakeData(t, [5, 9]) for t in ("sst", "para", "sts")])
    monkeypatch.setattr(pc, "make_batch", lambda d, idx, tok: FakeBatch(d.task))
    monkeypatch.setattr(pc, "resolve_precision", lambda p, d: ("fp32", "fake"))
    monkeypatch.setattr(pc, "time", SimpleNamespace(perf_counter=script.clock))
    capsys.readouterr()
    pc.main(argv)
    return capsys.readouterr().out, script


PC_DURATIONS = {"fp32": [0.001, 0.001, 1.0, 2.0, 3.0, 2.0, 1.0], "bf16": [50.0, 50.0, 0.4, 1.9, 2.5, 1.0, 0.6]}
PC_LOSSES = {"fp32": [9, 9, 9, 9, 9, 9, 0.70], "bf16": [9, 9, 9, 9, 9, 9, 0.71]}


def test_precision_compile_medians_minima_order_and_loss_column(monkeypatch, capsys):
    out, script = run_precision_compile(monkeypatch, capsys, PC_DURATIONS, PC_LOSSES,
                                        ["--steps", "5", "--warmup", "2", "--no-compile"])
    assert script.order == rounds_order(["fp32", "bf16"], 7, "alternate")
    for arm, ts in PC_DURATIONS.items():
        med, mn = numbers(line_of(out, arm + " ").split(arm, 1)[1])[:2]
        assert (med, mn) == pytest.approx((np.median(ts[2:]) / 3, min(ts[2:]) / 3), abs=5.1e-4)
    # the last round's summed task losses, bf16's minus fp32's
    assert numbers(line_of(out, "bf16 ").split("bf16", 1)[1])[-1] == pytest.approx(3 * (0.71 - 0.70), abs=5.1e-5)


def test_precision_compile_speedup_is_the_median_paired_ratio_with_its_iqr(monkeypatch, capsys):
    """Fixed 2026-11-30 (protocol), what was wrong: precision_compile.py's "speed-up" is median(fp32) / median(arm),
    one number with no interval, where the project's rule and bench/README.md ("Ratios everywhere are medians of
    per-round paired ratios ..., printed with their interquartile range, not ratios of medians") ask for the median of
    the per-round paired ratios with its spread. docs/benchmarks.md's "2.03x faster", "0.91x", "1.49x" come from it.
    Reproduction: fp32 rounds of 1, 2, 3, 2, 1 s and bf16 0.4, 1.9, 2.5, 1.0, 0.6 s (three task steps each) print
    "2.00x" (2 / 1), no interval; the paired ratios 2.5, 1.05, 1.2, 2.0, 1.67 have median 1.67 [IQR 1.20-2.00]."""
    out, _ = run_precision_compile(monkeypatch, capsys, PC_DURATIONS, PC_LOSSES,
                                   ["--steps", "5", "--warmup", "2", "--no-compile"])
    line = line_of(out, "bf16 ")
    speedup = float(re.search(r"([\d.]+)x", line).group(1))
    med, q1, q3 = ref_paired(PC_DURATIONS["fp32"][2:], PC_DURATIONS["bf16"][2:])
    assert speedup == pytest.approx(med, abs=TOL2), line
    assert f"{q1:.2f}" in line and f"{q3:.2f}" in line, line


# ----------------------------------------------------------------------------- pcgrad_overhead.py


def run_pcgrad_overhead(monkeypatch, capsys, plain, pcgrad, surgery) -> tuple[str, Script]:
    po = bench_script("pcgrad_overhead")
    script = Script({"plain": plain, "pcgrad": pcgrad, "surgery": surgery})

    def build(model, cfg, n, dev):
        arm = "pcgrad" if cfg.pcgrad else "plain"
        stepper = FakeStepper(script, arm, parts=1)
        stepper.pcgrad = SimpleNamespace(params=[torch.zeros(1000)], _buf=torch.zeros(3, 1000))
        return stepper

    monkeypatch.setattr(po, "build_model", lambda cfg: (None, "tok", None))
    monkeypatch.setattr(po, "mixed_batches", lambda cfg, tok: [FakeBatch(t) for t in ("sst", "para", "sts")])
    monkeypatch.setattr(po, "Stepper", SimpleNamespace(build=build))
    monkeypatch.setattr(po, "surgery", lambda buf, variant, gen: script.take("surgery"))
    monkeypatch.setattr(po, "time", SimpleNamespace(perf_counter=script.clock))
    capsys.readouterr()
    po.main(["--steps", str(len(plain) - 2), "--warmup", "2"])
    return capsys.readouterr().out, script


PO_PLAIN = [0.001, 0.001, 1.0, 2.0, 3.0, 2.0, 1.0]
PO_PCGRAD = [50.0, 50.0, 1.6, 3.2, 3.0, 3.0, 1.6]
PO_SURGERY = [40.0, 0.2, 0.3, 0.25]  # the first call is untimed: max(3, 5 // 2) + 1 = 4 calls


def test_pcgrad_overhead_medians_surgery_and_overhead_split(monkeypatch, capsys):
    out, script = run_pcgrad_overhead(monkeypatch, capsys, PO_PLAIN, PO_PCGRAD, PO_SURGERY)
    assert script.order[:14] == rounds_order(["plain", "pcgrad"], 7, "alternate")
    med = {a: float(np.median(ts[2:])) for a, ts in (("plain", PO_PLAIN), ("pcgrad", PO_PCGRAD))}
    for arm, ts in (("plain", PO_PLAIN), ("pcgrad", PO_PCGRAD)):
        assert numbers(line_of(out, f"{arm} step"))[:2] == pytest.approx([med[arm], min(ts[2:])], abs=5.1e-4)
    m_surg = float(np.median(PO_SURGERY[1:]))
    assert numbers(line_of(out, "surgery() alone")) == pytest.approx([m_surg, min(PO_SURGERY[1:])], abs=5.1e-4)
    over = med["pcgrad"] - med["plain"]
    assert numbers(line_of(out, "overhead per step")) == pytest.approx(
        [round(over * 1e3), round(m_surg * 1e3), round(max(over - m_surg, 0) * 1e3)])


def test_pcgrad_overhead_ratio_is_the_median_paired_ratio_with_its_iqr(monkeypatch, capsys):
    """Fixed 2026-11-30 (protocol), what was wrong: pcgrad_overhead.py prints "ratio pcgrad/plain" as median(pcgrad) /
    median(plain), with no interval, and judges the target (<= 1.5x) on it, where the project's rule and
    bench/README.md ask for the median of the per-round paired ratios with its spread (docs/benchmarks.md's "1.10x" is
    this figure). Reproduction: plain rounds 1, 2, 3, 2, 1 s and PCGrad 1.6, 3.2, 3.0, 3.0, 1.6 s print "1.50x (target
    <= 1.5x: OK)"; the paired ratios 1.6, 1.6, 1.0, 1.5, 1.6 have median 1.60 [IQR 1.50-1.60]: OVER."""
    out, _ = run_pcgrad_overhead(monkeypatch, capsys, PO_PLAIN, PO_PCGRAD, PO_SURGERY)
    line = line_of(out, "ratio pcgrad/plain")
    med, q1, q3 = ref_paired(PO_PCGRAD[2:], PO_PLAIN[2:])
    assert float(re.search(r"([\d.]+)x", line).group(1)) == pytest.approx(med, abs=TOL2), line
    assert f"{q1:.2f}" in line and f"{q3:.2f}" in line, line
    assert ("OK" if med <= 1.5 else "OVER") in line, line


# ----------------------------------------------------------------------------- pcgrad_epoch.py


def test_pcgrad_epoch_paired_ratios_to_the_default_epoch_and_targets(monkeypatch, capsys):
    pe = bench_script("pcgrad_epoch")
    durations = {"default": [99.0, 10.0, 12.0, 11.0, 10.0], "mixed": [0.1, 10.5, 12.0, 12.0, 10.2],
                 "pcgrad": [0.1, 13.5, 14.0, 14.0, 12.0]}
    effs = {"default": [0.5, 0.5, 0.5, 0.5, 0.888], "mixed": [0.5, 0.5, 0.5, 0.5, 0.948],
            "pcgrad": [0.99, 0.99, 0.99, 0.99, 0.948]}
    script = Script(durations)

    def one_epoch(arm, args, out_dir, clock):
        k = script.calls[arm]
        return script.take(arm), effs[arm][k], {"default": 90, "mixed": 80, "pcgrad": 80}[arm]

    monkeypatch.setattr(pe, "one_epoch", one_epoch)
    capsys.readouterr()
    pe.main(["--steps", "4", "--warmup", "1"])
    out = capsys.readouterr().out
    assert script.order == rounds_order(list(durations), 5, "alternate")
    for arm, ts in durations.items():
        line = line_of(out, arm + " ")
        steps, eff, med, ratio, q1, q3 = numbers(line.split(arm, 1)[1])[:6]
        assert steps == {"default": 90, "mixed": 80, "pcgrad": 80}[arm] and eff == effs[arm][-1]  # the last round's
        assert med == pytest.approx(np.median(ts[1:]), abs=0.051)
        want = ref_paired(ts[1:], durations["default"][1:])
        assert (ratio, q1, q3) == pytest.approx(want, abs=TOL2)
        if arm == "pcgrad":
            assert f"<= 1.3x {'OK' if want[0] <= 1.3 else 'OVER'}, padding >= 0.9 OK" in line


# ----------------------------------------------------------------------------- eval_speed.py


def ref_eval_batches(lengths, size: int, budget: int | None) -> tuple[int, int, int]:
    """(batches, real tokens, padded tokens) of evaluation's documented batching: the examples sorted by length,
    cut into consecutive batches of at most `size` examples and, with a budget, at most `budget` tokens once
    each is padded to its longest (at least one example a batch)."""
    s, i, batches, real, padded = sorted(int(x) for x in lengths), 0, 0, 0, 0
    while i < len(s):
        m = 1
        while i + m < len(s) and m < size and (budget is None or (m + 1) * s[i + m] <= budget):
            m += 1
        batches, real, padded, i = batches + 1, real + sum(s[i:i + m]), padded + max(s[i:i + m]) * m, i + m
    return batches, real, padded


EVAL_LENGTHS = {"sst": [3, 9, 4, 12, 5, 5, 30, 7, 8, 2], "para": [20, 22, 6, 40, 18, 9, 11], "sts": [14, 3, 3, 15]}


def run_eval_speed(monkeypatch, capsys, durations):
    es = bench_script("eval_speed")
    script = Script(durations)
    metrics = {None: {"sst_acc": 0.5, "para_acc": 0.7, "sts_corr": 0.8},
               8: {"sst_acc": 0.5, "para_acc": 0.7 + 3e-7, "sts_corr": 0.8},
               64: {"sst_acc": 0.5 - 2e-6, "para_acc": 0.7, "sts_corr": 0.8 + 1e-7}}

    def evaluate(model, dev, tok, batching, device):
        script.take(batching.max_tokens)
        return metrics[batching.max_tokens]

    monkeypatch.setattr(es, "build_model", lambda cfg: (FakeEncoder(None), "tok", None))
    monkeypatch.setattr(es, "dev_sets", lambda cfg, tok, limit: {t: FakeData(t, v) for t, v in EVAL_LENGTHS.items()})
    monkeypatch.setattr(es, "evaluate", evaluate)
    monkeypatch.setattr(es, "pick_clock", lambda kind, threads: (script.clock, "fake"))
    capsys.readouterr()
    es.main(["--steps", "5", "--warmup", "1", "--batch-size", "4", "--budgets", "8", "64"])
    return es, capsys.readouterr().out, script, metrics


def test_eval_speed_rows_batches_padding_and_default_over_arm(monkeypatch, capsys):
    """Per arm: batches and padding efficiency of the documented batching (worked out here), the median
    seconds, the median of the paired per-round ratios default / arm ("x faster") with its IQR, and the largest
    metric difference from the default arm."""
    durations = {None: [0.01, 55.0, 54.0, 56.0, 60.0, 50.0], 8: [99.0, 40.0, 41.0, 39.0, 50.0, 30.0],
                 64: [0.01, 50.0, 54.0, 50.0, 50.0, 51.0]}
    es, out, script, metrics = run_eval_speed(monkeypatch, capsys, durations)
    assert script.order == rounds_order([None, 8, 64], 6, "rotate")
    for budget, label in ((None, "batch 4"), (8, "tokens 8"), (64, "tokens 64")):
        f = numbers(line_of(out, label).split(label, 1)[1])
        cut = [ref_eval_batches(v, 4, budget) for v in EVAL_LENGTHS.values()]
        assert f[0] == sum(c[0] for c in cut)
        assert f[1] == pytest.approx(sum(c[1] for c in cut) / sum(c[2] for c in cut), abs=5.1e-4)
        assert f[2] == pytest.approx(np.median(durations[budget][1:]), abs=TOL2)
        assert f[3:6] == pytest.approx(ref_paired(durations[None][1:], durations[budget][1:]), abs=TOL2)
        diff = max(abs(metrics[budget][m] - metrics[None][m]) for m in metrics[None])
        assert f[6] == pytest.approx(diff, rel=0.05, abs=1e-12)


def test_eval_speed_docstring_says_default_over_arm_as_it_prints():
    """Fixed 2026-11-30 (documentation), what was wrong: eval_speed.py's docstring says "a ratio is the median over
    rounds of (arm / default) within a round", but main() prints paired_ratios(times[default], times[arm]), default /
    arm (its column says "x faster", its comment "default / arm: > 1 is faster", and docs/benchmarks.md's "1.34x
    faster" reads it so). Reproduction: the default arm 2 s a round and a budget arm 1 s print "2.00x", where the
    docstring's ratio is 0.50. The docstring is what is wrong."""
    es = bench_script("eval_speed")
    assert "(arm / default)" not in " ".join(es.__doc__.split())


# ----------------------------------------------------------------------------- eval_throughput.py


def run_eval_throughput(monkeypatch, capsys, durations, n=3000):
    et = bench_script("eval_throughput")
    script = Script(durations)
    arms = {k: (lambda k=k: script.take(k)) for k in durations}
    monkeypatch.setattr(et, "build_arms", lambda args, device, autocast: (arms, n, "quora-dev.csv"))
    monkeypatch.setattr(et, "time", SimpleNamespace(perf_counter=script.clock))
    capsys.readouterr()
    et.main(["--device", "cpu", "--passes", str(len(durations["minbert"]) - 1), "--warmup", "1"])
    return capsys.readouterr().out, script


ET_DURATIONS = {"minbert": [0.01, 8.0, 9.0, 10.0, 12.0, 7.0], "hf-file-order": [90.0, 10.0, 10.0, 12.5, 10.0, 10.0],
                "hf-sorted": [90.0, 9.0, 9.0, 9.0, 11.0, 9.0]}


def test_eval_throughput_pairs_per_second_and_median_per_pass_ratio(monkeypatch, capsys):
    out, script = run_eval_throughput(monkeypatch, capsys, ET_DURATIONS)
    assert script.order == rounds_order(list(ET_DURATIONS), 6, "alternate")
    for arm, ts in ET_DURATIONS.items():
        med, rate, ratio = numbers(line_of(out, arm + " ").split(arm, 1)[1])[:3]
        assert med == pytest.approx(np.median(ts[1:]), abs=5.1e-5)
        assert rate == pytest.approx(3000 / np.median(ts[1:]), abs=0.51)
        assert ratio == pytest.approx(ref_paired(ET_DURATIONS["minbert"][1:], ts[1:])[0], abs=TOL2)


def test_eval_throughput_prints_its_ratio_with_its_iqr(monkeypatch, capsys):
    """Fixed 2026-11-30 (protocol), what was wrong: eval_throughput.py prints the median per-pass ratio minbert / arm
    alone, where the project's rule (a ratio with its spread) and bench/README.md ("Ratios everywhere ... printed with
    their interquartile range") ask for its interval too; docs' "inference 1.43x transformers" has none. Reproduction:
    minbert passes 8, 9, 10, 12, 7 s against 10, 10, 12.5, 10, 10 s print "0.80x" alone; the paired ratios' IQR is
    0.80-0.90."""
    out, _ = run_eval_throughput(monkeypatch, capsys, ET_DURATIONS)
    line = line_of(out, "hf-file-order")
    _, q1, q3 = ref_paired(ET_DURATIONS["minbert"][1:], ET_DURATIONS["hf-file-order"][1:])
    assert f"{q1:.2f}" in line and f"{q3:.2f}" in line, line


# ----------------------------------------------------------------------------- heads_precision.py


def run_heads_precision(monkeypatch, capsys, durations, steps, warmup):
    hp = bench_script("heads_precision")
    script = Script(durations)

    class Head(torch.nn.Module):
        def __init__(self, arm):
            super().__init__()
            self.arm, self.w = arm, torch.nn.Parameter(torch.ones(1))

        def forward(self, task, inputs):
            script.take(self.arm)
            return self.w * torch.ones(2)

    monkeypatch.setattr(hp, "resolve_checkpoint", lambda model: "ckpt")
    monkeypatch.setattr(hp, "Tokenizer", SimpleNamespace(from_checkpoint=lambda path: "tok"))
    monkeypatch.setattr(hp, "load_task_split", lambda d, t, s: SimpleNamespace(examples=list(range(8))))
    monkeypatch.setattr(hp, "encode_task", lambda *a: "data")
    monkeypatch.setattr(hp, "make_batch", lambda data, idx, tok: FakeBatch("sts", n=2))
    monkeypatch.setattr(hp, "build", lambda cls, ckpt, seed: Head("fp32" if cls is hp.MultitaskBert else "autocast"))
    monkeypatch.setattr(hp, "task_loss", lambda task, out, labels: out.float().pow(2).mean())
    monkeypatch.setattr(hp, "pick_clock", lambda kind, threads: (script.clock, "fake"))
    capsys.readouterr()
    assert hp.main(["--steps", str(steps), "--warmup", str(warmup), "--batch-size", "2"]) == 0
    return capsys.readouterr().out, script


HP_DURATIONS = {"fp32": [0.001, 0.001, 1.00, 1.02, 1.10, 0.95], "autocast": [9.0, 9.0, 1.0, 1.0, 1.0, 1.0]}


def test_heads_precision_paired_ratio_order_and_warmup(monkeypatch, capsys):
    out, script = run_heads_precision(monkeypatch, capsys, HP_DURATIONS, steps=4, warmup=2)
    assert script.order[:12] == rounds_order(["fp32", "autocast"], 6, "alternate")
    got = re.search(r"fp32 heads / autocast heads: ([\d.]+) \[IQR ([\d.]+)-([\d.]+)\]", out)
    assert [float(x) for x in got.groups()] == pytest.approx(
        ref_paired(HP_DURATIONS["fp32"][2:], HP_DURATIONS["autocast"][2:]), abs=5.1e-4)


def test_heads_precision_median_of_an_even_count_is_the_mean_of_the_middle_two(monkeypatch, capsys):
    """Fixed 2026-11-30, what was wrong: heads_precision.py prints each arm's "median ... ms per step" as
    sorted(ts)[len(ts) // 2], the upper of the two middle values when the count is even (the documented command runs
    --steps 10), not the median. Reproduction: fp32-heads steps of 1.00, 1.02, 1.10, 0.95 s print "median 1020.0 ms";
    their median is 1010.0 ms (statistics.median, numpy.median)."""
    out, _ = run_heads_precision(monkeypatch, capsys, HP_DURATIONS, steps=4, warmup=2)
    got = float(re.search(r"fp32 heads\s+median\s+([\d.]+) ms", out).group(1))
    assert got == pytest.approx(np.median(HP_DURATIONS["fp32"][2:]) * 1e3, abs=0.051), out


# ----------------------------------------------------------------------------- schedules.py, frozen_cache.py


def test_schedules_speedups_are_paired_full_over_arm_with_rotation(monkeypatch, capsys):
    sc = bench_script("schedules")
    names = list(sc.ARMS)
    chosen = [names[0], names[1], names[4]]
    durations = {chosen[0]: [100.0, 110.0, 90.0, 105.0], chosen[1]: [70.0, 80.0, 70.0, 60.0],
                 chosen[2]: [50.0, 90.0, 60.0, 70.0]}
    scores = {chosen[0]: [0.70, 0.71, 0.69, 0.70], chosen[1]: [0.68] * 4, chosen[2]: [0.60, 0.64, 0.62, 0.66]}
    script = Script(durations)
    by_options = {id(v): k for k, v in sc.ARMS.items()}

    def run_arm(base, options, out, clock):
        name = by_options[id(options)]
        k = script.calls[name]
        return script.take(name), scores[name][k], [(20, 3)]

    monkeypatch.setattr(sc, "run_arm", run_arm)
    monkeypatch.setattr(sys, "argv", ["schedules.py", "--rounds", "4", "--arms", "1", "4"])
    capsys.readouterr()
    sc.main()
    out = capsys.readouterr().out
    assert script.order == rounds_order(chosen, 4, "rotate")
    for name in chosen:
        line = line_of(out, name).split(name, 1)[1]
        mean_s, med, q1, q3, dev = numbers(line)[:5]
        assert mean_s == pytest.approx(np.mean(durations[name]), abs=0.051)
        assert (med, q1, q3) == pytest.approx(ref_paired(durations[chosen[0]], durations[name]), abs=TOL2)
        assert dev == pytest.approx(np.mean(scores[name]), abs=5.1e-5)


def test_frozen_cache_totals_and_per_step_paired_ratios(monkeypatch, capsys):
    fc = bench_script("frozen_cache")
    warm, n = 2, 7
    durations = {"full": [0.01, 0.01, 3.0, 3.3, 2.9, 4.0, 3.1], "nocache": [9.0, 9.0, 2.0, 2.2, 1.9, 2.6, 2.0],
                 "cache": [0.01, 0.01, 0.9, 1.0, 1.1, 0.8, 1.3]}
    script = Script(durations)

    def prepare(cfg, cached, max_steps):
        arm = "full" if cfg.freeze_upto is None else ("cache" if cached else "nocache")
        return (lambda i: script.take(arm)), n

    rng = np.random.default_rng(0)
    train = {t: FakeData(t, rng.integers(3, 40, 100)) for t in ("sst", "para", "sts")}
    model = SimpleNamespace(encoder=SimpleNamespace(num_layers=6))
    monkeypatch.setattr(fc, "build_model", lambda cfg: (model, "tok", None))
    monkeypatch.setattr(fc, "prepare", prepare)
    monkeypatch.setattr(fc, "load_data", lambda cfg, tok: SimpleNamespace(train=train))
    monkeypatch.setattr(fc, "pick_clock", lambda kind, threads: (script.clock, "fake"))
    monkeypatch.setattr(sys, "argv", ["frozen_cache.py", "--warmup", str(warm)])
    capsys.readouterr()
    fc.main()
    out = capsys.readouterr().out
    assert script.order == rounds_order(["full", "nocache", "cache"], n, "rotate")
    assert f"{n - warm} timed steps per arm after {warm} warm-up" in out
    for arm, label in (("full", "full fine-tuning"), ("nocache", "freeze-upto 3, no cache"),
                       ("cache", "freeze-upto 3, cache")):
        assert numbers(line_of(out, label + " ").split(label, 1)[1])[0] == pytest.approx(sum(durations[arm][warm:]),
                                                                                         abs=0.051)
    for other, label in (("nocache", "cache vs uncached frozen:"), ("full", "cache vs full fine-tuning:")):
        total, med, q1, q3 = numbers(line_of(out, label).split(":", 1)[1])[:4]
        assert total == pytest.approx(sum(durations[other][warm:]) / sum(durations["cache"][warm:]), abs=TOL2)
        assert (med, q1, q3) == pytest.approx(ref_paired(durations[other][warm:], durations["cache"][warm:]), abs=TOL2)
    # padding efficiency: real tokens over tokens computed, never above 1, bucketing no worse than random
    for task in train:
        rand, buck = numbers(line_of(out, f"{task} "))[-2:]
        assert 0 < rand <= buck <= 1


# ----------------------------------------------------------------------------- study_cost.py


def _cost_run(epochs, cache, curve, wall=50.0, rss=900.0):
    return {"wall": wall, "epochs": list(epochs), "rss": rss, "cuda_mib": None, "cache": cache, "curve": curve}


COST_NAMES = ["full fine-tuning", "half the layers frozen", "half the layers frozen (cache off)"]
COST_RUNS = {
    COST_NAMES[0]: [_cost_run([10, 10], 0, [(0, 0.60), (1, 0.70)]), _cost_run([10, 10], 0, [(0, 0.60), (1, 0.70)]),
                    _cost_run([10, 10], 0, [(0, 0.60), (1, 0.80)])],
    COST_NAMES[1]: [_cost_run([1, 1], 3, [(0, 0.67), (1, 0.66)]), _cost_run([2, 2], 3, [(0, 0.50), (1, 0.68)]),
                    _cost_run([4, 4], 3, [(0, 0.50), (1, 0.60)])],
    COST_NAMES[2]: [_cost_run([2, 2], 0, [(0, 0.70), (1, 0.70)]), _cost_run([2, 2], 0, [(0, 0.70), (1, 0.70)]),
                    _cost_run([6, 6], 0, [(0, 0.70), (1, 0.70)])]}
COST_OPTIONS = {COST_NAMES[0]: {"freeze_upto": None}, COST_NAMES[1]: {"freeze_upto": 3},
                COST_NAMES[2]: {"freeze_upto": 3, "frozen_cache": "off"}}


def study_cost_report(capsys) -> str:
    sc = bench_script("study_cost")
    figures = {n: sc.summary(COST_RUNS[n], COST_OPTIONS[n]) for n in COST_NAMES}
    args = SimpleNamespace(threads=1, examples=10, eval_examples=10, epochs=2, rounds=3, share=0.95)
    capsys.readouterr()
    sc.report(args, COST_NAMES, COST_RUNS, figures)
    return capsys.readouterr().out


def test_study_cost_time_to_a_share_of_the_same_rounds_full_fine_tuning(capsys):
    """"the time to reach 95% of full fine-tuning's best dev overall of the same round (the cache's building
    and the training epochs up to the first evaluation at or above it)", worked out by hand: the targets are
    0.665, 0.665 and 0.76; half the layers frozen reaches them after 3 + 1 and 3 + 2 + 2 s, not in round 3 (so
    5.5 s, 2 of 3 rounds); with the cache off after 2 and 2 s, not in round 3; full fine-tuning after 20 s."""
    out = study_cost_report(capsys)
    want = {COST_NAMES[0]: ("20.0 s", ""), COST_NAMES[1]: ("5.5 s", "(2/3 rounds)"),
            COST_NAMES[2]: ("2.0 s", "(2/3 rounds)")}
    for name in COST_NAMES[::-1]:
        line = next(x for x in out.splitlines() if x.startswith(name + " ") or x.startswith(name + "  "))
        reach, note = want[name]
        assert reach in line and line.rstrip().endswith(note or reach), line
        med, q1, q3 = ref_quartiles([e for r in COST_RUNS[name] for e in r["epochs"]])
        assert numbers(line[48:])[:3] == pytest.approx([med, q1, q3], abs=0.051)


def test_study_cost_points_rotate_over_the_rounds_each_in_its_own_run(monkeypatch, capsys, tmp_path):
    """The points run one at a time, their order rotating from round to round; each point's figures are its
    own rounds' (its cache-off twin after it)."""
    sc = bench_script("study_cost")
    names = ["full fine-tuning", "half the layers frozen", "half the layers frozen (cache off)"]
    epochs = {names[0]: [[10, 11], [12, 10], [10, 10]], names[1]: [[4, 4], [5, 4], [4, 6]],
              names[2]: [[7, 7], [8, 7], [7, 9]]}
    order = []

    def one_run(base, options, out, threads):
        name = names[0] if options["freeze_upto"] is None else names[2 if options.get("frozen_cache") == "off"
                                                                          else 1]
        k = sum(n == name for n in order)
        order.append(name)
        return _cost_run(epochs[name][k], 0 if name != names[1] else 3, [(0, 0.6), (1, 0.7)], wall=sum(epochs[name][k]))

    monkeypatch.setattr(sc, "one_run", one_run)
    monkeypatch.setattr(sc, "model_layers", lambda model: 6)
    monkeypatch.setattr(sys, "argv", ["study_cost.py", "--rounds", "3", "--points", names[0], names[1]])
    capsys.readouterr()
    sc.main()
    out = capsys.readouterr().out
    assert order == rounds_order(names, 3, "rotate")
    for name in names:
        row = next(x for x in out.splitlines() if x.startswith(name + " ") and not x.startswith(name + " ("))
        med, q1, q3, run_s = numbers(row[48:])[:4]
        assert (med, q1, q3) == pytest.approx(ref_quartiles(sum(epochs[name], [])), abs=0.051)
        assert run_s == pytest.approx(np.median([sum(e) for e in epochs[name]]), abs=0.051)


def test_study_cost_cache_gain_is_the_median_per_round_ratio_with_its_iqr(capsys):
    """Fixed 2026-11-30 (protocol), what was wrong: study_cost.py's "cache gain per epoch" is median(all cache-off
    epochs) / median(all cache-on epochs), one number with no interval, though the two runs of each round are
    interleaved and paired; the project's rule asks for the median of per-round paired ratios with its spread (docs'
    "1.07x, 1.15x, 1.28x, 1.61x and 2.42x" are this figure). Reproduction: cache-on epochs of 1, 2 and 4 s in rounds
    1-3 against cache-off 2, 2 and 6 s print "1.00x" (both pooled medians are 2 s), while the rounds' ratios 2.0, 1.0,
    1.5 have median 1.50 [IQR 1.25-1.75]."""
    out = study_cost_report(capsys)
    line = line_of(out, "cache gain per epoch")
    per_round = [np.mean(off["epochs"]) / np.mean(on["epochs"])
                 for on, off in zip(COST_RUNS[COST_NAMES[1]], COST_RUNS[COST_NAMES[2]])]
    med, q1, q3 = float(np.median(per_round)), *np.percentile(per_round, [25, 75])
    assert float(re.search(r"([\d.]+)x", line).group(1)) == pytest.approx(med, abs=TOL2), line
    assert f"{q1:.2f}" in line and f"{q3:.2f}" in line, line


# ----------------------------------------------------------------------------- shape_warmup.py, front_clock.py


def test_shape_warmup_ratio_and_excess_per_new_length(monkeypatch, capsys):
    sw = bench_script("shape_warmup")
    passes = {("fp32", "1", "on"): (42, [1.54, 1.67]), ("fp32", "32", "on"): (2, [1.23, 1.20]),
              ("bf16", "1", "on"): (42, [15.58, 1.24]), ("bf16", "1", "off"): (0, [2.97, 2.15]),
              ("bf16", "32", "on"): (2, [2.10, 1.79]), ("bf16", "32", "off"): (2, [2.5, 2.0])}
    seen = []

    def run(cmd, **kw):
        arm = tuple(cmd[cmd.index("--arm") + 1:][:3])
        seen.append(arm)
        lengths, p = passes[arm]
        cudnn = "off" if arm[2] == "off" else "on"
        return SimpleNamespace(returncode=0, stderr="", stdout="noise\n" + json.dumps(
            {"precision": arm[0], "multiple": int(arm[1]), "cudnn": cudnn, "lengths": lengths, "passes": p}))

    monkeypatch.setattr(sw, "subprocess", SimpleNamespace(run=run))
    capsys.readouterr()
    sw.main(["--precisions", "fp32", "bf16", "--multiples", "1", "32", "--cudnn-attention", "on", "off"])
    out = capsys.readouterr().out
    assert seen == list(passes)  # fp32 once per multiple: cuDNN's attention never runs it
    for (precision, multiple, cudnn), (lengths, (first, second)) in passes.items():
        label = f"{precision} x{multiple}" + (" no-cudnn" if cudnn == "off" else "")
        row = next(x for x in out.splitlines() if x[:22].strip() == label)
        f = row[22:].split()
        assert int(f[0]) == lengths and float(f[1]) == first and float(f[2]) == second
        assert float(f[3]) == pytest.approx(first / second, abs=TOL2)
        assert f[4] == ("-" if lengths == 0 else f"{(first - second) / lengths * 1e3:.1f}")
    # docs/benchmarks.md's H100 row: 15.58 s against 1.24 s over 42 new lengths is 341 ms per length
    assert round((15.58 - 1.24) / 42 * 1e3) == 341


def test_shape_warmup_arm_times_both_passes_without_its_warmup_steps_and_counts_new_lengths(monkeypatch):
    """run_arm: two untimed steps on the first batch, then two timed passes over all the batches; "lengths" are
    the batch lengths the first pass meets that the warm-up steps did not."""
    sw = bench_script("shape_warmup")
    T = [8, 8, 12, 16, 12, 9]
    first, second = [0.5, 0.1, 0.9, 1.3, 0.2, 0.7], [0.1, 0.1, 0.2, 0.3, 0.2, 0.1]
    script = Script({"step": [100.0, 100.0] + first + second})
    stepper = SimpleNamespace(step=lambda batches, i: script.take("step"))
    monkeypatch.setattr(sw, "build_model", lambda cfg: (FakeEncoder(None), None, None))
    monkeypatch.setattr(sw, "Stepper", SimpleNamespace(build=lambda *a: stepper))
    monkeypatch.setattr(sw, "Tokenizer", SimpleNamespace(from_checkpoint=lambda path: "tok"))
    monkeypatch.setattr(sw, "resolve_checkpoint", lambda model: "ckpt")
    monkeypatch.setattr(sw, "epoch_batches", lambda cfg, tok, n: [("data", t) for t in T][:n])
    monkeypatch.setattr(sw, "make_batch", lambda d, t, tok, multiple, cap: FakeBatch("sst", n=2, T=t))
    monkeypatch.setattr(sw, "time", SimpleNamespace(perf_counter=script.clock))
    r = sw.run_arm(sw.parse_args(["--batches", "6"]), "fp32", 1, "on")
    assert r["lengths"] == len(set(T[1:]) - {T[0]}) == 3
    assert r["passes"] == pytest.approx([sum(first), sum(second)])


def test_peft_memory_figures_are_proc_status_kb_in_mib(monkeypatch):
    """/proc/self/status gives kB (KiB); the figures are MiB. And on this machine the resident size is at most
    its high-water mark."""
    peft = bench_script("peft_cost")
    assert 0 < peft._status_mib("VmRSS") <= peft._status_mib("VmHWM")
    status = "Name:\tpython\nVmHWM:\t  123456 kB\nVmRSS:\t   65536 kB\n"
    monkeypatch.setattr(peft, "Path", lambda path: SimpleNamespace(read_text=lambda: status))
    assert peft._status_mib("VmHWM") == 123456 / 1024 and peft._status_mib("VmRSS") == 64.0
    with pytest.raises(RuntimeError):
        peft._status_mib("VmSwap")


def test_front_clock_table_columns_are_the_rows_figures():
    fc = bench_script("front_clock")
    rows = [{"label": "full", "epochs": [3, 3], "dev": [0.75, 0.75], "wall": 400.0, "train": 300.0, "modelled": 1.0},
            {"label": "two", "epochs": [3, 2], "dev": [0.70, 0.71], "wall": 160.0, "train": 75.0, "modelled": 3.5},
            {"label": "tiny", "epochs": [1, 1], "dev": [0.5, 0.5], "wall": 20.0, "train": 0.0, "modelled": 9.0}]
    lines = {x.split("|")[1].strip(): [c.strip() for c in x.strip("|").split("|")] for x in
             fc.table(rows).splitlines()[2:]}
    assert lines["full"][5:] == ["1.00x", "1.00x", "1.00x", "1.00"]
    assert lines["two"][1:] == ["3 / 2", "0.7000 / 0.7100", "160", "75", f"{400 / 160:.2f}x", f"{300 / 75:.2f}x",
                                "3.50x", f"{300 / 75 / 3.5:.2f}"]
    assert lines["tiny"][6:] == ["n/a", "9.00x", "n/a"]  # no training seconds: no ratio made up


# ----------------------------------------------------------------------------- step_ops.py


def test_step_ops_counts_each_host_read_as_one_sync_and_views_as_no_op():
    """A value read into Python (.item(), bool(tensor), .tolist()) is one synchronisation each on CUDA; the
    counter lists each under its phase, and counts the computing ops but not views."""
    so = bench_script("step_ops")
    count = so.Counter()

    def phase(x):
        y = (x + 1).view(3)  # add: one op; view: none
        y.sum().item()       # sum, and the read
        bool(y[0] > 0)       # select is a view; gt, and the read
        y.tolist()           # a read without an op
    with count:
        count.enter("p", phase)(torch.ones(3))
    syncs = collections.Counter()
    for (ph, op, _line), k in count.syncs.items():
        assert ph == "p"
        syncs[op] += k
    assert syncs == {"_local_scalar_dense": 2, "tolist": 1}
    assert count.ops["p"] == 5  # add, sum, _local_scalar_dense, gt, _local_scalar_dense
