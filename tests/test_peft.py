"""--peft (training/methods/peft.py, minbert/lora.py): LoRA against its formula and against the `peft` library on
transformers' BERT, step 0 equal to the pretrained model, merged equal to unmerged, only the LoRA factors
(or the biases), the pooler and the heads trained and in the optimiser, the pretrained weights untouched
bit for bit, the merged export read by transformers, the export of the trained part alone (loaded
onto its base, checked by fingerprint), the frozen-prefix cache, the one-line refusals, and
the records (train.log, metrics.jsonl, the sweep, a study with PEFT arms)."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import tiny_runs
import torch

from minbert import Bert, BertConfig, CheckpointError, Tokenizer, load_bert
from minbert.lora import TARGETS, LoRALinear, add_lora, lora_modules, merged_state_dict
from training.config.peft_spec import parse_peft
from training.config.train_config import TrainConfig, validate
from training.run.build import build_model
from training.run.checkpointing import read_checkpoint
from training.run.trainer import Run
from training.train import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[1]


def tiny_bert(seed=0, layers=2, hidden=16, dropout=0.0) -> Bert:
    torch.manual_seed(seed)
    return Bert(BertConfig(vocab_size=30, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                           intermediate_size=2 * hidden, max_position_embeddings=32, hidden_dropout_prob=dropout,
                           attention_probs_dropout_prob=dropout)).eval()


def randomise_lora(module, seed=5):
    """B away from zero (it starts at zero), so that the update shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(module):
            for b in m.lora_B:
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)


# ----------------------------------------------------------------------------- the LoRA layer

def check_lora_formula(device="cpu", autocast=None, tol=1e-5):
    """LoRALinear's output and gradients against y = W x + b + (alpha / r) B_s A_s x on each adapted block s
    of rows (the others W x + b alone), written out in fp32 and differentiated by autograd, on `device`
    (under autocast to `autocast` when given); returns the layer, its input and the formula's output."""
    torch.manual_seed(0)
    base = torch.nn.Linear(8, 12)
    lora = LoRALinear(base, [(0, 4), (8, 12)], r=3, alpha=6.0, dropout=0.0)
    randomise_lora(torch.nn.ModuleList([lora]))
    lora.to(device)  # moves base's Parameters too: they are the layer's own
    W, b = base.weight.detach().clone(), base.bias.detach().clone()
    x, cot = torch.randn(2, 5, 8, device=device), torch.randn(2, 5, 12, device=device)
    As = [a.detach().clone().requires_grad_() for a in lora.lora_A]
    Bs = [b_.detach().clone().requires_grad_() for b_ in lora.lora_B]
    xw, xg = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = xw @ W.T + b
    for (lo, hi), A, B in zip(lora.blocks, As, Bs):
        want[..., lo:hi] = want[..., lo:hi] + (6.0 / 3) * (xw @ A.T) @ B.T
    (want * cot).sum().backward()
    with torch.autocast(torch.device(device).type, dtype=autocast, enabled=autocast is not None):
        got = lora(xg)
    (got.float() * cot).sum().backward()
    torch.testing.assert_close(got.float(), want.detach(), rtol=tol, atol=tol)
    for mine, ref in [(xg.grad, xw.grad), *((p.grad, q.grad) for p, q in zip(lora.lora_A, As)),
                      *((p.grad, q.grad) for p, q in zip(lora.lora_B, Bs))]:
        torch.testing.assert_close(mine, ref, rtol=tol, atol=tol)
    lora.zero_grad()
    return lora, x, want.detach()


def test_lora_linear_is_the_formula_written_out():
    # the layer adds every block's update in one product: its output and gradients are the formula's
    lora, x, want = check_lora_formula()
    check_lora_formula(autocast=torch.bfloat16, tol=5e-2)  # bf16 keeps 8 bits: outputs of about 1-5, sums of 8
    torch.testing.assert_close(lora.rows(x, 4, 12), want[..., 4:12], rtol=0, atol=1e-6)  # the K/V rows alone
    base = torch.nn.Linear(8, 12)
    assert LoRALinear(base, [(0, 12)], r=2, alpha=2.0, dropout=0.0).weight is base.weight  # the Parameters themselves
    # frozen W and an input without a gradient (a cached frozen prefix's states): the factors still get theirs
    lora.weight.requires_grad_(False)
    lora.bias.requires_grad_(False)
    lora.rows(x[:, :1], 0, 12).sum().backward()
    assert all(p.grad is not None for p in (*lora.lora_A, *lora.lora_B)) and lora.weight.grad is None


