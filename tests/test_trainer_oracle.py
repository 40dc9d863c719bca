"""The training loop's bookkeeping against references written out here, not derived from the trainer's code:

- steps per epoch by hand from the data sizes and the options (mtdnn and the sampled modes: sum over the tasks
  of ceil(n / batch); mixed: ceil(sum of n / batch); --max-batches-per-task, --max-train-examples, --pair-swap,
  --tasks), counted in the run's own records and in the batches it loaded;
- which steps evaluate (docs/options.md: K times an epoch "at evenly spaced steps, the last at the epoch's end");
- the learning rates a run applied (read from the optimiser by the on_update hook, and metrics.jsonl's `lr`)
  against transformers' get_linear_schedule_with_warmup over the update count worked out by hand, shifted one
  step during the warm-up as docs/options.md says;
- --grad-accum-steps: updates per epoch, steps per update, the schedule's length and --save-every in updates;
- the kept evaluation (best.pt, the manifest, train()'s answer): the first evaluation with the highest dev
  overall (strictly higher to replace it, so ties keep the first), with a weight average its scores;
- the dev prediction files scored by hand (numpy) against the gold labels tiny_runs writes: the kept
  evaluation's metrics;
- --early-stop-patience counted in evaluations, mid-epoch too, and what --resume auto does after either stop;
  --max-bad-steps counted in a row; --max-train-examples / --max-eval-examples as seeded subsets.

Tests named test_BUG_* fail on a fault found here; each docstring gives a reproduction: the non-finite stop
numbers its step from 0 where every record numbers from 1; the warm-up length truncates a float product (50 x
0.58 warms up over 28); an epoch's train_seconds counts its mid-epoch evaluations.
Tiny runs (tests/tiny_runs.py: 12 examples per task, dev = train, a 2-layer random encoder), shared per module.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import STS_GOLD, N, inputs, tiny_config

import training.methods.stepper as stepper_module
import training.run.trainer as trainer_module
from minbert import Tokenizer
from training.common.errors import NonFiniteLossError
from training.run.build import load_data
from training.run.metrics_file import kept_evaluation, read_metrics
from training.run.trainer import Run, train

pytestmark = pytest.mark.usefixtures("one_thread")

PEAK = 1e-2  # tiny_config's --lr
TASKS = ("sst", "para", "sts")
# the dev files' gold labels, as tests/tiny_runs.write_data writes them (dev = train)
GOLD = {"sst": {f"s{i}": float(i % 5) for i in range(N)},
        "para": {f"p{i}": float(i % 3 == 0) for i in range(N)},
        "sts": {f"t{i}": STS_GOLD[i] for i in range(N)}}
METRIC = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_pearson"}


# ----------------------------------------------------------------------------- helpers


def records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def step_rows(rows):
    return [r for r in rows if "lr" in r]


def eval_rows(rows):
    return [r for r in rows if "dev_overall" in r]


def epoch_rows(rows):
    return [r for r in rows if "train_seconds" in r]


def read_predictions(path: Path) -> dict[str, float]:
    """A course-format prediction file: a header, then `id , value` lines."""
    out = {}
    for line in path.read_text().splitlines()[1:]:
        if line.strip():
            key, value = (x.strip() for x in line.split(","))
            out[key] = float(value)
    return out


def hand_metrics(folder: Path, tasks=TASKS) -> dict[str, float]:
    """The course's metrics of a run's dev prediction files, by hand: accuracies, Pearson's r by numpy,
    overall = mean(sst_acc, para_acc, (r + 1) / 2)."""
    out = {}
    for task in tasks:
        preds = read_predictions(folder / f"{task}-dev-output.csv")
        p = np.array(list(preds.values()))
        g = np.array([GOLD[task][k] for k in preds])
        if task == "sts":
            assert np.ptp(p) > 0, "constant similarity predictions: Pearson's r is undefined"
            out["sts_pearson"] = float(np.corrcoef(p, g)[0, 1])
        else:
            out[METRIC[task]] = float(np.mean(p == g))
    parts = [out[k] for k in ("sst_acc", "para_acc") if k in out]
    parts += [(out["sts_pearson"] + 1) / 2] if "sts_pearson" in out else []
    out["overall"] = float(np.mean(parts))
    return out


def assert_scores(hand: dict, recorded: dict) -> None:
    """Accuracies exactly; Pearson (and so overall) to the 4 decimals the similarity files are written with."""
    for k, v in hand.items():
        tol = 0 if k.endswith("_acc") else 2e-4
        assert v == pytest.approx(recorded[k], abs=tol), (k, hand, recorded)


def hf_rates(peak: float, total: int, warmup: int) -> list[float]:
    """transformers.get_linear_schedule_with_warmup's rate at index 0..total."""
    transformers = pytest.importorskip("transformers")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
    rates = []
    for _ in range(total + 1):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def documented_rates(peak: float, total: int, warmup: int) -> list[float]:
    """The rate of updates 1..total as docs/options.md states it: over W warm-up updates the first runs at
    LR / W and the W-th at LR (transformers' schedule one step ahead), then transformers' own."""
    hf = hf_rates(peak, total, warmup)
    return [hf[u] if u <= warmup else hf[u - 1] for u in range(1, total + 1)]


