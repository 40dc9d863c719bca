"""--step-graphs on the CPU: the graph machinery (shape keys, static buffers, static gradients, the
parameters a shape does not reach, the random state around warm-up and capture, skipped steps) with
CUDA's recorder replaced by EagerGraph, which replays by calling the recorded function again and copying
its results into the outputs captured first. A replay reading a stale batch or a value fixed at capture
then goes wrong here as it would on a GPU, and the run must follow the eager run bit for bit (one BLAS,
the same sums). tests/test_cuda.py checks the real CUDA graphs against eager steps on a GPU.
"""
import logging
import re
from pathlib import Path

import pytest
import torch
from tiny_runs import tiny_config

from training.config.train_config import validate
from training.methods import step_graphs
from training.methods import stepper as stepper_mod
from training.run.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cpu_recorder(monkeypatch):
    """EagerGraph stands in for torch.cuda.CUDAGraph; returns the count of replays."""
    replays = []
    real = step_graphs.EagerGraph.replay

    def counted(self):
        replays.append(1)
        real(self)

    monkeypatch.setattr(step_graphs, "recorder_for", lambda device: step_graphs.EagerGraph)
    monkeypatch.setattr(step_graphs.EagerGraph, "replay", counted)
    return replays


def _weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "best.pt", map_location="cpu", weights_only=True)["model"]


def _losses(run_dir: Path) -> list[str]:
    return [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "train_loss" in line]


def _strip_times(lines: list[str]) -> list[dict]:
    import json
    return [{k: v for k, v in json.loads(x).items() if "seconds" not in k and "per_s" not in k} for x in lines]


CASES = {
    # per-task batches (each step reaches one head: the others must get no gradient), head dropout on
    "one task a step": dict(task_sampling="round-robin", head_dropout=0.1, batch_size=4),
    # mixed batches: three backward passes into one set of gradients
    "mixed batches": dict(task_sampling="mixed", batch_size=6),
    # the frozen prefix served from the cache (hidden states as the graph's inputs), weight averaging
    "frozen prefix cached, EMA": dict(freeze_upto=1, frozen_cache="memory", ema_decay=0.9, batch_size=4),
    "LoRA": dict(peft="lora:r=4", batch_size=4),
    # the best MiniLM recipe's SMART: the Bregman term alone (the teacher's forward in the graph, its
    # update eager), mean pooling
    "SMART's Bregman term": dict(smart=True, smart_lambda=0.0, pooling="mean", batch_size=4),
}


@pytest.mark.parametrize("case", CASES)
def test_replayed_steps_follow_the_eager_steps(tmp_path, cpu_recorder, case, caplog):
    kw = dict(epochs=4, pad_multiple=8, weight_decay=0.1, **CASES[case])
    train(eager := tiny_config(tmp_path, "eager", **kw))
    with caplog.at_level(logging.INFO):
        train(graphed := tiny_config(tmp_path, "graphed", step_graphs=True, **kw))
    assert cpu_recorder, "no step was replayed"
    said = [int(n) for n in re.findall(r"shapes recorded, (\d+) steps replayed", caplog.text)]
    assert len(said) == 4 and sum(said) == len(cpu_recorder), caplog.text  # each epoch's count, summed
    assert _strip_times(_losses(Path(graphed.out_dir))) == _strip_times(_losses(Path(eager.out_dir)))
    want, got = _weights(Path(eager.out_dir)), _weights(Path(graphed.out_dir))
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_a_replay_of_stale_inputs_is_caught(tmp_path, cpu_recorder, monkeypatch):
    """The check above can fail: graphs that never refill their inputs replay each shape's first batch."""
    monkeypatch.setattr(step_graphs, "refill", lambda static, batch: None)
    kw = dict(epochs=4, pad_multiple=32, batch_size=4, task_sampling="round-robin")
    train(eager := tiny_config(tmp_path, "eager", **kw))
    train(graphed := tiny_config(tmp_path, "graphed", step_graphs=True, **kw))
    assert cpu_recorder
    assert _strip_times(_losses(Path(graphed.out_dir))) != _strip_times(_losses(Path(eager.out_dir)))


