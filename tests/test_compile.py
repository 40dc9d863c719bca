"""--compile: compiled encoder layers compute what the eager ones do (values and gradients, over
batches of different lengths), and a compiler failure falls back to eager with one warning."""
import copy
import json
import logging

import pytest
import torch

from minbert import Bert, BertConfig
from training.methods.compiling import compile_layers

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_bert() -> Bert:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return Bert(cfg, attn_impl="matmul")


def batch(B: int, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 30, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, T // 2:] = 0  # one padded row
    return ids, mask


def loss_and_grads(model: Bert, ids, mask):
    model.zero_grad(set_to_none=True)
    out = model(ids, attention_mask=mask)
    loss = out.last_hidden_state.pow(2).mean() + out.pooler_output.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def failing_backend(gm, example_inputs):
    raise RuntimeError("no compiler here\nsecond line of the trace")


def test_fallback_runs_eagerly_and_warns_once(caplog):
    eager = tiny_bert()
    compiled = copy.deepcopy(eager)
    compile_layers(compiled, backend=failing_backend)
    with caplog.at_level(logging.WARNING, logger="training.methods.compiling"):
        for T, seed in ((7, 0), (11, 1)):
            ids, mask = batch(3, T, seed)
            le, ge = loss_and_grads(eager, ids, mask)
            lc, gc = loss_and_grads(compiled, ids, mask)
            assert torch.equal(le, lc)
            for n in ge:
                assert torch.equal(ge[n], gc[n]), n
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "torch.compile failed" in warnings[0].getMessage()
    assert "no compiler here" in warnings[0].getMessage()
    assert "second line" not in warnings[0].getMessage()


def test_state_dict_unchanged_by_compile():
    model = tiny_bert()
    keys = list(model.state_dict())
    compile_layers(model, backend=failing_backend)
    assert list(model.state_dict()) == keys


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_inductor_matches_eager_over_lengths(caplog, mode):
    """The real compiler (inductor; needs a C++ compiler, which CI has): same loss and gradients
    as eager on two batch shapes (dynamic shapes: no error, no fallback) and in eval mode; under
    reduce-overhead too, which on a CPU compiles without CUDA graphs."""
    from torch._dynamo.utils import counters
    counters.clear()
    eager = tiny_bert()
    compiled = copy.deepcopy(eager)
    compile_layers(compiled, mode=mode)
    with caplog.at_level(logging.WARNING, logger="training.methods.compiling"):
        for B, T, seed in ((3, 7, 0), (5, 12, 1)):
            ids, mask = batch(B, T, seed)
            le, ge = loss_and_grads(eager, ids, mask)
            lc, gc = loss_and_grads(compiled, ids, mask)
            torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-6)
            for n in ge:
                torch.testing.assert_close(gc[n], ge[n], rtol=1e-4, atol=1e-6, msg=n)
        eager.eval(), compiled.eval()
        with torch.inference_mode():
            ids, mask = batch(4, 9, 2)
            torch.testing.assert_close(compiled(ids, mask).last_hidden_state, eager(ids, mask).last_hidden_state,
                                       rtol=1e-5, atol=1e-6)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "fell back to eager"
    assert counters["stats"]["unique_graphs"] >= 1  # something was really compiled


def test_cli_flag_compiles_and_a_failure_keeps_training(tmp_path, monkeypatch, caplog):
    """`--compile` through the command line and the trainer: with a compiler that fails, the run warns
    once, finishes, and gives the same metrics and predictions as a run without --compile."""
    from test_training import make_checkpoint, write_data

    from training.train import main as cli_main

    real_compile = torch.compile
    calls = []

    def compile_with_failing_backend(fn, **kw):
        calls.append(fn)
        return real_compile(fn, **{**kw, "backend": failing_backend})

    monkeypatch.setattr(torch, "compile", compile_with_failing_backend)
    data, ckpt = write_data(tmp_path / "data"), make_checkpoint(tmp_path / "ckpt")
    runs = {}
    for flag in ([], ["--compile"]):
        root = tmp_path / ("compiled" if flag else "eager")
        with caplog.at_level(logging.WARNING, logger="training.methods.compiling"):
            rc = cli_main(["--model", str(ckpt), "--data-dir", str(data), "--epochs", "3", "--batch-size", "8",
                           "--lr", "1e-2", "--seed", "3", "--device", "cpu", "--precision", "fp32",
                           "--out-dir", str(root / "run"), "--predictions-dir", str(root / "pred"), *flag])
        assert rc == 0
        runs[bool(flag)] = root
    assert len(calls) == 2  # one per encoder layer, only in the --compile run
    warnings = [r for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(warnings) == 1

    def dev_metrics(root):
        lines = (root / "run" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in r.items() if k.startswith("dev_")} for r in map(json.loads, lines)
                if "train_seconds" in r]

    assert dev_metrics(runs[True]) == dev_metrics(runs[False])
    for name in ("sst-dev-output.csv", "para-test-output.csv"):
        assert (runs[True] / "pred" / name).read_text() == (runs[False] / "pred" / name).read_text()


def test_compile_mode_reaches_torch_compile_and_reduce_overhead_marks_each_step(monkeypatch):
    """--compile-mode: each layer is compiled with the mode (none passed for default); a Stepper under
    reduce-overhead marks the start of every step for the CUDA graphs, and under default never does."""
    import training.methods.stepper as stepper_module
    from data.batching import Batch
    from heads import MultitaskBert
    from training.config.train_config import TrainConfig
    from training.methods.stepper import Stepper

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    compile_layers(tiny_bert(), mode="reduce-overhead")
    compile_layers(tiny_bert())
    assert [kw.get("mode") for kw in seen] == ["reduce-overhead"] * 2 + [None] * 2

    marks = []
    monkeypatch.setattr(stepper_module, "mark_step", lambda: marks.append(1))
    ids, mask = batch(3, 7, 0)
    sst = Batch("sst", [{"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}],
                torch.tensor([0, 3, 4]), ["a", "b", "c"], [0, 1, 2])
    for mode, expected in (("default", 0), ("reduce-overhead", 3)):
        marks.clear()
        cfg = TrainConfig(compile=True, compile_mode=mode, device="cpu", precision="fp32")
        stepper = Stepper.build(MultitaskBert(tiny_bert(), "cross"), cfg, 10)
        for step in range(3):
            assert stepper.step([sst], step) is not None
        assert len(marks) == expected, mode