def evenly_spaced(points: list[int], steps: int, k: int) -> bool:
    """k points, the last the epoch's end, each within half a step of steps * i / k (i = 1..k), increasing."""
    return (len(points) == k and points[-1] == steps and points == sorted(set(points))
            and all(abs(p - steps * i / k) <= 0.5 for i, p in enumerate(points, 1)))


def best_pt(out: Path) -> dict:
    ckpt = torch.load(Path(out) / "best.pt", map_location="cpu", weights_only=True)
    return {"epoch": ckpt["epoch"], "step": ckpt["step"], "metrics": ckpt["metrics"]}


def zero_gradients(stepper) -> None:
    """An on_update hook that leaves nothing to learn: with weight decay 0, AdamW then moves no weight, so
    every evaluation scores the same model."""
    for group in stepper.optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.zero_()


@pytest.fixture(scope="module")
def root(tmp_path_factory, one_thread):
    r = tmp_path_factory.mktemp("trainer_oracle")
    inputs(r)
    return r


# ----------------------------------------------------------------------------- a run evaluating 4 times an epoch


@pytest.fixture(scope="module")
def evals_run(root):
    """4 epochs of 9 steps (mtdnn, batch 5: 3 tasks x ceil(12 / 5)), 4 evaluations an epoch, a weight average,
    warm-up 0.25 of 36 updates = 9; the rate each update applied, read from the optimiser."""
    cfg = tiny_config(root, "evals", epochs=4, batch_size=5, evals_per_epoch=4, warmup_ratio=0.25, ema_decay=0.5,
                      save_every=0)
    applied = []
    metrics = train(cfg, on_update=lambda st: applied.append([g["lr"] for g in st.optimizer.param_groups]))
    return {"cfg": cfg, "out": Path(cfg.out_dir), "metrics": metrics, "rows": records(cfg.out_dir),
            "applied": applied}