def test_a_non_finite_replayed_step_is_skipped_as_an_eager_one(tmp_path, cpu_recorder, monkeypatch):
    """A loss made NaN at one replayed step (a factor the graph reads at replay): both runs skip that
    step and go on alike; the static gradients stay on the parameters after the skip."""
    factor = torch.ones(())
    real_loss, real_step = stepper_mod.task_loss, stepper_mod.Stepper.step
    monkeypatch.setattr(stepper_mod, "task_loss", lambda task, out, labels: real_loss(task, out, labels) * factor)

    def step(self, batches, step, weights=None):
        factor.fill_(float("nan") if step == 9 else 1.0)
        return real_step(self, batches, step, weights)

    monkeypatch.setattr(stepper_mod.Stepper, "step", step)
    kw = dict(epochs=4, pad_multiple=32, batch_size=4, task_sampling="round-robin")
    train(eager := tiny_config(tmp_path, "eager", **kw))
    train(graphed := tiny_config(tmp_path, "graphed", step_graphs=True, **kw))
    assert len(cpu_recorder) > 9
    assert _strip_times(_losses(Path(graphed.out_dir))) == _strip_times(_losses(Path(eager.out_dir)))
    for k, v in _weights(Path(eager.out_dir)).items():
        assert torch.equal(_weights(Path(graphed.out_dir))[k], v), k


def test_runs_that_cannot_be_captured_say_why_and_step_eagerly(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        train(tiny_config(tmp_path, "cpu", epochs=1, step_graphs=True))
    assert "--step-graphs: CUDA graphs need a CUDA device, not cpu; every step runs eagerly" in caplog.text
    assert step_graphs.uncapturable(tiny_config(tmp_path, smart=True, pcgrad=True, task_sampling="mixed"),
                                    torch.device("cuda"), True, None, False) == \
        "SMART's adversarial ascent (--smart-lambda 0, the Bregman term alone, can), PCGrad's per-task " \
        "backward cannot be captured"
    assert step_graphs.uncapturable(tiny_config(tmp_path), torch.device("cuda"), True, None, True) == \
        "fp16's dynamic loss scale cannot be captured"
    assert step_graphs.uncapturable(tiny_config(tmp_path), torch.device("cuda"), True, None, False) is None


def test_step_graphs_and_per_layer_graphs_are_one_or_the_other(tmp_path):
    cfg = tiny_config(tmp_path, step_graphs=True, compile=True, compile_mode="reduce-overhead")
    assert any(e.startswith("--step-graphs records the whole step") for e in validate(cfg))
    assert not any("--step-graphs" in e for e in validate(tiny_config(tmp_path, step_graphs=True, compile=True)))


def test_shape_key_tells_padded_from_unpadded_masks():
    """The model skips the mask where a batch has no padding, so a graph recorded without padding must
    not replay a padded batch of the same shape."""
    from data.batching import Batch

    class Model:
        frozen_upto = None

    mask = torch.ones(2, 4, dtype=torch.long)
    padded, full = mask.clone(), mask.clone()
    padded.unpadded, full.unpadded = False, True
    ids = torch.zeros(2, 4, dtype=torch.long)
    a = Batch("sst", [{"input_ids": ids, "attention_mask": padded}], torch.zeros(2, dtype=torch.long), [], [])
    b = Batch("sst", [{"input_ids": ids, "attention_mask": full}], torch.zeros(2, dtype=torch.long), [], [])
    assert step_graphs.shape_key(Model, [a]) != step_graphs.shape_key(Model, [b])
    assert step_graphs.static_copy(a).inputs[0]["attention_mask"].unpadded is False


def test_a_failed_capture_leaves_that_shape_eager(tmp_path, monkeypatch, caplog):
    """A capture that raises (a host sync inside the step, on CUDA) is said once per shape, and the run
    goes on eagerly, the same run as without --step-graphs."""
    class Failing(step_graphs.EagerGraph):
        def capture(self, fn):
            raise RuntimeError("operation not permitted when stream is capturing\nmore lines")

    monkeypatch.setattr(step_graphs, "recorder_for", lambda device: Failing)
    kw = dict(epochs=3, pad_multiple=32, batch_size=4, task_sampling="round-robin")
    train(eager := tiny_config(tmp_path, "eager", **kw))
    with caplog.at_level(logging.WARNING):
        train(graphed := tiny_config(tmp_path, "graphed", step_graphs=True, **kw))
    failed = re.findall(r"capturing a (\w+) step failed \(RuntimeError: operation not permitted when stream is "
                        r"capturing\); steps of that shape run eagerly", caplog.text)
    assert sorted(set(failed)) == ["para", "sst", "sts"] and len(failed) == len(set(failed)), caplog.text
    assert _strip_times(_losses(Path(graphed.out_dir))) == _strip_times(_losses(Path(eager.out_dir)))
