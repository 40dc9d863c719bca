"""Data-parallel training (training/methods/distributed.py): two gloo ranks on CPU, launched by torchrun, train
the tiny model of test_training and must end where one process ends on the same global batches.

The rank runs all happen in one torchrun launch (a module fixture); the tests compare its outputs.
Batch size 7 splits unevenly over 2 ranks (4 + 3), and each task's last batch of 8 examples holds
one example, so rank 1 has an empty slice there. Dropout is off wherever runs are compared across
different numbers of ranks (the ranks draw other masks than one process would).
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_training import make_checkpoint, write_data

from data.sampler import epoch_schedule, mixed_schedule
from training.config.train_config import TrainConfig
from training.methods.distributed import local_step
from training.run.checkpointing import read_checkpoint
from training.run.trainer import train

REPO = Path(__file__).resolve().parents[1]
RESUME_AT = 3  # mid-epoch 0 of the mtdnn runs (6 steps an epoch)

# Each scenario: TrainConfig overrides on top of base(). Run by both 2 ranks and one process.
LR = 3e-3
SCENARIOS = {
    "mtdnn": {},
    "pcgrad": {"pcgrad": True, "task_sampling": "mixed", "evals_per_epoch": 2},  # rank 0 evaluates mid-epoch too
    "frozen": {"freeze_upto": 1, "frozen_cache": "disk", "task_sampling": "mixed"},
    "lora": {"peft": "lora:r=2", "freeze_upto": 1, "frozen_cache": "disk"},  # LoRA above a cached prefix
}


def base(root: Path, name: str, **kw) -> TrainConfig:
    cfg = dict(model=str(root / "ckpt"), data_dir=str(root / "data"), epochs=2, batch_size=7, eval_batch_size=8,
               lr=LR, warmup_ratio=0.0, head_dropout=0.0, seed=3, device="cpu", precision="fp32",
               log_every=1, save_every=1, keep_last=100, cache_dir=str(root / "cache" / name),
               out_dir=str(root / name), predictions_dir=str(root / name / "pred"))
    return TrainConfig(**{**cfg, **kw})


# Run by torchrun on each rank: python WORKER ROOT. One process group for all the runs (train() joins
# an existing group; a second default group in one process could reuse the first one's store keys).
WORKER = """
import sys, torch
from pathlib import Path
torch.set_num_threads(1)
sys.path[:0] = [{repo!r}, {tests!r}]
from test_distributed import SCENARIOS, RESUME_AT, base, fp16_ranks, smart_teachers
from training.methods.distributed import init_distributed
from training.run.trainer import train
root = Path(sys.argv[1])
ckpt = lambda run: str(root / run / "checkpoints" / f"step-{{RESUME_AT:07d}}.pt")
with init_distributed("cpu") as d:
    assert d.world_size == 2
    for name, kw in SCENARIOS.items():
        train(base(root, "dist-" + name, **kw))
    train(base(root, "dist-from-single", resume=ckpt("single-mtdnn")))  # 1 rank -> 2 ranks
    train(base(root, "dist-dropout", head_dropout=0.3))
    train(base(root, "dist-dropout-resumed", head_dropout=0.3, resume=ckpt("dist-dropout")))  # 2 -> 2
    smart_teachers(root)
    fp16_ranks(root)
