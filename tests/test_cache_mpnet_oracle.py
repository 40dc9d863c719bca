"""Oracles for three paths: the frozen-prefix cache at evaluation (against a forward pass one example at a time,
uncached), a training run with the cache on against one with it off, and MPNet's heads through the API against a
hand computation from transformers' MPNetModel hidden states; bf16 autocast predictions against fp32."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import inputs, make_mpnet_encoder, tiny_run, write_data

from data.batching import EvalBatching, encode_task
from data.loaders import COURSE_FILES, TASKS, load_task_file
from heads import MultitaskBert
from minbert import Tokenizer, load_bert
from training.api import load
from training.inference.metrics import metrics_of
from training.inference.outputs import predict_sets, task_outputs
from training.methods.frozen_cache import build_frozen_cache
from training.run.checkpointing import model_from_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def examples_of(data_dir, task):
    return load_task_file(Path(data_dir) / COURSE_FILES[task]["dev"], task, labelled=True).examples


# ------------------------------------------------------------------ (a) frozen-prefix cache at evaluation

@pytest.mark.parametrize("pairs", ["cross", "siamese"])
@pytest.mark.parametrize("multiple", [1, 8])
def test_dev_outputs_through_the_cache_equal_one_example_at_a_time_uncached(tmp_path, pairs, multiple):
    data_dir, enc = inputs(tmp_path)
    tok = Tokenizer.from_checkpoint(enc)
    torch.manual_seed(5)
    model = MultitaskBert(load_bert(enc), pairs, dropout=0.0)
    model.freeze(1)  # 2-layer model: layer 0 frozen, layer 1 runs from the cache
    both = pairs == "cross"
    dev = {t: encode_task(t, examples_of(data_dir, t), tok, pairs, both_orders=both) for t in TASKS}
    cache = build_frozen_cache(model, dev, tok, torch.device("cpu"), "memory", dtype="float32")
    batching = EvalBatching(5, None, multiple, 24)
    model.eval()
    with torch.no_grad():
        for t in TASKS:
            got = task_outputs(model, dev[t], tok, batching, torch.device("cpu"), cache=cache)
            plain = task_outputs(model, dev[t], tok, batching, torch.device("cpu"))
            want = []
            for e in examples_of(data_dir, t):
                if t == "sst":
                    want.append(model(t, [tok([e.text_a])])[0].tolist())
                elif pairs == "siamese":
                    want.append(model(t, [tok([e.text_a]), tok([e.text_b])]).item())
                else:  # both orders averaged
                    want.append((model(t, [tok([e.text_a], [e.text_b])]).item()
                                 + model(t, [tok([e.text_b], [e.text_a])]).item()) / 2)
            np.testing.assert_allclose(got.numpy(), np.array(want, dtype=np.float32), atol=2e-5, rtol=0)
            np.testing.assert_allclose(got.numpy(), plain.numpy(), atol=2e-5, rtol=0)
            assert got.std() > 1e-3  # outputs differ between examples: the comparison can fail
    m_cached = metrics_of(dev, predict_sets(model, dev, tok, batching, torch.device("cpu"), cache=cache))
    m_plain = metrics_of(dev, predict_sets(model, dev, tok, batching, torch.device("cpu")))
    for k in m_plain:
        assert m_cached[k] == pytest.approx(m_plain[k], abs=1e-5), k  # fp32 rounding


def _losses(run_dir: Path) -> list[float]:
    """Every number called loss in the run's jsonl logs, in order."""
    out = []
    for f in sorted(run_dir.rglob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            out += [v for k, v in sorted(rec.items()) if "loss" in k and isinstance(v, (int, float))]
    return out


@pytest.mark.parametrize("pairs", ["cross", "siamese"])
def test_a_run_with_the_cache_in_memory_matches_one_with_it_off(tmp_path, pairs):
    """docs/freezing.md: "the cached trajectory equals the uncached one" (training states stored in fp16, so to
    fp16 rounding, not bit for bit)."""
    _, off = tiny_run(tmp_path, "off", freeze_upto=1, frozen_cache="off", pair_encoding=pairs)
    _, mem = tiny_run(tmp_path, "mem", freeze_upto=1, frozen_cache="memory", pair_encoding=pairs)
    assert set(off) == set(mem)
    for k, v in off.items():
        if isinstance(v, float):
            assert mem[k] == pytest.approx(v, abs=2e-2), k
    lo, lm = _losses(tmp_path / "off"), _losses(tmp_path / "mem")
    assert len(lo) == len(lm) and lo
    np.testing.assert_allclose(lm, lo, rtol=5e-3, atol=5e-3)


# ------------------------------------------------------------------ (b) MPNet heads through the API

@pytest.fixture(scope="module", params=["cross", "siamese"])
def mpnet_run(request, tmp_path_factory):
    """A tiny MPNet run with every encoder layer frozen (pooler and heads train): the encoder's weights are
    still those transformers wrote, so MPNetModel over them is the oracle for the states."""
    root = tmp_path_factory.mktemp(f"mpnet-api-{request.param}")
    enc = make_mpnet_encoder(root / "mpnet")
    write_data(root / "data")
    cfg, _ = tiny_run(root, "run", model=str(enc), data_dir=str(root / "data"), freeze_upto=2, epochs=1,
                      pair_encoding=request.param, predict_both_orders=False)
    return cfg, enc, request.param


def test_mpnet_api_predictions_equal_heads_written_out_over_transformers_states(mpnet_run):
    from transformers import MPNetModel, MPNetTokenizer

    cfg, enc, pairs = mpnet_run
    run_dir = Path(cfg.out_dir)
    net, _, _ = model_from_checkpoint(run_dir / "best.pt")
    sd = {k: v.double() for k, v in net.state_dict().items()}
    ref, rtok = MPNetModel.from_pretrained(str(enc)).eval().double(), MPNetTokenizer.from_pretrained(str(enc))
    api = load(run_dir, device="cpu", precision="fp32", both_orders=False)

    def pooled(*texts):
        ids = rtok(*texts, return_tensors="pt")
        ids.pop("token_type_ids", None)
        if len(texts) == 2:  # <s> A </s></s> B </s>
            toks = rtok.convert_ids_to_tokens(ids["input_ids"][0])
            assert toks[0] == "<s>" and toks[-1] == "</s>" and "</s>,</s>" in ",".join(toks)
        with torch.no_grad():
            h = ref(**ids).last_hidden_state[0, 0]
        return torch.tanh(sd["encoder.pooler.weight"] @ h + sd["encoder.pooler.bias"])

    def lin(name, x):
        return sd[f"{name}.weight"] @ x + sd[f"{name}.bias"]

    with torch.no_grad():
        for task in TASKS:
            ex = examples_of(cfg.data_dir, task)
            if task == "sst":
                logits = torch.stack([lin("heads.sst.mlp.4", torch.nn.functional.gelu(lin("heads.sst.mlp.1",
                                                                                          pooled(e.text_a))))
                                      for e in ex])
                got = api.sentiment([e.text_a for e in ex]).probabilities
                np.testing.assert_allclose(got, logits.softmax(-1).numpy(), atol=2e-5)
                continue
            outs = []
            for e in ex:
                if pairs == "cross":
                    v = lin(f"heads.{task}.out", pooled(e.text_a, e.text_b)).squeeze()
                    outs.append(v if task == "para" else 5 * torch.sigmoid(v))
                else:
                    z1 = lin(f"heads.{task}.w1", pooled(e.text_a))
                    z2 = lin(f"heads.{task}.w2", pooled(e.text_b))
                    outs.append((z1 * z2).sum() if task == "para"
                                else 5 * torch.cosine_similarity(z1, z2, dim=0).clamp(min=0))
            outs = torch.stack(outs)
            pairs_in = [(e.text_a, e.text_b) for e in ex]
            if task == "para":
                got = api.paraphrase(pairs_in)
                np.testing.assert_allclose(got.probabilities, torch.sigmoid(outs).numpy(), atol=2e-5)
                assert got.labels.tolist() == (outs > 0).long().tolist()
            else:
                np.testing.assert_allclose(api.similarity(pairs_in).scores, outs.clamp(0, 5).numpy(), atol=2e-5)


# ------------------------------------------------------------------ (c) bf16 autocast inference on the CPU

def test_bf16_predictions_agree_with_fp32_and_heads_see_fp32(tmp_path, monkeypatch):
    cfg, _ = tiny_run(tmp_path)
    run_dir = Path(cfg.out_dir)
    fp32 = load(run_dir, device="cpu", precision="fp32")
    bf16 = load(run_dir, device="cpu", precision="bf16")
    seen = []
    from heads.tasks import SimilarityHead

    orig = SimilarityHead.forward

    def spy(self, y1, y2=None):
        seen.append((y1.dtype, torch.is_autocast_enabled("cpu") if hasattr(torch, "is_autocast_enabled") else None))
        out = orig(self, y1, y2)
        seen.append((out.dtype, None))
        return out

    monkeypatch.setattr(SimilarityHead, "forward", spy)
    ex = examples_of(cfg.data_dir, "sts")
    pairs_in = [(e.text_a, e.text_b) for e in ex]
    a, b = fp32.similarity(pairs_in).scores, bf16.similarity(pairs_in).scores
    assert seen and all(d == torch.float32 for d, _ in seen)
    assert all(auto is False for _, auto in seen[::2] if auto is not None)
    assert np.abs(a - b).max() < 0.15  # bf16's 8-bit mantissa through 2 layers
    assert len(set(np.round(b, 6))) == len(set(np.round(a, 6)))  # no bf16 ties in the scores
    sa = fp32.sentiment([e.text_a for e in examples_of(cfg.data_dir, "sst")]).probabilities
    sb = bf16.sentiment([e.text_a for e in examples_of(cfg.data_dir, "sst")]).probabilities
    assert np.abs(sa - sb).max() < 0.05
