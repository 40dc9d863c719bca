"""Tests for data/sampler.py: coverage, determinism, cap rotation, task mix, bucketing, sharding."""
import csv
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data.sampler import (
    DEFAULT_BUCKET_BATCHES,
    SAMPLING_MODES,
    TaskBatch,
    annealing_alpha,
    epoch_schedule,
    mixed_schedule,
    padding_efficiency,
    shard,
)

FEW = settings(max_examples=30, deadline=None)

sizes_st = st.dictionaries(st.sampled_from(["sst", "para", "sts"]), st.integers(1, 120), min_size=1)
bs_st = st.integers(1, 17)


def by_task(schedule):
    out = {}
    for b in schedule:
        out.setdefault(b.task, []).extend(b.indices)
    return out


# ---------------------------------------------------------------- mtdnn

@FEW
@given(sizes_st, bs_st, st.integers(0, 5), st.integers(0, 2**31))
def test_mtdnn_covers_every_example_once_with_valid_batch_sizes(sizes, bs, epoch, seed):
    sch = epoch_schedule(sizes, bs, epoch=epoch, seed=seed)
    seen = by_task(sch)
    assert set(seen) == set(sizes)
    for t, n in sizes.items():
        assert sorted(seen[t]) == list(range(n))
        lens = [len(b.indices) for b in sch if b.task == t]
        assert len(lens) == math.ceil(n / bs)
        assert all(1 <= k <= bs for k in lens) and sum(k < bs for k in lens) <= 1


SIZES = {"sst": 400, "para": 700, "sts": 275}


def test_mtdnn_deterministic_and_varies_with_seed_and_epoch():
    a = epoch_schedule(SIZES, 8, epoch=2, seed=7)
    assert a == epoch_schedule(SIZES, 8, epoch=2, seed=7)
    assert a != epoch_schedule(SIZES, 8, epoch=2, seed=8)
    assert a != epoch_schedule(SIZES, 8, epoch=3, seed=7)


def test_mtdnn_pool_is_interleaved_not_task_blocked():
    tasks = [b.task for b in epoch_schedule(SIZES, 8, epoch=0, seed=0)]
    switches = sum(x != y for x, y in zip(tasks, tasks[1:]))
    assert switches > len(tasks) // 3  # three blocks would give 2 switches


# ---------------------------------------------------------------- cap

