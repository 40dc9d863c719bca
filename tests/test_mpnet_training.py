"""The trainer's features on MPNet (issue 65, part 3), on a tiny random MPNet written by transformers: the
frozen-prefix cache trains as the frozen layers run every step would (the relative bias recomputed from the
cached states' length), and a run stopped by a real SIGTERM and resumed equals an uninterrupted one, bit for
bit, with freezing and SMART (both perturbation points), PCGrad, LoRA, BitFit, a weight EMA and siamese
pairs; the resumed run's course prediction files are the uninterrupted run's. The references are BERT's
own tests' (tests/test_frozen_cache.py, tests/test_resume.py) with the model swapped."""
import numpy as np
import pytest
import tiny_runs
import torch
from test_frozen_cache import _model, _train
from test_resume import resume_equals_uninterrupted
from test_training import write_data

from data.batching import encode_task
from data.loaders import Example
from minbert import Tokenizer, load_bert
from training.methods.frozen_cache import build_frozen_cache
from training.run.checkpointing import read_checkpoint


@pytest.fixture(scope="module")
def mpnet(tmp_path_factory):
    root = tmp_path_factory.mktemp("mpnet-training")
    return tiny_runs.make_mpnet_encoder(root / "mpnet", hidden=16, layers=3), write_data(root / "data") or root / "data"


def test_it_is_an_mpnet(mpnet):
    cfg = load_bert(mpnet[0]).config
    assert cfg.model_type == "mpnet" and cfg.relative_attention_num_buckets == 32 and cfg.num_hidden_layers == 3


def test_cached_training_matches_uncached_on_mpnet(mpnet):
    ckpt = mpnet[0]
    tok = Tokenizer.from_checkpoint(ckpt)
    rng = np.random.default_rng(0)

    def sent():
        return " ".join(rng.choice(tiny_runs.WORDS, size=rng.integers(1, 12)))
    train = {"sst": encode_task("sst", [Example(f"s{i}", sent(), None, int(rng.integers(5))) for i in range(24)], tok),
             "para": encode_task("para", [Example(f"p{i}", sent(), sent(), int(rng.integers(2))) for i in range(24)],
                                 tok, "siamese"),
             "sts": encode_task("sts", [Example(f"t{i}", sent(), sent(), float(rng.uniform(0, 5))) for i in range(24)],
                                tok, "siamese")}
    ref_losses, ref_model = _train(ckpt, tok, train, cache=None)
    cache = build_frozen_cache(_model(ckpt, 2), train, tok, torch.device("cpu"), "memory", dtype="float32")
    losses, model = _train(ckpt, tok, train, cache=cache)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    H = load_bert(ckpt).config.hidden_size
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        if name.endswith("qkv.bias"):  # the key bias shifts every score of a query alike: softmax cancels it, its
            p, q = torch.cat([p[:H], p[2 * H:]]), torch.cat([q[:H], q[2 * H:]])  # gradient is rounding noise
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)  # that Adam scales to full steps


@pytest.mark.parametrize("k, extra", [
    (3, ("--freeze-upto", "2", "--smart")),  # SMART perturbs the embeddings: the frozen layers run each step
    (4, ("--freeze-upto", "2", "--smart", "--smart-perturb-at", "first-trainable")),  # the cache kept
    (3, ("--pcgrad", "--ema-decay", "0.5")),
    (4, ("--peft", "lora:r=2,dropout=0.1", "--pair-encoding", "siamese", "--pooling", "mean")),
    (3, ("--peft", "bitfit", "--freeze-upto", "1")),
])
def test_sigterm_then_resume_equals_an_uninterrupted_run_on_mpnet(mpnet, tmp_path, k, extra):
    out, _ = resume_equals_uninterrupted(*mpnet, tmp_path, k, extra)
    assert any("relative" in name for name in read_checkpoint(out / "best.pt")["model"])  # MPNet's bias table
