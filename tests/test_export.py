"""python -m training.export: the encoder in the Hugging Face layout (transformers reads it to the same
hidden states), the heads beside it (training.api.load gives the checkpoint's outputs again), a model
card naming the recipe and the dev metrics, and a refusal to write into a non-empty folder."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import tiny_run

from data.loaders import COURSE_FILES, load_task_file
from minbert import Bert, BertConfig, Tokenizer
from training.api import load
from training.export import main as export_main
from training.run.checkpointing import read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

RUNS = {"cross-cls": dict(predict_both_orders=True, lr=2e-2),
        "siamese-mean": dict(pair_encoding="siamese", pooling="mean", tasks=("sst", "sts"), ema_decay=0.5)}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, tmp_path_factory):
    cfg, _ = tiny_run(tmp_path_factory.mktemp(request.param), **RUNS[request.param])
    return cfg


def outputs(model, cfg) -> dict:
    out = {}
    for task in model.tasks:
        ex = load_task_file(Path(cfg.data_dir) / COURSE_FILES[task]["dev"], task, labelled=True).examples
        out[task] = model.outputs(task, ex).numpy()
    return out


def test_export_reloads_to_the_checkpoints_outputs(run, tmp_path, capsys):
    out = tmp_path / "export"
    assert export_main([run.out_dir, str(out)]) == 0
    assert {"config.json", "model.safetensors", "vocab.txt", "heads.json", "heads.safetensors",
            "README.md"} <= {p.name for p in out.iterdir()}
    original, exported = load(run.out_dir, device="cpu"), load(out, device="cpu")
    assert exported.tasks == original.tasks == tuple(run.tasks)
    assert exported.both_orders == original.both_orders == run.predict_both_orders
    want, got = outputs(original, run), outputs(exported, run)
    for task in run.tasks:
        np.testing.assert_allclose(got[task], want[task], rtol=0, atol=1e-6)
    from safetensors.torch import load_file
    assert {k.split(".")[0] for k in load_file(str(out / "heads.safetensors"))} == set(run.tasks)
    meta = json.loads((out / "heads.json").read_text())
    assert (meta["pair_encoding"], meta["pooling"]) == (run.pair_encoding, run.pooling)
    assert meta["dev_metrics"] == read_checkpoint(Path(run.out_dir) / "best.pt")["metrics"]
    capsys.readouterr()


def test_transformers_reads_the_encoder_to_the_same_hidden_states(run, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "export"
    assert export_main([run.out_dir, str(out)]) == 0
    ckpt = read_checkpoint(Path(run.out_dir) / "best.pt")
    ours = Bert(BertConfig(**ckpt["bert_config"]), attn_impl="matmul").eval()  # an --ema-decay run's best.pt
    # holds the weight average as its model
    ours.load_state_dict({k[len("encoder."):]: v for k, v in ckpt["model"].items() if k.startswith("encoder.")})
    hf = transformers.BertModel.from_pretrained(str(out), attn_implementation="eager").eval()
    batch = Tokenizer.from_checkpoint(out)(["apple river stone", "tiger", "ocean desert lamp piano"],
                                          ["cloud", "honey silver", "violin"])
    with torch.no_grad():
        want = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        got = hf(**batch)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=0, atol=1e-5)


def test_model_card_names_the_recipe_and_the_dev_metrics(run, tmp_path, capsys):
    out = tmp_path / "card"
    assert export_main([run.out_dir, str(out)]) == 0
    card = (out / "README.md").read_text()
    metrics = read_checkpoint(Path(run.out_dir) / "best.pt")["metrics"]
    for k, v in metrics.items():
        assert f"| {k} | {v:.4f} |" in card
    assert f"--lr {run.lr}" in card and "--seed 3" in card
    assert ("--predict-both-orders" in card) == run.predict_both_orders
    assert ("--pair-encoding siamese --pooling mean" in card) == (run.pair_encoding == "siamese")
    assert ("--tasks sst sts" in card) == (tuple(run.tasks) == ("sst", "sts"))
    assert "--out-dir" not in card and "--epochs" not in card  # a location, and a default
    assert f'model = load("{out.name}")' in card and "BertModel.from_pretrained" in card
    names = [COURSE_FILES[t][s] for t in run.tasks for s in ("train", "dev")]
    assert f"The course's CSV files ({', '.join(f'`{n}`' for n in names)})" in card
    root = str(Path(run.out_dir).parent)  # the run's, data's and model's folder on the training machine
    assert root not in card and f"(`{Path(run.out_dir).name}/best.pt`" in card
    capsys.readouterr()


def test_a_training_checkpoint_exports_with_the_metrics_of_its_step(run, tmp_path, capsys):
    run_dir = Path(run.out_dir)
    step_file = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    step = read_checkpoint(step_file)["run_state"]["global_step"]
    record = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
              if '"dev_overall"' in x and json.loads(x)["step"] == step][0]
    out = tmp_path / "step"
    assert export_main([str(step_file), str(out)]) == 0
    meta = json.loads((out / "heads.json").read_text())
    assert meta["step"] == step
    assert meta["dev_metrics"] == {k[len("dev_"):]: v for k, v in record.items()
                                   if k.startswith("dev_") and not k.startswith("dev_raw_")}
    want = outputs(load(step_file, device="cpu"), run)
    for task, values in outputs(load(out, device="cpu"), run).items():
        np.testing.assert_allclose(values, want[task], rtol=0, atol=1e-6)
    if run.ema_decay:  # the raw weights of an --ema-decay run come with the raw weights' scores
        assert export_main([str(step_file), str(tmp_path / "raw"), "--raw-weights"]) == 0
        raw = json.loads((tmp_path / "raw" / "heads.json").read_text())["dev_metrics"]
        assert raw == {k[len("dev_raw_"):]: v for k, v in record.items() if k.startswith("dev_raw_")}
        assert raw != meta["dev_metrics"]
    capsys.readouterr()


def test_a_non_empty_folder_is_refused_unless_overwrite(run, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        export_main([run.out_dir, str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"python -m training.export: error: {out}: exists and is not empty; pass --overwrite to replace "
                   f"the export there, or name another OUT_DIR"]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    # an earlier export's weights and vocabulary would shadow the new ones: --overwrite removes them
    (out / "pytorch_model.bin").write_bytes(b"old")
    (out / "tokenizer.json").write_text("{}")
    assert export_main([run.out_dir, str(out), "--overwrite"]) == 0
    names = {p.name for p in out.iterdir()}
    assert "pytorch_model.bin" not in names and "tokenizer.json" not in names and "notes.txt" in names
    assert load(out, device="cpu").tasks == tuple(run.tasks)
    with pytest.raises(SystemExit) as e:
        export_main([str(tmp_path / "nowhere"), str(tmp_path / "x")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("nowhere does not exist (see --help)")
    assert not (tmp_path / "x").exists()


def test_export_files_follow_the_umask(run, tmp_path, capsys):
    old = os.umask(0o027)
    try:
        assert export_main([run.out_dir, str(tmp_path / "perm")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "perm").stat().st_mode & 0o777 == 0o750
    for p in (tmp_path / "perm").iterdir():
        assert p.stat().st_mode & 0o777 == 0o640, p.name
    capsys.readouterr()