@FEW
@given(st.integers(20, 300), st.integers(1, 9), st.integers(1, 6), st.integers(0, 2**31))
def test_cap_limits_batches_and_rotates(n, bs, cap, seed):
    sizes = {"big": n, "small": 5}
    per_pass = math.ceil(n / bs)
    epochs = [epoch_schedule(sizes, bs, epoch=e, seed=seed, max_batches_per_task=cap)
              for e in range(math.ceil(per_pass / min(cap, per_pass)))]
    for sch in epochs:
        assert sum(b.task == "big" for b in sch) == min(cap, per_pass)
        assert sum(b.task == "small" for b in sch) == min(cap, math.ceil(5 / bs))
    big = [by_task(sch)["big"] for sch in epochs]
    # Epochs that stay inside the first pass never repeat an example...
    within_pass = [i for sch in big[:per_pass // min(cap, per_pass)] for i in sch]
    assert len(within_pass) == len(set(within_pass))
    # ...and together the epochs of one pass see everything.
    assert set(i for sch in big for i in sch) == set(range(n))


def test_cap_example():
    sizes = {"sst": 100, "para": 1000}
    seen = set()
    for e in range(10):  # 100 batches of 10 per pass, 10 per epoch: exactly one pass in 10 epochs
        idx = by_task(epoch_schedule(sizes, 10, epoch=e, seed=3, max_batches_per_task=10))["para"]
        assert len(idx) == 100 and not seen & set(idx)
        seen |= set(idx)
    assert seen == set(range(1000))


# ---------------------------------------------------------------- sampled modes

def test_sampled_modes_take_mtdnn_step_count():
    for cap in (None, 20):
        n = len(epoch_schedule(SIZES, 8, epoch=1, seed=0, max_batches_per_task=cap))
        for mode in SAMPLING_MODES:
            sch = epoch_schedule(SIZES, 8, epoch=1, seed=0, sampling=mode, num_epochs=3,
                                 max_batches_per_task=cap)
            assert len(sch) == n
            assert all(1 <= len(b.indices) <= 8 for b in sch)
            assert all(0 <= i < SIZES[b.task] for b in sch for i in b.indices)


def test_round_robin_cycles_in_sizes_order():
    sizes = {"sts": 50, "sst": 300, "para": 90}
    sch = epoch_schedule(sizes, 10, epoch=0, seed=1, sampling="round-robin")
    assert [b.task for b in sch] == [list(sizes)[i % 3] for i in range(len(sch))]


def assert_frequencies(sizes, probs, epochs, **kw):
    counts, total = Counter(), 0
    for e in epochs:
        sch = epoch_schedule(sizes, 4, epoch=e, seed=11, **kw)
        counts.update(b.task for b in sch)
        total += len(sch)
    for t, p in probs.items():  # 4 binomial standard deviations
        sd = math.sqrt(total * p * (1 - p))
        assert abs(counts[t] - total * p) < 4 * sd, (t, counts[t], total * p, sd)


def test_proportional_frequencies_match_sizes():
    sizes = {"sst": 2000, "para": 6000, "sts": 500}
    total = sum(sizes.values())
    assert_frequencies(sizes, {t: n / total for t, n in sizes.items()}, range(3), sampling="proportional")


def test_proportional_with_cap_uses_capped_size():
    sizes = {"sst": 2000, "para": 20000, "sts": 500}
    eff = {"sst": 2000, "para": 600 * 4, "sts": 500}  # cap 600 batches of 4 bites on para only
    total = sum(eff.values())
    assert_frequencies(sizes, {t: n / total for t, n in eff.items()}, range(4),
                       sampling="proportional", max_batches_per_task=600)


def test_annealing_alpha_schedule():
    assert annealing_alpha(0, 1) == 1.0
    assert annealing_alpha(0, 5) == 1.0
    assert annealing_alpha(4, 5) == pytest.approx(0.2)
    assert annealing_alpha(2, 5) == pytest.approx(0.6)
    alphas = [annealing_alpha(e, 7) for e in range(7)]
    assert all(a > b for a, b in zip(alphas, alphas[1:]))
    with pytest.raises(ValueError):
        annealing_alpha(5, 5)


@pytest.mark.parametrize("epoch", [0, 2, 4])
def test_annealed_frequencies_follow_size_to_alpha(epoch):
    sizes = {"sst": 1000, "para": 8000, "sts": 300}
    alpha = annealing_alpha(epoch, 5)
    w = {t: n ** alpha for t, n in sizes.items()}
    probs = {t: x / sum(w.values()) for t, x in w.items()}
    assert_frequencies(sizes, probs, [epoch], sampling="annealed", num_epochs=5)
    if epoch == 4:  # flattened: para well below its proportional share of 0.86
        assert probs["para"] < 0.6


@FEW
@given(sizes_st, bs_st, st.sampled_from(["proportional", "round-robin", "annealed"]), st.integers(0, 2**31))
def test_streams_reshuffle_only_when_exhausted(sizes, bs, mode, seed):
    # Reading a task's batches in order across epochs, every n consecutive examples are one full
    # pass: an epoch that draws a task less (or more) than a pass's worth neither skips the rest
    # of that pass nor replays it in the next epoch.
    schedules = [epoch_schedule(sizes, bs, epoch=e, seed=seed, sampling=mode, num_epochs=3) for e in range(3)]
    for t, n in sizes.items():
        seen: list[int] = []
        for b in (b for sch in schedules for b in sch if b.task == t):
            seen.extend(b.indices)
            if len(seen) == n:
                assert sorted(seen) == list(range(n))
                seen = []
            assert len(seen) < n and len(set(seen)) == len(seen)


def test_round_robin_sees_all_of_a_large_task_over_epochs():
    # Round-robin gives each task a third of the steps: the large task's epochs must continue
    # through its pass instead of restarting it (which would never reach its last examples).
    sizes = {"sst": 40, "para": 400, "sts": 40}  # 16 of 48 steps per epoch each
    para = [i for e in range(3)
            for b in epoch_schedule(sizes, 10, epoch=e, seed=5, sampling="round-robin", num_epochs=3)
            if b.task == "para" for i in b.indices]
    assert len(para) == 480 and sorted(para[:400]) == list(range(400))


# ---------------------------------------------------------------- length bucketing

@FEW
@given(sizes_st, bs_st, st.integers(1, 4), st.integers(0, 2**31), st.data())
def test_bucketing_keeps_every_example_once(sizes, bs, bucket_batches, seed, data):
    lengths = {t: data.draw(st.lists(st.integers(3, 60), min_size=n, max_size=n)) for t, n in sizes.items()}
    sch = epoch_schedule(sizes, bs, epoch=1, seed=seed, lengths=lengths, bucket_batches=bucket_batches)
    for t, idx in by_task(sch).items():
        assert sorted(idx) == list(range(sizes[t]))
    assert all(1 <= len(b.indices) <= bs for b in sch)


def test_bucketing_raises_efficiency_and_keeps_batches_random():
    rng = np.random.default_rng(0)
    lengths = {"a": rng.integers(5, 80, 3000).tolist(), "b": rng.integers(5, 40, 1000).tolist()}
    sizes = {t: len(v) for t, v in lengths.items()}
    plain = epoch_schedule(sizes, 16, epoch=0, seed=0)
    bucketed = epoch_schedule(sizes, 16, epoch=0, seed=0, lengths=lengths)
    assert padding_efficiency(bucketed, lengths) > padding_efficiency(plain, lengths) + 0.2
    # Batch order is not sorted by length, and the task mix is still shuffled.
    first = [lengths[b.task][b.indices[0]] for b in bucketed if b.task == "a"]
    assert first != sorted(first) and first != sorted(first, reverse=True)
    tasks = [b.task for b in bucketed]
    assert sum(x != y for x, y in zip(tasks, tasks[1:])) > 20


def test_bucketing_with_cap_rotates():
    rng = np.random.default_rng(1)
    lengths = {"para": rng.integers(5, 80, 2000).tolist()}
    seen = [i for e in range(25) for b in epoch_schedule({"para": 2000}, 8, epoch=e, seed=0,
            max_batches_per_task=10, lengths=lengths, bucket_batches=5) for i in b.indices]
    assert len(seen) == 2000 and set(seen) == set(range(2000))  # 250 batches = one pass


def read_course_lengths(course_data_dir):
    def rows(name):
        with open(course_data_dir / name, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f, delimiter="\t"))
    sst = [len(r["sentence"].split()) + 2 for r in rows("ids-sst-train.csv")]  # [CLS] .. [SEP]
    sts = [len(r["sentence1"].split()) + len(r["sentence2"].split()) + 3 for r in rows("sts-train.csv")]
    return {"sst": sst, "sts": sts}


def test_default_bucketing_on_course_data(course_data_dir):
    lengths = read_course_lengths(course_data_dir)
    sizes = {t: len(v) for t, v in lengths.items()}
    assert sizes["sst"] > 5000 and sizes["sts"] > 5000
    for epoch in range(2):
        bucketed = epoch_schedule(sizes, 32, epoch=epoch, seed=0, lengths=lengths)
        plain = epoch_schedule(sizes, 32, epoch=epoch, seed=0)
        for t, idx in by_task(bucketed).items():
            assert sorted(idx) == list(range(sizes[t]))
        for t in sizes:
            eff = padding_efficiency([b for b in bucketed if b.task == t], lengths)
            assert eff >= 0.9, (t, eff, DEFAULT_BUCKET_BATCHES)
        random_sts = padding_efficiency([b for b in plain if b.task == "sts"], lengths)
        assert random_sts < 0.6


# ---------------------------------------------------------------- padding_efficiency

def test_padding_efficiency_hand_computed():
    lengths = {"a": [3, 5, 2, 10], "b": [4, 4]}
    sch = [TaskBatch("a", (0, 1)), TaskBatch("a", (2, 3)), TaskBatch("b", (0, 1)), TaskBatch("b", ())]
    # real = 3+5 + 2+10 + 4+4 = 28; computed = 2*5 + 2*10 + 2*4 = 38
    assert padding_efficiency(sch, lengths) == pytest.approx(28 / 38)
    assert padding_efficiency([TaskBatch("b", (0, 1))], lengths) == 1.0
    # --pad-multiple 4, --max-length 9: the batches pad to 8, 10 (12 would pass the cap, and a batch never
    # pads below its longest) and 4: computed = 2*8 + 2*10 + 2*4 = 44
    assert padding_efficiency(sch, lengths, 4, 9) == pytest.approx(28 / 44)
    with pytest.raises(ValueError):
        padding_efficiency([], lengths)


# ---------------------------------------------------------------- mixed_schedule

@FEW
@given(sizes_st, bs_st, st.integers(0, 4), st.integers(0, 2**31))
def test_mixed_covers_once_and_groups_by_task(sizes, bs, epoch, seed):
    steps = mixed_schedule(sizes, bs, epoch=epoch, seed=seed)
    order = list(sizes)
    for step in steps:
        tasks = [b.task for b in step]
        assert tasks == sorted(tasks, key=order.index) and len(set(tasks)) == len(tasks)
        assert all(b.indices for b in step)
        assert sum(len(b.indices) for b in step) <= bs
    assert len(steps) == math.ceil(sum(sizes.values()) / bs)
    seen = by_task([b for step in steps for b in step])
    assert {t: sorted(v) for t, v in seen.items()} == {t: list(range(n)) for t, n in sizes.items()}


def test_mixed_mixes_tasks_and_is_deterministic():
    steps = mixed_schedule(SIZES, 16, epoch=0, seed=4)
    assert steps == mixed_schedule(SIZES, 16, epoch=0, seed=4)
    assert steps != mixed_schedule(SIZES, 16, epoch=1, seed=4)
    assert sum(len(s) == 3 for s in steps) > len(steps) // 2


def test_mixed_cap_rotates():
    sizes = {"sst": 30, "para": 500}
    seen = []
    for e in range(5):
        idx = by_task([b for s in mixed_schedule(sizes, 8, epoch=e, seed=2, max_examples_per_task=100)
                       for b in s])
        assert len(idx["para"]) == 100 and sorted(idx["sst"]) == list(range(30))
        seen += idx["para"]
    assert sorted(seen) == list(range(500))


# ---------------------------------------------------------------- mixed_schedule, length-bucketed

@FEW
@given(sizes_st, bs_st, st.integers(0, 4), st.integers(0, 2**31), st.integers(1, 4), st.data())
def test_bucketed_mixed_covers_once_and_stratifies_the_task_mix(sizes, bs, epoch, seed, bucket_batches, data):
    lengths = {t: data.draw(st.lists(st.integers(3, 60), min_size=n, max_size=n)) for t, n in sizes.items()}
    steps = mixed_schedule(sizes, bs, epoch=epoch, seed=seed, lengths=lengths, bucket_batches=bucket_batches)
    order = list(sizes)
    n_steps = math.ceil(sum(sizes.values()) / bs)
    assert len(steps) == n_steps  # as many steps as the unbucketed mode
    for step in steps:
        tasks = [b.task for b in step]
        assert tasks == sorted(tasks, key=order.index) and len(set(tasks)) == len(tasks)
        assert all(b.indices for b in step) and sum(len(b.indices) for b in step) <= bs
        got = {b.task: len(b.indices) for b in step}
        for t, n in sizes.items():  # each task's share of the pool, to within one example
            assert abs(got.get(t, 0) - n / n_steps) < 1
            if n >= n_steps:
                assert t in got  # in every step
    seen = by_task([b for step in steps for b in step])
    assert {t: sorted(v) for t, v in seen.items()} == {t: list(range(n)) for t, n in sizes.items()}


def test_bucketed_mixed_is_deterministic_and_its_steps_are_not_in_length_order():
    rng = np.random.default_rng(0)
    lengths = {t: rng.integers(5, 80, n).tolist() for t, n in SIZES.items()}
    steps = mixed_schedule(SIZES, 16, epoch=0, seed=4, lengths=lengths)
    assert steps == mixed_schedule(SIZES, 16, epoch=0, seed=4, lengths=lengths)
    assert steps != mixed_schedule(SIZES, 16, epoch=1, seed=4, lengths=lengths)
    assert steps != mixed_schedule(SIZES, 16, epoch=0, seed=5, lengths=lengths)
    assert steps != mixed_schedule(SIZES, 16, epoch=0, seed=4)  # lengths change the grouping
    longest = [max(lengths["para"][i] for i in step[1].indices) for step in steps]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)


