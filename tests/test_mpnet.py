"""MPNet (minbert/model.py's second architecture) against `transformers.MPNetModel` and `MPNetTokenizer`, the
test-only oracle, on a tiny random MPNet built and saved by transformers itself: the relative position
buckets, every layer's hidden states and the pooler (both attention paths, padded), the three-step API
from any layer, gradients, bf16 autocast, loading (also a masked-LM file), the export that transformers
reads back (LoRA merged), LoRA against the `peft` library, freezing, and the tokenizer's pair template.
No test needs the real all-mpnet-base-v2 weights (bench/mpnet_parity.py compares those)."""
import json
import re

import pytest
import torch
from transformers import AutoModel, MPNetConfig, MPNetForMaskedLM, MPNetModel, MPNetTokenizer
from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

from minbert import BertConfig, Tokenizer, load_bert, save_hf
from minbert.checkpoint import copy_tokenizer_files
from minbert.lora import TARGETS, add_lora, lora_modules
from minbert.model import relative_buckets

pytestmark = pytest.mark.usefixtures("one_thread")

# MPNet's real vocabulary holds BERT's [CLS] and [SEP] too (ids 101 + 4, ...): a tokenizer that used BERT's
# template would not fail, it would give other ids
WORDS = ["the", "cat", "dog", "sat", "on", "a", "mat", "##s", "is", "happy", "how", "do", "i", "stay", "calm",
         "?", ".", "before", "exam", "an"]
