"""Task heads, losses and predictions against closed forms computed independently in numpy.

Siamese heads are the "Freeze Your Layers" paper's: paraphrase logit (W1 y1 + b1)^T (W2 y2 + b2),
similarity 5 max(0, cos(z1, z2)) with z_i = W_i y_i + b_i. Cross heads: 5 sentiment logits from an
MLP, one paraphrase logit, a similarity 5 sigmoid(w.y + b) in [0, 5].
"""
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from data.loaders import TASKS
from heads import KIND, MultitaskBert, ParaphraseHead, SentimentHead, SimilarityHead, predict, task_loss
from minbert import Bert, BertConfig

H = 8


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def linear(lin: torch.nn.Linear, y: np.ndarray) -> np.ndarray:
    return y @ np_(lin.weight).T + np_(lin.bias)


def gelu(x: np.ndarray) -> np.ndarray:  # exact erf GELU, as nn.GELU()
    return 0.5 * x * (1 + special.erf(x / np.sqrt(2)))


def pooled(seed: int, B: int = 6, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(B, H, generator=torch.Generator().manual_seed(seed)) * scale


# ----------------------------------------------------------------------------- heads in isolation

def test_sentiment_head_is_an_mlp_to_five_logits():
    torch.manual_seed(0)
    head = SentimentHead(H, dropout=0.3).eval()
    y = pooled(1)
    out = head(y)
    assert out.shape == (6, 5)
    first, last = head.mlp[1], head.mlp[4]
    want = linear(last, gelu(linear(first, np_(y))))
    np.testing.assert_allclose(np_(out), want, rtol=1e-5, atol=1e-6)


def test_cross_paraphrase_head_is_one_logit():
    torch.manual_seed(0)
    head = ParaphraseHead(H, dropout=0.3, siamese=False).eval()
    y = pooled(2, scale=3.0)
    out = head(y)
    assert out.shape == (6,)
    np.testing.assert_allclose(np_(out), linear(head.out, np_(y))[:, 0], rtol=1e-5, atol=1e-6)


def test_siamese_paraphrase_head_is_the_bilinear_form():
    torch.manual_seed(0)
    head = ParaphraseHead(H, dropout=0.3, siamese=True).eval()
    y1, y2 = pooled(3), pooled(4)
    out = head(y1, y2)
    assert out.shape == (6,)
    z1, z2 = linear(head.w1, np_(y1)), linear(head.w2, np_(y2))
    want = np.einsum("bh,bh->b", z1, z2)  # (W1 y1 + b1)^T (W2 y2 + b2), row by row
    np.testing.assert_allclose(np_(out), want, rtol=1e-5, atol=1e-6)


def test_cross_similarity_head_is_a_scaled_sigmoid():
    torch.manual_seed(0)
    head = SimilarityHead(H, dropout=0.3, siamese=False).eval()
    y = pooled(5, scale=3.0)
    out = head(y)
    assert out.shape == (6,)
    want = 5.0 * special.expit(linear(head.out, np_(y))[:, 0])
    np.testing.assert_allclose(np_(out), want, rtol=1e-5, atol=1e-6)


def test_siamese_similarity_head_is_five_relu_cosine():
    torch.manual_seed(0)
    head = SimilarityHead(H, dropout=0.3, siamese=True).eval()
    y1, y2 = pooled(6, B=32), pooled(7, B=32)
    out = head(y1, y2)
    assert out.shape == (32,)
    z1, z2 = linear(head.w1, np_(y1)), linear(head.w2, np_(y2))
    cos = np.einsum("bh,bh->b", z1, z2) / (np.linalg.norm(z1, axis=1) * np.linalg.norm(z2, axis=1))
    want = 5.0 * np.maximum(0.0, cos)
    np.testing.assert_allclose(np_(out), want, rtol=1e-5, atol=1e-6)
    # Random pairs: some cosines are negative and give exactly 0, others are strictly inside.
    assert (cos < 0).any() and (out[torch.from_numpy(cos < 0)] == 0).all()
    assert ((out > 0) & (out < 5)).any()


def test_siamese_similarity_extremes_are_0_and_5():
    head = SimilarityHead(H, dropout=0.0, siamese=True).eval()
    with torch.no_grad():
        for lin in (head.w1, head.w2):
            lin.weight.copy_(torch.eye(H))
            lin.bias.zero_()
    y = pooled(8)
    torch.testing.assert_close(head(y, 2.5 * y), torch.full((6,), 5.0))  # cos = 1
    torch.testing.assert_close(head(y, -y), torch.zeros(6))              # cos = -1 -> 0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**16), st.floats(1e-3, 1e4))
def test_similarity_heads_stay_in_0_5(seed, scale):
    torch.manual_seed(seed)
    for siamese in (False, True):
        head = SimilarityHead(H, dropout=0.0, siamese=siamese).eval()
        y1, y2 = pooled(seed, scale=scale), pooled(seed + 1, scale=scale)
        out = head(y1, y2) if siamese else head(y1)
        assert out.shape == (6,)
        assert torch.isfinite(out).all()
        assert ((out >= 0) & (out <= 5)).all()


def test_head_dropout_is_active_in_train_mode_only():
    torch.manual_seed(0)
    head = ParaphraseHead(H, dropout=0.5, siamese=True)
    y1, y2 = pooled(9), pooled(10)
    head.train()
    assert not torch.equal(head(y1, y2), head(y1, y2))
    head.eval()
    assert torch.equal(head(y1, y2), head(y1, y2))


# ----------------------------------------------------------------------------- the multi-task model

def tiny_encoder(seed: int = 0) -> Bert:
    torch.manual_seed(seed)
    return Bert(BertConfig(vocab_size=20, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=16, max_position_embeddings=16))


def seq(seed: int, B: int = 3, T: int = 5, pair: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 20, (B, T), generator=g)
    ids[:, 0] = 2
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, T - 2:] = 0  # one padded row
    ids[0, T - 2:] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    if pair:
        types[:, T // 2:] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


@pytest.mark.parametrize("pair_encoding", ["cross", "siamese"])
def test_multitask_output_shapes(pair_encoding):
    model = MultitaskBert(tiny_encoder(), pair_encoding).eval()
    sst = model("sst", [seq(0)])
    assert sst.shape == (3, 5)
    pair = [seq(1, pair=True)] if pair_encoding == "cross" else [seq(1), seq(2, T=7)]
    para, sts = model("para", pair), model("sts", pair)
    assert para.shape == (3,) and sts.shape == (3,)
    assert ((sts >= 0) & (sts <= 5)).all()


def test_siamese_model_pools_each_sentence_alone_then_applies_the_paper_heads():
    model = MultitaskBert(tiny_encoder(), "siamese").eval()
    a, b = seq(3), seq(4, T=7)
    y1 = model.encoder(a["input_ids"], a["attention_mask"], a["token_type_ids"]).pooler_output
    y2 = model.encoder(b["input_ids"], b["attention_mask"], b["token_type_ids"]).pooler_output
    heads = model.heads
    z1, z2 = linear(heads["para"].w1, np_(y1)), linear(heads["para"].w2, np_(y2))
    np.testing.assert_allclose(np_(model("para", [a, b])), np.einsum("bh,bh->b", z1, z2), rtol=1e-5, atol=1e-6)
    z1, z2 = linear(heads["sts"].w1, np_(y1)), linear(heads["sts"].w2, np_(y2))
    cos = np.einsum("bh,bh->b", z1, z2) / (np.linalg.norm(z1, axis=1) * np.linalg.norm(z2, axis=1))
    np.testing.assert_allclose(np_(model("sts", [a, b])), 5 * np.maximum(cos, 0), rtol=1e-5, atol=1e-6)


def test_cross_model_uses_the_pooled_pair():
    model = MultitaskBert(tiny_encoder(), "cross").eval()
    p = seq(5, pair=True)
    y = np_(model.encoder(p["input_ids"], p["attention_mask"], p["token_type_ids"]).pooler_output)
    np.testing.assert_allclose(np_(model("para", [p])), linear(model.heads["para"].out, y)[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np_(model("sts", [p])), 5 * special.expit(linear(model.heads["sts"].out, y)[:, 0]),
                               rtol=1e-5, atol=1e-6)


def test_bad_pair_encoding():
    with pytest.raises(ValueError, match="cross or siamese"):
        MultitaskBert(tiny_encoder(), "both")


def test_task_tables_agree():
    """The heads' table covers the course's tasks (data.loaders.TASKS, their one definition), in order."""
    assert TASKS == ("sst", "para", "sts")
    assert KIND == {"sst": "categorical", "para": "bernoulli", "sts": "regression"} and tuple(KIND) == TASKS


# ----------------------------------------------------------------------------- losses

def test_sst_loss_is_mean_cross_entropy():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(7, 5)) * 3, rng.integers(0, 5, size=7)
    want = np.mean(special.logsumexp(logits, axis=1) - logits[np.arange(7), labels])
    got = task_loss("sst", torch.tensor(logits, dtype=torch.float32), torch.tensor(labels))
    assert got.item() == pytest.approx(want, rel=1e-5)
    # float labels (as a collate might produce) are taken as class indices
    assert task_loss("sst", torch.tensor(logits, dtype=torch.float32), torch.tensor(labels, dtype=torch.float)).item() \
        == pytest.approx(want, rel=1e-5)


def test_para_loss_is_mean_bce_on_the_logit():
    rng = np.random.default_rng(1)
    logits, labels = rng.normal(size=9) * 4, rng.integers(0, 2, size=9)
    p = special.expit(logits)
    want = -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    got = task_loss("para", torch.tensor(logits, dtype=torch.float32), torch.tensor(labels))  # int labels
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_para_loss_is_stable_for_extreme_logits():
    logits = torch.tensor([200.0, -200.0, 200.0, -200.0])
    labels = torch.tensor([1, 0, 0, 1])
    # softplus form: y * log(1 + e^-x) + (1 - y) * log(1 + e^x)
    want = np.mean([0.0, 0.0, 200.0, 200.0])
    assert task_loss("para", logits, labels).item() == pytest.approx(want, rel=1e-6)


def test_sts_loss_is_mse():
    scores, labels = np.array([0.0, 1.5, 4.9, 2.2]), np.array([0.4, 1.5, 3.0, 5.0])
    want = np.mean((scores - labels) ** 2)
    got = task_loss("sts", torch.tensor(scores, dtype=torch.float32), torch.tensor(labels, dtype=torch.float32))
    assert got.item() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("task", TASKS)
def test_losses_are_fp32_scalars_under_bf16(task):
    out = {"sst": torch.randn(4, 5), "para": torch.randn(4), "sts": torch.rand(4) * 5}[task].bfloat16()
    labels = {"sst": torch.tensor([0, 4, 2, 1]), "para": torch.tensor([0.0, 1.0, 1.0, 0.0]),
              "sts": torch.tensor([0.0, 5.0, 2.5, 1.0])}[task]
    loss = task_loss(task, out, labels)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert loss.item() == pytest.approx(task_loss(task, out.float(), labels).item())


def test_losses_have_gradients():
    x = torch.randn(3, 5, requires_grad=True)
    task_loss("sst", x, torch.tensor([1, 2, 3])).backward()
    # d CE / d logits = (softmax - onehot) / B
    want = (F.softmax(x.detach(), -1) - F.one_hot(torch.tensor([1, 2, 3]), 5)) / 3
    torch.testing.assert_close(x.grad, want)


# ----------------------------------------------------------------------------- predictions

def test_predict_sst_is_argmax():
    out = torch.tensor([[0.1, 2.0, -1.0, 0.0, 1.9], [-3.0, -2.0, -1.0, -0.5, -0.6], [5.0, 0, 0, 0, 0]])
    assert predict("sst", out).tolist() == [1, 3, 0]


def test_predict_para_thresholds_the_probability_at_one_half():
    logits = np.array([-30.0, -2.0, -1e-3, 0.0, 1e-3, 0.7, 30.0])
    want = (special.expit(logits) > 0.5).astype(int)   # p = 0.5 exactly is not a paraphrase
    got = predict("para", torch.tensor(logits, dtype=torch.float32))
    assert got.tolist() == want.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert got.dtype == torch.long


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6).filter(lambda v: abs(v) > 1e-6), min_size=1, max_size=8))
def test_predict_para_matches_probability_threshold(logits):
    x = np.array(logits, dtype=np.float32)
    want = (special.expit(x.astype(np.float64)) > 0.5).astype(int)
    assert predict("para", torch.from_numpy(x)).tolist() == want.tolist()