@pytest.mark.parametrize("targets", [TARGETS, ("q", "v"), ("k", "ffn_out")])
def test_lora_equals_the_peft_library_on_transformers_bert(targets):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    ours = tiny_bert()
    hf = transformers.BertModel(transformers.BertConfig(**ours.config.to_hf_dict()), add_pooling_layer=True).eval()
    from minbert.checkpoint import minbert_to_hf
    hf.load_state_dict(minbert_to_hf(ours.state_dict()), strict=False)
    add_lora(ours, targets, r=4, alpha=8.0)
    randomise_lora(ours)
    hf_names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                "attn_out": "attention.output.dense", "ffn_in": "intermediate.dense", "ffn_out": "output.dense"}
    # the exact module paths: "output.dense" alone would also match attention.output.dense
    paths = [f"encoder.layer.{i}.{hf_names[t]}" for i in range(2) for t in targets]
    wrapped = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=paths))
    for i, layer in enumerate(ours.layers):  # our factors copied into theirs, block by block
        q_blocks = [t for t in ("q", "k", "v") if t in targets]
        pairs = [(layer.qkv, j, t) for j, t in enumerate(q_blocks)]
        pairs += [(getattr(layer, t), 0, t) for t in TARGETS[3:] if t in targets]
        for m, j, t in pairs:
            theirs = wrapped.get_submodule(f"base_model.model.encoder.layer.{i}.{hf_names[t]}")
            with torch.no_grad():
                theirs.lora_A["default"].weight.copy_(m.lora_A[j])
                theirs.lora_B["default"].weight.copy_(m.lora_B[j])
    ids = torch.tensor([[2, 7, 9, 11, 3, 0], [2, 5, 6, 3, 8, 3]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        want = wrapped(input_ids=ids, attention_mask=mask)
        got = ours(ids, mask)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=0, atol=1e-5)


def test_the_merged_weights_keep_the_function():
    """merged_state_dict (what save_hf exports): a plain Bert with those weights computes the LoRA model's
    function, and the LoRA model is left as it was."""
    bert = tiny_bert()
    add_lora(bert, TARGETS, r=2, alpha=4.0)
    randomise_lora(bert)
    ids, mask = torch.tensor([[2, 7, 9, 3]]), torch.ones(1, 4, dtype=torch.long)
    before = {k: v.clone() for k, v in bert.state_dict().items()}
    plain = tiny_bert(seed=1)
    plain.load_state_dict(merged_state_dict(bert))
    with torch.no_grad():
        want = bert(ids, mask).last_hidden_state
        first = bert.encode(bert.embed(ids), mask, first_only=True)  # the [CLS]-only path reads LoRA's rows
        merged = plain(ids, mask).last_hidden_state
    # fp32: W + BA rounded once against W x and B A x rounded apart; the hidden states are LayerNorm'd (~1)
    torch.testing.assert_close(merged, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(first, merged[:, :1], rtol=0, atol=1e-5)
    assert all(torch.equal(bert.state_dict()[k], v) for k, v in before.items())


# ----------------------------------------------------------------------------- the spec

@pytest.mark.parametrize("text, says", [
    ("lora", "needs its rank"), ("lora:r=0", "r must be a whole number >= 1"), ("lora:r=2,rank=3", "'rank=3'"),
    ("lora:r=2,targets=query", "targets must be all or some of"), ("lora:r=2,alpha=0", "alpha must be a number > 0"),
    ("lora:r=2,dropout=1", "dropout must be a probability"), ("bitfit:r=2", "bitfit takes no settings"),
    ("adapters", "must be none, bitfit or lora"),
])
def test_a_bad_peft_is_one_line_naming_the_flag_before_any_work(tmp_path, capsys, text, says):
    data, enc = tiny_runs.inputs(tmp_path)
    out = tmp_path / "o"
    try:
        rc = cli_main(["--model", str(enc), "--data-dir", str(data), "--out-dir", str(out), "--peft", text])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"--peft {text}" in err[0] and says in err[0], err
    assert not out.exists()


def test_the_spec_parses_its_settings_and_refuses_a_schedule():
    from training.config import peft_spec
    assert peft_spec.TARGETS == TARGETS  # the flag's names are the LoRA module's
    spec = parse_peft("lora:r=4,alpha=16,dropout=0.1,targets=v+q")
    assert (spec.kind, spec.r, spec.alpha, spec.dropout, spec.targets) == ("lora", 4, 16.0, 0.1, ("q", "v"))
    assert parse_peft("lora:r=8").targets == TARGETS and parse_peft("lora:r=8").alpha == 8.0
    errors = validate(TrainConfig(peft="bitfit", unfreeze_schedule="lp-ft:1epoch", data_dir="/x"))
    assert any(e.startswith("--peft bitfit cannot be used with --unfreeze-schedule lp-ft:1epoch") for e in errors)


# ----------------------------------------------------------------------------- what trains

def _expected_trainable(name: str, peft: str, first_layer: int) -> bool:
    """Written out from the definitions: heads and pooler always; LoRA's factors; BitFit's biases (LayerNorm's
    beta too) in the trainable part of the encoder."""
    if name.startswith(("heads.", "encoder.pooler.")):
        return True
    if name.startswith("encoder.embeddings."):
        layer = -1
    else:
        layer = int(name.split(".")[2])
    if layer < first_layer:
        return False
    if peft == "bitfit":
        return name.endswith(".bias")
    return ".lora_" in name


@pytest.mark.parametrize("peft, upto", [("bitfit", None), ("lora:r=2", None), ("lora:r=2,targets=q+v", 1),
                                        ("bitfit", 1)])
def test_only_peft_parameters_and_heads_train_and_the_pretrained_weights_stay(tmp_path, peft, upto):
    cfg = tiny_runs.tiny_config(tmp_path, peft=peft, freeze_upto=upto, lr=5e-2)
    run = Run(cfg).build()
    model, stepper = run.model, run.stepper
    first = -1 if upto is None else upto  # -1: the embeddings train too (BitFit: their LayerNorm's beta)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names == {n for n, _ in model.named_parameters() if _expected_trainable(n, peft, first)}
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if n not in names}
    start = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
    in_optimiser = {id(p) for g in stepper.optimizer.param_groups for p in g["params"]}
    assert in_optimiser == {id(p) for n, p in model.named_parameters() if n in names}
    from data.batching import make_batch
    from training.run.build import updates_for_epoch
    for step, update in enumerate(updates_for_epoch(cfg, run.data.train, 0)):
        batches = [make_batch(run.data.train[tb.task], tb.indices, run.tokenizer) for tbs in update for tb in tbs]
        assert stepper.step(batches, step) is not None
        got_grad = {n for n, p in model.named_parameters() if p.grad is not None}
        assert got_grad <= names and any(n.startswith("encoder.") for n in got_grad)
    state = stepper.optimizer.state_dict()["state"]
    assert len(state) == len(names)  # AdamW's moments for what trains, nothing else
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n  # bit for bit
    moved = [n for n in names if n.startswith("encoder.layers.") and not torch.equal(start[n], dict(
        model.named_parameters())[n])]
    assert moved, "the PEFT parameters did not train"


def test_lora_at_step_0_is_the_plain_model_exactly(tmp_path):
    # One model before and after its LoRA factors are added: the same weight tensors (two models loaded
    # apart may round a GEMM differently, their buffers aligned differently), so equal means bit for bit.
    from training.methods.peft import apply_peft
    data, enc = tiny_runs.inputs(tmp_path)
    model, tok, _ = build_model(TrainConfig(model=str(enc), seed=3))
    model.eval()
    batch = tok(["apple river stone", "tiger"], ["cloud", "honey silver violin"])

    def outputs():
        with torch.no_grad():  # the heads read the [CLS]-only last layer and the pooler; then every state
            heads = [model(task, [batch]) for task in ("sst", "para", "sts")]
            return heads + [model.encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])[0]]

    # the encoder's weights frozen as LoRA holds them: F.linear on a strided input rounds differently (1e-6)
    # when its weight requires a gradient, even under no_grad
    for name, p in model.encoder.named_parameters():
        p.requires_grad_(name.startswith("pooler."))
    before = outputs()
    assert apply_peft(model, "lora:r=4,dropout=0.2", 0, seed=3) > 0 and lora_modules(model.encoder)
    model.eval()
    for a, b in zip(outputs(), before):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- the frozen-prefix cache

