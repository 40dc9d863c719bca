"""The GPU path: the CPU tests' checks again on CUDA, and training end to end with --device cuda.

Every test here is marked `cuda` (`pytest -m cuda` runs them alone) and skipped, with the reason
shown (`-rs`, on by default in setup.cfg), where torch sees no CUDA device. bench/gpu_check.sh runs
them on a GPU machine. They reuse the CPU tests' helpers and independent references (transformers,
the SMART objective and PCGrad surgery recomputed, the EMA recursion in float64), so a change to
those checks reaches both.
"""
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_ema import check_recursion
from test_frozen_cache import _model as frozen_model
from test_frozen_cache import setup as frozen_setup  # noqa: F401 (a fixture)
from test_parity import IMPLS, PAIRS, SENTS, _compare, _dropout_free_pair, minilm_dir  # noqa: F401 (a fixture)
from test_pcgrad_loop import _setup as pcgrad_setup
from test_pcgrad_loop import check_surgery
from test_peft import check_lora_formula
from test_resume import CHILD, _args, _epoch_records, files  # noqa: F401 (a fixture)
from test_smart_loop import BIG_BALL, check_step_objective
from test_smart_loop import _setup as smart_setup
from test_training import EPOCHS, SEED, N, check_learnt, config, inputs, metrics_records  # noqa: F401 (a fixture)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (torch.cuda.is_available() is False); bench/gpu_check.sh runs "
                              "these on a GPU machine"),
]
CUDA = torch.device("cuda")
REPO = Path(__file__).resolve().parents[1]

# fp32 on CUDA, ours against transformers: both are fp32 throughout (TF32 off, see `true_fp32`), but
# cuBLAS picks its kernels and summation orders by shape, and ours multiplies Q, K and V as one
# (B*T, 384) x (384, 1152) product where the reference does three. fp32 keeps 24 bits (unit
# roundoff 6e-8); dot products of up to 1536 terms summed in another order differ by about
# sqrt(1536) * 6e-8 ~ 2.4e-6 of their magnitude, and six layers with LayerNorm's rescaling, on
# hidden values up to 6, stay below 1e-4. A real difference (a mask, a bias, bf16 leaking into
# an fp32 run) moves outputs by 1e-2 or more. The CPU parity tests hold 1e-5 with one BLAS.
FP32_ATOL = 1e-4
# Gradients: the embedding's backward sums by atomic adds on CUDA (any order), hence rtol too.
FP32_GRAD = dict(atol=1e-4, rtol=1e-3)


