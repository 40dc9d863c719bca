"""data/batching.py's evaluation batches: length-sorted, capped by count and by padded tokens."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data.batching import EvalBatching, _sorted_spans, encode_task, eval_batches
from data.loaders import COURSE_FILES, load_task_file

pytestmark = pytest.mark.usefixtures("one_thread")


def test_spans_hand_computed():
    lengths = np.array([2, 3, 3, 5, 8, 8, 9])
    # budget 10: 3 x 3 = 9 fits, 4 x 5 = 20 does not; then 5, 8, 8 (2 x 8 = 16 > 10) and 9 alone
    assert _sorted_spans(lengths, 4, 10) == [(0, 3), (3, 4), (4, 5), (5, 6), (6, 7)]
    assert _sorted_spans(lengths, 4, None) == [(0, 4), (4, 7)]  # the count alone, as before the budget
    assert _sorted_spans(lengths, 2, 1000) == [(0, 2), (2, 4), (4, 6), (6, 7)]  # the count still caps
    assert _sorted_spans(np.array([50, 60]), 8, 10) == [(0, 1), (1, 2)]  # over budget alone: one per batch
    with pytest.raises(ValueError, match="max_tokens"):
        _sorted_spans(lengths, 4, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 130), min_size=1, max_size=300), st.integers(1, 64), st.integers(1, 3000))
def test_spans_cover_in_order_respect_both_caps_and_are_as_large_as_the_caps_allow(lengths, batch_size, budget):
    lengths = np.sort(np.array(lengths))
    spans = _sorted_spans(lengths, batch_size, budget)
    assert [a for a, _ in spans] == [0] + [b for _, b in spans[:-1]] and spans[-1][1] == len(lengths)
    for a, b in spans:
        assert 1 <= b - a <= batch_size
        assert (b - a) * lengths[b - 1] <= budget or b - a == 1
        if b < len(lengths):  # one more example would break a cap
            assert b - a == batch_size or (b - a + 1) * lengths[b] > budget


@pytest.fixture(scope="module")
def dev_subset(course_data_dir):
    """60 examples of each real dev file, encoded for MiniLM, and a model with seeded heads."""
    from heads import MultitaskBert
    from minbert import load_bert, load_tokenizer, resolve_checkpoint
    path = resolve_checkpoint("minilm-l6")
    tok = load_tokenizer(path)
    torch.manual_seed(0)
    model = MultitaskBert(load_bert(path), "cross").eval()
    dev = {}
    for task in ("sst", "para", "sts"):
        examples = load_task_file(course_data_dir / COURSE_FILES[task]["dev"], task, labelled=True).examples
        dev[task] = encode_task(task, examples[:60], tok, "cross", 128)
    return model, tok, dev


def test_token_budget_batches_are_smaller_for_long_examples_and_cover_every_example(dev_subset):
    _, tok, dev = dev_subset
    data = dev["para"]
    batches = eval_batches(data, tok, 256, max_tokens=600)
    assert sorted(i for b in batches for i in b.indices) == list(range(len(data)))
    widths = [b.inputs[0]["input_ids"].shape[1] for b in batches]
    assert widths == sorted(widths) and all(b.size * w <= 600 for b, w in zip(batches, widths))
    assert batches[0].size > batches[-1].size  # short examples in large batches, long ones in small


def test_outputs_per_example_do_not_depend_on_the_batching(dev_subset):
    """Each example's output under the token budget equals its output computed alone (batch of one,
    no padding: the reference), to float noise; the metrics equal the fixed-count batching's to 1e-6."""
    from training.inference.outputs import evaluate, raw_outputs
    model, tok, dev = dev_subset
    cpu = torch.device("cpu")
    for task, data in dev.items():
        alone = raw_outputs(model, data, tok, EvalBatching(1, None), cpu)
        budget = raw_outputs(model, data, tok, EvalBatching(256, 500), cpu)
        assert len(eval_batches(data, tok, 256, max_tokens=500)) > 3  # really several batch compositions
        torch.testing.assert_close(budget, alone, atol=2e-5, rtol=0)
    fixed = evaluate(model, dev, tok, EvalBatching(256, None), cpu)
    budgeted = evaluate(model, dev, tok, EvalBatching(256, 500), cpu)
    assert fixed.keys() == budgeted.keys()
    for k in fixed:
        assert abs(fixed[k] - budgeted[k]) <= 1e-6, (k, fixed[k], budgeted[k])


def _task_of_lengths(lengths):
    from data.batching import TaskData
    from data.loaders import Example
    return TaskData("sst", [Example(str(i), "x", None, 0) for i in range(len(lengths))],
                    [[([1] * n, [0] * n) for n in lengths]])


