"""--precision fp16 (dynamic loss scaling with torch's GradScaler) and --precision auto, on the CPU: torch
2.13 has float16 autocast there, so the scaler's logic runs for real on the tiny model of tiny_runs.

What is checked: an overflowing step is skipped and leaves weights, optimiser state and the weight average
untouched, halves the scale and is counted apart from --max-bad-steps; clipping and PCGrad see the
unscaled gradients (against fp32 gradients and the projection written out here); SMART's adversarial
perturbation does not depend on the scale; a resumed fp16 run is bit-exact with an uninterrupted one;
auto's choice on every kind of device, with the device's capabilities faked, and its logged reason.
"""
import contextlib
import copy
import functools
import json
import logging
from pathlib import Path

import pytest
import tiny_runs
import torch

import training.methods.pcgrad as pcgrad_mod
import training.methods.smart as smart_mod
from data.batching import make_batch
from training.common import device as device_mod
from training.common.errors import NonFiniteLossError, TrainingInterrupted
from training.run.trainer import Run, train
from training.train import main as cli_main

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings(r"ignore:Seems like `optimizer.step\(\)` has been overridden")]
CPU = torch.device("cpu")


def build(root: Path, name: str = "run", **kw) -> Run:
    """A tiny run's model, data and step machine (no run directory)."""
    return Run(tiny_runs.tiny_config(root, name, **kw)).build()


def batch(run: Run, task: str, n: int = 6, start: int = 0):
    return make_batch(run.data.train[task], list(range(start, start + n)), run.tokenizer)


def set_scale(run: Run, scale: float) -> None:
    scaler = run.stepper.loss_scaler.scaler
    scaler.load_state_dict({**scaler.state_dict(), "scale": scale})


def reference_grads(run: Run, groups: list[list], scale: float | None = None) -> dict[str, torch.Tensor]:
    """The gradient of the mean over `groups` of each group's summed task losses, the model untouched:
    in fp32 (scale None), or under the run's autocast with the loss times `scale` and the gradient divided
    by it again, written out here (fp16's unscaled gradients lose their small values below 2^-14)."""
    stepper = copy.copy(run.stepper)
    stepper.model = model = copy.deepcopy(run.model)
    for batches in groups:
        for b in batches:
            with stepper.autocast() if scale else contextlib.nullcontext():
                loss, _ = stepper.task_loss(b)
            (loss * (scale or 1.0) / len(groups)).backward()
    return {n: g / (scale or 1.0) for n, g in grads_of(model).items()}


def grads_at_clipping(monkeypatch, model) -> list[dict]:
    """Records, by parameter name, the gradients clip_grad_norm_ is handed, before it clips them."""
    seen = []
    real = torch.nn.utils.clip_grad_norm_

    def recording(params, max_norm, *a, **kw):
        params = list(params)
        seen.append(grads_of(model))
        return real(params, max_norm, *a, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    return seen


def grads_at_update(run: Run) -> list[dict]:
    """Records, by parameter name, the gradients the optimiser steps on."""
    seen, real = [], run.stepper.optimizer.step

    def recording(*a, **kw):
        seen.append(grads_of(run.model))
        return real(*a, **kw)

    run.stepper.optimizer.step = recording
    return seen


def grads_of(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def total_norm(grads) -> float:
    return float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())))


# ----------------------------------------------------------------------------- the scaler on an overflow

