"""Finding and loading checkpoints: every way it can go wrong gives an error naming the file/tensor."""
import json
import os
import subprocess
import sys

import pytest
import torch

from minbert import Bert, BertConfig, CheckpointError, load_bert, load_tokenizer, resolve_checkpoint, save_hf
from minbert.checkpoint import minbert_to_hf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s"]


def tiny_config(**kw) -> BertConfig:
    base = dict(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=32)
    return BertConfig(**{**base, **kw})


@pytest.fixture
def tiny_dir(tmp_path):
    torch.manual_seed(0)
    model = Bert(tiny_config())
    d = save_hf(model, tmp_path / "tiny")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return d, model


def _same_weights(a: Bert, b: Bert):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


def test_round_trip(tiny_dir):
    d, model = tiny_dir
    _same_weights(load_bert(d), model)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_bert(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_bert("./no/such/dir")


def test_missing_weight_file(tiny_dir):
    d, _ = tiny_dir
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weight file"):
        load_bert(d)


def test_missing_config_and_vocab(tiny_dir):
    d, _ = tiny_dir
    (d / "vocab.txt").unlink()
    with pytest.raises(CheckpointError, match="no vocabulary"):
        load_bert(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_bert(d)


def test_wrong_shape_names_file_and_tensor(tiny_dir):
    d, _ = tiny_dir
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 48
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor encoder\.layer\.0\.intermediate\.dense"
                                              r"\.(weight|bias) has shape \(32,( 16)?\).*\(48,( 16)?\)"):
        load_bert(d)


def test_missing_tensor_is_an_error_not_a_random_init(tiny_dir):
    from safetensors.torch import load_file, save_file
    d, _ = tiny_dir
    sd = load_file(d / "model.safetensors")
    del sd["encoder.layer.1.output.dense.bias"]
    save_file(sd, d / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing tensors \['encoder\.layer\.1\.output\.dense\.bias'\]"):
        load_bert(d)


def test_missing_pooler_is_loud(tiny_dir, caplog):
    from safetensors.torch import load_file, save_file
    d, _ = tiny_dir
    sd = {k: v for k, v in load_file(d / "model.safetensors").items() if not k.startswith("pooler")}
    save_file(sd, d / "model.safetensors")
    load_bert(d)
    assert "no pooler weights" in caplog.text


def test_truncated_safetensors(tiny_dir):
    d, _ = tiny_dir
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read weights.*corrupt or truncated"):
        load_bert(d)


def test_legacy_names_bert_prefix_and_pretraining_heads_in_a_bin_file(tiny_dir, caplog):
    d, model = tiny_dir
    (d / "model.safetensors").unlink()
    sd = {}
    for k, v in minbert_to_hf(model.state_dict()).items():
        k = "bert." + k
        if "LayerNorm" in k:
            k = k.replace(".weight", ".gamma").replace(".bias", ".beta")
        sd[k] = v
    sd["cls.predictions.bias"] = torch.zeros(len(VOCAB))            # MLM head: ignored
    sd["cls.seq_relationship.weight"] = torch.zeros(2, 16)          # NSP head: ignored
    sd["bert.encoder.layer.0.attention.self.distance_embedding.weight"] = torch.zeros(3)  # reported
    # a quantiser's statistics under modules we load (bitsandbytes writes such names): reported, not a KeyError
    sd["bert.encoder.layer.0.output.dense.SCB"] = torch.zeros(16)
    sd["bert.encoder.layer.1.attention.self.query.SCB"] = torch.zeros(16)
    sd["bert.embeddings.position_ids"] = torch.arange(32)[None]  # a saved constant: neither head nor unexpected
    torch.save(sd, d / "pytorch_model.bin")
    with caplog.at_level("INFO", logger="minbert.checkpoint"):
        _same_weights(load_bert(d), model)
    assert ("ignored 3 unexpected tensors: bert.encoder.layer.0.attention.self.distance_embedding.weight, "
            "bert.encoder.layer.0.output.dense.SCB, bert.encoder.layer.1.attention.self.query.SCB") in caplog.text
    assert "ignoring 2 tensors of pre-training or task heads (cls)" in caplog.text


def test_sharded_safetensors(tiny_dir):
    from safetensors.torch import load_file, save_file
    d, model = tiny_dir
    sd = load_file(d / "model.safetensors")
    keys = sorted(sd)
    half = len(keys) // 2
    save_file({k: sd[k] for k in keys[:half]}, d / "model-00001-of-00002.safetensors")
    save_file({k: sd[k] for k in keys[half:]}, d / "model-00002-of-00002.safetensors")
    weight_map = {k: f"model-0000{1 + (i >= half)}-of-00002.safetensors" for i, k in enumerate(keys)}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (d / "model.safetensors").unlink()
    _same_weights(load_bert(d), model)


def test_packaged_alias():
    d = resolve_checkpoint("minilm-l6")
    assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()
    assert load_tokenizer("minilm-l6").vocab_size == 30522


def _run_with_hub(hf_home, code):
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": REPO}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def _hub_cache(root, files):
    """A hand-made Hugging Face cache holding `files` (name -> bytes) of bert-base-uncased."""
    snapshot = root / "hub" / "models--bert-base-uncased" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")


def test_hub_id_resolves_through_a_local_hub_cache(tmp_path, tiny_dir):
    """bert-base-uncased cannot be downloaded here; a hand-made cache in the hub's layout stands in."""
    d, model = tiny_dir
    _hub_cache(tmp_path / "hf", {n: (d / n).read_bytes() for n in ("config.json", "model.safetensors", "vocab.txt")})
    torch.save(model.state_dict(), tmp_path / "expected.pt")
    code = ("import torch; from minbert import load_bert, load_tokenizer\n"
            "m = load_bert('bert-base-uncased'); exp = torch.load(%r)\n"
            "assert all(torch.equal(v, exp[k]) for k, v in m.state_dict().items())\n"
            "print('ok', load_tokenizer('bert-base-uncased').vocab_size)" % str(tmp_path / "expected.pt"))
    r = _run_with_hub(tmp_path / "hf", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ok {len(VOCAB)}"


def test_offline_uncached_hub_id_says_how_to_pass_a_local_directory(tmp_path):
    r = _run_with_hub(tmp_path / "empty-hf", "from minbert import load_bert; load_bert('bert-base-uncased')")
    assert r.returncode != 0
    assert "CheckpointError: 'bert-base-uncased' is not in the Hugging Face cache" in r.stderr
    assert str(tmp_path / "empty-hf") in r.stderr and "--model /path/to/dir" in r.stderr
    assert "nor is there a local directory" not in r.stderr  # no slash: not meant as a path


def test_offline_partly_cached_hub_id_names_what_is_missing_without_blaming_the_hub(tmp_path, tiny_dir):
    d, _ = tiny_dir
    _hub_cache(tmp_path / "hf", {n: (d / n).read_bytes() for n in ("config.json", "vocab.txt")})
    r = _run_with_hub(tmp_path / "hf", "from minbert import load_bert; load_bert('bert-base-uncased')")
    assert r.returncode != 0
    assert ("CheckpointError: 'bert-base-uncased': no model.safetensors or pytorch_model.bin in the Hugging Face "
            "cache, and the hub cannot be reached") in r.stderr
    assert "on the hub" not in r.stderr


def test_hub_repository_without_config_json_is_a_checkpoint_error(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    import minbert.checkpoint

    def no_such_file(repo_id, filename, **kw):
        raise EntryNotFoundError(f"{repo_id}/{filename} not found")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_such_file)
    monkeypatch.setattr(minbert.checkpoint, "_check_hub_reachable", lambda repo_id, missing: None)  # it answers
    # online, whatever the machine running the tests says (bench/gpu_check.sh sets HF_HUB_OFFLINE=1)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(CheckpointError, match=r"'someone/weights-only': no config\.json in the cache or on the hub"
                                              r"(.|\n)*nor is there a local directory .*someone/weights-only"):
        resolve_checkpoint("someone/weights-only")  # a hub id, or a mistyped folder: both are named


def test_a_name_that_is_neither_a_directory_nor_a_hub_id(tmp_path):
    with pytest.raises(CheckpointError, match=r"'my model' is neither a local directory nor a valid hub id"):
        resolve_checkpoint("my model")