def test_padded_evaluation_plans_count_the_padded_tokens_by_hand():
    data = _task_of_lengths([10, 3, 9, 5])  # sorted: 3 5 9 10 (indices 1 3 2 0)
    # unpadded, budget 32: 3 x 9 = 27 fits, 4 x 10 = 40 does not
    assert EvalBatching(8, 32).plan(data, "cpu") == [[1, 3, 2], [0]]
    # to multiples of 8 the lengths are 8 8 16 16: 3 x 16 = 48 > 32, so two and two
    assert EvalBatching(8, 32, multiple=8).plan(data, "cpu") == [[1, 3], [2, 0]]
    # the cap (--max-length 12) bounds the rounding: 8 8 12 12; budget 36: 3 x 12 fits, 3 x 16 would not
    assert EvalBatching(8, 36, multiple=8).plan(data, "cpu") == [[1, 3], [2, 0]]
    assert EvalBatching(8, 36, multiple=8, cap=12).plan(data, "cpu") == [[1, 3, 2], [0]]
    from minbert import load_tokenizer, resolve_checkpoint
    tok = load_tokenizer(resolve_checkpoint("minilm-l6"))
    widths = [EvalBatching(8, 32, 8, 12).batch(data, idx, tok).inputs[0]["input_ids"].shape[1]
              for idx in ([1, 3], [2, 0])]
    assert widths == [8, 12]


def test_padded_evaluation_batches_give_each_examples_unpadded_output(dev_subset):
    """Padding every batch to a multiple of 16 tokens (--pad-multiple) changes the shapes, not the outputs:
    the mask hides the extra positions (reference: the batches padded to their longest alone)."""
    from training.inference.outputs import raw_outputs
    model, tok, dev = dev_subset
    cpu = torch.device("cpu")
    widths = []
    for data in dev.values():
        plain = raw_outputs(model, data, tok, EvalBatching(16, 600), cpu)
        plan = EvalBatching(16, 600, multiple=16, cap=128)
        widths += [plan.batch(data, idx, tok).inputs[0]["input_ids"].shape[1] for idx in plan.plan(data, "cpu")]
        torch.testing.assert_close(raw_outputs(model, data, tok, plan, cpu), plain, atol=2e-5, rtol=0)
    assert len(set(widths)) > 1  # several shapes, each a multiple of 16:
    assert set(widths) <= set(range(16, 129, 16))


def test_auto_budget_is_the_cpu_measurement_on_cpu_and_none_elsewhere():
    from data.batching import CPU_EVAL_TOKENS, eval_token_budget
    assert eval_token_budget("auto", "cpu") == CPU_EVAL_TOKENS
    assert eval_token_budget("auto", "cuda") is None
    assert eval_token_budget(777, "cuda") == 777 and eval_token_budget(None, "cpu") is None


@pytest.mark.parametrize("value", ["-1", "many"])
def test_evaluate_cli_rejects_a_bad_token_budget_in_one_line(value, capsys):
    from training.evaluate import main
    with pytest.raises(SystemExit) as e:
        main([".", "--score", "sst", "f.csv", f"--eval-tokens={value}"])  # a RUN that exists: the flag is at fault
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m training.evaluate: error: argument --eval-tokens: ")
    assert value in err[0] and "unrecognized" not in err[0]


def test_a_batch_copied_to_the_device_says_on_its_mask_whether_it_is_padded_and_the_model_asks_nothing():
    """Batch.to decides `.unpadded` from the host's mask (here recomputed by hand), and padding_bias
    reads it without touching the mask's values: no host sync on a GPU, the same bias as asking."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from data.batching import Batch
    from minbert.model import padding_bias

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.values = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.values += func.overloadpacket.__name__ == "_local_scalar_dense"
            return func(*args, **(kwargs or {}))

    full = torch.ones(2, 4, dtype=torch.long)
    padded = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    for mask in (full, padded):
        seq = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "token_type_ids": torch.zeros(2, 4, dtype=torch.long),
               "attention_mask": mask.clone()}
        on_device = Batch("sst", [seq], torch.zeros(2, dtype=torch.long), ["a", "b"], [0, 1]).to("cpu")
        got = on_device.inputs[0]["attention_mask"]
        assert got.unpadded is bool((mask == 1).all().item())
        with Reads() as reads:
            bias = padding_bias(got, torch.float32)
        assert reads.values == 0
        bare = mask.clone()  # a mask nobody annotated: asked, as before
        with Reads() as reads:
            want = padding_bias(bare, torch.float32)
        assert reads.values == 1
        assert (bias is None) == (want is None) and (bias is None or torch.equal(bias, want))
