"""The frozen-prefix cache: same training trajectory as running the frozen layers, never stale."""
import numpy as np
import pytest
import torch

from data.batching import encode_task, make_batch
from data.loaders import Example
from heads import MultitaskBert
from minbert import Bert, BertConfig, Tokenizer, save_hf
from training.config.train_config import TrainConfig
from training.methods.frozen_cache import build_frozen_cache, cache_key, estimate_bytes
from training.methods.stepper import Stepper

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "home", "big", "red"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS


@pytest.fixture
def setup(tmp_path):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=128)
    d = save_hf(Bert(cfg), tmp_path / "ckpt")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = Tokenizer.from_checkpoint(d)
    rng = np.random.default_rng(0)

    def sent():
        return " ".join(rng.choice(WORDS, size=rng.integers(1, 12)))

    train = {
        "sst": encode_task("sst", [Example(f"s{i}", sent(), None, int(rng.integers(5))) for i in range(24)], tok),
        "para": encode_task("para", [Example(f"p{i}", sent(), sent(), int(rng.integers(2))) for i in range(24)],
                            tok, "siamese"),
        "sts": encode_task("sts", [Example(f"t{i}", sent(), sent(), float(rng.uniform(0, 5))) for i in range(24)],
                           tok, "siamese"),
    }
    return d, tok, train


def _model(ckpt, upto):
    from minbert import load_bert
    torch.manual_seed(1)
    m = MultitaskBert(load_bert(ckpt), "siamese", dropout=0.1)
    m.freeze(upto)
    return m