def test_lora_above_a_frozen_prefix_trains_the_same_with_the_cache(tmp_path):
    from data.batching import make_batch
    from training.methods.frozen_cache import build_frozen_cache
    from training.methods.stepper import Stepper
    from training.run.build import load_data

    def train(cached):
        cfg = tiny_runs.tiny_config(tmp_path, freeze_upto=1, peft="lora:r=2", lr=5e-2)
        model, tok, _ = build_model(cfg)
        data = load_data(cfg, tok)
        cache = build_frozen_cache(model, data.train, tok, torch.device("cpu"), "memory", dtype="float32") \
            if cached else None
        stepper = Stepper.build(model, cfg, 6)
        losses = []
        for step in range(6):
            task = ("sst", "para", "sts")[step % 3]
            idx = list(range((step // 3) * 6, (step // 3) * 6 + 6))
            batch = cache.batch(data.train[task], idx) if cache else make_batch(data.train[task], idx, tok)
            losses.append(stepper.step([batch], step)[task]["loss"])
        return losses, model

    cache_losses, cached = train(True)
    ref_losses, ref = train(False)
    # float32 states: the same trajectory but for the rounding of layer 0's output, computed in another
    # batch shape (as tests/test_frozen_cache.py)
    np.testing.assert_allclose(cache_losses, ref_losses, rtol=1e-5, atol=1e-6)
    assert not any(".lora_" in n for n, _ in cached.named_parameters() if n.startswith("encoder.layers.0."))
    assert any(".lora_" in n for n, _ in cached.named_parameters() if n.startswith("encoder.layers.1."))
    for (n, p), q in zip(cached.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)


# ----------------------------------------------------------------------------- a trained LoRA run

@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    cfg, _ = tiny_runs.tiny_run(tmp_path_factory.mktemp("lora"), peft="lora:r=2", epochs=2, lr=5e-2)
    return cfg


def lora_count(hidden, inter, layers, r):
    """LoRA's factors on every linear map, written out: A (r x in) and B (out x r) for q, k, v, attn_out
    (hidden -> hidden), ffn_in (hidden -> inter), ffn_out (inter -> hidden)."""
    return layers * (4 * (r * hidden + hidden * r) + (r * hidden + inter * r) + (r * inter + hidden * r))


def test_the_records_count_what_trains_and_its_share(lora_run):
    H, I, L = 32, 64, 2  # tiny_runs.make_encoder
    heads = (H * H + H + H * 5 + 5) + (H + 1) + (H + 1)  # sst MLP, para linear, sts linear (cross)
    bert = BertConfig(vocab_size=len(tiny_runs.VOCAB), hidden_size=H, num_hidden_layers=L, num_attention_heads=2,
                      intermediate_size=I, max_position_embeddings=128).num_parameters()
    trainable = lora_count(H, I, L, 2) + (H * H + H) + heads  # the factors, the pooler, the heads
    total = bert + heads + lora_count(H, I, L, 2)
    records = [json.loads(x) for x in (Path(lora_run.out_dir) / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if "train_seconds" in r]
    assert len(epochs) == 2
    for r in epochs:
        assert r["trainable_params"] == trainable and r["trainable_share"] == pytest.approx(trainable / total, rel=1e-5)
    log = (Path(lora_run.out_dir) / "train.log").read_text()
    assert f"{trainable} trainable = {100 * trainable / total:.4f}%" in log and "peft lora:r=2" in log


def test_the_merged_export_loads_in_transformers_as_our_encoder(lora_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    from training.api import load
    from training.export import main as export_main
    from training.run.checkpointing import model_from_checkpoint
    out = tmp_path / "export"
    assert export_main([lora_run.out_dir, str(out)]) == 0
    network, _, _ = model_from_checkpoint(Path(lora_run.out_dir) / "best.pt")
    ours = network.encoder.eval()
    B = lora_modules(ours)[0].lora_B[0]
    assert B.abs().max() > 0  # trained: the update is not zero, so the merge matters
    hf = transformers.BertModel.from_pretrained(str(out), attn_implementation="eager").eval()
    base = transformers.BertModel.from_pretrained(lora_run.model, attn_implementation="eager").eval()
    batch = Tokenizer.from_checkpoint(out)(["apple river stone", "tiger", "ocean desert lamp piano"],
                                          ["cloud", "honey silver", "violin"])
    with torch.no_grad():
        want = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])  # unmerged
        got, before = hf(**batch), base(**batch)
    # fp32; W + (alpha/r) BA rounded once against the two products added, then LayerNorm'd states (~1):
    # 1.0e-5 apart on an AMD EPYC, 1.3e-5 on the H200 machine's Xeon (other matrix kernels), so 5e-5
    tol = 5e-5
    # the update moves the states far beyond that: an export that lost the merge would fail
    assert (before.last_hidden_state - want.last_hidden_state).abs().max() > 100 * tol  # 2.6 here
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=tol)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=0, atol=tol)
    exported, original = load(out, device="cpu"), load(lora_run.out_dir, device="cpu")
    assert not lora_modules(exported.network)
    from data.loaders import COURSE_FILES, load_task_file
    for task in ("sst", "para", "sts"):
        ex = load_task_file(Path(lora_run.data_dir) / COURSE_FILES[task]["dev"], task, labelled=True).examples
        np.testing.assert_allclose(exported.outputs(task, ex).numpy(), original.outputs(task, ex).numpy(), atol=1e-5)
    card, meta = (out / "README.md").read_text(), json.loads((out / "heads.json").read_text())
    trained = meta["trained_parameters"]
    assert "--peft lora:r=2" in card and f"Trained: {trained['trainable']:,} of {trained['total']:,}" in card
    records = [json.loads(x) for x in (Path(lora_run.out_dir) / "metrics.jsonl").read_text().splitlines()]
    assert trained["trainable"] == [r for r in records if "trainable_params" in r][-1]["trainable_params"]
    capsys.readouterr()


def test_predictions_and_best_pt_of_a_lora_run(lora_run):
    ckpt = read_checkpoint(Path(lora_run.out_dir) / "best.pt")
    assert any(".lora_A." in k for k in ckpt["model"]) and ckpt["config"]["peft"] == "lora:r=2"
    files = sorted(p.name for p in Path(lora_run.predictions_dir).glob("*-output.csv"))
    assert len(files) == 6


# ----------------------------------------------------------------------------- the trained part alone

def dev_outputs(model, data_dir) -> dict:
    from data.loaders import COURSE_FILES, load_task_file
    return {t: model.outputs(t, load_task_file(Path(data_dir) / COURSE_FILES[t]["dev"], t, labelled=True).examples)
            for t in model.tasks}


def export_trained_part(run_dir, out, capsys) -> dict:
    from safetensors.torch import load_file

    from training.export import main as export_main
    assert export_main([str(run_dir), str(out), "--trained-only"]) == 0
    capsys.readouterr()
    assert not {"config.json", "model.safetensors"} & {p.name for p in out.iterdir()}
    return load_file(str(out / "encoder-trained.safetensors"))


def test_the_trained_part_of_a_lora_run_is_its_factors_and_reloads_to_the_same_outputs(lora_run, tmp_path, capsys):
    from safetensors.torch import load_file

    from training.api import load
    from training.export import main as export_main
    stored = export_trained_part(lora_run.out_dir, tmp_path / "part", capsys)
    model = read_checkpoint(Path(lora_run.out_dir) / "best.pt")["model"]
    # what LoRA trains in the encoder, by its rule: the factors and the pooler (cls pooling), nothing else
    want = {k[len("encoder."):] for k in model if k.startswith("encoder.") and (".lora_" in k or ".pooler." in f".{k}")}
    assert set(stored) == want and len(want) == 2 * 12 + 2  # 2 layers x (A, B) x (q, k, v, attn_out, ffn_in, ffn_out)
    for k, v in stored.items():
        assert torch.equal(v, model[f"encoder.{k}"]), k
    original, part = load(lora_run.out_dir, device="cpu"), load(tmp_path / "part", device="cpu")
    assert lora_modules(part.network)  # unmerged, as the run computed
    want_out, got_out = dev_outputs(original, lora_run.data_dir), dev_outputs(part, lora_run.data_dir)
    for task in want_out:
        assert torch.equal(got_out[task], want_out[task]), task  # the same weights, the same arithmetic
    # exported whole again, it is the run's own whole export, bit for bit
    assert export_main([str(tmp_path / "part"), str(tmp_path / "again")]) == 0
    assert export_main([lora_run.out_dir, str(tmp_path / "whole")]) == 0
    again, whole = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("again", "whole"))
    assert again.keys() == whole.keys() and all(torch.equal(again[k], whole[k]) for k in whole)
    part_bytes = (tmp_path / "part" / "encoder-trained.safetensors").stat().st_size
    assert part_bytes < (tmp_path / "whole" / "model.safetensors").stat().st_size / 2
    card = (tmp_path / "part" / "README.md").read_text()
    assert f"those of `{Path(lora_run.model).name}`" in card and "python -m training.export part part-whole" in card
    capsys.readouterr()