def test_an_overflow_is_skipped_backs_off_and_is_not_a_bad_step(tmp_path, caplog):
    run = build(tmp_path, precision="fp16", ema_decay=0.5, max_bad_steps=1)
    stepper, model = run.stepper, run.model
    set_scale(run, 2.0 ** 4)
    assert stepper.step([batch(run, "sst")], 0) is not None  # a step taken: the optimiser has state
    weights = copy.deepcopy(model.state_dict())
    optimiser = copy.deepcopy(stepper.optimizer.state_dict())
    ema = copy.deepcopy(stepper.ema.state_dict())
    lr_step = stepper.scheduler.last_epoch
    # 2^40 times the loss: its fp16 gradients overflow (a real overflow, not an injected inf)
    set_scale(run, 2.0 ** 40)
    with caplog.at_level(logging.INFO, logger="training.methods.stepper"):
        assert stepper.step([batch(run, "sst")], 1) is None
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    after = stepper.optimizer.state_dict()
    for i, state in optimiser["state"].items():
        for k, v in state.items():
            assert torch.equal(after["state"][i][k], v), (i, k)
    shadow = stepper.ema.state_dict()
    assert shadow["num_updates"] == ema["num_updates"] == 1 and len(shadow["shadow"]) == len(ema["shadow"]) > 0
    assert all(torch.equal(a, b) for a, b in zip(shadow["shadow"], ema["shadow"]))
    assert stepper.loss_scaler.get_scale() == 2.0 ** 39  # halved
    assert stepper.loss_scaler.skipped == 1 and stepper.bad_steps == 0  # counted apart; max_bad_steps=1 not hit
    assert stepper.scheduler.last_epoch == lr_step + 1  # the schedule follows the step count
    assert "fp16 gradients overflowed at loss scale 1.09951e+12; step skipped, scale now 5.49756e+11" in caplog.text
    assert all(p.grad is None for p in model.parameters())
    assert stepper.scale_record() == {"loss_scale": 2.0 ** 39, "overflow_steps": 1}
    set_scale(run, 2.0 ** 4)
    assert stepper.step([batch(run, "sst")], 2) is not None  # and the next step trains
    assert any(not torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_a_gradient_not_finite_even_unscaled_is_a_bad_step(tmp_path):
    """At a scale <= 1 nothing was scaled up: a non-finite gradient is the model's, and --max-bad-steps
    counts it (else the scale would halve forever on a run that diverged)."""
    run = build(tmp_path, precision="fp16", max_bad_steps=2)
    stepper = run.stepper
    hook = next(run.model.encoder.parameters()).register_hook(lambda g: g * float("inf"))
    set_scale(run, 2.0)
    assert stepper.step([batch(run, "sst")], 0) is None
    assert (stepper.loss_scaler.skipped, stepper.bad_steps, stepper.loss_scaler.get_scale()) == (1, 0, 1.0)
    assert stepper.step([batch(run, "sst")], 1) is None
    assert (stepper.loss_scaler.skipped, stepper.bad_steps) == (1, 1)
    with pytest.raises(NonFiniteLossError, match="2 consecutive non-finite steps"):
        stepper.step([batch(run, "sst")], 2)
    hook.remove()


# ----------------------------------------------------------------------------- unscaled gradients

@pytest.mark.parametrize("accumulate", [1, 2])
def test_clipping_sees_the_unscaled_gradient(tmp_path, monkeypatch, accumulate):
    """The gradient clip_grad_norm_ is handed, and the clipped one the optimiser steps on, against the
    unscaled gradient (the mean over the accumulated groups) and its clipping written out in fp64,
    g * min(1, c / |g|)."""
    c = 0.05
    run = build(tmp_path, precision="fp16", max_grad_norm=c, grad_accum_steps=accumulate)
    set_scale(run, 2.0 ** 10)
    groups = [[batch(run, "sts", 4, start=4 * i)] for i in range(accumulate)]
    reference, fp32 = reference_grads(run, groups, 2.0 ** 10), reference_grads(run, groups)
    seen, stepped = grads_at_clipping(monkeypatch, run.model), grads_at_update(run)
    if accumulate == 1:
        assert run.stepper.step(groups[0], 0) is not None
    else:
        assert run.stepper.accumulated_step(groups, 0) is not None
    assert run.stepper.loss_scaler.get_scale() == 2.0 ** 10  # no overflow: the scale was in use
    norm = total_norm(reference)
    assert norm > 2 * c and sorted(seen[0]) == sorted(reference)  # clipping is active
    assert total_norm(seen[0]) == pytest.approx(norm, rel=1e-6)  # 2^10 times it were the scale left in
    assert norm == pytest.approx(total_norm(fp32), rel=1e-2)  # and fp16 autocast is close to fp32
    for n, g in reference.items():
        torch.testing.assert_close(seen[0][n], g, rtol=1e-6, atol=1e-6 * float(g.abs().max()))
        clipped = g * (c / norm)
        torch.testing.assert_close(stepped[0][n], clipped, rtol=1e-5, atol=1e-6 * float(clipped.abs().max()))


def test_pcgrad_projects_the_unscaled_task_gradients(tmp_path, monkeypatch):
    """The rows surgery sees are the tasks' unscaled encoder gradients (not 2^10 times them), and the update
    of the shared parameters is PCGrad's projection of them, written out in fp64 for two tasks."""
    run = build(tmp_path, precision="fp16", pcgrad=True, tasks=("sst", "sts"), max_grad_norm=0.0)
    set_scale(run, 2.0 ** 10)
    batches = [batch(run, "sst"), batch(run, "sts")]
    shared = [n for n, p in run.model.named_parameters() if n.startswith("encoder.") and p.requires_grad]
    per_task = [reference_grads(run, [[b]], 2.0 ** 10) for b in batches]
    g1, g2 = (torch.cat([g[n].reshape(-1) for n in shared]).double() for g in per_task)
    seen_rows = []
    real_surgery = pcgrad_mod.surgery
    monkeypatch.setattr(pcgrad_mod, "surgery", lambda g, *a: (seen_rows.append(g.clone()), real_surgery(g, *a))[1])
    stepped = grads_at_update(run)
    assert run.stepper.step(batches, 0) is not None
    rows = seen_rows[0].double()
    for row, ref in zip(rows, (g1, g2)):
        assert float(row.norm()) == pytest.approx(float(ref.norm()), rel=1e-4)
        torch.testing.assert_close(row, ref, rtol=0, atol=1e-4 * float(ref.abs().max()))
    dot = float(g1 @ g2)
    assert abs(dot) > 0.05 * float(g1.norm() * g2.norm())  # the conflict decision is not rounding's

    def project(a, b):  # Yu et al.: a loses its component along b where they conflict
        return a - min(0.0, float(a @ b)) / float(b @ b) * b

    expected = project(g1, g2) + project(g2, g1)
    got = torch.cat([stepped[0][n].reshape(-1) for n in shared]).double()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * float(expected.abs().max()))