"""


def smart_teachers(root: Path) -> None:
    """On each rank: 4 SMART steps (dropout on, so the ranks' students see different noise) through
    Stepper; rank 0 saves every rank's teacher and student for the test to compare."""
    from data.batching import make_batch
    from training.methods.distributed import init_distributed
    from training.methods.stepper import Stepper
    from training.run.build import build_model, load_data, schedule_for_epoch
    cfg = base(root, "unused", smart=True, head_dropout=0.2)
    with init_distributed(cfg.device) as d:
        model, tok, _ = build_model(cfg)
        data = load_data(cfg, tok)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        stepper = Stepper.build(model, cfg, 10, d.device, dist=d)
        for n, tbs in enumerate(schedule_for_epoch(cfg, data.train, 0)[:4]):
            mine, weights = local_step(tbs, d.rank, d.world_size)
            assert stepper.step([make_batch(data.train[tb.task], tb.indices, tok) for tb in mine], n, weights)
        states = d.all_gather_object({"teacher": stepper.teacher.state_dict()["module"],
                                      "student": model.state_dict()})
        if d.is_main:
            torch.save({"ranks": states, "initial": initial}, root / "smart.pt")


def fp16_ranks(root: Path) -> None:
    """On each rank: an epoch's 4 PCGrad steps under --precision fp16 (dropout on: the ranks' slices see
    different noise) from the default loss scale, 2^16, at which this model's first steps overflow; rank 0
    saves every rank's model, loss scale and count of skipped steps for the test to compare."""
    from data.batching import make_batch
    from training.methods.distributed import init_distributed
    from training.methods.stepper import Stepper
    from training.run.build import build_model, load_data, schedule_for_epoch
    cfg = base(root, "unused", precision="fp16", head_dropout=0.2, pcgrad=True, task_sampling="mixed")
    with init_distributed(cfg.device) as d:
        model, tok, _ = build_model(cfg)
        data = load_data(cfg, tok)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        stepper = Stepper.build(model, cfg, 10, d.device, torch.float16, dist=d)
        taken = []
        for n, tbs in enumerate(schedule_for_epoch(cfg, data.train, 0)):
            mine, weights = local_step(tbs, d.rank, d.world_size)
            taken.append(stepper.step([make_batch(data.train[tb.task], tb.indices, tok) for tb in mine], n, weights)
                         is not None)
        states = d.all_gather_object({"student": model.state_dict(), "scaler": stepper.loss_scaler.state_dict(),
                                      "taken": taken})
        if d.is_main:
            torch.save({"ranks": states, "initial": initial}, root / "fp16.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Single-process runs of every scenario, then the one torchrun launch of 2 ranks."""
    root = tmp_path_factory.mktemp("dist")
    make_checkpoint(root / "ckpt")
    write_data(root / "data")
    torch.set_num_threads(1)
    for name, kw in SCENARIOS.items():
        train(base(root, "single-" + name, **kw))
    script = root / "worker.py"
    script.write_text(WORKER.format(repo=str(REPO), tests=str(REPO / "tests")))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", str(script), str(root)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return root


def models(run: Path) -> dict[int, dict]:
    """The model after each step: step -> state dict, from the rolling checkpoints."""
    return {int(p.stem.split("-")[1]): read_checkpoint(p)["model"] for p in (run / "checkpoints").glob("step-*.pt")}


def assert_close(a: dict, b: dict, what: str) -> None:
    """Equal to fp tolerance, where Adam's normalisation turns rounding noise in a (near-)zero gradient
    into a visible step: 1e-4 is 3% of one step at lr 3e-3. The attention's key bias (qkv.bias[H:2H]) is
    left out: its exact gradient is zero (softmax ignores a score shift per query), so Adam moves it by
    +-lr on the sign of rounding noise, and that changes no output. The same happens to a weight whose
    input is a GELU unit that is off for every token (gradient ~1e-9, below Adam's eps): one such
    element per tensor in a thousand may differ, by less than one step of lr. A real error (a gradient
    averaged wrongly, a batch split differently) moves most elements."""
    for name in a:
        x, y = a[name], b[name]
        if name.endswith("qkv.bias"):
            H = x.numel() // 3
            x, y = torch.cat([x[:H], x[2 * H:]]), torch.cat([y[:H], y[2 * H:]])
        off = (x - y).abs() > 1e-4 + 1e-4 * y.abs()
        assert int(off.sum()) <= x.numel() // 1000 and (x - y).abs().max() < LR, (
            what, name, int(off.sum()), x.numel(), (x - y).abs().max().item())


def epoch_records(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("train_seconds", "frozen_cache_seconds")}
            for r in rows if "dev_overall" in r]


# ----------------------------------------------------------------------------- the sampler's shards

@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("mixed", [False, True])
def test_shards_are_disjoint_cover_the_epoch_and_agree_on_the_task(world, mixed):
    sizes = {"sst": 23, "para": 9, "sts": 4}
    if mixed:
        schedule = mixed_schedule(sizes, 7, epoch=1, seed=5)
    else:
        schedule = [[tb] for tb in epoch_schedule(sizes, 7, epoch=1, seed=5)]
    seen = {t: [] for t in sizes}
    for tbs in schedule:
        per_rank = [local_step(tbs, r, world) for r in range(world)]
        for mine, weights in per_rank:  # every rank runs the step's tasks, in the same order
            assert [tb.task for tb in mine] == [tb.task for tb in tbs]
        for g, tb in enumerate(tbs):
            real = [mine[g].indices for mine, weights in per_rank if weights[g] > 0]
            assert sorted(i for part in real for i in part) == sorted(tb.indices)  # disjoint, complete
            assert sum(weights[g] for _, weights in per_rank) == pytest.approx(1.0)
            for mine, weights in per_rank:
                n = len(mine[g].indices)
                assert weights[g] == (n / len(tb.indices) if weights[g] else 0.0)
            seen[tb.task] += tb.indices
    for t, n in sizes.items():  # and the epoch is every example once
        assert sorted(seen[t]) == list(range(n))


def test_an_empty_slice_runs_the_groups_first_example_with_weight_zero():
    from data.sampler import TaskBatch
    mine, weights = local_step([TaskBatch("sst", (4, 2)), TaskBatch("sts", (6,))], rank=1, world_size=2)
    assert [(tb.task, tb.indices) for tb in mine] == [("sst", (2,)), ("sts", (6,))] and weights == [0.5, 0.0]


# ----------------------------------------------------------------------------- 2 ranks = 1 process