@pytest.mark.parametrize("options, trained", [
    (dict(peft="bitfit"), lambda k: k.endswith(".bias")),  # every bias, LayerNorm's beta included
    (dict(freeze_upto=1), lambda k: k.startswith("layers.1.")),  # the layer above the frozen prefix
])
def test_the_trained_part_of_bitfit_and_of_a_frozen_prefix(tmp_path, capsys, options, trained):
    from training.api import load
    cfg, _ = tiny_runs.tiny_run(tmp_path, **options)
    stored = export_trained_part(cfg.out_dir, tmp_path / "part", capsys)
    keys = read_checkpoint(Path(cfg.out_dir) / "best.pt")["model"]
    encoder = {k[len("encoder."):] for k in keys if k.startswith("encoder.")}
    assert set(stored) == {k for k in encoder if trained(k) or k.startswith("pooler.")}
    want, got = (dev_outputs(load(where, device="cpu"), cfg.data_dir) for where in (cfg.out_dir, tmp_path / "part"))
    for task in want:
        assert torch.equal(got[task], want[task]), task


def test_the_trained_part_is_refused_onto_another_base_and_for_full_fine_tuning(lora_run, tmp_path, capsys):
    import shutil

    from safetensors.torch import load_file, save_file

    from training.api import load
    from training.common.errors import LoadError
    from training.export import main as export_main
    export_trained_part(lora_run.out_dir, tmp_path / "part", capsys)
    with pytest.raises(CheckpointError) as e:  # e.g. --model PART: not a whole encoder, and how to get one
        load_bert(tmp_path / "part")
    assert str(e.value) == (f"{tmp_path / 'part'}: holds the trained part of an encoder alone (encoder-trained."
                            f"safetensors), not a whole checkpoint; write a whole one with: python -m training.export "
                            f"{tmp_path / 'part'} WHOLE_DIR")
    other = tmp_path / "other-base"
    shutil.copytree(lora_run.model, other)
    weights = load_file(str(other / "model.safetensors"))
    name = next(k for k in weights if k.endswith("attention.self.query.weight"))
    weights[name] = weights[name].clone()
    weights[name][0, 0] += 1e-3  # one number of a frozen weight
    save_file(weights, str(other / "model.safetensors"))
    meta_file = tmp_path / "part" / "heads.json"
    meta = json.loads(meta_file.read_text())
    gone = tmp_path / "gone"
    for base, says in [(str(other), f"but {other} here is not the pretrained model it was trained from"),
                       (str(gone), f"cannot load the export onto its pretrained base {gone}")]:
        meta["encoder"]["base"] = base
        meta_file.write_text(json.dumps(meta))
        with pytest.raises(LoadError) as e:
            load(tmp_path / "part", device="cpu")
        assert says in str(e.value) and "\n" not in str(e.value)
    full, _ = tiny_runs.tiny_run(tmp_path, "full")
    with pytest.raises(SystemExit) as e:
        export_main([full.out_dir, str(tmp_path / "full-part"), "--trained-only"])
    assert e.value.code == 2 and not (tmp_path / "full-part").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"python -m training.export: error: --trained-only: {Path(full.out_dir) / 'best.pt'} changed every "
                   f"tensor of its encoder (full fine-tuning): its trained part is the whole model; export it "
                   f"without --trained-only"]


