"""Data-parallel training (docs/distributed.md) against independent references: a one-process run of the
same global batches, the dev metrics' definitions computed by hand from the prediction files, which training
examples each rank's forward passes held (read from the token ids themselves), the learning-rate schedule as
docs/options.md states it, and torch.distributed's semantics (an all-reduce leaves every rank the same sum).

tests/test_distributed.py compares the models step by step (AdamW largely hides a gradient's scale: with the
gradients halved, this file's run A ends with 21 of 1312 word-embedding elements off, the rest within rounding)
and the dev records; here, what it does not: the gradient each update was made from, the examples each rank
trained on, the step records' losses and rates, the prediction files' contents, one writer, per-rank dropout
masks, a NaN on one rank, early stopping, a SIGTERM seen by one rank only, and ranks resumed from different
steps.

The data (every size odd, so no split over 2 ranks is even): train 13 / 11 / 9 examples (sst / para / sts),
dev 7 / 5 / 9, test 5 each; batch 5, so each epoch has 3 + 3 + 2 = 8 steps whose groups of 5 split 3 + 2, whose
last groups of 3 and 4 split 2 + 1 and 2 + 2, and para's last group of 1 leaves rank 1 an empty slice. Each
training sentence (the first of a pair) starts with a word of its own, its example's index (MARK), so that
what a forward pass trained on is read off its input ids.

One torchrun launch (2 gloo ranks) runs every distributed run; the one-process references (ref-A, ref-D,
ref-S) run in this process meanwhile. The runs:
  A  dropout off: equal to one process with the same config, to rounding;
  D  mixed steps, and S SMART's Bregman term alone: equal to one process like A;
  B  dropout on, sst and para only, a rate of 1e-9, 3 evaluations an epoch and --early-stop-patience 1 (the
     accuracies cannot move, so the second evaluation is no new best and the run stops), rank 1's loss NaN
     at update 2;
  C  A's config stopped by a SIGTERM sent to rank 1 alone during update STOP_AT, then resumed on 2 ranks;
  E  rank 0 resumed from C's checkpoint, rank 1 not: both must refuse.

Fault found and fixed (2026-11-30): --frozen-cache auto was decided from each node's own RAM, and only the disk
choice takes world_size barriers, so ranks on nodes of different RAM made different collective calls.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_distributed import _free_port
from tiny_runs import VOCAB, make_encoder, sent

from data.loaders import COURSE_FILES
from training.config.train_config import TrainConfig
from training.run.checkpointing import read_checkpoint
from training.run.trainer import train

REPO = Path(__file__).resolve().parents[1]
MARK = [f"mk{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(16)]  # one first word per training example
SIZES = {"sst": (13, 7), "para": (11, 5), "sts": (9, 9)}  # (train, dev): none a multiple of 2
N_TEST = 5
BATCH, EPOCHS, LR, WARMUP = 5, 2, 3e-3, 0.25
STEPS = EPOCHS * sum(math.ceil(n / BATCH) for n, _ in SIZES.values())  # 16, by hand: 2 x (3 + 3 + 2)
# the runs compared with one process: A, MT-DNN (one task a step); D, mixed steps (a group per task, the
# gradient of the sum of the task losses) of ceil(33 / 5) = 7 steps an epoch, many groups of 1;
# S: SMART's Bregman term alone (no adversarial pass, so no noise: deterministic with dropout off)
COMPARED = {"A": {}, "D": {"task_sampling": "mixed"}, "S": {"smart": True, "smart_lambda": 0.0, "smart_beta": 0.9}}
STEPS_OF = {"A": STEPS, "D": EPOCHS * math.ceil(sum(n for n, _ in SIZES.values()) / BATCH), "S": STEPS}
SAVE_EVERY = 4
STOP_AT = 3  # run C: the update during which rank 1 alone gets SIGTERM
WORLD = 2


def write_data(d: Path) -> Path:
    """Course-format files: train, dev and test of every task, other sentences in each (dev != train)."""
    d.mkdir(parents=True, exist_ok=True)
    header = {"sst": "\tid\tsentence", "para": "\tid\tsentence1\tsentence2", "sts": "\tid\tsentence1\tsentence2"}
    label = {"sst": "\tsentiment", "para": "\tis_duplicate", "sts": "\tsimilarity"}

    def rows(task: str, n: int, off: int, labelled: bool) -> str:
        out = []
        for i in range(n):
            first = (MARK[i] + " " if off == 0 else "") + sent(i + off, 2 + i % 3)
            text = first if task == "sst" else f"{first}\t{sent(i + off + 5, 2)}"
            gold = {"sst": f"{(3 * i + off) % 5}", "para": f"{float((i + off) % 3 == 0)}",
                    "sts": f"{((7 * i + off) % 11) / 2:.1f}"}[task]
            out.append(f"{i}\t{task[:2]}{off}_{i}\t{text}" + (f"\t{gold}" if labelled else ""))
        return "\n".join(out) + "\n"

    for task, (n_train, n_dev) in SIZES.items():
        (d / COURSE_FILES[task]["train"]).write_text(header[task] + label[task] + "\n" + rows(task, n_train, 0, True))
        (d / COURSE_FILES[task]["dev"]).write_text(header[task] + label[task] + "\n" + rows(task, n_dev, 3, True))
        (d / COURSE_FILES[task]["test"]).write_text(header[task] + "\n" + rows(task, N_TEST, 7, False))
    return d


def config(root: Path, name: str, **kw) -> TrainConfig:
    cfg = dict(model=str(root / "enc"), data_dir=str(root / "data"), epochs=EPOCHS, batch_size=BATCH,
               eval_batch_size=2, lr=LR, warmup_ratio=WARMUP, max_grad_norm=0.5, head_dropout=0.0, seed=3,
               device="cpu", precision="fp32", log_every=1, save_every=SAVE_EVERY, keep_last=100,
               evals_per_epoch=2, out_dir=str(root / name), predictions_dir=str(root / name / "pred"))
    return TrainConfig(**{**cfg, **kw})


# sst 3 + para 3 = 6 steps an epoch, evaluated after steps 2, 4 and 6; a checkpoint every step
RUN_B = dict(head_dropout=0.3, tasks=("sst", "para"), lr=1e-9, early_stop_patience=1, evals_per_epoch=3,
             save_every=1)
POISON_AT = 2  # run B: rank 1's loss of its 2nd training forward (update 2) is made NaN


class Recorder:
    """What one process trained on and with, read from the tensors: per optimiser update, each training
    forward's (task, the MARK index of each row's first word) and the gradients the update was made from;
    the weights after the last update (train() leaves best.pt's in the model on rank 0); and the mask of
    the first dropout with p > 0 (its zeroed positions)."""

    def __init__(self, kill_at: int | None = None, poison_at: int | None = None):
        self.forwards, self.steps, self.grads, self.mask, self.model = [], [], [], None, None
        self.kill_at = kill_at  # send this process SIGTERM during that update
        self.poison_at, self.n_forwards = poison_at, 0  # make the loss of that training forward NaN
        self.dist_initialized = []

    @contextlib.contextmanager
    def installed(self):
        from training.methods.stepper import Stepper
        terms, drop, update, rec = Stepper.loss_terms, torch.nn.Dropout.forward, Stepper._update, self

        def loss_terms(stepper, batch):
            if stepper.model.training:
                first = batch.inputs[0]["input_ids"][:, 1]  # after [CLS]: the first sentence's first word
                rec.forwards.append((batch.task, [int(t) - len(VOCAB) for t in first]))
                rec.n_forwards += 1
                if rec.n_forwards == rec.poison_at:
                    loss, parts = terms(stepper, batch)
                    return loss * float("nan"), {k: v * float("nan") for k, v in parts.items()}
            return terms(stepper, batch)

        def dropout(module, x):
            out = drop(module, x)
            if module.training and module.p > 0 and rec.mask is None:
                rec.mask = ((out == 0) & (x != 0)).clone()
            return out

        def after_update(stepper, *args):
            taken = update(stepper, *args)
            rec.model = {k: v.detach().clone() for k, v in stepper.model.state_dict().items()}
            return taken

        Stepper.loss_terms, torch.nn.Dropout.forward, Stepper._update = loss_terms, dropout, after_update
        try:
            yield self
        finally:
            Stepper.loss_terms, torch.nn.Dropout.forward, Stepper._update = terms, drop, update

    def on_update(self, stepper) -> None:
        self.steps.append(self.forwards)
        self.forwards = []
        self.grads.append({n: p.grad.detach().clone() for n, p in stepper.model.named_parameters()
                           if p.grad is not None})
        self.dist_initialized.append(torch.distributed.is_available() and torch.distributed.is_initialized())
        if self.kill_at == len(self.steps):
            os.kill(os.getpid(), signal.SIGTERM)

    def saved(self, **extra) -> dict:
        return {"steps": self.steps, "grads": self.grads, "mask": self.mask, "dist": self.dist_initialized,
                "model": self.model, **extra}


def recorded_train(cfg: TrainConfig, kill_at: int | None = None, poison_at: int | None = None) -> dict:
    rec = Recorder(kill_at, poison_at)
    with rec.installed():
        try:
            returned = train(cfg, on_update=rec.on_update)
        except Exception as e:  # the interrupted run
            from training.common.errors import TrainingInterrupted
            if not isinstance(e, TrainingInterrupted):
                raise
            returned = "interrupted"
    return rec.saved(returned=returned)


def rank_runs(root: Path) -> None:
    """Each rank (run by torchrun): runs A, D, S, B, C and E; saves what it recorded to ROOT/rank{r}.pt."""
    from training.methods.distributed import init_distributed
    with init_distributed("cpu") as d:
        assert d.world_size == WORLD
        out = {name: recorded_train(config(root, "dist-" + name, **kw)) for name, kw in COMPARED.items()}
        out |= {"B": recorded_train(config(root, "dist-B", **RUN_B), poison_at=POISON_AT if d.rank == 1 else None),
               "C1": recorded_train(config(root, "dist-C"), kill_at=STOP_AT if d.rank == 1 else None),
               "C2": recorded_train(config(root, "dist-C", resume="auto"))}
        # E: rank 0 resumes C's step-3 checkpoint, rank 1 starts afresh (as a rank that found none would)
        from training.common.errors import ConfigError
        step3 = str(root / "dist-C" / "checkpoints" / f"step-{STOP_AT:07d}.pt")
        try:
            train(config(root, "dist-E", resume=step3 if d.rank == 0 else None))
            out["E"] = "trained"
        except ConfigError as e:
            out["E"] = str(e)
        torch.save(out, root / f"rank{d.rank}.pt")


WORKER = """
import sys, torch
from pathlib import Path
torch.set_num_threads(1)
sys.path[:0] = [{repo!r}, {tests!r}]
from test_distributed_oracle import rank_runs
rank_runs(Path(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The torchrun launch of 2 ranks, and meanwhile, here, the one-process references of A, D and S, run
    as under `torchrun --nproc_per_node 1` (WORLD_SIZE=1 and the rest of its variables set)."""
    root = tmp_path_factory.mktemp("dpo")
    make_encoder(root / "enc", VOCAB + MARK)
    write_data(root / "data")
    script = root / "worker.py"
    script.write_text(WORKER.format(repo=str(REPO), tests=str(REPO / "tests")))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", str(script), str(root)]
    output = root / "torchrun.log"  # a file, not a pipe: the ranks' log must not fill a pipe read only at the end
    with open(output, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    threads, saved_env = torch.get_num_threads(), dict(os.environ)
    torch.set_num_threads(1)
    try:
        os.environ.update({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
        ref = {name: recorded_train(config(root, "ref-" + name, **kw)) for name, kw in COMPARED.items()}
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
    try:
        proc.wait(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks: the session it was started in
        proc.wait()
    assert proc.returncode == 0, output.read_text()[-8000:]
    ranks = [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    return {"root": root, "ref": ref, "ranks": ranks}


# ----------------------------------------------------------------------------- helpers: files read by hand

def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def step_records(run: Path) -> list[dict]:
    return [r for r in records(run) if "lr" in r]


def eval_records(run: Path) -> list[dict]:
    return [r for r in records(run) if "dev_overall" in r]


def course_rows(path: Path) -> list[list[str]]:
    """A course file's rows, split at tabs, without its header."""
    return [line.split("\t") for line in path.read_text().splitlines()[1:]]


def prediction_rows(path: Path) -> list[tuple[str, str]]:
    """`id , prediction` rows of a course prediction file, as strings."""
    lines = path.read_text().splitlines()
    assert lines[0].split("\t")[0].strip() == "id"
    return [tuple(p.strip() for p in line.split(",")) for line in lines[1:]]


def hand_metrics(pred: Path, data: Path, tasks) -> dict[str, float]:
    """Accuracy, Pearson's r (numpy's corrcoef) and the course's overall score from the files alone."""
    out = {}
    for task in tasks:
        gold = np.array([float(r[-1]) for r in course_rows(data / COURSE_FILES[task]["dev"])])
        p = np.array([float(v) for _, v in prediction_rows(pred / f"{task}-dev-output.csv")])
        key = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_pearson"}[task]
        out[key] = float(np.corrcoef(p, gold)[0, 1]) if task == "sts" else float(np.mean(p == gold))
    parts = [out.get("sst_acc"), out.get("para_acc")] + ([(out["sts_pearson"] + 1) / 2] if "sts_pearson" in out else [])
    out["overall"] = float(np.mean([x for x in parts if x is not None]))
    return out


def close_states(a: dict, b: dict, what: str, tol: float = 1e-4) -> None:
    """Equal to rounding, where AdamW turns rounding noise in a (near-)zero gradient into a step of up to
    lr (tests/test_distributed.py::assert_close says which): at most one element in a thousand may differ,
    and by less than LR. A wrong gradient (scaled, or from other examples) moves most elements."""
    for name in a:
        x, y = a[name].float(), b[name].float()
        if name.endswith("qkv.bias"):  # the key bias: zero exact gradient (softmax is shift-invariant)
            H = x.numel() // 3
            x, y = torch.cat([x[:H], x[2 * H:]]), torch.cat([y[:H], y[2 * H:]])
        off = (x - y).abs() > tol + tol * y.abs()
        assert int(off.sum()) <= x.numel() // 1000 and float((x - y).abs().max()) < LR, (
            what, name, int(off.sum()), x.numel(), float((x - y).abs().max()))


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([grads[k].flatten() for k in sorted(grads)])


# ----------------------------------------------------------------------------- which examples each rank saw

@pytest.mark.parametrize("name", list(COMPARED))
def test_each_rank_trains_on_its_contiguous_slice_and_each_epoch_on_every_example_once(runs, name):
    """Read from the input ids of the forward passes: at every update the ranks run the one process's task
    groups, in its order, rank 0 on the first ceil(n/2) rows of the one process's group and rank 1 on the rest
    (7 -> 4 + 3, as docs/distributed.md says); a group of 1 leaves rank 1 an empty slice, where it runs the
    group's first example (with weight 0). Each epoch, the real slices hold every training example once."""
    ref = runs["ref"][name]["steps"]
    ranks = [r[name]["steps"] for r in runs["ranks"]]
    steps = STEPS_OF[name]
    assert len(ref) == steps and all(len(s) == steps for s in ranks)
    empty_slices = 0
    for epoch in range(EPOCHS):
        seen = {t: [] for t in SIZES}
        for k in range(epoch * steps // EPOCHS, (epoch + 1) * steps // EPOCHS):
            assert [t for t, _ in ranks[0][k]] == [t for t, _ in ranks[1][k]] == [t for t, _ in ref[k]], k
            for (task, rows), (_, r0), (_, r1) in zip(ref[k], ranks[0][k], ranks[1][k]):
                if len(rows) >= WORLD:
                    half = math.ceil(len(rows) / WORLD)
                    assert (r0, r1) == (rows[:half], rows[half:]), (k, rows, r0, r1)
                    seen[task] += r0 + r1
                else:
                    assert r0 == rows and r1 == rows[:1], (k, rows, r0, r1)  # rank 1: the dummy of weight 0
                    empty_slices += 1
                    seen[task] += r0
        for task, (n, _) in SIZES.items():
            assert sorted(seen[task]) == list(range(n)), (epoch, task, seen[task])
    assert empty_slices >= EPOCHS  # (A: para's last group of 1 each epoch) the empty slice was exercised


# ----------------------------------------------------------------------------- the gradient's scale

@pytest.mark.parametrize("name", list(COMPARED))
def test_every_update_uses_the_one_process_gradient_summed_not_averaged(runs, name):
    """The gradient each update was made from (unclipped, as on_update sees it) is the same on both ranks,
    bit for bit (one all-reduce gives every rank the same sum), and is the one process's gradient of the
    global batch's mean loss (mixed steps: of the sum of the task groups' means): at update 1, from the same
    weights, to 1e-5; later to rounding. An average over the ranks would be half of it, a sum of unweighted
    slice means up to twice."""
    ref = runs["ref"][name]["grads"]
    g0, g1 = (r[name]["grads"] for r in runs["ranks"])
    assert len(ref) == len(g0) == len(g1) == STEPS_OF[name]
    for k in range(STEPS_OF[name]):
        assert g0[k].keys() == g1[k].keys() == ref[k].keys(), k  # the same parameters have gradients
        a, b, want = flat(g0[k]), flat(g1[k]), flat(ref[k])
        assert torch.equal(a, b), k
        tol = 1e-5 if k == 0 else 1e-2  # update 1: rounding (mixed: 2.7e-6); later AdamW amplifies it (1.2e-3)
        assert float((a - want).norm() / want.norm()) < tol, (k, float(a.norm()), float(want.norm()))


@pytest.mark.parametrize("name", list(COMPARED))
def test_models_identical_on_both_ranks_and_equal_to_one_process(runs, name):
    one, two = (r[name]["model"] for r in runs["ranks"])
    for k in one:
        assert torch.equal(one[k], two[k]), k
    close_states(one, runs["ref"][name]["model"], "final model")
    close_states(read_checkpoint(runs["root"] / f"dist-{name}" / "best.pt")["model"],
                 read_checkpoint(runs["root"] / f"ref-{name}" / "best.pt")["model"], "best.pt")


# ----------------------------------------------------------------------------- the step records

@pytest.mark.parametrize("name", list(COMPARED))
def test_step_records_hold_the_global_losses_and_the_documented_rates_once_each(runs, name):
    """metrics.jsonl: one record per update, steps 1..S in order (S counted from the data by hand), each
    written once although two ranks trained; the rate of update k (1-based) is docs/options.md's: LR k / W
    over the W = S / 4 warm-up updates, then linear decay to 0 over all S global updates; the losses are
    the global batch's (and S's Bregman terms), the one process's to rounding."""
    dist, ref = step_records(runs["root"] / f"dist-{name}"), step_records(runs["root"] / f"ref-{name}")
    S = STEPS_OF[name]
    assert [r["step"] for r in dist] == list(range(1, S + 1))
    W = int(S * WARMUP)
    for r, s in zip(dist, ref, strict=True):
        k = r["step"]
        want = LR * k / W if k <= W else LR * (S - (k - 1)) / (S - W)
        assert r["lr"] == pytest.approx(want, rel=1e-12) == s["lr"], k
        assert r.keys() == s.keys(), k
        for key in set(r) - {"step", "epoch", "lr"}:  # the losses (and S's Bregman terms d_breg_TASK)
            # update 1 from the same weights; later AdamW amplifies rounding (measured up to 6e-4 of a small
            # loss); a wrong weighting is off by tens of percent
            assert r[key] == pytest.approx(s[key], rel=1e-6 if k == 1 else 5e-3, abs=1e-6), (k, key)


# ----------------------------------------------------------------------------- dev evaluation and prediction files

@pytest.mark.parametrize("name", list(COMPARED))
def test_dev_and_test_prediction_files_cover_every_example_once_in_file_order(runs, name):
    """Dev sets of 7, 5 and 9 examples and test sets of 5 over 2 ranks: each prediction file lists the data
    file's ids once each, in the file's order (no padded duplicate, none missing), with the one process's
    predictions (classes exactly, similarity to 2e-4: rounding, and the 4 decimals written)."""
    root = runs["root"]
    for task, (_, n_dev) in SIZES.items():
        for split, n in (("dev", n_dev), ("test", N_TEST)):
            ids = [r[1] for r in course_rows(root / "data" / COURSE_FILES[task][split])]
            got = prediction_rows(root / f"dist-{name}" / "pred" / f"{task}-{split}-output.csv")
            want = prediction_rows(root / f"ref-{name}" / "pred" / f"{task}-{split}-output.csv")
            assert [i for i, _ in got] == ids and len(ids) == n, (task, split)
            if task == "sts":
                assert np.allclose([float(v) for _, v in got], [float(v) for _, v in want], atol=2e-4), (task, split)
            else:
                assert got == want, (task, split)


@pytest.mark.parametrize("name", list(COMPARED))
def test_dev_metrics_are_those_of_the_prediction_files_computed_by_hand(runs, name):
    """The manifest's, the best metrics.jsonl record's, and what train() returned on each rank: the per-example
    definitions (accuracy, Pearson's r, the course's overall) applied to the dev prediction files; the best
    record is the one best.pt was written at (the first highest dev_overall); every dev record is the one
    process's to rounding."""
    root = runs["root"]
    run = root / f"dist-{name}"
    hand = hand_metrics(run / "pred", root / "data", SIZES)
    manifest = json.loads((run / "pred" / "manifest.json").read_text())
    evals = eval_records(run)
    assert len(evals) == 2 * EPOCHS
    best = max(evals, key=lambda r: r["dev_overall"])  # max keeps the first of equals, as `>` does
    assert manifest["step"] == best["step"] == read_checkpoint(run / "best.pt")["step"]
    for key, value in hand.items():
        assert manifest["dev_metrics"][key] == pytest.approx(value, abs=2e-4), key  # sts: 4 decimals in the file
        assert best[f"dev_{key}"] == pytest.approx(manifest["dev_metrics"][key], rel=1e-12), key
        for r in runs["ranks"]:
            assert r[name]["returned"][key] == manifest["dev_metrics"][key], key
    ref = eval_records(root / f"ref-{name}")
    for a, b in zip(evals, ref, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith("dev_") or key.startswith("train_loss_"):
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (a["step"], key)


# ----------------------------------------------------------------------------- one writer

def test_rank_0_alone_writes_the_log_checkpoints_and_records(runs):
    """train.log holds rank 0's lines once (one 'epoch N:' line per epoch, one data-parallel line); the
    checkpoints are exactly those of --save-every and the epoch ends, with no temp file left, each holding
    both ranks' random streams; metrics.jsonl has each step once (checked with the step records)."""
    run = runs["root"] / "dist-A"
    log = (run / "train.log").read_text().splitlines()
    assert sum("data-parallel over 2 ranks" in line for line in log) == 1
    for epoch in range(EPOCHS):
        assert sum(f"epoch {epoch}: {STEPS // EPOCHS} steps" in line for line in log) == 1, epoch
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    saves = sorted(set(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY)) | {STEPS // EPOCHS * (e + 1) for e in range(EPOCHS)})
    assert names == [f"step-{s:07d}.pt" for s in saves]
    leftovers = [p.name for p in run.rglob("*") if p.name.endswith(".tmp") or ".tmp" in p.name]
    assert not leftovers
    ckpt = read_checkpoint(run / "checkpoints" / names[0])
    assert ckpt["run_state"]["global_step"] == saves[0] and len(ckpt["rng_ranks"]) == WORLD


def test_a_torchrun_of_one_process_never_initialises_torch_distributed(runs):
    """The references ran with torchrun's variables for one process (WORLD_SIZE=1): no process group."""
    for name in COMPARED:
        assert runs["ref"][name]["dist"] == [False] * STEPS_OF[name]
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())


# ----------------------------------------------------------------------------- random streams

def test_dropout_masks_differ_between_ranks(runs):
    """Run B, dropout 0.3 on the heads: the first dropout of each rank (the same step, the same head) zeroes
    other positions, and a checkpoint keeps two different streams."""
    m0, m1 = (r["B"]["mask"] for r in runs["ranks"])
    assert m0 is not None and m1 is not None and m0.shape[1:] == m1.shape[1:]
    n = min(len(m0), len(m1))
    assert m0[:n].any() and m1[:n].any() and not torch.equal(m0[:n], m1[:n])
    ckpt = read_checkpoint(runs["root"] / "dist-B" / "checkpoints" / "step-0000001.pt")
    a, b = ckpt["rng_ranks"]
    assert not torch.equal(torch.as_tensor(a["rng"]["torch"]), torch.as_tensor(b["rng"]["torch"]))


# ----------------------------------------------------------------------------- a NaN on one rank; early stopping

def test_a_nan_loss_on_one_rank_skips_that_update_on_every_rank(runs):
    """Run B: rank 1's loss at update 2 is NaN (rank 0's is finite). Both ranks skip update 2 (neither
    updates from it), metrics.jsonl has no record of step 2, and the ranks' weights stay identical."""
    b0, b1 = (r["B"] for r in runs["ranks"])
    assert len(b0["steps"]) == len(b1["steps"])
    steps = [r["step"] for r in step_records(runs["root"] / "dist-B")]
    assert POISON_AT not in steps and steps == [k for k in range(1, steps[-1] + 1) if k != POISON_AT]
    assert len(b0["steps"]) == len(steps)  # the updates taken: all but the skipped one
    for k in b0["model"]:
        assert torch.equal(b0["model"][k], b1["model"][k]), k


def test_early_stopping_stops_every_rank_after_the_same_update(runs):
    """Run B (--early-stop-patience 1, 3 evaluations an epoch, accuracies that a rate of 1e-9 cannot move):
    from its dev records, by hand, the run stops at the first evaluation that is no new best (mid-epoch,
    step 4); both ranks trained up to exactly that step and returned the same metrics, those of the best
    record and of the prediction files."""
    run = runs["root"] / "dist-B"
    evals = eval_records(run)
    best, stop = -1.0, None
    for r in evals:
        if r["dev_overall"] > best:
            best = r["dev_overall"]
        else:
            stop = r["step"]
            break
    assert stop == 4 and evals[-1]["step"] == stop
    b0, b1 = (r["B"] for r in runs["ranks"])
    for b in (b0, b1):  # updates taken, plus the one skipped (the NaN)
        assert len(b["steps"]) + 1 == stop
    assert step_records(run)[-1]["step"] == stop
    assert b0["returned"] == b1["returned"]
    assert b0["returned"]["overall"] == pytest.approx(best, rel=1e-12)
    assert hand_metrics(run / "pred", runs["root"] / "data", ("sst", "para"))["overall"] == pytest.approx(best)


# ----------------------------------------------------------------------------- a signal seen by one rank

def test_sigterm_to_one_rank_stops_both_after_the_same_update_and_the_resume_is_exact(runs):
    """Run C: rank 1 alone gets SIGTERM during update 3. Both ranks finish that update and stop (neither
    takes update 4), rank 0 writes the step-3 checkpoint; resumed on 2 ranks, each rank trains on the
    examples of the uninterrupted run A and ends with A's model bit for bit (docs: same number of ranks,
    exactly the uninterrupted run), and metrics.jsonl is A's."""
    root = runs["root"]
    for r in runs["ranks"]:
        first, rest = r["C1"], r["C2"]
        assert first["returned"] == "interrupted" and len(first["steps"]) == STOP_AT
        assert first["steps"] + rest["steps"] == r["A"]["steps"]  # the same examples, step by step
        for k in r["A"]["model"]:
            assert torch.equal(rest["model"][k], r["A"]["model"][k]), k
    assert read_checkpoint(root / "dist-C" / "checkpoints" / f"step-{STOP_AT:07d}.pt")["run_state"][
        "global_step"] == STOP_AT

    def clock_free(run):
        return [{k: v for k, v in r.items() if k not in ("train_seconds",)} for r in records(run)]

    assert clock_free(root / "dist-C") == clock_free(root / "dist-A")


# ----------------------------------------------------------------------------- resumed from different steps

def test_ranks_resumed_from_different_steps_refuse_together(runs):
    """Run E: rank 0 resumes at step 3, rank 1 finds no checkpoint (a node that does not see --out-dir):
    docs/distributed.md, 'The ranks check that they resumed from the same step': both refuse, in one line,
    and nothing trains."""
    for r in runs["ranks"]:
        assert "resumed from different checkpoints" in r["E"], r["E"]
    assert not (runs["root"] / "dist-E" / "metrics.jsonl").exists()


# ----------------------------------------------------------------------------- every rank, the same collectives

GIB = 2 ** 30


def test_frozen_cache_auto_is_one_choice_for_every_rank(monkeypatch):
    """torch.distributed needs every rank to make the same collective calls in the same order. Under
    --frozen-cache auto each node counts its ranks against its own RAM (docs/distributed.md), and only the
    disk takes turns through world_size barriers: it had chosen per node, so on two machines whose RAM
    straddles the threshold one node's ranks went on to the first step's all-reduce while the other's waited
    in barrier(). Now one node short of RAM puts every rank on the disk.

    8 ranks, 4 a node, a training cache estimated at 3 GiB a rank; node 0 has 64 GiB (12 GiB < 64/4: memory
    alone), node 1 32 GiB (12 GiB >= 32/4: disk). The collectives are counted, without a process group: Dist.any,
    the all-reduce of the verdict, is played by the flags of both nodes' first ranks."""
    from training.methods import cache_keeper
    from training.methods.distributed import Dist

    collectives: dict[int, list[str]] = {}
    flags: dict[int, bool] = {}
    modes: dict[int, str] = {}
    nodes = ((0, 64 * GIB), (4, 32 * GIB))  # the first rank of each node

    class CountingDist(Dist):
        def barrier(self) -> None:
            collectives[self.rank].append("barrier")

        def any(self, flag: bool) -> bool:  # an all-reduce: every rank's flag, once each has given its own
            collectives[self.rank].append("any")
            flags[self.rank] = flag
            return any(flags.values())

    def build(model, train, tokenizer, device, mode, *rest, **kw):
        modes[d.rank] = mode
        return "a cache"

    monkeypatch.setattr(cache_keeper, "estimate_bytes", lambda train, hidden: 3 * GIB)
    monkeypatch.setattr(cache_keeper, "build_frozen_cache", build)
    model = type("M", (), {"encoder": type("E", (), {"config": type("C", (), {"hidden_size": 32})})})
    flags.update({0: False, 4: True})  # what each node's RAM says (checked below, as each rank gives it)
    for rank, ram in nodes:
        pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": ram // 4096}
        monkeypatch.setattr(cache_keeper.os, "sysconf", lambda name, pages=pages: pages[name])
        collectives[rank] = []
        d = CountingDist(rank=rank, world_size=8, local_rank=rank % 4, local_world_size=4, device=torch.device("cpu"))
        assert cache_keeper.frozen_cache_per_rank(d, model, {}, None, d.device, "auto", "unused") == "a cache"
    assert flags == {0: False, 4: True}  # node 0 alone would have kept the cache in memory
    assert collectives[0] == collectives[4] == ["any"] + ["barrier"] * 8, collectives
    assert modes == {0: "disk", 4: "disk"}
