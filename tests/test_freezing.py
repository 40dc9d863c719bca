"""MultitaskBert.freeze(N): embeddings + layers 0..N-1 frozen (N=-1: embeddings only, N=L: the whole
encoder but the pooler). Frozen tensors must stay bit-identical through real optimiser steps, stay out of
the optimiser, and run in eval mode; out-of-range N is an error naming the depth, on the CLI too."""
import pytest
import tiny_runs
import torch

from data.batching import Batch
from heads import MultitaskBert
from minbert import Bert, BertConfig, save_hf
from training.config.train_config import TrainConfig
from training.methods.stepper import Stepper, build_optimizer, linear_warmup_decay
from training.train import main as cli_main

L = 2
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s"]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(**kw) -> BertConfig:
    base = dict(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=L, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=128)  # dropout 0.1, as BERT
    return BertConfig(**{**base, **kw})


def tiny_model(pair_encoding="cross", seed=0) -> MultitaskBert:
    torch.manual_seed(seed)
    return MultitaskBert(Bert(tiny_config()), pair_encoding, dropout=0.1)


def _seq(g, B, T, pair=False):
    return tiny_runs.random_batch(g, B, T, len(VOCAB), padded=1, pair=pair)


def batches(pair_encoding, seed=0, B=4) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    pair = ((lambda: [_seq(g, B, 7, pair=True)]) if pair_encoding == "cross"
            else (lambda: [_seq(g, B, 5), _seq(g, B, 6)]))
    ids, idx = [str(i) for i in range(B)], list(range(B))
    return [Batch("sst", [_seq(g, B, 5)], torch.randint(0, 5, (B,), generator=g), ids, idx),
            Batch("para", pair(), torch.randint(0, 2, (B,), generator=g).float(), ids, idx),
            Batch("sts", pair(), torch.rand(B, generator=g) * 5, ids, idx)]


def frozen_names(model: MultitaskBert, upto) -> set[str]:
    """Which parameters freeze(upto) must freeze, written from the definition, not from the code."""
    if upto is None:
        return set()
    prefixes = ["encoder.embeddings."] + [f"encoder.layers.{i}." for i in range(max(upto, 0))]
    return {n for n, _ in model.named_parameters() if n.startswith(tuple(prefixes))}


def train_steps(model, pair_encoding, steps=6):
    cfg = TrainConfig(lr=1e-2, weight_decay=0.01, warmup_ratio=0.0, max_grad_norm=1.0, seed=0, device="cpu",
                      pair_encoding=pair_encoding)
    stepper = Stepper.build(model, cfg, steps + 1)
    bs = batches(pair_encoding)
    for s in range(steps):
        parts = stepper.step([bs[s % 3]], s)  # one task per step, as the mtdnn sampler does
        assert parts is not None
    return stepper.optimizer


@pytest.mark.parametrize("pair_encoding,upto", [("cross", None), ("cross", -1), ("cross", 0), ("cross", 1),
                                                ("cross", L), ("siamese", 1)])
def test_frozen_parameters_do_not_move(pair_encoding, upto):
    model = tiny_model(pair_encoding)
    model.freeze(upto)
    frozen = frozen_names(model, upto)
    assert frozen == {n for n, p in model.named_parameters() if not p.requires_grad}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    # three steps per task: the siamese similarity head, 5 max(0, cos), gets no gradient on a step where
    # every pair's cosine is negative, so one step per task may leave it untouched
    opt = train_steps(model, pair_encoding, steps=9)

    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, before[n]), f"{n} is frozen but changed"
            assert id(p) not in in_opt, f"{n} is frozen but in the optimiser"
            assert p.grad is None
        else:
            assert not torch.equal(p, before[n]), f"{n} is trainable but did not change"
            assert id(p) in in_opt, f"{n} is trainable but not in the optimiser"
    assert len(in_opt) == sum(1 for _ in model.parameters()) - len(frozen)
    # the first group decays (matrices), the second does not (biases, LayerNorm)
    assert all(p.ndim >= 2 for p in opt.param_groups[0]["params"]) and opt.param_groups[0]["weight_decay"] > 0
    assert all(p.ndim < 2 for p in opt.param_groups[1]["params"]) and opt.param_groups[1]["weight_decay"] == 0


@pytest.mark.parametrize("upto", [-1, 0, 1, L])
def test_frozen_modules_stay_in_eval_mode(upto):
    model = tiny_model()
    model.freeze(upto)
    frozen_mods = [model.encoder.embeddings, *model.encoder.layers[:max(upto, 0)]]
    trainable_mods = [*model.encoder.layers[max(upto, 0):], model.encoder.pooler, *model.heads.values()]
    for _ in range(2):
        model.train()
        assert model.training
        for m in frozen_mods:
            assert not any(sub.training for sub in m.modules())
        for m in trainable_mods:
            assert all(sub.training for sub in m.modules())
        model.eval()
        assert not any(m.training for m in model.modules())
    train_steps(model, "cross", steps=3)  # Stepper.step calls model.train() itself
    assert not any(sub.training for m in frozen_mods for sub in m.modules())

    # Dropout is really off in the frozen prefix: its output is a fixed function of the input...
    model.train()
    inputs = batches("cross")[0].inputs
    layer = model.first_trainable_layer
    assert layer == max(upto, 0)
    torch.testing.assert_close(model.hidden_at(inputs, layer), model.hidden_at(inputs, layer), rtol=0, atol=0)
    # ...while the trainable layers above still drop out in train mode.
    if layer < L:
        h = model.hidden_at(inputs, layer)[0]
        mask = inputs[0]["attention_mask"]
        assert not torch.equal(model.encoder.encode(h, mask, start=layer), model.encoder.encode(h, mask, start=layer))