def test_smarts_perturbation_does_not_depend_on_the_loss_scale(tmp_path, monkeypatch):
    """SMART's inner ascent runs in fp32 outside autocast on its own unscaled loss (torch.autograd.grad of
    the perturbation, not through the scaler): the perturbation is the same at any scale, and the step's
    unscaled gradients differ only by fp16 rounding."""
    deltas, real_perturb = [], smart_mod.perturb

    def recording(*a, **kw):
        deltas.append(real_perturb(*a, **kw))
        return deltas[-1]

    monkeypatch.setattr(smart_mod, "perturb", recording)
    grads = {}
    for k in (2, 12):
        run = build(tmp_path, f"s{k}", precision="fp16", smart=True, max_grad_norm=1e9)
        seen = grads_at_clipping(monkeypatch, run.model)
        set_scale(run, 2.0 ** k)
        assert run.stepper.step([batch(run, "sst")], 0) is not None
        assert run.stepper.loss_scaler.get_scale() == 2.0 ** k
        grads[k] = seen[-1]
    assert len(deltas) == 2 and deltas[0][0].dtype == torch.float32
    assert all(torch.equal(a, b) for a, b in zip(deltas[0], deltas[1]))
    assert sorted(grads[2]) == sorted(grads[12])
    for n, b in grads[12].items():
        torch.testing.assert_close(grads[2][n], b, rtol=1e-2, atol=1e-3 * float(b.abs().max()) + 1e-12)


# ----------------------------------------------------------------------------- exact resume

def test_a_resumed_fp16_run_is_bit_exact_with_the_scalers_state(tmp_path, monkeypatch):
    """The scale doubles after every clean step here (growth_interval 1), so it overflows every few steps:
    a resume that lost the scaler's state would skip other steps and end elsewhere."""
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, growth_interval=1))
    kw = dict(precision="fp16", epochs=4, batch_size=6, save_every=1, keep_last=20, head_dropout=0.2)
    straight = tiny_runs.tiny_config(tmp_path, "straight", **kw)
    train(straight)
    interrupted = tiny_runs.tiny_config(tmp_path, "resumed", **kw)
    real = Run.stop_requested
    monkeypatch.setattr(Run, "stop_requested", lambda self: self.state.global_step == 7 or real(self))
    with pytest.raises(TrainingInterrupted):
        train(interrupted)
    monkeypatch.setattr(Run, "stop_requested", real)
    saved = torch.load(Path(interrupted.out_dir) / "checkpoints" / "step-0000007.pt", weights_only=False)
    assert saved["scaler"]["scaler"]["scale"] != 65536.0 and saved["scaler"]["skipped"] > 0
    train(tiny_runs.tiny_config(tmp_path, "resumed", resume="auto", **kw))

    def records(name):
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "train_seconds"} for r in rows]

    assert records("resumed") == records("straight")
    assert sum("overflow_steps" in r for r in records("straight")) > 0
    assert len({r["loss_scale"] for r in records("straight") if "loss_scale" in r}) > 2
    a = torch.load(tmp_path / "resumed" / "best.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "straight" / "best.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in b)


# ----------------------------------------------------------------------------- auto's choice

def fake_device(monkeypatch, cuda_bf16=None, amx=False, avx512_bf16=False):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: cuda_bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "FakeGPU")