def test_bucketed_mixed_cap_rotates():
    sizes = {"sst": 30, "para": 500}
    rng = np.random.default_rng(2)
    lengths = {t: rng.integers(3, 50, n).tolist() for t, n in sizes.items()}
    seen = []
    for e in range(5):
        idx = by_task([b for s in mixed_schedule(sizes, 8, epoch=e, seed=2, max_examples_per_task=100,
                                                 lengths=lengths) for b in s])
        assert len(idx["para"]) == 100 and sorted(idx["sst"]) == list(range(30))
        seen += idx["para"]
    assert sorted(seen) == list(range(500))


def test_bucketed_mixed_places_every_example_uniformly_over_the_steps():
    """What PCGrad's pooled sampling needs in expectation: over many seeds, every example lands in
    each of the S steps with frequency 1/S. Bound: 5 binomial standard deviations,
    5 * sqrt(p (1 - p) / seeds) with p = 1/S; 648 (example, step) cells, so a 5-sigma miss by
    chance is unlikely (~4e-4). Long and short examples alike: the length sort does not decide the step."""
    sizes, bs, seeds = {"a": 40, "b": 25, "c": 7}, 8, 2000
    rng = np.random.default_rng(3)
    lengths = {t: rng.integers(3, 60, n).tolist() for t, n in sizes.items()}
    S = math.ceil(sum(sizes.values()) / bs)
    hits = {t: np.zeros((n, S)) for t, n in sizes.items()}
    for seed in range(seeds):
        for s, step in enumerate(mixed_schedule(sizes, bs, epoch=0, seed=seed, lengths=lengths, bucket_batches=2)):
            for b in step:
                hits[b.task][list(b.indices), s] += 1
    p = 1 / S
    bound = 5 * math.sqrt(p * (1 - p) / seeds)
    for t, h in hits.items():
        assert (h.sum(1) == seeds).all()  # once per epoch
        assert np.abs(h / seeds - p).max() < bound, (t, np.abs(h / seeds - p).max(), bound)


