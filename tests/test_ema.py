"""--ema-decay: the weight average against the recursion computed by hand in float64, the swap in
and out, and in a training run: the kept checkpoint and the predictions are the averaged weights."""
import json
from pathlib import Path

import pytest
import torch
from test_training import EPOCHS, config, make_checkpoint, write_data
from torch import nn

from training.args import config_from_args
from training.config.train_config import validate
from training.methods.ema import WeightEMA
from training.run.checkpointing import read_checkpoint
from training.run.trainer import train
from training.train import build_parser

pytestmark = pytest.mark.usefixtures("one_thread")


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    m[0].requires_grad_(False)  # frozen: no shadow, never touched
    return m


def test_average_follows_the_warmed_up_recursion():
    check_recursion(torch.device("cpu"))


def check_recursion(device: torch.device):
    """The average of a model on `device` against the recursion computed here in float64 on the CPU."""
    model, decay = _model().to(device), 0.9
    ema = WeightEMA(model, decay)
    assert ema.names == ["1.weight", "1.bias", "2.weight", "2.bias"]
    trainable = dict(model.named_parameters())
    assert all(s.device == trainable[n].device for n, s in zip(ema.names, ema.shadow))  # kept beside the weights
    expected = {n: trainable[n].detach().double().cpu().clone() for n in ema.names}
    gen = torch.Generator().manual_seed(1)
    for t in range(30):  # past the warm-up: (1 + t) / (10 + t) exceeds 0.9 from t = 80 on, so both regimes
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen).to(device))
        ema.update(model)
        d = min(decay, (1 + t) / (10 + t))
        for n in ema.names:
            expected[n] = d * expected[n] + (1 - d) * trainable[n].detach().double().cpu()
    for n, s in zip(ema.names, ema.shadow):
        torch.testing.assert_close(s.double().cpu(), expected[n], rtol=1e-6, atol=1e-6)
    assert ema.num_updates == 30


def test_decay_reaches_its_cap_after_the_warm_up():
    model = _model()
    ema = WeightEMA(model, 0.5)  # (1 + t) / (10 + t) >= 0.5 from t = 8: then plain 0.5
    for _ in range(8):
        ema.update(model)
    before = [s.clone() for s in ema.shadow]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)
    params = dict(model.named_parameters())
    for n, b, s in zip(ema.names, before, ema.shadow):
        torch.testing.assert_close(s, 0.5 * b + 0.5 * params[n].detach())


def test_applied_swaps_in_and_restores_bit_for_bit_even_on_error():
    model = _model()
    ema = WeightEMA(model, 0.0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        ema.shadow[0].fill_(7.0)
    with pytest.raises(RuntimeError, match="boom"):
        with ema.applied(model):
            assert torch.all(model[1].weight == 7.0)
            torch.testing.assert_close(model[2].weight, ema.shadow[2])
            assert torch.equal(model[0].weight, before["0.weight"])  # frozen: left alone
            raise RuntimeError("boom")
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
        assert p.requires_grad == (n != "0.weight" and n != "0.bias")


def test_state_dict_round_trip_and_mismatch():
    a = WeightEMA(_model(), 0.9)
    a.update(_model())
    b = WeightEMA(_model(), 0.9)
    with torch.no_grad():
        b.shadow[0].zero_()
    b.load_state_dict(a.state_dict())
    assert b.num_updates == 1 and all(torch.equal(x, y) for x, y in zip(a.shadow, b.shadow))
    other = _model()
    other[2].requires_grad_(False)
    with pytest.raises(ValueError, match="other parameters"):
        WeightEMA(other, 0.9).load_state_dict(a.state_dict())


@pytest.mark.parametrize("value", ["1", "-0.1", "1.5"])
def test_cli_rejects_a_decay_outside_0_1(value):
    cfg = config_from_args(build_parser().parse_args(["--ema-decay", value]))
    assert any("--ema-decay must be in [0, 1)" in e for e in validate(cfg))


# ----------------------------------------------------------------------------- in a training run

def _records(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "train_seconds" in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny run three times: without EMA, with decay 0 (the average is the last weights) and
    with decay 0.9 (save_every=0: one training checkpoint per epoch, holding both weight sets)."""
    root = tmp_path_factory.mktemp("inputs")
    inputs = write_data(root / "data"), make_checkpoint(root / "ckpt")
    out = {}
    for name, decay in [("plain", None), ("zero", 0.0), ("ema", 0.9)]:
        root = tmp_path_factory.mktemp(name)
        cfg = config(root, *inputs, ema_decay=decay, save_every=0, keep_last=EPOCHS)
        out[name] = (cfg, train(cfg))
    return out


def test_decay_zero_gives_the_plain_run(runs):
    (pcfg, plain), (zcfg, zero) = runs["plain"], runs["zero"]
    assert zero == plain
    p, z = Path(pcfg.out_dir), Path(zcfg.out_dir)
    for rp, rz in zip(_records(p), _records(z)):
        assert {k: rz[k] for k in rp if k.startswith("dev_")} == {k: v for k, v in rp.items() if k.startswith("dev_")}
        assert rz["dev_raw_overall"] == rz["dev_overall"]
    predictions = sorted(Path(pcfg.predictions_dir).glob("*-output.csv"))  # manifest.json names its own run
    assert len(predictions) == 6
    for f in predictions:
        assert (Path(zcfg.predictions_dir) / f.name).read_text() == f.read_text()


def test_best_checkpoint_and_predictions_hold_the_average(runs):
    cfg, best = runs["ema"]
    run = Path(cfg.out_dir)
    records = _records(run)
    assert all("dev_raw_overall" in r for r in records)
    assert any(r["dev_raw_overall"] != r["dev_overall"] for r in records)  # the two weight sets differ
    kept = read_checkpoint(run / "best.pt")
    assert kept["metrics"] == best
    assert best["overall"] == max(r["dev_overall"] for r in records)
    epoch = kept["epoch"]
    state = read_checkpoint(sorted((run / "checkpoints").iterdir())[epoch])  # the end of that epoch
    assert state["run_state"]["epoch"] == epoch + 1
    ema = dict(zip(state["ema"]["names"], state["ema"]["shadow"]))
    assert ema, "no EMA state in the training checkpoint"
    for name, averaged in ema.items():
        assert torch.equal(kept["model"][name], averaged), name
    assert any(not torch.equal(state["model"][n], a) for n, a in ema.items())  # not the raw weights
