"""Our encoder against the reference `transformers.BertModel` (test-only oracle), same weights."""
import pytest
import torch
from transformers import BertConfig as HFConfig
from transformers import BertModel

from minbert import Bert, BertConfig, load_bert, load_tokenizer, resolve_checkpoint, save_hf

SENTS = ["It 's a lovely film with lovely performances by Buy and Accorsi .",
         "No one goes unindicted here .", "ok", "What are some tips for staying calm during or before an exam ?",
         "Two black dogs are playing on the grass ."]
PAIRS = ["How do I stay calm before a competitive exam ?", "a", "Two dogs play in a grassy plain .",
         "UN chief welcomes peaceful presidential elections in Guinea", "yes"]
# our attention path -> the reference's attention implementation that computes the same sums
IMPLS = [("matmul", "eager"), ("sdpa", "sdpa")]


def _compare(ours: Bert, ref: BertModel, batch, atol=1e-5):
    ours.eval(), ref.eval()
    with torch.no_grad():
        o = ours(**batch, output_hidden_states=True)
        r = ref(**batch, output_hidden_states=True)
    torch.testing.assert_close(o.last_hidden_state, r.last_hidden_state, atol=atol, rtol=0)
    torch.testing.assert_close(o.pooler_output, r.pooler_output, atol=atol, rtol=0)
    assert len(o.hidden_states) == len(r.hidden_states)
    for a, b in zip(o.hidden_states, r.hidden_states):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def minilm_dir():
    return resolve_checkpoint("minilm-l6")


@pytest.mark.parametrize("ours_impl,ref_impl", IMPLS)
def test_minilm_matches_transformers(minilm_dir, ours_impl, ref_impl):
    ours = load_bert(minilm_dir, attn_impl=ours_impl)
    ref = BertModel.from_pretrained(str(minilm_dir), attn_implementation=ref_impl)
    tok = load_tokenizer(minilm_dir)
    _compare(ours, ref, tok(SENTS))           # single sentences, padded to the longest
    _compare(ours, ref, tok(SENTS, PAIRS))    # pairs with token type ids


@pytest.mark.parametrize("ours_impl,ref_impl", IMPLS)
def test_bert_base_shaped_random_model_round_trips_through_hf_layout(tmp_path, ours_impl, ref_impl):
    torch.manual_seed(0)
    hf_cfg = HFConfig(vocab_size=1000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, attn_implementation=ref_impl)
    ref = BertModel(hf_cfg)
    assert ref.config._attn_implementation == ref_impl
    ref.save_pretrained(tmp_path)             # config.json + model.safetensors, HF's own writer
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                                                  [f"w{i}" for i in range(995)]) + "\n")
    ours = load_bert(tmp_path, attn_impl=ours_impl)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 1000, (4, 37), generator=g)
    mask = torch.ones_like(ids)
    for i, n in enumerate([37, 20, 5, 11]):
        mask[i, n:] = 0
    types = (torch.arange(37) > 8).long().expand(4, -1).clone() * mask
    _compare(ours, ref, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})


def test_our_export_loads_in_transformers(tmp_path, minilm_dir):
    ours = load_bert(minilm_dir)
    save_hf(ours, tmp_path / "export", vocab_src=minilm_dir)
    ref = BertModel.from_pretrained(str(tmp_path / "export"), attn_implementation="eager")
    for layer in ours.layers:
        layer.attn_impl = "matmul"
    _compare(ours, ref, load_tokenizer(tmp_path / "export")(SENTS, PAIRS))