@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_ranks_equal_one_process_step_by_step(runs, name):
    one, two = models(runs / f"single-{name}"), models(runs / f"dist-{name}")
    assert sorted(one) == sorted(two) and len(one) >= 8
    for step in sorted(one):
        assert_close(two[step], one[step], f"{name} step {step}")
    first = next(iter(one))
    assert any(not torch.equal(one[max(one)][k], one[first][k]) for k in one[first])  # it did train
    # the run's record (global losses, dev metrics) is the same too; only rank 0 wrote it
    evals = epoch_records(runs / f"dist-{name}")
    assert len(evals) == SCENARIOS[name].get("evals_per_epoch", 1) * base(runs, "unused").epochs
    for a, b in zip(evals, epoch_records(runs / f"single-{name}"), strict=True):
        assert a.keys() == b.keys()
        for k in a:  # numbers to a tolerance, words (the precision) exactly
            assert a[k] == (b[k] if isinstance(b[k], str) else pytest.approx(b[k], rel=1e-4, abs=1e-5)), (name, k)
    for f in (runs / f"single-{name}" / "pred").iterdir():
        assert (runs / f"dist-{name}" / "pred" / f.name).is_file()


def test_only_rank_0_writes_a_run_directory_and_frozen_layers_stay_put(runs):
    run = runs / "dist-frozen"
    assert {p.name for p in run.iterdir()} >= {"best.pt", "config.json", "metrics.jsonl", "train.log", "pred"}
    start, end = models(run)[1], models(run)[max(models(run))]
    frozen = [k for k in start if k.startswith(("encoder.embeddings.", "encoder.layers.0."))]
    assert frozen and all(torch.equal(start[k], end[k]) for k in frozen)
    assert len(list((runs / "cache" / "dist-frozen").iterdir())) == 1  # one disk cache, shared by the ranks


# ----------------------------------------------------------------------------- resume across rank counts

def test_single_process_checkpoint_resumed_on_two_ranks(runs):
    one, resumed = models(runs / "single-mtdnn"), models(runs / "dist-from-single")
    assert min(resumed) == RESUME_AT + 1 and max(resumed) == max(one)
    for step in resumed:
        assert_close(resumed[step], one[step], f"step {step}")


def test_two_rank_checkpoint_resumed_in_one_process(runs, tmp_path):
    ckpt = runs / "dist-mtdnn" / "checkpoints" / f"step-{RESUME_AT:07d}.pt"
    assert len(read_checkpoint(ckpt)["rng_ranks"]) == 2
    train(base(runs, "unused", out_dir=str(tmp_path), predictions_dir=str(tmp_path / "pred"), resume=str(ckpt)))
    one, resumed = models(runs / "single-mtdnn"), models(tmp_path)
    assert min(resumed) == RESUME_AT + 1 and max(resumed) == max(one)
    for step in resumed:
        assert_close(resumed[step], one[step], f"step {step}")
    last, single = epoch_records(tmp_path)[-1], epoch_records(runs / "single-mtdnn")[-1]
    assert last.keys() == single.keys()
    for k in last:  # numbers to a tolerance, words (the precision) exactly
        assert last[k] == (single[k] if isinstance(single[k], str) else pytest.approx(single[k], rel=1e-4)), k


def test_two_ranks_resumed_on_two_ranks_is_exact_with_dropout(runs):
    """Each rank restores its own dropout stream (rng_ranks), so the continuation is bit-identical."""
    straight, resumed = models(runs / "dist-dropout"), models(runs / "dist-dropout-resumed")
    for step in resumed:
        for k in straight[step]:
            assert torch.equal(resumed[step][k], straight[step][k]), (step, k)
    assert epoch_records(runs / "dist-dropout-resumed") == epoch_records(runs / "dist-dropout")


# ----------------------------------------------------------------------------- SMART

def test_smart_teacher_is_identical_on_every_rank(runs):
    saved = torch.load(runs / "smart.pt", weights_only=True)
    states = saved["ranks"]
    assert len(states) == 2
    for key in ("teacher", "student"):
        for k in states[0][key]:
            assert torch.equal(states[0][key][k], states[1][key][k]), (key, k)
    start = saved["initial"]
    assert any(not torch.equal(states[0]["teacher"][k], start[k]) for k in start)  # it followed the students


# ----------------------------------------------------------------------------- fp16

def test_fp16_ranks_skip_the_same_overflow_steps_and_keep_one_scale(runs):
    """The ranks sum their scaled gradients before unscaling: an overflow on one is an overflow on all,
    so every rank skips the same steps, backs off to the same scale and keeps the same weights."""
    saved = torch.load(runs / "fp16.pt", weights_only=False)
    one, two = saved["ranks"]
    assert one["taken"] == two["taken"] and one["scaler"] == two["scaler"]
    assert one["scaler"]["skipped"] == one["taken"].count(False) > 0 and any(one["taken"])
    assert one["scaler"]["scaler"]["scale"] < 2.0 ** 16
    for k in one["student"]:
        assert torch.equal(one["student"][k], two["student"][k]), k
    assert any(not torch.equal(one["student"][k], saved["initial"][k]) for k in saved["initial"])