# ----------------------------------------------------------------------------- with everything else

@pytest.mark.parametrize("peft", ["lora:r=2", "bitfit"])
@pytest.mark.parametrize("name, options", [
    ("pcgrad", dict(pcgrad=True)),
    ("smart", dict(smart=True, smart_lambda=1.0, smart_mu=1.0)),
    ("ema", dict(ema_decay=0.5)),
    ("accumulation", dict(grad_accum_steps=2, batch_size=6)),
    ("frozen-prefix-smart", dict(freeze_upto=1, smart=True, smart_perturb_at="first-trainable")),
])
def test_peft_trains_beside_every_trick_and_keeps_the_pretrained_weights(tmp_path, peft, name, options):
    cfg, metrics = tiny_runs.tiny_run(tmp_path, peft=peft, epochs=1, lr=5e-2, **options)
    assert math.isfinite(metrics["overall"])
    pretrained = load_bert(cfg.model).state_dict()
    best = {k[len("encoder."):]: v for k, v in read_checkpoint(Path(cfg.out_dir) / "best.pt")["model"].items()
            if k.startswith("encoder.")}
    first = cfg.freeze_upto or 0
    changed = []
    for k, v in pretrained.items():
        layer = int(k.split(".")[1]) if k.startswith("layers.") else -1
        trains = k.startswith("pooler.") or (peft == "bitfit" and k.endswith(".bias") and
                                             (layer >= first if cfg.freeze_upto is not None else True))
        if not trains:
            assert torch.equal(best[k], v), k  # bit for bit
        elif not torch.equal(best[k], v):
            changed.append(k)
    if peft == "bitfit":
        assert any(k.startswith("layers.") for k in changed)
    else:
        assert any(".lora_B." in k and v.abs().max() > 0 for k, v in best.items())