@pytest.fixture(scope="module")
def course_token_lengths(course_data_dir):
    """Tokens per example of the three real training sets, with the MiniLM tokenizer."""
    from data.batching import encode_task
    from data.loaders import COURSE_FILES, load_task_file
    from minbert import load_tokenizer, resolve_checkpoint
    tok = load_tokenizer(resolve_checkpoint("minilm-l6"))
    return {t: encode_task(t, load_task_file(course_data_dir / COURSE_FILES[t]["train"], t, labelled=True).examples,
                           tok).lengths for t in ("sst", "para", "sts")}


@pytest.mark.parametrize("bs", [16, 32, 64])
def test_bucketed_mixed_padding_efficiency_on_the_course_training_sets(course_token_lengths, bs):
    lengths = course_token_lengths
    sizes = {t: len(v) for t, v in lengths.items()}
    for epoch in range(2):
        bucketed = mixed_schedule(sizes, bs, epoch=epoch, seed=0, lengths=lengths)
        assert all(len(step) == 3 for step in bucketed)  # every task in every step
        eff = padding_efficiency([b for step in bucketed for b in step], lengths)
        assert eff >= 0.9, (bs, eff)
    plain = mixed_schedule(sizes, bs, epoch=0, seed=0)
    assert padding_efficiency([b for step in plain for b in step], lengths) < 0.65