def _dropout_free_pair(minilm_dir, ours_impl="matmul", ref_impl="eager"):
    """Ours and the reference from the same MiniLM weights, dropout off, in training mode."""
    ours = load_bert(minilm_dir, attn_impl=ours_impl)
    ref = BertModel.from_pretrained(str(minilm_dir), attn_implementation=ref_impl,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    for m in ours.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    ours.train(), ref.train()
    return ours, ref


def test_training_mode_gradients_match_reference(minilm_dir):
    """Same weights, dropout off (p=0): loss on the pooled output and its gradients agree."""
    ours, ref = _dropout_free_pair(minilm_dir)
    batch = load_tokenizer(minilm_dir)(SENTS, PAIRS)
    ours(**batch).pooler_output.pow(2).sum().backward()
    ref(**batch).pooler_output.pow(2).sum().backward()
    torch.testing.assert_close(ours.embeddings.word.weight.grad, ref.embeddings.word_embeddings.weight.grad,
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours.layers[5].ffn_out.weight.grad, ref.encoder.layer[5].output.dense.weight.grad,
                               atol=1e-5, rtol=1e-4)
    q_grad = ours.layers[2].qkv.weight.grad[:384]
    torch.testing.assert_close(q_grad, ref.encoder.layer[2].attention.self.query.weight.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("ours_impl,ref_impl", IMPLS)
def test_first_only_matches_reference_values_and_gradients(minilm_dir, ours_impl, ref_impl):
    """The task heads' path: encode(first_only=True) computes the last layer for [CLS] alone.
    Its pooled output and every gradient equal the reference's full forward (dropout off)."""
    ours, ref = _dropout_free_pair(minilm_dir, ours_impl, ref_impl)
    batch = load_tokenizer(minilm_dir)(SENTS, PAIRS)
    cls = ours.encode(ours.embed(batch["input_ids"], batch["token_type_ids"]), batch["attention_mask"],
                      first_only=True)
    assert cls.shape == (len(SENTS), 1, 384)
    pooled, r = ours.pool(cls), ref(**batch).pooler_output
    torch.testing.assert_close(pooled, r, atol=1e-5, rtol=0)
    pooled.pow(2).sum().backward()
    r.pow(2).sum().backward()
    last, ref_last = ours.layers[5], ref.encoder.layer[5]
    for ours_grad, ref_grad in [
        (last.qkv.weight.grad[:384], ref_last.attention.self.query.weight.grad),
        (last.qkv.weight.grad[384:768], ref_last.attention.self.key.weight.grad),
        (last.qkv.bias.grad[768:], ref_last.attention.self.value.bias.grad),
        (last.ffn_in.weight.grad, ref_last.intermediate.dense.weight.grad),
        (ours.layers[0].qkv.weight.grad[:384], ref.encoder.layer[0].attention.self.query.weight.grad),
        (ours.embeddings.word.weight.grad, ref.embeddings.word_embeddings.weight.grad),
    ]:
        torch.testing.assert_close(ours_grad, ref_grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layer", [0, 4])
def test_mean_pooling_matches_sentence_transformers_pooling_of_the_reference(minilm_dir, layer):
    """--pooling mean: y is the reference's last hidden state averaged over the unpadded tokens
    (sentence-transformers' mean pooling, written out here), whatever layer the encoding starts at."""
    from heads import MultitaskBert
    ours, ref = _dropout_free_pair(minilm_dir)
    model = MultitaskBert(ours, "siamese", dropout=0.0, pooling="mean").eval()
    batch = load_tokenizer(minilm_dir)(SENTS)
    mask = batch["attention_mask"]
    assert (mask == 0).any()  # padding present: a plain mean would differ
    hs = model.hidden_at([batch], layer)
    y = model.pool(hs[0], mask, layer)
    with torch.no_grad():
        last = ref.eval()(**batch).last_hidden_state
    expected = torch.stack([last[i, mask[i].bool()].mean(0) for i in range(len(SENTS))])
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=0)
    assert not any(p.requires_grad for p in model.encoder.pooler.parameters())
    model.freeze(2)  # freezing again leaves the unused pooler out of training
    assert not any(p.requires_grad for p in model.encoder.pooler.parameters())
    assert model.encoder.layers[2].qkv.weight.requires_grad


def test_first_only_with_no_layer_to_run_and_with_hidden_states(minilm_dir):
    ours = load_bert(minilm_dir).eval()
    h = torch.randn(2, 5, 384)
    torch.testing.assert_close(ours.encode(h, start=6, first_only=True), h[:, :1])
    with pytest.raises(ValueError, match="exclude"):
        ours.encode(h, first_only=True, output_hidden_states=True)


def test_encode_from_layer_n_equals_full_forward(minilm_dir):
    """The frozen-prefix cache relies on this: layers N.. applied to hidden state N."""
    ours = load_bert(minilm_dir).eval()
    batch = load_tokenizer(minilm_dir)(SENTS)
    with torch.no_grad():
        full = ours(**batch, output_hidden_states=True)
        for n in range(ours.num_layers + 1):
            h = ours.encode(full.hidden_states[n], batch["attention_mask"], start=n)
            torch.testing.assert_close(h, full.last_hidden_state, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="6 layers"):
        ours.encode(full.hidden_states[0], batch["attention_mask"], start=7)


def test_config_rejects_what_we_do_not_implement(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 10, "num_attention_heads": 3}')
    with pytest.raises(ValueError, match="divisible"):
        BertConfig.from_json(tmp_path / "config.json")
    (tmp_path / "config.json").write_text('{"position_embedding_type": "relative_key"}')
    with pytest.raises(ValueError, match="relative_key"):
        BertConfig.from_json(tmp_path / "config.json")


def test_padding_bias_is_zero_for_tokens_most_negative_for_padding_and_absent_without_padding():
    from minbert.model import padding_bias
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    for dtype in (torch.float32, torch.bfloat16):
        bias = padding_bias(mask, dtype)
        assert bias.shape == (2, 1, 1, 3) and bias.dtype == dtype
        expected = torch.tensor([[0.0, 0.0, torch.finfo(dtype).min], [0.0, 0.0, 0.0]], dtype=dtype)
        assert torch.equal(bias[:, 0, 0], expected)
    assert padding_bias(torch.ones(2, 3, dtype=torch.long), torch.float32) is None
    assert padding_bias(None, torch.float32) is None


def test_auto_attention_picks_sdpa_on_cpu_only_for_large_scores_without_dropout():
    from minbert.model import SDPA_MIN_SCORES_CPU, _use_sdpa
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not _use_sdpa("auto", cpu, 0.0, SDPA_MIN_SCORES_CPU - 1)
    assert _use_sdpa("auto", cpu, 0.0, SDPA_MIN_SCORES_CPU)
    assert not _use_sdpa("auto", cpu, 0.1, 10 * SDPA_MIN_SCORES_CPU)  # dropout: sdpa has no faster kernel
    assert _use_sdpa("auto", cuda, 0.1, 1)
    assert _use_sdpa("sdpa", cpu, 0.1, 1) and not _use_sdpa("matmul", cuda, 0.0, 10 * SDPA_MIN_SCORES_CPU)


@pytest.mark.parametrize("padded", [False, True])
def test_auto_attention_matches_reference_above_the_sdpa_threshold(minilm_dir, padded):
    """Eval-mode batches large enough for auto to take sdpa on CPU (2 x 12 heads x 128 x 128 scores),
    padded and not (no bias at all): the same outputs as the reference's eager attention."""
    ours = load_bert(minilm_dir, attn_impl="auto")
    ref = BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 30000, (2, 128), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 40:] = 0
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention",
                   lambda *a, **k: calls.append(k) or real(*a, **k))
        _compare(ours, ref, {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)})
    assert len(calls) == ours.num_layers
    assert all((k["attn_mask"] is None) != padded for k in calls)  # no mask work without padding