@pytest.fixture
def true_fp32():
    """TF32 off for matmuls and convolutions (Ampere+ would otherwise round fp32 inputs to 10 bits)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def _pair(minilm_dir, ours_impl, ref_impl):
    from transformers import BertModel

    from minbert import load_bert
    ours = load_bert(minilm_dir, attn_impl=ours_impl).to(CUDA)
    # .float(): a prepared fp16 checkpoint (bench/gpu_prepare.py) must give an fp32 reference
    ref = BertModel.from_pretrained(str(minilm_dir), attn_implementation=ref_impl).float().to(CUDA)
    return ours, ref


# ----------------------------------------------------------------------------- parity with transformers

@pytest.mark.parametrize("ours_impl,ref_impl", IMPLS)
def test_parity_in_fp32(minilm_dir, true_fp32, ours_impl, ref_impl):
    from minbert import load_tokenizer
    ours, ref = _pair(minilm_dir, ours_impl, ref_impl)
    tok = load_tokenizer(minilm_dir)
    _compare(ours, ref, tok(SENTS, device=CUDA), atol=FP32_ATOL)
    _compare(ours, ref, tok(SENTS, PAIRS, device=CUDA), atol=FP32_ATOL)


def test_training_gradients_in_fp32(minilm_dir, true_fp32):
    from minbert import load_tokenizer
    ours, ref = (m.to(CUDA) for m in _dropout_free_pair(minilm_dir, "sdpa", "sdpa"))
    batch = load_tokenizer(minilm_dir)(SENTS, PAIRS, device=CUDA)
    ours(**batch).pooler_output.pow(2).sum().backward()
    ref(**batch).pooler_output.pow(2).sum().backward()
    torch.testing.assert_close(ours.embeddings.word.weight.grad, ref.embeddings.word_embeddings.weight.grad,
                               **FP32_GRAD)
    torch.testing.assert_close(ours.layers[5].ffn_out.weight.grad, ref.encoder.layer[5].output.dense.weight.grad,
                               **FP32_GRAD)
    torch.testing.assert_close(ours.layers[2].qkv.weight.grad[:384],
                               ref.encoder.layer[2].attention.self.query.weight.grad, **FP32_GRAD)


def test_parity_under_bf16_autocast(minilm_dir, true_fp32):
    """Under bf16 autocast neither implementation is exact: bf16 keeps 8 bits (unit roundoff 2^-9 ~
    2e-3) in every matmul and in attention. Both run the same ops in bf16 (autocast decides by op,
    and LayerNorm and softmax's sums stay fp32), so ours must be as close to the fp32 truth as the
    reference is: within twice the reference's own error (room for other rounding points: our fused
    QKV product, where the heads are split), plus 1e-3 for errors too small to compare as ratios."""
    from minbert import load_tokenizer
    ours, ref = _pair(minilm_dir, "sdpa", "sdpa")
    ours.eval(), ref.eval()
    batch = load_tokenizer(minilm_dir)(SENTS, PAIRS, device=CUDA)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        truth = ref(**batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o, r = ours(**batch), ref(**batch)
    for name, pick in (("hidden", lambda x: x.last_hidden_state[real]), ("pooled", lambda x: x.pooler_output)):
        want = pick(truth).float()
        err_ours, err_ref = ((pick(x).float() - want).abs() for x in (o, r))
        assert err_ours.max() > 1e-4, f"{name}: no bf16 rounding at all: autocast did not reach our matmuls"
        assert err_ours.max() <= 2 * err_ref.max() + 1e-3, (name, err_ours.max().item(), err_ref.max().item())
        assert err_ours.mean() <= 2 * err_ref.mean() + 1e-3, (name, err_ours.mean().item(), err_ref.mean().item())


# ----------------------------------------------------------------------------- frozen-prefix cache

def test_frozen_cache_holds_what_the_frozen_layers_compute(frozen_setup):
    """Built on the GPU in fp32, the cache equals the frozen layers' output for a batch put together
    otherwise. Same device, same fp32 arithmetic: only the padding length differs, which changes the
    matmul shapes and so cuBLAS's summation order, a few ulps of values of order 1 (atol 1e-5)."""
    from data.batching import make_batch
    from training.methods.frozen_cache import build_frozen_cache
    ckpt, tok, train = frozen_setup
    model = frozen_model(ckpt, 2).to(CUDA).eval()
    cache = build_frozen_cache(model, train, tok, CUDA, "memory", dtype="float32")
    idx = [3, 0, 17, 5]
    batch = make_batch(train["para"], idx, tok).to(CUDA)
    cached = cache.batch(train["para"], idx).to(CUDA)
    with torch.no_grad():
        for seq, c in zip(batch.inputs, cached.inputs):
            h = model.hidden_at([seq], 2)[0]
            real = seq["attention_mask"].bool()
            assert torch.equal(c["attention_mask"], seq["attention_mask"])
            torch.testing.assert_close(c["hidden"][real], h[real], rtol=0, atol=1e-5)


def test_training_with_the_cache_follows_the_run_without_it(tmp_path, inputs):
    """train() on CUDA with --freeze-upto 1: the cached run (fp16 storage, the default) and the one
    that runs the frozen layer every step reach the same losses and dev scores to fp16 precision
    (the CPU test's tolerance for the same storage)."""
    runs = {}
    for mode in ("off", "memory"):
        from training.run.trainer import train
        cfg = config(tmp_path / mode, *inputs, epochs=3, freeze_upto=1, frozen_cache=mode, device="cuda",
                     precision="fp32-strict")
        runs[mode] = (train(cfg), [r for r in metrics_records(Path(cfg.out_dir)) if "train_seconds" in r])
    (best_off, rec_off), (best_mem, rec_mem) = runs["off"], runs["memory"]
    for a, b in zip(rec_off, rec_mem):
        for task in ("sst", "para", "sts"):
            assert b[f"train_loss_{task}"] == pytest.approx(a[f"train_loss_{task}"], rel=5e-3, abs=5e-3)
    assert best_mem["overall"] == pytest.approx(best_off["overall"], abs=5e-3)