# ---------------------------------------------------------------- shard

@FEW
@given(st.lists(st.integers(0, 10_000), max_size=40), st.integers(1, 9))
def test_shard_disjoint_cover_same_task(indices, world):
    batch = TaskBatch("sts", tuple(indices))
    parts = [shard(batch, r, world) for r in range(world)]
    assert all(p.task == "sts" for p in parts)
    assert tuple(i for p in parts for i in p.indices) == batch.indices  # contiguous, in order
    assert [len(p.indices) for p in parts] == [len(a) for a in np.array_split(np.arange(len(indices)), world)]


# ---------------------------------------------------------------- validation

def test_validation_errors_are_clear():
    with pytest.raises(ValueError, match="round-robin"):
        epoch_schedule(SIZES, 8, epoch=0, seed=0, sampling="uniform")
    with pytest.raises(ValueError, match="batch_size"):
        epoch_schedule(SIZES, 0, epoch=0, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        mixed_schedule(SIZES, 0, epoch=0, seed=0)
    with pytest.raises(ValueError, match="sts"):
        mixed_schedule(SIZES, 8, epoch=0, seed=0, lengths={"sst": [5] * 400, "para": [5] * 700, "sts": [5] * 274})
    bad = {"sst": [5] * 400, "para": [5] * 700, "sts": [5] * 274}
    with pytest.raises(ValueError, match="sts"):
        epoch_schedule(SIZES, 8, epoch=0, seed=0, lengths=bad)
    with pytest.raises(ValueError, match="para"):
        epoch_schedule(SIZES, 8, epoch=0, seed=0, lengths={"sst": [5] * 400, "sts": [5] * 275})
    with pytest.raises(ValueError, match="max_batches_per_task"):
        epoch_schedule(SIZES, 8, epoch=0, seed=0, max_batches_per_task=0)
    with pytest.raises(ValueError, match="epoch"):
        epoch_schedule(SIZES, 8, epoch=3, seed=0, sampling="annealed", num_epochs=3)
    with pytest.raises(ValueError, match="rank"):
        shard(TaskBatch("sst", (1, 2)), 2, 2)