VOCAB = ["<s>", "<pad>", "</s>", "<unk>", "[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, "<mask>"]
V = 1000  # the tiny model's vocabulary: VOCAB, then filler tokens
SENTS = ["the cat sat on the mat", "how do i stay calm before an exam ?", "dogs", "a happy dog is a happy dog ."]
PAIRS = ["a dog sat on a cat", "the exam", "the mats on the mats on the mats", "is it ?"]
IMPLS = ["matmul", "sdpa"]  # transformers' MPNet has eager attention alone: both of ours against it


def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Weights far from transformers' init (std 0.02, attention near uniform, a bias table near 0) so that a
    wrong bucket, position or mask moves the outputs by far more than the tolerance."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape, generator=g))  # about one unit of score per bucket
            elif "LayerNorm.weight" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def mpnet_dir(tmp_path_factory):
    """A random 4-layer, hidden-64 MPNet saved by transformers (config.json, model.safetensors) with its
    tokenizer's files (tokenizer.json, tokenizer_config.json) and vocab.txt."""
    d = tmp_path_factory.mktemp("mpnet")
    torch.manual_seed(0)
    cfg = MPNetConfig(vocab_size=V, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
                      max_position_embeddings=514, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
    ref = MPNetModel(cfg)
    randomise(ref)
    ref.save_pretrained(d)
    (d / "vocab.txt").write_text("\n".join(VOCAB + [f"x{i}" for i in range(V - len(VOCAB))]) + "\n")
    MPNetTokenizer.from_pretrained(str(d)).save_pretrained(d)
    return d


def reference(mpnet_dir) -> MPNetModel:
    return MPNetModel.from_pretrained(str(mpnet_dir)).eval()


def long_padded_batch(T=150):
    """Four sequences of T, 7T/8, 5 and T/4 tokens (<s> ... </s>, then <pad>); at T = 150, distances past
    128 (the last bucket's), and rows of mostly padding."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(len(VOCAB), V, (4, T), generator=g)
    ids[:, 0] = 0
    mask = torch.ones_like(ids)
    for i, n in enumerate([T, 7 * T // 8, 5, T // 4]):
        ids[i, n - 1], ids[i, n:], mask[i, n:] = 2, 1, 0
    return {"input_ids": ids, "attention_mask": mask}


def compare(ours, ref, batch, atol=1e-5):
    ours.eval()
    with torch.no_grad():
        o = ours(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"), output_hidden_states=True)
        r = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    assert len(o.hidden_states) == len(r.hidden_states) == 5
    for layer, (a, b) in enumerate(zip(o.hidden_states, r.hidden_states)):
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=lambda m, i=layer: f"hidden state {i}: {m}")
    torch.testing.assert_close(o.pooler_output, r.pooler_output, atol=atol, rtol=0)
    return o


def test_relative_buckets_are_transformers_buckets():
    rel = torch.arange(-700, 701)
    assert torch.equal(relative_buckets(rel), MPNetEncoder.relative_position_bucket(rel))
    assert set(relative_buckets(rel).tolist()) == set(range(32)) - {16}  # 16 would be distance 0 after the query


def test_the_bucket_ids_are_kept_and_give_the_bias_and_its_gradient_bit_for_bit(mpnet_dir):
    """Embeddings.buckets keeps the longest length's ids and slices shorter ones from them: the bias and the
    table's gradient are those of ids computed afresh, at lengths met in any order, the first of them under
    inference mode (the kept table must still serve training); a torch.compile trace computes them itself."""
    emb = load_bert(mpnet_dir).embeddings

    def fresh(T):
        pos = torch.arange(T)
        return emb.relative(relative_buckets(pos[None, :] - pos[:, None])).permute(2, 0, 1).unsqueeze(0)

    with torch.inference_mode():
        emb.relative_bias(150, "cpu")
    for T in (150, 5, 149, 200, 1, 64):
        got, want = emb.relative_bias(T, "cpu"), fresh(T)
        assert got.shape == (1, 4, T, T) and torch.equal(got, want), T
        w = torch.randn(got.shape)
        assert torch.equal(*(torch.autograd.grad((b * w).sum(), emb.relative.weight)[0] for b in (got, want))), T
    assert list(emb._buckets) == [torch.device("cpu")] and emb._buckets[torch.device("cpu")].shape == (200, 200)
    traced = torch.compile(emb.relative_bias, backend="eager", fullgraph=True)(70, "cpu")
    assert torch.equal(traced, fresh(70)) and emb._buckets[torch.device("cpu")].shape == (200, 200)


def test_the_config_reads_mpnet_and_counts_its_parameters(mpnet_dir):
    cfg = BertConfig.from_json(mpnet_dir / "config.json")
    assert (cfg.model_type, cfg.relative_attention_num_buckets, cfg.type_vocab_size) == ("mpnet", 32, 0)
    assert (cfg.pad_token_id, cfg.layer_norm_eps, cfg.max_sequence_length) == (1, 1e-5, 512)
    assert cfg.num_parameters() == sum(p.numel() for p in reference(mpnet_dir).parameters())
    assert cfg.num_parameters() == sum(p.numel() for p in load_bert(mpnet_dir).parameters())


@pytest.mark.parametrize("impl", IMPLS)
def test_every_layer_and_the_pooler_match_transformers_with_padding(mpnet_dir, impl):
    ours, ref = load_bert(mpnet_dir, attn_impl=impl), reference(mpnet_dir)
    batch = long_padded_batch()
    out = compare(ours, ref, batch)
    # the comparison can fail: without the relative bias, or with BERT's positions, the outputs move by far more
    with torch.no_grad():
        ours.embeddings.relative.weight.zero_()
        assert (ours(**batch).last_hidden_state - out.last_hidden_state).abs().max() > 0.1
    ours = load_bert(mpnet_dir, attn_impl=impl).eval()
    ours.embeddings.positions = lambda ids: torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        assert (ours(**batch).last_hidden_state - out.last_hidden_state).abs().max() > 0.1


@pytest.mark.parametrize("impl", IMPLS)
def test_tokenized_pairs_and_singles_match_transformers(mpnet_dir, impl):
    ours, ref = load_bert(mpnet_dir, attn_impl=impl), reference(mpnet_dir)
    tok = Tokenizer.from_checkpoint(mpnet_dir)
    for batch in (tok(SENTS), tok(SENTS, PAIRS)):
        assert (batch["attention_mask"] == 0).any() and (batch["token_type_ids"] == 0).all()
        compare(ours, ref, batch)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_three_steps_from_any_layer_equal_the_full_forward(mpnet_dir, impl):
    """The frozen-prefix cache and SMART start encode() from a stored or perturbed h: the relative bias is
    computed there from h's length alone. first_only (the cls path) gives transformers' pooler output."""
    ours, ref = load_bert(mpnet_dir, attn_impl=impl).eval(), reference(mpnet_dir)
    batch = long_padded_batch(T=70)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        full = ours(ids, mask, output_hidden_states=True)
        assert torch.equal(ours.embed(ids, torch.ones_like(ids)), full.hidden_states[0])  # token types unused
        for n in range(ours.num_layers + 1):
            h = ours.encode(full.hidden_states[n], mask, start=n)
            torch.testing.assert_close(h, full.last_hidden_state, atol=1e-6, rtol=0)
        pooled = ours.pool(ours.encode(ours.embed(ids), mask, first_only=True))
        torch.testing.assert_close(pooled, ref(input_ids=ids, attention_mask=mask).pooler_output, atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_training_gradients_match_transformers(mpnet_dir, impl):
    """Dropout off, train mode: the gradients of the bias table (through sdpa's float mask too), of the
    positions, of Q/K/V/O and of the feed-forward maps are transformers'."""
    ours, ref = load_bert(mpnet_dir, attn_impl=impl).train(), reference(mpnet_dir).train()
    batch = long_padded_batch(T=40)
    for model, out in ((ours, ours(batch["input_ids"], batch["attention_mask"])),
                       (ref, ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]))):
        (out.pooler_output.pow(2).sum() + out.last_hidden_state[:, 1:].pow(2).mean()).backward()
    H = 64
    lay, ref_lay = ours.layers[1], ref.encoder.layer[1]
    for got, want in [
        (ours.embeddings.relative.weight.grad, ref.encoder.relative_attention_bias.weight.grad),
        (ours.embeddings.position.weight.grad, ref.embeddings.position_embeddings.weight.grad),
        (ours.embeddings.word.weight.grad, ref.embeddings.word_embeddings.weight.grad),
        (lay.qkv.weight.grad[:H], ref_lay.attention.attn.q.weight.grad),
        (lay.qkv.weight.grad[H:2 * H], ref_lay.attention.attn.k.weight.grad),
        (lay.qkv.bias.grad[2 * H:], ref_lay.attention.attn.v.bias.grad),
        (lay.attn_out.weight.grad, ref_lay.attention.attn.o.weight.grad),
        (lay.ffn_in.weight.grad, ref_lay.intermediate.dense.weight.grad),
        (lay.ffn_norm.weight.grad, ref_lay.output.LayerNorm.weight.grad),
    ]:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert ours.embeddings.relative.weight.grad.abs().max() > 1e-3
    assert ours.embeddings.position.weight.grad[1].abs().max() == 0  # padding's position: no gradient


def test_bf16_autocast_runs_both_paths_to_bf16_precision(mpnet_dir):
    """Under bf16 autocast both attention paths run with the relative bias, to bf16's precision."""
    ours, ref = load_bert(mpnet_dir).eval(), reference(mpnet_dir)
    batch = long_padded_batch(T=40)
    with torch.no_grad():
        want = ref(**batch).pooler_output
        for impl in IMPLS:
            for layer in ours.layers:
                layer.attn_impl = impl
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = ours(**batch).pooler_output.float()
            torch.testing.assert_close(got, want, atol=0.1, rtol=0)
            assert (got - want).abs().max() > 0  # really computed in bf16


def test_a_sequence_past_the_positions_is_refused(mpnet_dir):
    ours = load_bert(mpnet_dir).eval()
    ids = torch.full((1, 513), 9)
    with pytest.raises(ValueError, match="513 exceeds the 512 positions of max_position_embeddings 514"):
        ours.embed(ids)
    assert ours.embed(ids[:, :512]).shape == (1, 512, 64)


def test_a_masked_lm_file_loads_its_encoder(tmp_path, mpnet_dir):
    """MPNetForMaskedLM's names (mpnet.*, lm_head.*), as microsoft/mpnet-base ships them; no pooler."""
    torch.manual_seed(0)
    mlm = MPNetForMaskedLM(MPNetConfig.from_pretrained(str(mpnet_dir)))
    randomise(mlm, seed=3)
    mlm.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_bytes((mpnet_dir / "vocab.txt").read_bytes())
    ours, ref = load_bert(tmp_path, attn_impl="matmul").eval(), mlm.mpnet.eval()
    batch = long_padded_batch(T=30)
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).last_hidden_state, ref(**batch).last_hidden_state, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lora", [False, True])
def test_the_export_loads_in_transformers_to_the_same_outputs(tmp_path, mpnet_dir, lora):
    ours = load_bert(mpnet_dir, attn_impl="matmul").eval()
    if lora:  # folded into the weights: a plain MPNetModel computes the adapted function
        add_lora(ours, TARGETS, r=2, alpha=4.0)
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for m in lora_modules(ours):
                for b in m.lora_B:
                    b.copy_(0.3 * torch.randn(b.shape, generator=g))
    out = save_hf(ours, tmp_path / "export", vocab_src=mpnet_dir)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mpnet" and "type_vocab_size" not in config
    assert Tokenizer.from_checkpoint(out).model_type == "mpnet"
    batch = Tokenizer.from_checkpoint(out)(SENTS, PAIRS)
    with torch.no_grad():
        want = ours(batch["input_ids"], batch["attention_mask"])
    for reader in (MPNetModel, AutoModel):
        hf = reader.from_pretrained(str(out)).eval()
        assert type(hf) is MPNetModel
        with torch.no_grad():
            got = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-5, rtol=0)
    if not lora:  # and ours reads its own export back to the same tensors
        again = load_bert(out).state_dict()
        assert all(torch.equal(again[k], v) for k, v in ours.state_dict().items())