@pytest.mark.parametrize("device, caps, expected, why", [
    ("cuda", {"cuda_bf16": True}, "bf16", "FakeGPU computes bf16 natively"),
    ("cuda", {"cuda_bf16": False}, "fp16", "FakeGPU has no native bf16, so fp16 with dynamic loss scaling"),
    ("cpu", {"amx": True, "avx512_bf16": True}, "bf16", "the CPU computes bf16 natively (AMX tiles)"),
    ("cpu", {"avx512_bf16": True}, "bf16", "the CPU computes bf16 natively (AVX512-BF16)"),
    ("cpu", {}, "fp32", "the CPU has neither AMX nor AVX512-BF16"),
    ("meta", {"amx": True}, "fp32", "a meta device"),
])
def test_auto_on_each_kind_of_device(monkeypatch, device, caps, expected, why):
    fake_device(monkeypatch, **caps)
    d = torch.device(device)
    assert device_mod.resolve_precision("auto", d) == (expected, f"--precision auto: {why}")
    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    assert device_mod.autocast_dtype("auto", d) is dtypes[expected]
    for given in ("fp32", "bf16", "fp16"):  # a named precision is taken as given
        assert device_mod.resolve_precision(given, d) == (given, f"--precision {given}")


@pytest.mark.parametrize("caps, expected", [({"avx512_bf16": True}, "bf16"), ({}, "fp32")])
def test_a_run_logs_and_records_what_auto_chose(tmp_path, monkeypatch, caplog, caps, expected):
    fake_device(monkeypatch, **caps)
    with caplog.at_level(logging.INFO, logger="training.run.trainer"):
        tiny_runs.tiny_run(tmp_path, precision="auto", epochs=1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision ")]
    why = "the CPU computes bf16 natively (AVX512-BF16)" if caps else "the CPU has neither AMX nor AVX512-BF16"
    assert lines == [f"precision {expected} (--precision auto: {why})"]
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    epochs = [json.loads(x) for x in records if "train_seconds" in x]
    assert [r["precision"] for r in epochs] == [expected]
    assert "loss_scale" not in epochs[0]


@pytest.mark.parametrize("precision, caps, warned", [
    ("bf16", {}, "--precision bf16 on a CPU without AMX or AVX512-BF16: torch emulates bf16"),
    ("bf16", {"avx512_bf16": True}, None),
    ("bf16", {"amx": True}, None),
    ("fp16", {"avx512_bf16": True}, "--precision fp16 on a CPU without AMX-FP16: torch emulates float16"),
    ("fp32", {}, None),
])
def test_a_run_warns_once_where_its_half_precision_is_emulated(tmp_path, monkeypatch, caplog, precision, caps,
                                                               warned):
    fake_device(monkeypatch, **caps)
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: False, raising=False)
    with caplog.at_level(logging.WARNING, logger="training.run.trainer"):
        tiny_runs.tiny_run(tmp_path, precision=precision, epochs=1)
    found = [r.getMessage() for r in caplog.records if "emulates" in r.getMessage()]
    assert [m[:len(warned)] for m in found] == ([warned] if warned else [])
    assert device_mod.emulated_precision(precision, torch.device("meta")) is None  # a CPU's matter alone


