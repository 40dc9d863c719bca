"""bench/import_runs.py: runs a study finished elsewhere join its record, once each, with their dev
predictions, and only when trained with the record's settings (checked before anything is written)."""
import gzip
import json
from pathlib import Path

import pytest
from bench_scripts import bench_script

from training.config.train_config import TrainConfig
from training.experiments.sweep.records import settings_of

SETTINGS = settings_of(TrainConfig())


@pytest.fixture(scope="module")
def imp():
    return bench_script("import_runs")


def record(seed: int, overall: float, **settings) -> dict:
    return {"tasks": "sst", "depth": None, "size": "all", "seed": seed, "arm": "smart", "dev": {"overall": overall},
            "settings": {**SETTINGS, **settings}, "dev_predictions": f"dev-predictions/s{seed}.json.gz"}


def study(folder: Path, records: list[dict]) -> Path:
    (folder / "dev-predictions").mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for r in records:
        with gzip.open(folder / r["dev_predictions"], "wt") as f:
            json.dump({"sst": [r["seed"]] * 3}, f)
    return folder


def lines(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]


def test_new_runs_join_once_with_their_predictions_and_held_runs_stay(imp, tmp_path):
    into = study(tmp_path / "into", [record(1, 0.70)])
    source = study(tmp_path / "gpu", [record(1, 0.99), record(2, 0.72), record(3, 0.73), record(2, 0.5)])
    assert imp.main([str(source), str(into)]) == 0
    assert [(r["seed"], r["dev"]["overall"]) for r in lines(into)] == [(1, 0.70), (2, 0.72), (3, 0.73)]
    with gzip.open(into / "dev-predictions" / "s3.json.gz", "rt") as f:
        assert json.load(f) == {"sst": [3, 3, 3]}
    assert imp.main([str(source), str(into)]) == 0  # again: nothing left to add
    assert len(lines(into)) == 3


def test_other_settings_are_refused_before_anything_is_written(imp, tmp_path, capsys):
    into = study(tmp_path / "into", [record(1, 0.70)])
    before = (into / "results.jsonl").read_text()
    source = study(tmp_path / "gpu", [record(2, 0.72), record(3, 0.73, lr=0.5)])
    assert imp.main([str(source), str(into)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"import_runs: {source / 'results.jsonl'} holds 1 result(s) made with other settings "
                   f"(lr: 0.5 there, {SETTINGS['lr']!r} now) than {into / 'results.jsonl'}'s"]
    assert (into / "results.jsonl").read_text() == before and not (into / "dev-predictions" / "s2.json.gz").exists()


def test_a_missing_prediction_file_is_named(imp, tmp_path, capsys):
    into = study(tmp_path / "into", [record(1, 0.70)])
    source = study(tmp_path / "gpu", [record(2, 0.72)])
    (source / "dev-predictions" / "s2.json.gz").unlink()
    assert imp.main([str(source), str(into)]) == 2
    assert capsys.readouterr().err.strip() == (f"import_runs: {source / 'dev-predictions/s2.json.gz'}: missing "
                                               f"(1 dev prediction file(s) in all)")
    assert len(lines(into)) == 1


def test_a_record_older_than_an_option_takes_runs_at_its_default_only(imp, tmp_path, capsys):
    """The record's runs predate an option (their settings lack it): they ran at its default, so runs
    trained at the default join, and runs trained otherwise are refused."""
    old = record(1, 0.70)
    del old["settings"]["peft"], old["settings"]["pad_multiple"]
    into = study(tmp_path / "into", [old])
    source = study(tmp_path / "gpu", [record(2, 0.72, peft="none", pad_multiple=1)])
    assert imp.main([str(source), str(into)]) == 0
    assert [r["seed"] for r in lines(into)] == [1, 2]
    other = study(tmp_path / "lora", [record(3, 0.73, peft="lora")])
    assert imp.main([str(other), str(into)]) == 2
    assert "peft: 'lora' there, 'none' now" in capsys.readouterr().err
    assert len(lines(into)) == 2