def test_padded_batch_under_bf16_autocast_matches_reference_to_bf16_precision(minilm_dir):
    """The bias is built in autocast's dtype: float32's most negative value would round to -inf in
    bf16, and a row with no token at all (here the last) would turn to NaN instead of the
    reference's uniform attention."""
    ours = load_bert(minilm_dir, attn_impl="sdpa").eval()
    ref = BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    batch = load_tokenizer(minilm_dir)(SENTS, PAIRS)
    batch["attention_mask"][-1] = 0
    for impl in ("sdpa", "matmul"):
        for layer in ours.layers:
            layer.attn_impl = impl
        with torch.no_grad():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = ours(**batch).pooler_output.float()
            want = ref(**batch).pooler_output
        torch.testing.assert_close(got, want, atol=0.05, rtol=0)
        assert (got - want).abs().max() > 0  # really computed in bf16


def test_cpu_dropout_keeps_1_minus_p_scales_like_nn_dropout_and_passes_gradients_through_the_mask():
    from minbert.model import Dropout
    torch.manual_seed(0)
    drop = Dropout(0.1).train()
    assert isinstance(drop, torch.nn.Dropout)  # SMART's dropout_disabled finds it
    x = torch.randn(2_000_000).abs().add_(0.1).requires_grad_()  # no zeros: kept <=> nonzero output
    y = drop(x)
    kept = y != 0
    n = x.numel()
    assert abs(kept.float().mean().item() - 0.9) < 5 * (0.9 * 0.1 / n) ** 0.5  # Bernoulli(0.9), 5 sigma
    scale = torch.tensor(1 / 0.9, dtype=torch.float32)
    assert torch.equal(y[kept], x.detach()[kept] * scale)  # nn.Dropout's 1 / (1 - p), exactly
    g = torch.randn(n)
    y.backward(g)
    assert torch.equal(x.grad, torch.where(kept, g * scale, torch.zeros(())))
    assert torch.equal(drop.eval()(x), x)
    torch.manual_seed(1)
    a = drop.train()(x)
    torch.manual_seed(1)
    assert torch.equal(drop(x), a)  # seeded by torch's generator, like nn.Dropout
    # bf16 (autocast's activations): the same draw, so the same seed keeps the same units as in float32;
    # the scale rounded to bf16, as nn.Dropout rounds it there; the gradient through the same mask
    xb = x.detach().bfloat16().requires_grad_()
    torch.manual_seed(1)
    half = drop(xb)
    assert half.dtype == torch.bfloat16 and torch.equal(half != 0, a != 0)
    bscale = torch.tensor(1 / 0.9).bfloat16()
    assert torch.equal(half[a != 0], xb.detach()[a != 0] * bscale)
    half.backward(g.bfloat16())
    assert torch.equal(xb.grad, torch.where(a != 0, g.bfloat16() * bscale, torch.zeros((), dtype=torch.bfloat16)))
    reference = torch.nn.functional.dropout(torch.ones(10, dtype=torch.bfloat16), 0.1, training=True)
    assert set(reference.unique().tolist()) <= {0.0, bscale.item()}  # nn.Dropout's own bf16 scale