def test_step_and_epoch_numbers_of_the_records(evals_run):
    rows = evals_run["rows"]
    steps = step_rows(rows)
    assert [r["step"] for r in steps] == list(range(1, 37))  # --log-every 1: every update, 1-based
    assert [r["epoch"] for r in steps] == [(s - 1) // 9 for s in range(1, 37)]
    ends = epoch_rows(rows)
    assert [(r["epoch"], r["step"]) for r in ends] == [(0, 9), (1, 18), (2, 27), (3, 36)]
    assert all(r["train_seconds"] >= 0 and "dev_overall" in r for r in ends)  # each epoch end evaluates
    # the evaluation records follow the step record of their step (written after the step)
    order = [("eval" if "dev_overall" in r else "step", r["step"]) for r in rows if "lr" in r or "dev_overall" in r]
    for i, (kind, s) in enumerate(order):
        if kind == "eval":
            assert order[i - 1] == ("step", s), order[i - 1: i + 1]


def test_evaluations_come_k_times_an_epoch_evenly_spaced_the_last_at_its_end(evals_run):
    evals = eval_rows(evals_run["rows"])
    assert len(evals) == 16
    for epoch in range(4):
        mine = [r for r in evals if r["epoch"] == epoch]
        points = [r["step"] - 9 * epoch for r in mine]
        assert evenly_spaced(points, 9, 4), points
        for r, p in zip(mine[:-1], points[:-1]):  # mid-epoch: where in the epoch, no epoch record's fields
            assert r["epoch_progress"] == round(p / 9, 4) and "train_seconds" not in r
        assert "epoch_progress" not in mine[-1] and "train_seconds" in mine[-1]
    # a weight average: the raw weights are scored at the epoch ends only (docs/training.md)
    assert [r["step"] for r in evals if "dev_raw_overall" in r] == [9, 18, 27, 36]


def test_the_applied_learning_rates_are_transformers_linear_schedule(evals_run):
    """docs/options.md: warm-up over warmup_ratio of the updates, then linear decay to 0; the first update at
    LR / W, the W-th at LR, transformers' schedule from there on. 36 updates, W = 0.25 x 36 = 9."""
    want = documented_rates(PEAK, 36, 9)
    applied = evals_run["applied"]
    assert len(applied) == 36 and all(len(set(g)) == 1 for g in applied)  # one rate, every group
    assert [g[0] for g in applied] == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert [r["lr"] for r in step_rows(evals_run["rows"])] == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert want[0] == pytest.approx(PEAK / 9) and want[8] == want[9] == pytest.approx(PEAK)


def test_the_kept_evaluation_is_the_first_with_the_highest_overall(evals_run):
    evals = eval_rows(evals_run["rows"])
    scores = [r["dev_overall"] for r in evals]
    assert len(set(scores)) > 1  # a spread, so that the choice below can be wrong
    first_best = next(r for r in evals if r["dev_overall"] == max(scores))  # by hand: strictly higher replaces
    kept = best_pt(evals_run["out"])
    assert (kept["epoch"], kept["step"]) == (first_best["epoch"], first_best["step"])
    assert kept["metrics"] == {k[4:]: v for k, v in first_best.items() if k.startswith("dev_") and "raw" not in k}
    assert evals_run["metrics"] == kept["metrics"]
    manifest = json.loads((evals_run["out"] / "predictions" / "manifest.json").read_text())
    assert (manifest["epoch"], manifest["step"]) == (first_best["epoch"], first_best["step"])
    assert manifest["dev_metrics"] == kept["metrics"]
    assert kept_evaluation(read_metrics(evals_run["out"] / "metrics.jsonl")) == first_best  # the readers' choice


def test_the_dev_files_score_as_the_kept_evaluation(evals_run):
    """The dev prediction files, scored by hand against the gold labels, give the kept evaluation's metrics
    (the weight average's, not the raw weights')."""
    kept = best_pt(evals_run["out"])["metrics"]
    hand = hand_metrics(evals_run["out"] / "predictions")
    assert_scores(hand, kept)
    folder = evals_run["out"] / "predictions"
    for task in TASKS:  # every dev example once; the test sets whole
        assert sorted(read_predictions(folder / f"{task}-dev-output.csv")) == sorted(GOLD[task])
        assert sorted(read_predictions(folder / f"{task}-test-output.csv")) == sorted(["z9", "a3", "m1", "b7", "q0"])


# ----------------------------------------------------------------------------- gradient accumulation


@pytest.fixture(scope="module")
def accum_run(root):
    """--grad-accum-steps 2 over 9 steps an epoch (mtdnn, batch 5), 2 epochs, warm-up 0.2, 2 evaluations an
    epoch, a checkpoint every 2 updates (all kept). Records the steps each update was made of."""
    cfg = tiny_config(root, "accum", epochs=2, batch_size=5, grad_accum_steps=2, warmup_ratio=0.2,
                      evals_per_epoch=2, save_every=2, keep_last=50)
    loaded, per_update, applied, losses = [], [], [], []
    real, real_loss = Run.load_batch, stepper_module.task_loss

    def load(self, tb):
        loaded.append((tb.task, tuple(tb.indices)))
        return real(self, tb)

    def task_loss(task, out, labels):
        loss = real_loss(task, out, labels)
        losses.append((task, float(loss.detach())))
        return loss

    def on_update(st):
        per_update.append(len(loaded) - sum(per_update))
        applied.append(max(g["lr"] for g in st.optimizer.param_groups))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Run, "load_batch", load)
        mp.setattr(stepper_module, "task_loss", task_loss)
        train(cfg, on_update=on_update)
    return {"out": Path(cfg.out_dir), "rows": records(cfg.out_dir), "per_update": per_update, "applied": applied,
            "loaded": loaded, "losses": losses}


