"""An arms study's report: report.md (the protocol, the baselines, the tuning, each point's scores with
intervals, each point against full fine-tuning) and report.csv, rewritten from the results so far."""
from __future__ import annotations

import csv
import math
import os
import statistics
from pathlib import Path

import numpy as np

from data.loaders import COURSE_FILES, load_task_file
from training.experiments.study.arms import (
    METRICS,
    gap_changes,
    point_rows,
    split_scores,
    twins_due,
    twins_undecided,
    versus,
)
from training.experiments.study.arms_cost import COST, cost_lines, cost_rows, first_depth, read_cost, scale_line
from training.experiments.study.baselines import labels_digest, read_baselines
from training.experiments.study.protocol import Protocol, borrows
from training.experiments.sweep.records import RESULTS, RunKey, read_results


def _f(x, digits: int = 4, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _ci(lo_hi, digits: int = 4, sign: bool = False) -> str:
    lo, hi = lo_hi
    return "-" if math.isnan(lo) else f"[{_f(lo, digits, sign)}, {_f(hi, digits, sign)}]"


def _p(p) -> str:
    return "-" if p is None or math.isnan(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")


def dev_labels(records: list[dict], tasks: list[str], results: Path,
               data_dir: str | None = None) -> dict[str, np.ndarray]:
    """The dev labels of data_dir (default: the records' data folder), checked against the fingerprints the
    study took of the files its runs are scored on (baselines.json)."""
    folder = Path(data_dir or records[0]["settings"]["data_dir"])
    labels = {t: np.array([e.label for e in load_task_file(folder / COURSE_FILES[t]["dev"], t, labelled=True).examples],
                          dtype=np.float64) for t in tasks}
    known = (read_baselines(results) or {}).get("dev_labels", {})
    for t in tasks:
        if t in known and labels_digest(labels[t]) != known[t]:
            raise ValueError(f"{folder / COURSE_FILES[t]['dev']}: not the dev file the study's runs were scored on "
                             f"(pass the --data-dir they used)")
    return labels


def cpu_label(record: dict) -> str:
    """The CPU a run ran on, with its bf16 instructions where the record names them (older ones do not)."""
    name = record.get("cpu") or "?"
    if "cpu_bf16" not in record:
        return name
    return f"{name} ({record['cpu_bf16'] or 'bf16 emulated'})"


def machine_label(record: dict) -> str:
    """Where a run trained: its GPU (a CUDA memory peak marks a run that trained on one; records before the
    gpu field leave it unnamed), else its CPU."""
    if record.get("cuda_peak_mib") is not None:
        return f"GPU {record.get('gpu') or '(unnamed)'}"
    return f"CPU {cpu_label(record)}"


def machines_phrase(records: list[dict]) -> str:
    """Where the runs trained, with how many runs each (a study's runs may span machines)."""
    places = [machine_label(r) for r in records]
    return "; ".join(f"{p} ({places.count(p)} run{'s' * (places.count(p) > 1)})" for p in sorted(set(places))) or "-"


def epochs_phrase(recipe, settings: dict) -> str:
    """How long the points train: the recipe's epochs and early stopping, or each kind its arms set, the
    most points' first (a recipe whose arms override them trains its points for different lengths)."""
    lengths = [(o.get("epochs", settings.get("epochs")),
                o.get("early_stop_patience", settings.get("early_stop_patience")))
               for o in map(recipe.options, recipe.points)]
    kinds = sorted(set(lengths), key=lambda k: (-lengths.count(k), lengths.index(k)))
    said = [f"up to {e} epochs with early stopping after {p} evaluations without a gain" if p else
            f"{e} epochs without early stopping" for e, p in kinds]
    return said[0] if len(said) == 1 else f"by point ({'; '.join(said)})"


def protocol_lines(recipe, records: list[dict]) -> list[str]:
    s = records[0]["settings"] if records else {}
    split = recipe.tuning_split
    n_train = next((r["n_train"] for r in records), {})
    n_tune = next((r["split"]["n_tune"] for r in records if "split" in r), {})
    planned = set(recipe.plan(records))
    own = [r for r in records if RunKey.of(r) in planned]  # a results file may be shared with other recipes
    shared = f" (the results file holds {len(records)}, with other recipes' runs)" if len(own) < len(records) else ""
    commits = sorted({(r.get("commit") or "?")[:10] for r in own})
    grid = recipe.lr_grid
    return [
        f"Model `{s.get('model', '?')}` ({recipe.layers} layers), tasks {', '.join(recipe.tasks)} trained together; "
        f"batch {s.get('batch_size', '?')}, {epochs_phrase(recipe, s)}, pooling {s.get('pooling', '?')}, "
        f"precision {s.get('precision', '?')}.",
        "",
        f"Protocol: a stratified {split['share']:.0%} of each training file (seed {split['seed']}) is held out as "
        f"the tuning split ({', '.join(f'{t} {n}' for t, n in n_tune.items())} examples; training on the rest: "
        f"{', '.join(f'{t} {n}' for t, n in n_train.items())}). It alone chooses each run's kept epoch and each "
        f"point's learning rate, on the tuning seed(s) {grid['tuning_seeds']}; the reporting seeds "
        f"{recipe.seeds} then train each point at its chosen rate, and only they are reported, on the dev sets, "
        f"which choose nothing. A rate chosen on the edge of the grid extends it along 1-3-10 (at most "
        f"{grid.get('max_extensions', 2)} times each way).",
        "",
        f"Runs: {len(own)} recorded of {len(planned)} planned so far{shared}; code at commit(s) "
        f"{', '.join(commits) or '-'}; trained on {machines_phrase(own)}.",
    ]


def baseline_lines(baselines: dict | None) -> list[str]:
    if not baselines:
        return ["Baselines: not computed yet."]
    t, z = baselines["trivial"], baselines.get("zero_shot", {})
    return ["| baseline | sst_acc | para_acc | sts_pearson | overall |", "|---|---:|---:|---:|---:|",
            f"| trivial: majority class (SST, Quora), a constant (STS) | {_f(t.get('sst_acc'))} "
            f"| {_f(t.get('para_acc'))} "
            f"| {_f(t.get('sts_pearson'))} | {_f(t.get('overall'))} |",
            f"| untrained model, zero-shot cosine ({baselines.get('pooling')} pooling; Quora's threshold chosen on "
            f"the tuning split) | - | {_f(z.get('para_acc'))} | {_f(z.get('sts_pearson'))} | - |"]


def tuning_lines(recipe, records: list[dict]) -> list[str]:
    protocol = Protocol(recipe, records)
    lines = ["Margin: the chosen rate's score minus the runner-up's; one run's sd: the spread of the tuning-split "
             "score over the point's reporting seeds at its chosen rate, the noise a single tuning run carries. A "
             "margin below it is a near tie, which a twin at the runner-up rate (a point with runner_up_of) settles.",
             "",
             "| point | rates tried: tuning-split overall (mean over tuning seeds) | chosen | margin | one run's sd |",
             "|---|---|---|---:|---:|"]
    for point in recipe.points:
        if borrows(point):
            how = "the rate of" if "lr_of" in point else "the runner-up rate of"
            chosen = _lr(protocol.chosen(point["label"]))
            lines.append(f"| {point['label']} | ({how} {borrows(point)}) | {chosen} | | |")
            continue
        lrs, best = protocol.tried(point)
        cells = [f"{lr:g}: {_f(protocol.score(point, lr))}" for lr in lrs]
        edge = " (edge: the ladder's limit)" if best is not None and best in (lrs[0], lrs[-1]) else ""
        lines.append(f"| {point['label']} | {'; '.join(cells)} | {_lr(best)}{edge} "
                     f"| {_f(choice_margin(protocol, point))} "
                     f"| {_f(tune_spread(protocol, point['label']))} |")
    return lines


def choice_margin(protocol, point: dict) -> float:
    """The tuning-split score of a point's chosen rate minus its runner-up's (nan until both are known)."""
    ranked = protocol.ranked(point)
    return protocol.score(point, ranked[0]) - protocol.score(point, ranked[1]) if len(ranked) > 1 else math.nan


def tune_spread(protocol, label: str) -> float:
    """The sd of the tuning-split overall over a point's reporting runs (nan below two)."""
    scores = [r["tune"]["overall"] for r in protocol.reporting(label).values()]
    return statistics.stdev(scores) if len(scores) > 1 else math.nan


def heads_description(settings: dict) -> str:
    """What a run's heads read and compute, from its settings (heads/tasks.py says the same at length)."""
    y = "the mean of the last layer's states" if settings.get("pooling") == "mean" else "BERT's pooler on [CLS]"
    if settings.get("pair_encoding") == "siamese":
        start = "the identity" if settings.get("siamese_init") == "identity" else "random"
        pairs = (f"each sentence encoded alone, y1 and y2 projected by W_i (starting as {start}): Quora the dot "
                 "product of the projections, STS 5 max(0, cosine)")
    else:
        pairs = "both sentences in one sequence: Quora a linear logit, STS 5 sigmoid(linear), a regressor"
    return f"y = {y}; SST a two-layer MLP on y; {pairs}"


def heads_lines(recipe, records: list[dict]) -> list[str]:
    """Which heads each point's runs have: one line per distinct kind, naming its points."""
    protocol, kinds = Protocol(recipe, records), {}
    for point in recipe.points:
        runs = list(protocol.reporting(point["label"]).values())
        if runs:
            kinds.setdefault(heads_description(runs[0]["settings"]), []).append(point["label"])
    if len(kinds) == 1:
        return [f"Heads of every point: {next(iter(kinds))}."]
    return [f"Heads: {kind} ({'; '.join(labels)})." for kind, labels in kinds.items()]


def _lr(lr) -> str:
    return "pending" if lr is None else f"{lr:g}"


def results_lines(rows: list[dict]) -> list[str]:
    lines = ["| point | trainable | lr | seeds | sst_acc | para_acc | sts_pearson | overall [95% CI] | normalised "
             "| Lee ratio | sd of overall [95% CI] | kept epochs | kept the last |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = {r["metric"]: r for r in rows if r["label"] == label}
        o = mine.get("overall")
        any_row = next(iter(mine.values()))
        trainable = any_row.get("trainable_params")
        share = (f"{trainable / 1e6:.2f}M ({trainable / any_row['total_params']:.1%})"
                 if trainable else "-")
        cells = [_f(mine[m]["mean"]) if m in mine else "-" for m in METRICS[:3]]
        lines.append(f"| {label} | {share} | {_lr(any_row['lr'])} | {len(any_row['values'])} | " + " | ".join(cells)
                     + (f" | {_f(o['mean'])} {_ci(o['ci'])} | {_f(o['normalised'], 3)} | {_f(o['lee'], 3)} "
                        f"| {_f(o['sd'])} {_ci(o['sd_ci'])} | {', '.join(str(e) for e in o['best_epochs'])} "
                        f"| {o['at_last']} of {len(o['best_epochs'])} |"
                        if o else " | - | - | - | - | - | - |"))
    return lines


def versus_lines(tests: list[dict], reference: str) -> list[str]:
    lines = [f"Each point minus {reference} (or the point it names), paired by seed; t: paired t-test; bootstrap: "
             "both scored on the same resampled dev examples; Holm: adjusted over the points, per metric and test.", "",
             "| point | against | metric | seeds | difference [95% t CI] | t p | Holm | bootstrap 95% CI | bootstrap p "
             "| Holm |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    return lines + [f"| {t['label']} | {t['vs']} | {_test_cells(t)} |" for t in tests]


def _test_cells(t: dict) -> str:
    """metric | seeds | difference [CI] | t p | Holm | bootstrap CI | bootstrap p | Holm, of one versus() row."""
    return f"{t['metric']} | {len(t['seeds'])} | {_difference_cells(t)}"


def _difference_cells(t: dict) -> str:
    """difference [CI] | t p | Holm | bootstrap CI | bootstrap p | Holm, of a versus() or gap_changes() row."""
    return (f"{_f(t['diff'], sign=True)} {_ci(t['ci'], sign=True)} | {_p(t['t_p'])} | {_p(t['t_p_holm'])} "
            f"| {_ci(t.get('boot_ci', (math.nan, math.nan)), sign=True)} | {_p(t.get('boot_p', math.nan))} "
            f"| {_p(t.get('boot_p_holm', math.nan))}")


def compare_lines(compare: list[list[str]], tests: list[dict]) -> list[str]:
    """The recipe's own pairs (a confound against the point it isolates, a matched budget, a twin): the
    questions numbered, then each pair's differences, Holm over these pairs as their own family."""
    lines = ["The pairs the recipe names, each a question of its own: the first point minus the second, paired "
             "by seed, as above; Holm over these pairs (a family apart from the points against full fine-tuning), "
             "per metric and test. A pair waits until both points have reporting runs.", ""]
    lines += [f"{i}. {question} ({label} against {against})" for i, (label, against, question) in enumerate(compare, 1)]
    lines += ["", "| # | metric | seeds | difference [95% t CI] | t p | Holm | bootstrap 95% CI | bootstrap p | Holm |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    number = {(label, against): i for i, (label, against, _) in enumerate(compare, 1)}
    return lines + [f"| {number[t['label'], t['vs']]} | {_test_cells(t)} |" for t in tests]


def gap_lines(changes: list[dict]) -> list[str]:
    """The size study's question: does freezing's gap to full fine-tuning change with the training-set size?"""
    lines = ["Does a point's gap to the full fine-tuning of its own size change with the size? For each point and "
             "the same point at a smaller size (the same depth and heads): either gap (the point minus its size's "
             "full fine-tuning, paired by seed, mean over the seeds), and the larger size's gap minus the smaller's "
             "(negative: the gap grows with the data) with Welch's t interval over the two sizes' seeds (they draw "
             "different subsets) and the bootstrap over dev examples (all four points' runs scored on the same "
             "resampled examples); Holm over these comparisons, per metric and test.", "",
             "| point | smaller size | metric | seeds | gap | gap, smaller size | change [95% t CI] | t p | Holm "
             "| bootstrap 95% CI | bootstrap p | Holm |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in changes:
        lines.append(f"| {c['label']} | {c['smaller']} | {c['metric']} | {c['seeds'][0]} + {c['seeds'][1]} "
                     f"| {_f(c['gap'], sign=True)} | {_f(c['gap_smaller'], sign=True)} | {_difference_cells(c)} |")
    return lines


def spread_lines(tests: list[dict], rows: list[dict], reference: str) -> list[str]:
    """Each point's spread of the overall score over seeds against its reference's."""
    sd = {r["label"]: r for r in rows if r["metric"] == "overall"}
    lines = ["Does a point change how much the score depends on the seed? Its sd of dev overall over the reporting "
             f"seeds against {reference}'s (or the point it names): the ratio of the two with its 95% interval and "
             "the Pitman-Morgan test of equal variances, which pairs the runs by seed (the same seed gives both the "
             "same data order); Holm over the points. Five seeds measure a spread loosely: read the intervals.", "",
             "| point | against | seeds | sd | sd of the other | sd ratio [95% CI] | p | Holm |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for t in (t for t in tests if t["metric"] == "overall"):
        lines.append(f"| {t['label']} | {t['vs']} | {len(t['seeds'])} | {_f(sd[t['label']]['sd'])} "
                     f"| {_f(sd[t['vs']]['sd'])} | {_f(t['sd_ratio'], 2)} {_ci(t['sd_ratio_ci'], 2)} "
                     f"| {_p(t['spread_p'])} | {_p(t['spread_p_holm'])} |")
    return lines


def unseen_lines(rows: list[dict], reference: str) -> list[str]:
    lines = ["The embeddings of word pieces that no training example holds are never updated by fine-tuning; "
             "freezing the embeddings keeps every row as pretrained instead. Each task's dev set split by whether "
             "an example holds such a piece; each point's metric on either part (mean over the reporting seeds), "
             f"its difference from {reference} (paired by seed; 95% bootstrap interval over the part's examples) "
             "and the gap between the two differences: if the unseen pieces explained what a point changes, its "
             "gap would be far from 0 (bootstrap resampling each part on its own; p Holm-adjusted over the "
             "points, per task).", "",
             "| point | task | unseen: n | unseen: score | unseen: difference [95% CI] | seen: n | seen: score "
             "| seen: difference [95% CI] | gap [95% CI] | p (Holm) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["label"] == reference:
            cells = ["-"] * 4
        else:
            cells = [f"{_f(r[f'{part}_diff'], sign=True)} {_ci(r.get(f'{part}_ci', (math.nan, math.nan)), sign=True)}"
                     for part in ("unseen", "seen", "gap")] + [_p(r.get("gap_p_holm", math.nan))]
        lines.append(f"| {r['label']} | {r['task']} | {r['n_unseen']} | {_f(r['unseen'])} | {cells[0]} "
                     f"| {r['n_seen']} | {_f(r['seen'])} | {cells[1]} | {cells[2]} | {cells[3]} |")
    return lines


def summary_lines(rows: list[dict], tests: list[dict], costs: list[dict], baselines: dict | None,
                  reference: str) -> list[str]:
    """One line per point with reporting runs: what trains, its seeds, dev overall, its difference from the reference
    (Holm-adjusted p of the paired t and of the bootstrap over dev examples), and its end-to-end speed-up; the
    trivial predictor's score last."""
    versus_ref = {t["label"]: t for t in tests if t["metric"] == "overall" and t["vs"] == reference}
    speedup = {c["label"]: c["speedup"] for c in costs}
    lines = [f"| point | trainable | seeds | dev overall [95% CI] | against {reference} [95% CI] (Holm p: t / "
             "bootstrap) | normalised | end-to-end speed-up |", "|---|---:|---:|---:|---:|---:|---:|"]
    overall = [r for r in rows if r["metric"] == "overall"]
    plain = sorted((r for r in overall if r["arm"] == ""), key=lambda r: -2 if r["depth"] is None else r["depth"])
    for r in plain + [r for r in overall if r["arm"] != ""]:  # the plain depths in depth order, then the rest
        t = versus_ref.get(r["label"])
        against = (f"{_f(t['diff'], sign=True)} {_ci(t['ci'], sign=True)} ({_p(t['t_p_holm'])} / "
                   f"{_p(t.get('boot_p_holm', math.nan))})" if t else "-")
        share = f"{r['trainable_params'] / r['total_params']:.1%}" if r.get("trainable_params") else "-"
        lines.append(f"| {r['label']} | {share} | {len(r['values'])} | {_f(r['mean'])} {_ci(r['ci'])} | {against} "
                     f"| {_f(r['normalised'], 3)} | {_speedup(speedup.get(r['label']))} |")
    trivial = (baselines or {}).get("trivial", {}).get("overall")
    if trivial is not None:
        lines.append(f"| trivial predictor (majority class, constant) | 0 | | {_f(trivial)} | | 0 | |")
    return lines


def one_point_lines(recipe, records: list[dict], reference: str) -> list[str]:
    """A note for each point that borrowed the reference's own rate: its runs are the reference's."""
    protocol = Protocol(recipe, records)
    same = [p["label"] for p in recipe.points if borrows(p) and protocol.same_runs(p["label"], reference)]
    return [f"\n{label}: the rate it borrows is {reference}'s own, so its runs are {reference}'s (left out of the "
            f"tables and figures, where its rows would be {reference}'s)." for label in same]


def mixed_machine_lines(recipe, records: list[dict]) -> list[str]:
    """A note for each point whose reporting runs trained on more than one machine (a study that took runs
    from a lent GPU, say): which, and how many runs each, so that no reader takes its spread for the seeds'
    alone (bench/device_twin.py measures what the machines do to a score)."""
    protocol = Protocol(recipe, records)
    lines = []
    for point in recipe.points:
        runs = list(protocol.reporting(point["label"]).values())
        if len({machine_label(r) for r in runs}) > 1:
            lines.append(f"\n{point['label']}: its reporting runs trained on {machines_phrase(runs)}.")
    return lines


def schedule_lines(recipe, records: list[dict], costs: list[dict], quality: dict[str, dict], reference: str,
                   share: float = 0.99) -> list[str]:
    """The freezing schedules against the reference: end to end (each run's kept model) and at equal quality
    (the cost to reach `share` of the reference's kept tuning-split score, the reference's own cost to
    reach it over the schedule's), the depth each run had frozen when it ended, and the figure the recipe
    quotes from the schedule's paper (a point's "published")."""
    protocol, by_label = Protocol(recipe, records), {c["label"]: c for c in costs}
    scheduled = [p for p in recipe.points if "unfreeze_schedule" in recipe.arms.get(p["arm"], {})
                 and p["label"] in by_label]
    if not scheduled or reference not in by_label:
        return []
    theirs = by_label[reference]["to"][share][0]
    lines = [f"Each schedule against {reference}: end to end, to its kept model; at equal quality, the cost to its "
             f"first evaluation at {share:.0%} of {reference}'s mean kept tuning-split score against {reference}'s "
             f"own ({_epochs(theirs)} epochs of {reference}; medians over the seeds that reached it); the depth "
             f"frozen when each run ended (of {recipe.layers} layers; none: every layer training).", "",
             f"| schedule | end-to-end speed-up | dev overall against {reference} [95% t CI] (Holm p) "
             f"| to {share:.0%}: "
             f"epochs of {reference} (seeds) | speed-up at {share:.0%} | frozen at the end, per seed | published |",
             "|---|---:|---:|---:|---:|---|---|"]
    for point in scheduled:
        row, t = by_label[point["label"]], quality.get(point["label"])
        mine, reached = row["to"][share]
        at_share = "-" if mine is None or theirs is None else f"{theirs / mine:.2f}x"
        against = f"{_f(t['diff'], sign=True)} {_ci(t['ci'], sign=True)} ({_p(t['t_p_holm'])})" if t else "-"
        ends = [_depth_name(final_depth(recipe, point, r), recipe.layers)
                for _, r in sorted(protocol.reporting(point["label"]).items())]
        lines.append(f"| {point['label']} | {_speedup(row['speedup'])} | {against} | {_epochs(mine)} ({reached}/"
                     f"{row['seeds']}) | {at_share} | {', '.join(ends)} | {point.get('published', '-')} |")
    return lines


def final_depth(recipe, point: dict, record: dict):
    """The depth a run had frozen when it ended: its schedule's last move, else where it started."""
    moves = record.get("depth_changes")
    return moves[-1][1] if moves else first_depth(recipe, point)


def _depth_name(depth, layers: int) -> str:
    return "none" if depth is None else "embeddings" if depth <= 0 else f"{depth}/{layers}"


def _epochs(x) -> str:
    return "not reached" if x is None else f"{x:.2f}"


def _speedup(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def convergence_line(recipe, rows: list[dict]) -> str:
    """What the convergence rule asks of the recipe: the twins due, none, or why it does not apply."""
    due, undecided = twins_due(recipe, rows), twins_undecided(recipe, rows)
    if recipe.fixed_budget:
        verdict = f"not applied: {recipe.fixed_budget}"
    else:
        verdict = (f"due and not yet in the recipe for {'; '.join(due)}" if due
                   else "no twin is due" + (" so far" if undecided else ""))
        verdict += (f"; undecided until more reporting runs are in for {'; '.join(undecided)}." if undecided
                    else ".")
    return ("Convergence rule (a point most of whose reporting runs kept their last evaluation gets a twin "
            "trained for longer, tuned the same way): " + verdict)


def arms_markdown(recipe, results: Path, report: Path,
                  data_dir: str | None = None) -> tuple[str, list[dict], list[dict]]:
    records = read_results(Path(results) / RESULTS)
    baselines = read_baselines(results)
    reference = recipe.points[0]["label"]
    rows = point_rows(recipe, records, baselines, reference)
    labels = dev_labels(records, recipe.tasks, results, data_dir) if records else None
    tests = versus(recipe, records, results, labels, reference) if records else []
    measurements = read_cost(results)
    costs = cost_rows(recipe, records, measurements, reference)
    lines = [f"# {recipe.title}", "", recipe.about, ""] + protocol_lines(recipe, records)
    lines += ["", "## Summary", "", "Each point's mean over its reporting seeds (the plain depths first, by depth, "
              "then the other points in the recipe's order); the sections below give the rest (per task, spread, the "
              "bootstrap over dev examples, cost to a share of the score).", ""]
    lines += summary_lines(rows, tests, costs, baselines, reference) + one_point_lines(recipe, records, reference)
    lines += mixed_machine_lines(recipe, records)
    lines += ["", "## Baselines (dev)", ""] + baseline_lines(baselines)
    lines += ["", "## Tuning (the tuning split; tuning seeds only)", ""] + tuning_lines(recipe, records)
    lines += ["", "## Dev scores of the reporting seeds", "",
              "Mean over the reporting seeds with its 95% t interval; normalised: (score - trivial) / (full - "
              "trivial), per seed against the full fine-tuning run of the same seed, then averaged; Lee ratio: "
              "score / full, likewise; kept epochs: each seed's kept evaluation (0-based), and how many runs kept "
              "their last one (those may have stopped still learning).", ""] + heads_lines(recipe, records)
    lines += [""] + results_lines(rows)
    lines += ["", convergence_line(recipe, rows)]
    if costs:
        n_train = next(iter(Protocol(recipe, records).reporting(reference).values()))["n_train"]
        scale = scale_line(recipe, measurements, reference, n_train)
        quality = {t["label"]: t for t in tests if t["metric"] == "overall" and t["vs"] == reference}
        link = Path(os.path.relpath(Path(results) / COST, report)).as_posix() + "/"  # as report.md reaches it
        lines += ["", "## Cost", ""] + cost_lines(costs, measurements, reference, scale, quality, link)
        schedules = schedule_lines(recipe, records, costs, quality, reference)
        if schedules:
            lines += ["", "## The freezing schedules", ""] + schedules
    if records:
        lines += comparison_sections(recipe, records, results, labels, baselines, rows, tests, reference)
    return "\n".join(lines) + "\n", rows, costs


def comparison_sections(recipe, records, results, labels, baselines, rows, tests, reference) -> list[str]:
    """Against the reference, the spread over seeds, the recipe's pairs, the gap against size, the unseen-piece
    split."""
    lines = ["", f"## Against {reference}", ""] + versus_lines(tests, reference)
    lines += ["", "## Spread over seeds", ""] + spread_lines(tests, rows, reference)
    if recipe.compare:
        pairs = [(label, against) for label, against, _ in recipe.compare]
        lines += ["", "## The questions the pairs ask", ""]
        lines += compare_lines(recipe.compare, versus(recipe, records, results, labels, reference, pairs=pairs))
    changes = gap_changes(recipe, records, results, labels)
    if changes:
        lines += ["", "## The gap against the training-set size", ""] + gap_lines(changes)
    if baselines and baselines.get("unseen"):
        lines += ["", "## Dev examples with word pieces training never saw", ""]
        lines += unseen_lines(split_scores(recipe, records, results, labels, baselines["unseen"], reference), reference)
    return lines


CSV_COLUMNS = ["point", "depth", "arm", "lr", "metric", "seeds", "mean", "ci_low", "ci_high", "sd", "sd_ci_low",
               "sd_ci_high", "normalised", "lee", "trainable_params", "total_params"]


def write_arms_report(recipe, results: Path, report: Path, data_dir: str | None = None) -> Path:
    from training.experiments.study.arms_figures import arms_figures, figure_lines

    text, rows, costs = arms_markdown(recipe, results, report, data_dir)
    report.mkdir(parents=True, exist_ok=True)
    figures = arms_figures(recipe, read_results(Path(results) / RESULTS), rows, read_baselines(results), report, costs)
    (report / "report.md").write_text(text + figure_lines(figures))
    with open(report / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({"point": r["label"], "depth": "none" if r["depth"] is None else r["depth"], "arm": r["arm"],
                        "lr": r["lr"], "metric": r["metric"], "seeds": len(r["values"]), "mean": r["mean"],
                        "ci_low": r["ci"][0], "ci_high": r["ci"][1], "sd": r["sd"], "sd_ci_low": r["sd_ci"][0],
                        "sd_ci_high": r["sd_ci"][1], "normalised": r["normalised"], "lee": r["lee"],
                        "trainable_params": r["trainable_params"], "total_params": r["total_params"]})
    return report / "report.md"