@pytest.mark.parametrize("targets", [TARGETS, ("q", "v"), ("attn_out", "ffn_out")])
def test_lora_targets_resolve_on_mpnet_as_the_peft_library_adapts_transformers(mpnet_dir, targets):
    peft = pytest.importorskip("peft")
    ours, ref = load_bert(mpnet_dir, attn_impl="matmul").eval(), reference(mpnet_dir)
    batch = long_padded_batch(T=30)
    with torch.no_grad():
        plain = ref(**batch).last_hidden_state
    add_lora(ours, targets, r=2, alpha=4.0)
    assert len(lora_modules(ours)) == 4 * (any(t in targets for t in "qkv") + sum(t in targets for t in TARGETS[3:]))
    hf_names = {"q": "attention.attn.q", "k": "attention.attn.k", "v": "attention.attn.v",
                "attn_out": "attention.attn.o", "ffn_in": "intermediate.dense", "ffn_out": "output.dense"}
    paths = [f"encoder.layer.{i}.{hf_names[t]}" for i in range(4) for t in targets]
    wrapped = peft.get_peft_model(ref, peft.LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=paths))
    g = torch.Generator().manual_seed(5)
    for i, layer in enumerate(ours.layers):  # random B (it starts at zero), copied into theirs block by block
        pairs = [(layer.qkv, j, t) for j, t in enumerate(t for t in "qkv" if t in targets)]
        pairs += [(getattr(layer, t), 0, t) for t in TARGETS[3:] if t in targets]
        for m, j, t in pairs:
            theirs = wrapped.get_submodule(f"base_model.model.encoder.layer.{i}.{hf_names[t]}")
            with torch.no_grad():
                m.lora_B[j].copy_(0.3 * torch.randn(m.lora_B[j].shape, generator=g))
                theirs.lora_A["default"].weight.copy_(m.lora_A[j])
                theirs.lora_B["default"].weight.copy_(m.lora_B[j])
    with torch.no_grad():
        got, want = ours(**batch), wrapped(**batch)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-5, rtol=0)
    assert (got.last_hidden_state - plain).abs().max() > 1e-2  # the updates show