def test_predict_sts_is_the_clamped_score():
    out = torch.tensor([-0.5, 0.0, 2.5, 5.0, 7.25]).bfloat16()
    got = predict("sts", out)
    assert got.dtype == torch.float32
    assert got.tolist() == [0.0, 0.0, 2.5, 5.0, 5.0]


def test_siamese_identity_init_starts_similarity_from_the_encoders_cosine():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=20, hidden_size=H, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    eye = MultitaskBert(Bert(cfg), "siamese", dropout=0.0, siamese_init="identity").eval()
    rnd = MultitaskBert(Bert(cfg), "siamese", dropout=0.0).eval()
    y1, y2 = pooled(8, B=16), pooled(9, B=16)
    a, b = np_(y1), np_(y2)
    cos = np.einsum("bh,bh->b", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    with torch.no_grad():
        np.testing.assert_allclose(np_(eye.heads["sts"](y1, y2)), 5.0 * np.maximum(0.0, cos), rtol=1e-5, atol=1e-6)
        para = eye.heads["para"]  # stays random: its logit would be the raw dot product
        assert not torch.allclose(para.w1.weight, torch.eye(H)) and not torch.allclose(para(y1, y2), (y1 * y2).sum(-1))
        assert not torch.allclose(rnd.heads["sts"](y1, y2), eye.heads["sts"](y1, y2))  # the default stays random
    with pytest.raises(ValueError, match="siamese_init"):
        MultitaskBert(Bert(cfg), "siamese", siamese_init="eye")


# ----------------------------------------------------------------------------- heads in fp32 under autocast


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("encoding", ["cross", "siamese"])
def test_heads_run_in_fp32_under_autocast(tmp_path, pooling, encoding, dtype):
    """Under bf16 (or fp16) autocast the encoder runs in bf16 (fp16), but the heads' outputs equal an fp32
    computation of the heads on the same (autocast) pooled vectors: no half-precision rounding of logits
    or scores."""
    import tiny_runs

    from data.batching import encode_task, make_batch
    from data.loaders import load_task_file
    from minbert import Tokenizer, load_bert

    data, enc = tiny_runs.inputs(tmp_path)
    tok = Tokenizer.from_checkpoint(enc)
    torch.manual_seed(0)
    model = MultitaskBert(load_bert(enc), encoding, dropout=0.0, pooling=pooling).eval()
    for task, file in (("sst", "ids-sst-dev.csv"), ("para", "quora-dev.csv"), ("sts", "sts-dev.csv")):
        d = encode_task(task, load_task_file(data / file, task, labelled=True).examples, tok, encoding)
        inputs = make_batch(d, list(range(len(d))), tok).inputs
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            out = model(task, inputs)
            ys = [model.pool(model.hidden_at([seq], 0)[0], seq["attention_mask"], 0) for seq in inputs]
        with torch.no_grad():
            ref = model.heads[task](*[y.float() for y in ys])  # outside autocast: fp32 throughout
        assert out.dtype == torch.float32
        assert torch.equal(out, ref)
        if pooling == "mean":  # the mean itself is taken in fp32 over the half-precision states
            assert ys[0].dtype == torch.float32


def test_bf16_similarity_predictions_are_not_rounded_to_bf16_steps(tmp_path):
    """A tiny run under bf16 autocast writes as many distinct STS predictions as an fp32 run does (a bf16
    score in [4, 5] has 32 possible values)."""
    import tiny_runs

    from training.inference.formats import read_predictions

    counts = {}
    for precision in ("fp32", "bf16"):
        cfg, _ = tiny_runs.tiny_run(tmp_path, precision, precision=precision, epochs=2)
        scores = [v for _, v in read_predictions(Path(cfg.predictions_folder()) / "sts-dev-output.csv")[1]]
        counts[precision] = (len(set(scores)), len(scores))
    assert counts["fp32"][0] == counts["fp32"][1] == tiny_runs.N
    assert counts["bf16"] == counts["fp32"]