def test_accumulation_counts_updates_in_steps_epochs_and_checkpoints(accum_run):
    """9 batches an epoch in updates of 2: ceil(9 / 2) = 5 updates, the last of one batch; steps, the
    evaluation points and --save-every count updates (docs/options.md)."""
    assert accum_run["per_update"] == [2, 2, 2, 2, 1] * 2
    rows = accum_run["rows"]
    assert [r["step"] for r in step_rows(rows)] == list(range(1, 11))
    assert [r["epoch"] for r in step_rows(rows)] == [0] * 5 + [1] * 5
    assert [(r["epoch"], r["step"]) for r in epoch_rows(rows)] == [(0, 5), (1, 10)]
    evals = eval_rows(rows)
    for epoch in (0, 1):
        assert evenly_spaced([r["step"] - 5 * epoch for r in evals if r["epoch"] == epoch], 5, 2), evals
    saved = sorted(int(p.stem.split("-")[1]) for p in (accum_run["out"] / "checkpoints").glob("step-*.pt"))
    assert saved == [2, 4, 5, 6, 8, 10]  # every 2nd update, and each epoch's end
    # each epoch's batches cover each training example once
    for epoch in (0, 1):
        batches = accum_run["loaded"][9 * epoch: 9 * epoch + 9]
        for task in TASKS:
            seen = [i for t, ix in batches if t == task for i in ix]
            assert sorted(seen) == list(range(N)), (epoch, task)