def test_minus_one_and_zero_both_freeze_the_embeddings_only():
    for upto in (-1, 0):
        model = tiny_model()
        model.freeze(upto)
        assert {n for n, p in model.named_parameters() if not p.requires_grad} == \
            {n for n, _ in model.named_parameters() if n.startswith("encoder.embeddings.")}
        assert model.first_trainable_layer == 0


def test_unfreezing_restores_everything():
    model = tiny_model()
    model.freeze(L)
    model.freeze(None)
    assert all(p.requires_grad for p in model.parameters())
    model.train()
    assert all(m.training for m in model.modules())
    assert model.frozen_modules() == [] and model.first_trainable_layer == 0


@pytest.mark.parametrize("upto", [L + 1, 9, -2, -10])
def test_out_of_range_names_the_depth(upto):
    model = tiny_model()
    model.freeze(1)
    with pytest.raises(ValueError, match=rf"--freeze-upto {upto} is out of range: the model has {L} layers"):
        model.freeze(upto)
    assert model.frozen_upto == 1  # a refused freeze changes nothing
    assert {n for n, p in model.named_parameters() if not p.requires_grad} == frozen_names(model, 1)


# ----------------------------------------------------------------------------- the command line

def write_course_files(d):
    d.mkdir(parents=True, exist_ok=True)
    sst = "\tid\tsentence\tsentiment\n0\ta\tthe cat sat\t3\n1\tb\tthe mats\t1\n"
    pair = "\tid\tsentence1\tsentence2\t{}\n0\tc\tthe cat\ton the mat\t{}\n1\td\tcats sat\tthe cat\t{}\n"
    files = {"ids-sst-{}.csv": sst, "quora-{}.csv": pair.format("is_duplicate", 1.0, 0.0),
             "sts-{}.csv": pair.format("similarity", 4.2, 1.0)}
    for name, text in files.items():
        for split in ("train", "dev"):
            (d / name.format(split)).write_text(text)
    return d


def tiny_checkpoint(d):
    torch.manual_seed(0)
    save_hf(Bert(tiny_config()), d)
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return d


@pytest.mark.parametrize("upto", [9, L + 1])
def test_cli_freeze_beyond_the_depth_exits_2_naming_the_layers(tmp_path, capsys, upto):
    data, ckpt = write_course_files(tmp_path / "data"), tiny_checkpoint(tmp_path / "ckpt")
    rc = cli_main(["--model", str(ckpt), "--data-dir", str(data), "--freeze-upto", str(upto), "--epochs", "1",
                   "--device", "cpu", "--out-dir", str(tmp_path / "run"), "--predictions-dir", str(tmp_path / "pred")])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("run_multitask.py: error: ")
    assert f"--freeze-upto {upto} is out of range: " in lines[0] and f" has {L} layers" in lines[0]
    assert not (tmp_path / "run" / "best.pt").exists()


def test_cli_freeze_below_minus_one_is_a_validation_error(tmp_path, capsys):
    data = write_course_files(tmp_path / "data")
    with pytest.raises(SystemExit) as e:  # argparse's own refusal of the value
        cli_main(["--model", str(tmp_path / "nowhere"), "--data-dir", str(data), "--freeze-upto", "-2",
                  "--out-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.strip() == ("run_multitask.py: error: argument --freeze-upto: must be >= -1 (-1: the embeddings only), "
                           "not -2 (see --help)")
    assert not (tmp_path / "run").exists()  # refused before any work


# ----------------------------------------------------------------------------- --layer-lr-decay

def expected_lr_scale(name: str, g: float) -> float:
    """Written from the flag's definition for this 2-layer model: heads and pooler 1, layer 1 g,
    layer 0 g^2, embeddings g^3."""
    if name.startswith("encoder.embeddings."):
        return g ** 3
    for i in range(L):
        if name.startswith(f"encoder.layers.{i}."):
            return g ** (L - i)
    return 1.0


@pytest.mark.parametrize("upto", [None, 1])
def test_layer_lr_decay_gives_each_depth_its_rate(upto):
    assert L == 2
    model = tiny_model("cross")
    model.freeze(upto)
    g, lr = 0.5, 1e-3
    opt = build_optimizer(model, TrainConfig(lr=lr, layer_lr_decay=g, weight_decay=0.01), torch.device("cpu"))
    sched = linear_warmup_decay(opt, 10, 0.0)
    group_of = {id(p): grp for grp in opt.param_groups for p in grp["params"]}
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert len(group_of) == len(trainable) == sum(len(grp["params"]) for grp in opt.param_groups)
    for _ in range(3):  # the schedule scales every group alike
        opt.step()  # no gradients: changes nothing
        sched.step()
    factor = sched.get_last_lr()[0] / lr
    assert 0 < factor < 1
    for n, p in trainable:
        grp = group_of[id(p)]
        assert grp["lr"] == pytest.approx(lr * factor * expected_lr_scale(n, g)), n
        assert grp["weight_decay"] == (0.0 if p.ndim < 2 else 0.01), n
    if upto == 1:
        assert not any(n.startswith(("encoder.embeddings.", "encoder.layers.0.")) for n, _ in trainable)


def test_layer_lr_decay_rejects_values_outside_0_1():
    from training.args import config_from_args
    from training.config.train_config import validate
    from training.train import build_parser
    for bad in ("0", "1.5", "-0.9"):
        cfg = config_from_args(build_parser().parse_args(["--layer-lr-decay", bad]))
        assert any("--layer-lr-decay must be in (0, 1]" in e for e in validate(cfg)), bad