def test_fp16_without_autocast_support_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """A torch build without CPU float16 autocast warns and computes fp32: fp16 is refused instead."""
    import contextlib
    import warnings

    @contextlib.contextmanager
    def old_autocast(device_type, dtype=None, enabled=True):
        warnings.warn("In CPU autocast, but the target dtype is not supported. Disabling autocast.")
        yield

    monkeypatch.setattr(torch, "autocast", old_autocast)
    assert device_mod.fp16_autocast_problem(CPU).startswith("--precision fp16: torch ")
    cfg = tiny_runs.tiny_config(tmp_path, precision="fp16")
    args = ["--model", cfg.model, "--data-dir", cfg.data_dir, "--out-dir", cfg.out_dir, "--device", "cpu",
            "--precision", "fp16"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--precision fp16: torch" in err[0] and "no float16 autocast on cpu" in err[0]
    assert not Path(cfg.out_dir).exists()


# ----------------------------------------------------------------------------- fp32: TF32 or strict

@pytest.fixture
def tf32_switches():
    """torch's process-wide TF32 switches, put back after the test whatever it set."""
    saved = device_mod.tf32_flags()
    yield
    device_mod.set_tf32_flags(saved)


@pytest.mark.parametrize("capability, precision, expected", [
    ((9, 0), "fp32", (True, True, "high")),  # Hopper: TF32 matmuls and convolutions
    ((8, 0), "fp32", (True, True, "high")),  # Ampere
    ((8, 0), "fp32-strict", (False, False, "highest")),  # full fp32, convolutions' TF32 off too
    ((7, 0), "fp32", None),  # Volta: no TF32 tensor cores, nothing touched
    ((9, 0), "bf16", None),  # autocast picks the matmuls' type
    ((9, 0), "fp16", None),
])
def test_fp32_allows_tf32_on_ampere_and_later_and_strict_does_not(monkeypatch, tf32_switches, capability,
                                                                   precision, expected):
    """The function a run sets its fp32 arithmetic with, on a fake CUDA device of each capability: the
    switches it sets, and the ones it found returned for train() to put back."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    found = (False, True, "highest")  # torch's defaults
    device_mod.set_tf32_flags(found)
    cuda = torch.device("cuda")
    assert device_mod.apply_fp32_math(precision, cuda) == (found if expected else None)
    assert device_mod.tf32_flags() == (expected or found)
    words = {"fp32": "TF32 matmuls", "fp32-strict": "full fp32 matmuls (TF32 off)"}
    assert device_mod.fp32_math(precision, cuda) == (words[precision] if expected else None)
    for fp32 in ("fp32", "fp32-strict"):  # the CPU: never touched, fp32-strict is fp32
        device_mod.set_tf32_flags(found)
        assert device_mod.apply_fp32_math(fp32, CPU) is None and device_mod.tf32_flags() == found
        assert device_mod.autocast_dtype(fp32, CPU) is None


def test_a_run_puts_back_the_switches_it_found(tmp_path, monkeypatch, tf32_switches, caplog):
    """A run that chose TF32 (a CPU run with the device check faked as an Ampere GPU's) logs it, records
    it per epoch, and train() leaves torch's switches as the caller had them."""
    monkeypatch.setattr(device_mod, "fp32_math", lambda p, d: "TF32 matmuls" if p == "fp32" else None)
    monkeypatch.setattr("training.run.trainer.fp32_math", device_mod.fp32_math)
    mine = (False, False, "highest")
    device_mod.set_tf32_flags(mine)
    seen = []
    with caplog.at_level(logging.INFO, logger="training.run.trainer"):
        train(tiny_runs.tiny_config(tmp_path, precision="fp32", epochs=1),
              on_update=lambda stepper: seen.append(device_mod.tf32_flags()))
    assert seen and set(seen) == {(True, True, "high")}  # set while it trained
    assert device_mod.tf32_flags() == mine  # and put back
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision ")] == [
        "precision fp32 (--precision fp32; TF32 matmuls)"]
    epochs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if "train_seconds" in x]
    assert [(r["precision"], r["tf32"]) for r in epochs] == [("fp32", True)]


def test_fp32_strict_on_a_cpu_is_fp32_and_recorded(tmp_path, tf32_switches, caplog):
    """--precision fp32-strict through the command line on the CPU: accepted, config.json keeps it, the
    log line and each epoch's record name it, nothing says TF32, and the switches are not touched."""
    before = device_mod.tf32_flags()
    cfg = tiny_runs.tiny_config(tmp_path, precision="fp32-strict")
    args = ["--model", cfg.model, "--data-dir", cfg.data_dir, "--out-dir", cfg.out_dir, "--device", "cpu",
            "--precision", "fp32-strict", "--epochs", "1", "--batch-size", str(cfg.batch_size)]
    with caplog.at_level(logging.INFO, logger="training.run.trainer"):
        assert cli_main(args) == 0
    assert device_mod.tf32_flags() == before
    run = Path(cfg.out_dir)
    assert json.loads((run / "config.json").read_text())["precision"] == "fp32-strict"
    log = (run / "train.log").read_text()
    assert "precision fp32-strict (--precision fp32-strict)\n" in log and "device cpu, fp32-strict" in log
    assert "TF32" not in log
    epochs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "train_seconds" in x]
    assert [r["precision"] for r in epochs] == ["fp32-strict"] and "tf32" not in epochs[0]


def test_cpu_model_names_the_family_a_virtual_machine_hides(tmp_path):
    """Records and benchmarks name the CPU by its model name and its family and model numbers: two
    virtual machines both called "AMD EPYC" (Zen 4 and Zen 5, family 25 and 26) are told apart."""
    from training.common.device import cpu_model
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
                    "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 99\nmodel name\t: other\n")
    assert cpu_model(info) == "AMD EPYC (family 26, model 2)"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert cpu_model(info) == "Some CPU"