# ----------------------------------------------------------------------------- the sweep and the study

def test_the_sweep_takes_peft_and_records_the_share():
    from training.experiments.sweep import cli as sweep_cli
    from training.experiments.sweep import records as sweep_records
    args = sweep_cli.build_parser().parse_args(["--tasks", "sst", "--sizes", "4", "--peft", "lora:r=4"])
    assert args.peft == "lora:r=4"
    assert "peft" in sweep_records.SWEEP_OPTIONS


def test_a_study_runs_lora_and_bitfit_arms(tmp_path):
    from training.experiments.study import cli as C
    from training.experiments.sweep import records as sweep_records
    data, enc = tiny_runs.inputs(tmp_path)
    recipe = {"title": "t", "kind": "depth", "results": str(tmp_path / "results"), "report": str(tmp_path / "report"),
              "tasks": ["sst", "para", "sts"], "depths": ["none", 1], "sizes": [6], "seeds": [1],
              "train": {"epochs": 1, "batch_size": 4, "lr": 1e-3, "device": "cpu", "precision": "fp32"},
              "arms": {"": {}, "lora4": {"peft": "lora:r=4"}, "bitfit": {"peft": "bitfit"}}}
    path = tmp_path / "peft.json"
    path.write_text(json.dumps(recipe))
    assert C.main([str(path), "--model", str(enc), "--data-dir", str(data), "--in-process", "--threads", "1",
                   "--runs-dir", str(tmp_path / "runs")]) == 0
    records = sweep_records.read_results(tmp_path / "results" / "results.jsonl")
    by = {(r["depth"], r.get("arm", "")): r for r in records}
    assert len(by) == 6
    for depth in (None, 1):
        full, lora, bitfit = by[depth, ""], by[depth, "lora4"], by[depth, "bitfit"]
        assert lora["overrides"] == {"peft": "lora:r=4"}
        assert bitfit["trainable_params"] < full["trainable_params"]
        for r in (full, lora, bitfit):
            assert r["trainable_share"] == pytest.approx(r["trainable_params"] / r["total_params"], rel=1e-5)
    assert by[None, ""]["trainable_share"] == 1.0


@pytest.mark.parametrize("peft, upto", [("lora:r=3", None), ("lora:r=2,targets=q+v+ffn_in", 1), ("bitfit", None),
                                        ("bitfit", 1)])
def test_the_preflight_memory_estimate_counts_what_peft_trains(tmp_path, peft, upto):
    # the estimate from the config's sizes alone against the parameters the built model trains (its heads,
    # which the estimate leaves out of both counts, taken off)
    from training.run.preflight import footprint
    data, enc = tiny_runs.inputs(tmp_path)
    cfg = TrainConfig(model=str(enc), peft=peft, freeze_upto=upto)
    model, _, _ = build_model(cfg)
    heads = sum(p.numel() for p in model.heads.parameters())
    need = footprint(model.encoder.config, cfg)
    assert need.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad) - heads
    assert need.params == sum(p.numel() for p in model.parameters()) - heads