def test_freezing_freezes_the_bias_table_and_bitfit_leaves_it(mpnet_dir):
    """Every layer reads the table: it freezes with the embeddings, so that frozen layers keep their function
    (the frozen-prefix cache); BitFit trains the maps' biases (q/k/v/o's among them), never the table."""
    from heads import MultitaskBert
    from training.methods.peft import apply_peft

    model = MultitaskBert(load_bert(mpnet_dir), "cross")
    assert model.encoder.embeddings.relative.weight.requires_grad
    model.freeze(2)
    assert not model.encoder.embeddings.relative.weight.requires_grad
    assert model.encoder.layers[2].qkv.weight.requires_grad and not model.encoder.layers[1].qkv.weight.requires_grad
    model.freeze(None)
    apply_peft(model, "bitfit", 0, seed=0)
    trained = {n for n, p in model.encoder.named_parameters() if p.requires_grad}
    assert "embeddings.relative.weight" not in trained
    for name in ("qkv.bias", "attn_out.bias", "ffn_in.bias", "ffn_out.bias", "attn_norm.bias", "ffn_norm.bias"):
        assert f"layers.3.{name}" in trained
    assert all(n.endswith(".bias") or n.startswith("pooler.") for n in trained)


# ----------------------------------------------------------------------------- the tokenizer