def _train(ckpt, tok, train, cache, upto=2, steps=6, multiple=1, dropout=True, **options):
    model = _model(ckpt, upto)
    for m in model.modules() if not dropout else []:
        if isinstance(getattr(m, "p", None), float):
            m.p = 0.0
    cfg = TrainConfig(freeze_upto=upto, lr=1e-2, max_grad_norm=1.0, warmup_ratio=0.0, **options)
    stepper = Stepper.build(model, cfg, steps)
    torch.manual_seed(2)  # dropout in the trainable layers draws the same numbers in both runs
    losses = []
    for step in range(steps):
        task = ("sst", "para", "sts")[step % 3]
        idx = list(range((step // 3) * 8, (step // 3) * 8 + 8))
        shape = multiple, 24  # the cap: --max-length
        batch = cache.batch(train[task], idx, *shape) if cache else make_batch(train[task], idx, tok, *shape)
        if multiple > 1:
            assert all(seq["attention_mask"].shape[1] % multiple == 0 for seq in batch.inputs)
        losses.append(stepper.step([batch], step)[task]["loss"])
    return losses, model


def test_cached_training_matches_uncached(setup):
    ckpt, tok, train = setup
    ref_losses, ref_model = _train(ckpt, tok, train, cache=None)
    cache = build_frozen_cache(_model(ckpt, 2), train, tok, torch.device("cpu"), "memory", dtype="float32")
    losses, model = _train(ckpt, tok, train, cache=cache)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
    # fp16 storage, the default: same trajectory to fp16 precision
    cache16 = build_frozen_cache(_model(ckpt, 2), train, tok, torch.device("cpu"), "memory")
    losses16, _ = _train(ckpt, tok, train, cache=cache16)
    np.testing.assert_allclose(losses16, ref_losses, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("cached", [False, True])
def test_padding_to_a_multiple_trains_as_padding_to_the_longest_does(setup, cached):
    """--pad-multiple only adds masked positions: the same losses and weights as batches padded to their
    longest, to float noise (dropout off: its draws follow the batch's shape), with the cache too."""
    ckpt, tok, train = setup
    cache = (build_frozen_cache(_model(ckpt, 2), train, tok, torch.device("cpu"), "memory", dtype="float32")
             if cached else None)
    ref_losses, ref_model = _train(ckpt, tok, train, cache=cache, dropout=False)
    losses, model = _train(ckpt, tok, train, cache=cache, dropout=False, multiple=8)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_bregman_only_smart_keeps_the_cache_and_its_trajectory(setup):
    """--smart --smart-lambda 0 perturbs nothing, so the frozen prefix needs no graph: the cache stays on
    (full SMART perturbing the embeddings turns it off) and trains as the uncached run does."""
    from training.methods.cache_keeper import maybe_frozen_cache
    ckpt, tok, train = setup
    bregman = dict(smart=True, smart_lambda=0.0)
    assert maybe_frozen_cache(TrainConfig(freeze_upto=2, **bregman), _model(ckpt, 2), train, tok,
                              torch.device("cpu")) is not None
    assert maybe_frozen_cache(TrainConfig(freeze_upto=2, smart=True), _model(ckpt, 2), train, tok,
                              torch.device("cpu")) is None
    ref_losses, ref_model = _train(ckpt, tok, train, cache=None, **bregman)
    cache = build_frozen_cache(_model(ckpt, 2), train, tok, torch.device("cpu"), "memory", dtype="float32")
    losses, model = _train(ckpt, tok, train, cache=cache, **bregman)
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=0)


def test_cached_states_equal_the_frozen_layers_output(setup):
    ckpt, tok, train = setup
    model = _model(ckpt, 2).eval()
    cache = build_frozen_cache(model, train, tok, torch.device("cpu"), "memory", dtype="float32")
    idx = [3, 0, 17, 5]
    batch = make_batch(train["para"], idx, tok)
    cached = cache.batch(train["para"], idx)
    with torch.no_grad():
        for seq, c in zip(batch.inputs, cached.inputs):
            h = model.hidden_at([seq], 2)[0]
            m = seq["attention_mask"].bool()
            assert torch.equal(c["attention_mask"], seq["attention_mask"])
            torch.testing.assert_close(c["hidden"][m], h[m], rtol=0, atol=1e-6)
    assert torch.equal(cached.labels, batch.labels) and cached.ids == batch.ids


def test_disk_cache_round_trips_and_is_reused(setup, tmp_path, caplog):
    ckpt, tok, train = setup
    mem = build_frozen_cache(_model(ckpt, 2), train, tok, torch.device("cpu"), "memory")
    disk = build_frozen_cache(_model(ckpt, 2), train, tok, torch.device("cpu"), "disk", cache_dir=tmp_path / "c")
    for task in train:
        for a, b in zip(mem.states[task], disk.states[task]):
            assert isinstance(b.data, np.memmap)
            np.testing.assert_array_equal(a.data, b.data)
            np.testing.assert_array_equal(a.offsets, b.offsets)
    caplog.set_level("INFO")
    build_frozen_cache(_model(ckpt, 2), train, tok, torch.device("cpu"), "disk", cache_dir=tmp_path / "c")
    assert "reusing" in caplog.text
    assert len(list((tmp_path / "c").iterdir())) == 1


def test_two_runs_building_the_same_disk_entry_at_once(setup, tmp_path, monkeypatch):
    import training.methods.frozen_cache as fc
    ckpt, tok, train = setup
    fill, cpu = fc._fill, torch.device("cpu")

    def fill_while_another_run_builds_the_entry(*a, **k):
        fill(*a, **k)
        if not getattr(fill_while_another_run_builds_the_entry, "done", False):
            fill_while_another_run_builds_the_entry.done = True
            with monkeypatch.context() as m:
                m.setattr(fc.os, "getpid", lambda: 999_999)  # the other process
                build_frozen_cache(_model(ckpt, 2), train, tok, cpu, "disk", cache_dir=tmp_path / "c")

    monkeypatch.setattr(fc, "_fill", fill_while_another_run_builds_the_entry)
    disk = build_frozen_cache(_model(ckpt, 2), train, tok, cpu, "disk", cache_dir=tmp_path / "c")
    mem = build_frozen_cache(_model(ckpt, 2), train, tok, cpu, "memory")
    for task in train:
        for a, b in zip(mem.states[task], disk.states[task]):
            np.testing.assert_array_equal(a.data, b.data)
            np.testing.assert_array_equal(a.offsets, b.offsets)
    (entry,) = (tmp_path / "c").iterdir()
    assert not [p.name for p in entry.iterdir() if ".tmp" in p.name]


def test_key_changes_with_depth_checkpoint_and_data(setup):
    ckpt, tok, train = setup
    base = cache_key(_model(ckpt, 2), train, 2, "float16")
    assert cache_key(_model(ckpt, 2), train, 2, "float16") == base
    assert cache_key(_model(ckpt, 1), train, 1, "float16") != base          # another N
    changed = _model(ckpt, 2)
    with torch.no_grad():
        changed.encoder.layers[1].ffn_in.weight[0, 0] += 1e-3                 # another checkpoint
    assert cache_key(changed, train, 2, "float16") != base
    unfrozen_change = _model(ckpt, 2)
    with torch.no_grad():
        unfrozen_change.encoder.layers[2].ffn_in.weight[0, 0] += 1.0          # a trainable layer: same states
    assert cache_key(unfrozen_change, train, 2, "float16") == base
    fewer = {**train, "sst": encode_task("sst", train["sst"].examples[:-1], tok)}
    assert cache_key(_model(ckpt, 2), fewer, 2, "float16") != base            # other data / tokens
    shorter = {**train, "sst": encode_task("sst", train["sst"].examples, tok, max_length=4)}
    assert cache_key(_model(ckpt, 2), shorter, 2, "float16") != base          # another max length


def test_bf16_cache_holds_what_a_bf16_step_computes(setup):
    """Under --precision bf16 the frozen layers run in autocast; the cache must hold those states,
    not fp32 ones, and must not be reused for an fp32 run."""
    ckpt, tok, train = setup
    model = _model(ckpt, 2).eval()
    cache = build_frozen_cache(model, train, tok, torch.device("cpu"), "memory", dtype="float32",
                               compute_dtype=torch.bfloat16)
    idx = [3, 0, 7]
    batch = make_batch(train["para"], idx, tok)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model.hidden_at(batch.inputs, 2)
    got = cache.batch(train["para"], idx).inputs
    for w, g, inp in zip(want, got, batch.inputs):
        real = inp["attention_mask"].bool()
        torch.testing.assert_close(g["hidden"][real], w.float()[real], atol=1e-6, rtol=0)
    fp32 = build_frozen_cache(model, train, tok, torch.device("cpu"), "memory", dtype="float32")
    assert not torch.equal(fp32.batch(train["para"], idx).inputs[0]["hidden"], got[0]["hidden"])
    assert cache_key(model, train, 2, "float16", torch.bfloat16) != cache_key(model, train, 2, "float16")


def test_size_estimate_counts_real_tokens(setup):
    _, _, train = setup
    tokens = sum(len(ids) for d in train.values() for seq in d.sequences for ids, _ in seq)
    assert estimate_bytes(train, hidden=16) == tokens * 16 * 2


def test_needs_a_frozen_layer(setup):
    ckpt, tok, train = setup
    with pytest.raises(ValueError, match="at least one frozen encoder layer"):
        build_frozen_cache(_model(ckpt, -1), train, tok, torch.device("cpu"))


@pytest.mark.parametrize("options, says", [
    (dict(frozen_cache="disk", freeze_upto=-1), "--frozen-cache disk: does nothing here"),
    (dict(frozen_cache="memory"), "--frozen-cache memory: does nothing here"),
    (dict(frozen_dropout=True, cache_dir="elsewhere"), "--frozen-dropout, --cache-dir elsewhere: do nothing here"),
    (dict(frozen_cache="auto", freeze_upto=-1), None),
    (dict(frozen_cache="disk", unfreeze_schedule="lp-ft:1epochs", epochs=2), None),  # frozen in its first phase
])
def test_the_frozen_layers_options_on_a_run_without_frozen_layers_are_not_ignored_silently(tmp_path, caplog,
                                                                                          options, says):
    """Said once as the run starts, where the depth is known (the check once sat in a path such a run never took)."""
    from tiny_runs import tiny_run
    with caplog.at_level("WARNING"):
        tiny_run(tmp_path, epochs=options.pop("epochs", 1), **options)
    said = [r.getMessage() for r in caplog.records if "nothing here" in r.getMessage()]
    assert said == ([] if says is None else [said[0]]) and (says is None or said[0].startswith(says)), said