def test_an_accumulated_updates_record_holds_each_tasks_mean_loss(accum_run):
    """The step record's loss_TASK (--log-every 1: a window of one update) is the mean of that task's batch
    losses in the update (stepper.accumulated_step: "each task's mean over the groups"); a task the update did
    not train keeps its last value, and an epoch starts afresh (the epoch record: the mean over the epoch)."""
    losses, rows = accum_run["losses"], accum_run["rows"]
    assert len(losses) == sum(accum_run["per_update"]) == 18  # one task loss per mtdnn batch
    last, start, epoch_losses = {}, 0, {}
    for u, (n, record) in enumerate(zip(accum_run["per_update"], step_rows(rows)), 1):
        if u in (1, 6):
            last, epoch_losses = {}, {}
        mine = losses[start: start + n]
        start += n
        for task in {t for t, _ in mine}:
            last[task] = float(np.mean([v for t, v in mine if t == task]))
            epoch_losses.setdefault(task, []).append(last[task])
        assert {k[5:]: v for k, v in record.items() if k.startswith("loss_")} == pytest.approx(last, rel=1e-6), u
        if u in (5, 10):
            end = epoch_rows(rows)[u // 5 - 1]
            assert {k[11:]: v for k, v in end.items() if k.startswith("train_loss_")} == pytest.approx(
                {t: float(np.mean(v)) for t, v in epoch_losses.items()}, rel=1e-6)


def test_accumulation_schedules_the_rate_over_updates(accum_run):
    """The schedule's length is the updates' count, 2 x 5 = 10, its warm-up 0.2 x 10 = 2 updates."""
    want = documented_rates(PEAK, 10, 2)
    assert accum_run["applied"] == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert [r["lr"] for r in step_rows(accum_run["rows"])] == pytest.approx(want, rel=1e-12, abs=1e-15)


# ----------------------------------------------------------------------------- steps per epoch by hand


CASES = {  # options -> (steps of one epoch, per task: (examples trained, of how many), or None where sampled)
    "mtdnn": ({}, 3 * math.ceil(12 / 5), {"sst": (12, 12), "para": (12, 12), "sts": (12, 12)}),
    "round-robin": ({"task_sampling": "round-robin"}, 9, {"sst": (12, 12), "para": (12, 12), "sts": (12, 12)}),
    "proportional": ({"task_sampling": "proportional"}, 9, None),
    "annealed": ({"task_sampling": "annealed"}, 9, None),
    "mixed": ({"task_sampling": "mixed"}, math.ceil(36 / 5), {"sst": (12, 12), "para": (12, 12), "sts": (12, 12)}),
    "capped": ({"max_batches_per_task": 2}, 3 * 2, None),  # 2 batches a task: 5 + 5 or 5 + 2 examples
    "subset": ({"max_train_examples": 7, "max_eval_examples": 5}, 3 * math.ceil(7 / 5),
               {"sst": (7, 7), "para": (7, 7), "sts": (7, 7)}),
    "pair-swap": ({"pair_swap": True}, math.ceil(12 / 5) + 2 * math.ceil(24 / 5),
                  {"sst": (12, 12), "para": (24, 24), "sts": (24, 24)}),
    "mixed-pair-swap": ({"task_sampling": "mixed", "pair_swap": True}, math.ceil(60 / 5),
                        {"sst": (12, 12), "para": (24, 24), "sts": (24, 24)}),
    "two-tasks": ({"tasks": ("sst", "sts")}, 2 * 3, {"sst": (12, 12), "sts": (12, 12)}),
    "log-every-4": ({"log_every": 4}, 9, {"sst": (12, 12), "para": (12, 12), "sts": (12, 12)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_steps_per_epoch_from_the_data_sizes(root, case, monkeypatch):
    """One epoch at batch 5 on 12 examples per task: the steps the run took (its updates, its step records
    every --log-every, its epoch record) are the count worked out from the sizes, and an epoch trains no
    example twice: each once uncapped; 2 batches a task under --max-batches-per-task 2."""
    options, steps, examples = CASES[case]
    cfg = tiny_config(root, f"count-{case}", epochs=1, batch_size=5, save_every=0, test_predictions=False,
                      **options)
    loaded, updates = [], []
    real = Run.load_batch
    monkeypatch.setattr(Run, "load_batch", lambda self, tb: loaded.append((tb.task, tb.indices)) or real(self, tb))
    train(cfg, on_update=lambda st: updates.append(1))
    rows = records(cfg.out_dir)
    every = options.get("log_every", 1)
    assert len(updates) == steps
    assert [r["step"] for r in step_rows(rows)] == list(range(every, steps + 1, every))
    assert [(r["epoch"], r["step"]) for r in epoch_rows(rows)] == [(0, steps)]
    if examples is not None:
        for task, (n, of) in examples.items():
            seen = [i for t, ix in loaded if t == task for i in ix]
            assert len(seen) == len(set(seen)) == n and set(seen) <= set(range(of)), (task, seen)
        assert {t for t, _ in loaded} == set(examples)
    if case == "capped":
        for task in TASKS:
            batches = [ix for t, ix in loaded if t == task]
            seen = [i for ix in batches for i in ix]
            assert len(batches) == 2 and len(seen) == len(set(seen)) and set(seen) <= set(range(12)), batches
    if case == "subset":  # --max-eval-examples 5: the dev files hold 5 dev examples, scored as recorded
        folder = Path(cfg.predictions_folder())
        for task in TASKS:
            ids = read_predictions(folder / f"{task}-dev-output.csv")
            assert len(ids) == 5 and set(ids) <= set(GOLD[task])
        assert_scores(hand_metrics(folder), {k[4:]: v for k, v in eval_rows(rows)[-1].items()
                                             if k.startswith("dev_")})


def test_the_subsets_are_seeded(root):
    """--max-train-examples / --max-eval-examples: a subset of the file's examples, the same for a seed, another
    for another seed."""
    _, enc = inputs(root)
    tok = Tokenizer.from_checkpoint(enc)

    def chosen(seed):
        cfg = tiny_config(root, "subsets", max_train_examples=7, max_eval_examples=5, seed=seed,
                          test_predictions=False)
        data = load_data(cfg, tok)
        return ({t: [e.id for e in d.examples] for t, d in data.train.items()},
                {t: [e.id for e in d.examples] for t, d in data.dev.items()})

    a, again, other = chosen(3), chosen(3), chosen(4)
    assert a == again and a != other
    for split, n in ((0, 7), (1, 5)):
        for task in TASKS:
            ids = a[split][task]
            assert len(set(ids)) == n and set(ids) <= set(GOLD[task])


# ----------------------------------------------------------------------------- early stopping


@pytest.fixture(scope="module")
def patience_run(root):
    """Nothing learnt (zero gradients, no weight decay): every evaluation ties. 3 evaluations an epoch of 9
    steps (at 3, 6, 9), --early-stop-patience 3: the first evaluation is kept, the next 3 bring no new best,
    so the run stops at the 4th, step 12, a third into epoch 1. What the run wrote, read at once."""
    cfg = tiny_config(root, "patience", epochs=3, batch_size=5, evals_per_epoch=3, early_stop_patience=3,
                      weight_decay=0.0, save_every=0)
    metrics = train(cfg, on_update=zero_gradients)
    out = Path(cfg.out_dir)
    folder = out / "predictions"
    return {"cfg": cfg, "out": out, "metrics": metrics, "rows": records(out), "best": best_pt(out),
            "metrics_bytes": (out / "metrics.jsonl").read_bytes(), "log": (out / "train.log").read_text(),
            "manifest": json.loads((folder / "manifest.json").read_text()),
            "csv": {p.name: p.read_bytes() for p in sorted(folder.glob("*.csv"))}}


def test_patience_counts_evaluations_not_epochs_and_may_stop_mid_epoch(patience_run):
    rows = patience_run["rows"]
    evals = eval_rows(rows)
    assert [r["step"] for r in evals] == [3, 6, 9, 12]
    assert len({r["dev_overall"] for r in evals}) == 1  # all tied
    assert [r["step"] for r in step_rows(rows)] == list(range(1, 13))  # nothing after the stopping evaluation
    assert [(r["epoch"], r["step"]) for r in epoch_rows(rows)] == [(0, 9)]  # epoch 1 never ended
    assert "early stop: 3 dev evaluations without a new best (--early-stop-patience 3)" in patience_run["log"]


def test_a_tie_keeps_the_first_evaluation(patience_run):
    best = patience_run["best"]
    assert (best["epoch"], best["step"]) == (0, 3)
    assert patience_run["metrics"] == best["metrics"]
    manifest = patience_run["manifest"]
    assert (manifest["epoch"], manifest["step"]) == (0, 3) and manifest["dev_metrics"] == best["metrics"]


def test_resume_auto_after_a_mid_epoch_stop_ends_the_same(patience_run):
    """docs/training.md counts a run stopped by patience at an epoch's end as finished; one stopped mid-epoch
    goes on from its last checkpoint (epoch 0's end) and must stop at the same evaluation, with the same
    records and prediction files."""
    cfg = dataclasses.replace(patience_run["cfg"], resume="auto")
    metrics = train(cfg, on_update=zero_gradients)
    out = patience_run["out"]
    assert metrics == patience_run["metrics"]
    assert (out / "metrics.jsonl").read_bytes() == patience_run["metrics_bytes"]
    assert {p.name: p.read_bytes() for p in sorted((out / "predictions").glob("*.csv"))} == patience_run["csv"]
    assert best_pt(out) == patience_run["best"]


def test_a_stop_at_an_epochs_end_is_a_finished_run(root, monkeypatch):
    """--early-stop-patience 1, one evaluation an epoch, nothing learnt: epoch 0 is kept, epoch 1 brings no new
    best, and the run stops there (2 of 3 epochs). docs/training.md: such a run is finished; --resume auto
    says so, builds nothing and writes nothing."""
    cfg = tiny_config(root, "patience-end", epochs=3, batch_size=5, early_stop_patience=1, weight_decay=0.0,
                      save_every=0, test_predictions=False)
    metrics = train(cfg, on_update=zero_gradients)
    out = Path(cfg.out_dir)
    rows = records(out)
    assert [(r["epoch"], r["step"]) for r in eval_rows(rows)] == [(0, 9), (1, 18)]
    assert [r["step"] for r in step_rows(rows)] == list(range(1, 19))
    assert (best_pt(out)["epoch"], best_pt(out)["step"]) == (0, 9)
    before = {str(f): (f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(out.rglob("*"))}

    def no_model(*a, **k):
        raise AssertionError("a finished run was built again")
    monkeypatch.setattr(trainer_module, "build_model", no_model)
    assert train(dataclasses.replace(cfg, resume="auto")) == metrics
    assert {str(f): (f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(out.rglob("*"))} == before


# ----------------------------------------------------------------------------- non-finite steps


def nan_on(calls: set[int] | None = None, after: int | None = None):
    """A task_loss that is NaN on the given 1-based calls (or on every call after `after`)."""
    real, n = stepper_module.task_loss, [0]

    def loss(task, out, labels):
        n[0] += 1
        bad = (calls is not None and n[0] in calls) or (after is not None and n[0] > after)
        return real(task, out, labels) * (float("nan") if bad else 1.0)
    return loss


def test_max_bad_steps_counts_non_finite_steps_in_a_row(root, monkeypatch):
    """--max-bad-steps 2 with every other update non-finite: never 2 in a row, so the run ends; the skipped
    updates have no record (one task loss per mtdnn update: call u is update u)."""
    monkeypatch.setattr(stepper_module, "task_loss", nan_on(calls={1, 3, 5, 7, 9}))
    cfg = tiny_config(root, "alternate-nan", epochs=1, batch_size=5, max_bad_steps=2, save_every=0,
                      test_predictions=False)
    train(cfg)
    rows = records(cfg.out_dir)
    assert [r["step"] for r in step_rows(rows)] == [2, 4, 6, 8]
    log = (Path(cfg.out_dir) / "train.log").read_text()
    assert log.count("step skipped (1 in a row)") == 5 and "(2 in a row)" not in log


def test_the_non_finite_stop_names_the_step_as_the_records_do(root, monkeypatch):
    """The --max-bad-steps error and each skip's warning number the update from 1, as metrics.jsonl, the
    checkpoints (step-N.pt), --save-every and the interruption message do (they had numbered it from 0):
    updates 1 and 2 train (metrics.jsonl: steps 1, 2), updates 3 and 4 are non-finite, the last is step 4."""
    monkeypatch.setattr(stepper_module, "task_loss", nan_on(after=2))
    cfg = tiny_config(root, "nan-stop", epochs=1, batch_size=5, max_bad_steps=2, save_every=0,
                      test_predictions=False)
    with pytest.raises(NonFiniteLossError) as e:
        train(cfg)
    assert [r["step"] for r in step_rows(records(cfg.out_dir))] == [1, 2]
    assert "2 consecutive non-finite steps, the last at step 4 " in str(e.value), str(e.value)


# ----------------------------------------------------------------------------- faults this audit found (fixed)


def test_the_warm_up_length_is_the_share_as_written(root):
    """--warmup-ratio R warms up over R of the updates, rounded down as R is written: 0.58 of 50 is 29 (it had
    been int(50 * 0.58) = 28 in floating point, 28.999999999999996: the first update at LR / 28). One epoch of
    50 updates (batch 1, --max-train-examples 10, --pair-swap: 10 + 20 + 20 examples)."""
    cfg = tiny_config(root, "warmup", epochs=1, batch_size=1, max_train_examples=10, pair_swap=True,
                      warmup_ratio=0.58, save_every=0, test_predictions=False)
    train(cfg)
    lrs = [r["lr"] for r in step_rows(records(cfg.out_dir))]
    assert len(lrs) == 50  # the steps per epoch by hand: 10 + 2 x 10 + 2 x 10 at batch 1
    assert lrs == pytest.approx(documented_rates(PEAK, 50, 29), rel=1e-12), (lrs[0], PEAK / 29)


def test_train_seconds_leaves_out_the_mid_epoch_evaluations(root, monkeypatch):
    """An epoch's train_seconds is "the training steps alone, without evaluation or prediction" (docs/api.md),
    the search's and the studies' cost: the --evals-per-epoch evaluations inside the epoch are left out as
    the epoch-end one is (they had been counted). One epoch of 9 tiny steps with --evals-per-epoch 3, each
    mid-epoch evaluation made 0.75 s slower: train_seconds stays under 0.75 s."""
    real = Run.evaluate_mid_epoch

    def slow(self, epoch, steps):
        time.sleep(0.75)
        return real(self, epoch, steps)

    monkeypatch.setattr(Run, "evaluate_mid_epoch", slow)
    cfg = tiny_config(root, "clock", epochs=1, batch_size=5, evals_per_epoch=3, save_every=0,
                      test_predictions=False)
    train(cfg)
    rows = records(cfg.out_dir)
    assert len(eval_rows(rows)) == 3
    (end,) = epoch_rows(rows)
    assert end["train_seconds"] < 0.75, end["train_seconds"]