def converter_style(src, dst):
    """src's tokenizer with the template transformers' slow-to-fast converter once wrote for MPNet: the same
    ids, but B's token types 1. Ours gives all 0, as MPNetTokenizer does."""
    from tokenizers import Tokenizer as Backend
    from tokenizers.processors import TemplateProcessing

    dst.mkdir()
    backend = Backend.from_file(str(src / "tokenizer.json"))
    backend.post_processor = TemplateProcessing(single="<s>:0 $A:0 </s>:0", pair="<s>:0 $A:0 </s>:0 </s>:0 $B:1 </s>:1",
                                                special_tokens=[("<s>", 0), ("</s>", 2)])
    backend.save(str(dst / "tokenizer.json"))
    (dst / "config.json").write_bytes((src / "config.json").read_bytes())
    return dst


@pytest.mark.parametrize("source", ["checkpoint", "vocab.txt", "converter template", "run's tokenizer folder"])
@pytest.mark.parametrize("max_length", [128, 9])
def test_pairs_are_s_a_ss_b_s_as_mpnet_tokenizer_gives_them(tmp_path, mpnet_dir, source, max_length):
    folder = mpnet_dir
    if source == "vocab.txt":  # no tokenizer.json: built from the vocabulary, config.json saying mpnet
        folder = tmp_path / "v"
        folder.mkdir()
        for name in ("vocab.txt", "config.json"):
            (folder / name).write_bytes((mpnet_dir / name).read_bytes())
    elif source == "converter template":
        folder = converter_style(mpnet_dir, tmp_path / "c")
    elif source == "run's tokenizer folder":  # training copies the tokenizer files alone (no config.json)
        folder = tmp_path / "run" / "tokenizer"
        copy_tokenizer_files(mpnet_dir, folder)
        assert not (folder / "config.json").exists()
    ours, ref = Tokenizer.from_checkpoint(folder), MPNetTokenizer.from_pretrained(str(mpnet_dir))
    assert ours.model_type == "mpnet" and (ours.cls_id, ours.sep_id, ours.pad_id) == (0, 2, 1)
    for args in [(SENTS,), (SENTS, PAIRS)]:
        got = ours(*args, max_length=max_length)
        want = ref(*args, max_length=max_length, truncation="longest_first", padding="longest", return_tensors="pt")
        assert got["input_ids"].tolist() == want["input_ids"].tolist()
        assert got["attention_mask"].tolist() == want["attention_mask"].tolist()
        assert (got["token_type_ids"] == 0).all()
    ids = ours.encode(["the cat"], ["a dog"])[0][0]
    assert ids == [0, VOCAB.index("the"), VOCAB.index("cat"), 2, 2, VOCAB.index("a"), VOCAB.index("dog"), 2]


def test_bert_checkpoints_keep_their_template(tiny_ckpt):
    tok = Tokenizer.from_checkpoint(tiny_ckpt)
    assert tok.model_type == "bert"
    ids, types = tok.encode(["the cat"], ["sat"])[0]
    assert ids == [2, 5, 6, 3, 7, 3] and types == [0, 0, 0, 0, 1, 1]


# ----------------------------------------------------------------------------- the config's refusals

@pytest.mark.parametrize("edit, says", [
    ({"model_type": "roberta"}, "model_type 'roberta' is not supported (one of bert, mpnet)"),
    ({"relative_attention_num_buckets": 16}, ("relative_attention_num_buckets 16: MPNet buckets relative "
                                              "positions into 32")),
    ({"pad_token_id": 0}, "pad_token_id 0: MPNet's padding token is 1"),
    ({"max_position_embeddings": 2}, "max_position_embeddings 2: MPNet's positions start at pad_token_id + 1"),
])
def test_a_config_mpnet_cannot_run_as_written_is_refused_naming_the_key(tmp_path, mpnet_dir, edit, says):
    cfg = json.loads((mpnet_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'config.json'))}: .*{re.escape(says)}"):
        BertConfig.from_json(tmp_path / "config.json")


def test_bert_and_mpnet_keep_their_own_tables():
    with pytest.raises(ValueError, match="type_vocab_size 2: MPNet has no token-type embeddings"):
        BertConfig(model_type="mpnet", relative_attention_num_buckets=32, pad_token_id=1)
    with pytest.raises(ValueError, match="relative_attention_num_buckets 32: BERT has no relative position bias"):
        BertConfig(relative_attention_num_buckets=32)
    with pytest.raises(ValueError, match="type_vocab_size 0: BERT needs at least one token type"):
        BertConfig(type_vocab_size=0)
    bert = BertConfig().to_hf_dict()
    assert "relative_attention_num_buckets" not in bert and bert["model_type"] == "bert"