def _dropout_free_model(ckpt):
    """The frozen-cache tests' tiny model on CUDA, every dropout off: graphed and eager steps then compute
    the same function, so their losses can be held to a tolerance."""
    model = frozen_model(ckpt, None)
    for m in model.modules():
        if isinstance(getattr(m, "p", None), float):
            m.p = 0.0
    return model.to(CUDA)


def test_cuda_graphs_train_as_eager_does(frozen_setup, true_fp32):
    """--compile --compile-mode reduce-overhead with --pad-multiple 8: six steps with each layer's kernels
    replayed as CUDA graphs reach the eager run's losses and weights (fp32, dropout off; inductor's fused
    kernels sum in other orders, hence the tolerances), and inductor skipped no graph. A graph replaying
    stale inputs or outputs would be off by far more."""
    from torch._dynamo.utils import counters

    from data.batching import make_batch
    from training.config.train_config import TrainConfig
    from training.methods.compiling import compile_layers
    from training.methods.stepper import Stepper
    ckpt, tok, train = frozen_setup
    counters.clear()
    runs = {}
    for compiled in (False, True):
        model = _dropout_free_model(ckpt)
        cfg = TrainConfig(lr=1e-2, max_grad_norm=1.0, warmup_ratio=0.0, device="cuda", precision="fp32-strict",
                          compile=compiled, compile_mode="reduce-overhead", pad_multiple=8)
        stepper = Stepper.build(model, cfg, 6, CUDA, None)
        if compiled:
            compile_layers(model.encoder, mode="reduce-overhead")
        losses = []
        for step in range(6):
            task, idx = ("sst", "para", "sts")[step % 3], list(range((step // 3) * 8, (step // 3) * 8 + 8))
            batch = make_batch(train[task], idx, tok, 8, 24).to(CUDA)
            losses.append(stepper.step([batch], step)[task]["loss"])
        runs[compiled] = losses, [p.detach().cpu() for p in model.parameters()]
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-3, abs=1e-4)
    for got, want in zip(runs[True][1], runs[False][1]):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("precision", ["fp32-strict", "bf16"])
def test_step_graphs_train_as_eager_does(frozen_setup, true_fp32, precision):
    """--step-graphs: 20 steps over six batches (three tasks, up to two shapes each, --pad-multiple 8), each
    shape's first step eager and the rest replayed from its CUDA graph, reach the eager run's losses and
    weights (dropout off: the same kernels, so the tolerances only allow for cuBLAS picking other
    algorithms on a side stream). A graph replaying stale inputs, or AdamW stepping a head no batch
    reached, would be off by far more."""
    from data.batching import make_batch
    from training.config.train_config import TrainConfig
    from training.methods.step_graphs import StepGraphs, shape_key
    from training.methods.stepper import Stepper
    ckpt, tok, train = frozen_setup
    amp = None if precision == "fp32-strict" else torch.bfloat16
    batches = [make_batch(train[task], list(range(k * 8, k * 8 + 8)), tok, 8, 24).to(CUDA)
               for k in range(2) for task in ("sst", "para", "sts")]
    runs = {}
    for graphed in (False, True):
        model = _dropout_free_model(ckpt)
        cfg = TrainConfig(lr=1e-2, max_grad_norm=1.0, warmup_ratio=0.0, device="cuda", precision=precision,
                          step_graphs=graphed, pad_multiple=8)
        stepper = Stepper.build(model, cfg, 20, CUDA, amp)
        if graphed:
            stepper.graphs = StepGraphs.for_run(stepper, CUDA)
        losses = [stepper.step([batches[step % 6]], step)[batches[step % 6].task]["loss"] for step in range(20)]
        runs[graphed] = losses, [p.detach().cpu() for p in model.parameters()]
        if graphed:
            shapes = {shape_key(model, [b]) for b in batches}
            assert len(stepper.graphs.recorded) == len(shapes) and not stepper.graphs.eager
    tol = dict(rel=1e-4, abs=1e-5) if amp is None else dict(rel=2e-2, abs=2e-2)
    assert runs[True][0] == pytest.approx(runs[False][0], **tol)
    for got, want in zip(runs[True][1], runs[False][1]):
        torch.testing.assert_close(got, want, rtol=tol["rel"], atol=tol["abs"])


# ----------------------------------------------------------------------------- LoRA, SMART, PCGrad, EMA

def test_lora_layer_is_its_formula(true_fp32):
    # LoRA adds every block's update inside one GEMM (addmm): output and gradients against the formula
    check_lora_formula("cuda")
    check_lora_formula("cuda", autocast=torch.bfloat16, tol=5e-2)


def test_smart_step_objective(tiny_ckpt):
    check_step_objective(*smart_setup(tiny_ckpt, device=CUDA, smart=True, smart_lambda=3.0, smart_mu=2.0,
                                      **BIG_BALL))


@pytest.mark.parametrize("variant", ["pcgrad", "dominant"])
def test_pcgrad_step_surgery(tiny_ckpt, variant):
    check_surgery(variant, *pcgrad_setup(tiny_ckpt, device=CUDA, pcgrad=True, pcgrad_variant=variant))


def test_weight_ema_recursion():
    check_recursion(CUDA)


# ----------------------------------------------------------------------------- exact resume

DETERMINISTIC = "import torch\ntorch.use_deterministic_algorithms(True)\n"
PLAIN_CLI = "import sys\nfrom training.train import main\nsys.exit(main(sys.argv[1:]))\n"


def _deterministic_env() -> dict:
    # cuBLAS is deterministic only with a fixed workspace; set before CUDA starts, hence a child process
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def _child(code: str, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DETERMINISTIC + code, *map(str, argv)], env=_deterministic_env(),
                          capture_output=True, text=True, timeout=600)


# mid-epoch with a weight EMA to restore too, and at an epoch's last step; bf16 autocast (auto on CUDA)
@pytest.mark.parametrize("k, extra", [(3, ("--ema-decay", "0.5")), (6, ())])
def test_sigterm_then_resume_equals_an_uninterrupted_run(files, tmp_path, k, extra):
    """test_resume's check on the GPU: with torch.use_deterministic_algorithms and a fixed cuBLAS
    workspace, a run stopped by SIGTERM after step k and resumed ends bit for bit where an
    uninterrupted run does (dropout on: the CUDA random state must come back too)."""
    from training.run.checkpointing import read_checkpoint
    ckpt, data = files
    straight, out = tmp_path / "straight", tmp_path / "interrupted"
    r = _child(PLAIN_CLI, *_args(ckpt, data, straight, "--device", "cuda", *extra))
    assert r.returncode == 0, r.stderr[-3000:]
    r = _child(CHILD, k, *_args(ckpt, data, out, "--device", "cuda", *extra))
    assert r.returncode == 143, r.stderr[-3000:]
    r = _child(PLAIN_CLI, *_args(ckpt, data, out, "--device", "cuda", *extra, "--resume", "auto"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "device cuda" in (out / "train.log").read_text()
    assert _epoch_records(out) == _epoch_records(straight)
    a, b = read_checkpoint(out / "best.pt")["model"], read_checkpoint(straight / "best.pt")["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), name
    for f in (straight / "pred").glob("*-output.csv"):  # manifest.json names its own run
        assert (out / "pred" / f.name).read_text() == f.read_text()


# ----------------------------------------------------------------------------- --device cuda end to end

def _cli_args(inputs, root, *extra) -> list[str]:
    """test_training's memorisation run, through the command line, on the GPU."""
    data, ckpt = inputs
    return ["--model", str(ckpt), "--data-dir", str(data), "--epochs", str(EPOCHS), "--batch-size", str(N),
            "--eval-batch-size", "3", "--lr", "1e-2", "--warmup-ratio", "0", "--head-dropout", "0", "--seed",
            str(SEED), "--device", "cuda", "--log-every", "4", "--out-dir", str(root / "run"),
            "--predictions-dir", str(root / "pred"), *extra]


@pytest.mark.parametrize("precision", ["auto", "fp32", "fp32-strict"])
def test_cli_trains_on_cuda_end_to_end(tmp_path, inputs, capsys, caplog, precision):
    """It learns (test_training's memorisation check), says it ran on CUDA (in bf16 where the GPU
    computes it natively, else fp16, for --precision auto), writes the prediction files, and its best.pt
    evaluated again on the CPU scores what the run recorded (same weights, other kernels: 1e-3)."""
    from training import evaluate as evaluate_mod
    from training.train import main as cli_main
    caplog.set_level(logging.INFO)  # what train.log receives (pytest's own handler leaves the root at WARNING)
    found = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    assert cli_main(_cli_args(inputs, tmp_path, "--precision", precision, "--ema-decay", "0.5")) == 0
    assert (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()) == found  # put back
    cfg = config(tmp_path, *inputs, device="cuda", precision=precision)
    best = max((r for r in metrics_records(tmp_path / "run") if "dev_overall" in r), key=lambda r: r["dev_overall"])
    check_learnt(cfg, {k[len("dev_"):]: v for k, v in best.items() if k.startswith("dev_")})
    log = (tmp_path / "run" / "train.log").read_text()
    native_bf16 = torch.cuda.get_device_capability() >= (8, 0)  # auto: bf16 there, else fp16 with a loss scale
    asked = ('bf16' if native_bf16 else 'fp16') + ' autocast' if precision == 'auto' else precision
    assert f"device cuda, {asked}" in log
    if precision != "auto" and native_bf16:  # Ampere and later: TF32 for fp32, not for fp32-strict
        assert ("; TF32 matmuls)" in log) == (precision == "fp32"), log
    assert sorted(p.name for p in (tmp_path / "pred").iterdir()) == sorted(
        ["manifest.json"] + [f"{t}-{s}-output.csv" for t in ("sst", "para", "sts") for s in ("dev", "test")])
    capsys.readouterr()
    sts_dev = str(inputs[0] / "sts-dev.csv")
    assert evaluate_mod.main([str(tmp_path / "run" / "best.pt"), "--device", "cpu",
                              "--precision", "fp32", "--score", "sts", sts_dev]) == 0
    pearson = float(capsys.readouterr().out.split("sts_pearson ")[-1].split()[0])
    assert pearson == pytest.approx(best["dev_sts_pearson"], abs=1e-3)


def test_cli_smart_and_pcgrad_on_cuda(tmp_path, inputs):
    """SMART (both terms) with PCGrad's mixed batches on the GPU: runs through, and logs finite terms."""
    from training.train import main as cli_main
    assert cli_main(_cli_args(inputs, tmp_path, "--epochs", "2", "--log-every", "1", "--pcgrad", "--smart")) == 0
    steps = [r for r in metrics_records(tmp_path / "run") if "pcgrad_conflict" in r]
    assert steps
    for r in steps:
        terms = [k for k in r if k.startswith(("r_s_", "d_breg_"))]
        assert terms and all(r[k] is not None and r[k] >= 0 for k in terms), r


def test_a_study_run_on_the_gpu_names_it(tmp_path):
    """A tiny arms study trained on the GPU: its records name the GPU (and say they trained there by their
    CUDA memory peak), and the report counts the runs per machine."""
    import tiny_runs
    from test_study_protocol import arms_recipe

    from training.experiments.study import cli as study_cli
    from training.experiments.sweep.records import read_results

    data, enc = tiny_runs.inputs(tmp_path)
    train = {"epochs": 1, "batch_size": 4, "device": "cuda", "precision": "fp32-strict", "frozen_cache": "disk"}
    path = arms_recipe(tmp_path, train=train, points=[{"label": "full", "depth": "none", "arm": ""}])
    out = tmp_path / "out"
    assert study_cli.main([str(path), "--model", str(enc), "--data-dir", str(data), "--in-process", "--threads", "1",
                           "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    records = read_results(out / "results.jsonl")
    name = torch.cuda.get_device_name()
    assert records and all(r["gpu"] == name and r["cuda_peak_mib"] > 0 for r in records)
    assert f"trained on GPU {name} ({len(records)} runs)." in (out / "arms" / "report.md").read_text()
