"""python -m training.experiments.report --compare on two tiny runs: only the options that differ, each run's kept
evaluation (the one its best.pt holds), its training time, as markdown and CSV, and the overlaid curves."""
import csv
import json
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from training.experiments.report import main
from training.run.checkpointing import read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    a, _ = tiny_run(root, "plain")
    b, _ = tiny_run(root, "tuned", lr=2e-2, seed=4, evals_per_epoch=3, ema_decay=0.5)
    return [Path(a.out_dir), Path(b.out_dir)]


def test_the_table_holds_the_differences_the_kept_metrics_and_the_time(runs, tmp_path, capsys):
    csv_path, png = tmp_path / "compare.csv", tmp_path / "compare.png"
    assert main(["--compare", *map(str, runs), "--csv", str(csv_path), "-o", str(png)]) == 0
    md = capsys.readouterr().out.splitlines()
    with open(csv_path, newline="") as f:
        header, *rows = list(csv.reader(f))
    assert header == ["run", "--evals-per-epoch", "--lr", "--ema-decay", "--seed", "sst_acc", "para_acc",
                      "sts_pearson", "overall", "kept at epoch", "kept at step", "train s"]
    assert md[0] == "| " + " | ".join(header) + " |" and len(md) == 2 + len(runs)
    assert [r[:5] for r in rows] == [["plain", "1", "0.01", "none", "3"], ["tuned", "3", "0.02", "0.5", "4"]]
    for run, row in zip(runs, rows):
        best = read_checkpoint(run / "best.pt")  # the evaluation the run kept
        assert row[5:9] == [f"{best['metrics'][m]:.4f}" for m in ("sst_acc", "para_acc", "sts_pearson", "overall")]
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        kept = [r for r in records if r["step"] == best["step"] and "dev_overall" in r][0]
        assert row[9:11] == [f"{kept['epoch'] + kept.get('epoch_progress', 1.0):.2f}", str(best["step"])]
        assert row[11] == f"{sum(r['train_seconds'] for r in records if 'train_seconds' in r):.1f}"
        assert md[runs.index(run) + 2] == "| " + " | ".join(row) + " |"
    import matplotlib.image
    image = matplotlib.image.imread(png)
    assert image.shape[1] > 3 * image.shape[0] > 600 and image[..., :3].std() > 0.05  # four panels, drawn


def test_identical_runs_differ_in_nothing(runs, capsys):
    assert main(["--compare", str(runs[0]), str(runs[0])]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("| run | sst_acc |")


def test_a_folder_that_is_not_a_run_is_named(runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--compare", str(runs[0]), str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"python -m training.experiments.report: error: {tmp_path / 'config.json'}: "
                                       f"no such file (is {tmp_path} a run directory?)\n")
    with pytest.raises(SystemExit) as e:
        main(["--compare", str(runs[0]), "--curves", str(runs[0])])
    assert e.value.code == 2
    assert "--compare goes alone" in capsys.readouterr().err


def test_a_torn_metrics_line_is_skipped_with_its_line_named(runs, tmp_path, capsys, caplog):
    """A run killed mid-write (or still writing) leaves a partial last line: the readers of metrics.jsonl
    (--compare, --curves, training.experiments.stats, the API) skip it and say which, rather than crash."""
    import shutil

    from training.api import load
    from training.experiments.stats import main as stats_main
    torn = tmp_path / "torn"
    shutil.copytree(runs[0], torn)
    lines = (torn / "metrics.jsonl").read_text().splitlines()
    (torn / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 99, "dev_ove')
    assert main(["--compare", str(runs[0]), str(torn), "--csv", str(tmp_path / "c.csv"), "-o",
                 str(tmp_path / "c.png")]) == 0
    rows = list(csv.reader(open(tmp_path / "c.csv", newline="")))
    assert rows[1][5:] == rows[2][5:]  # the same run: the torn line changed nothing
    assert main(["--curves", str(torn), "-o", str(tmp_path / "curves.png")]) == 0
    assert stats_main([str(runs[0]), "--vs", str(torn)]) == 0
    last = sorted((torn / "checkpoints").glob("step-*.pt"))[-1].name  # its metrics come from metrics.jsonl
    assert load(torn / "checkpoints" / last).metrics == load(runs[0] / "checkpoints" / last).metrics != {}
    assert f"{torn / 'metrics.jsonl'}: skipped line(s) {len(lines) + 1}" in caplog.text
    capsys.readouterr()
