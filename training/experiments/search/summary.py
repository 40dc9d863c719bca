"""A search's results: summary.md and summary.csv (every trial: settings, score, training time, state),
the best trial (or, two-objective, the Pareto front of score against training time) with the command
that reruns it, and Optuna's own figures where matplotlib is installed."""
from __future__ import annotations

import csv
import logging
import math
import warnings
from pathlib import Path

from training.experiments.search.space import Space

log = logging.getLogger(__name__)


def is_duplicate(trial) -> bool:
    """A trial told FAIL unrun: its settings were a lower-numbered live trial's."""
    return trial.state.name == "FAIL" and trial.user_attrs.get("state_note", "").startswith("duplicate of trial")


def rows(study, space: Space) -> list[dict]:
    out = []
    for t in study.get_trials(deepcopy=False):
        if is_duplicate(t):
            continue  # settings another trial holds: not a trial of the search
        dev = t.user_attrs.get("dev", {})
        out.append({"trial": t.number, "state": t.state.name, **{f"param:{k}": t.params.get(k) for k in space.params},
                    "score": dev.get(space.objective[0]) if dev else _last_report(t),
                    "train_seconds": t.user_attrs.get("train_seconds"), "note": t.user_attrs.get("state_note", ""),
                    "run_dir": t.user_attrs.get("run_dir", "")})
    return out


def _last_report(t):
    return t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None


def best_numbers(study, space: Space) -> list[int]:
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not complete:
        return []
    if space.multi:
        return sorted(t.number for t in study.best_trials)
    return [study.best_trial.number]


def _repeats(study, space: Space) -> str:
    """What the sampler's proposals of settings already tried cost (a grid's are workers' races: nothing)."""
    n = sum(map(is_duplicate, study.get_trials(deepcopy=False)))
    if not n or space.sampler == "grid":
        return ""
    return f" {n} proposal(s) repeated settings already tried: not run, counted in the budget."


def front(table: list[dict]) -> list[dict]:
    """The completed trials no other completed trial beats on both dev score (up) and training seconds
    (down): for a given accuracy, the fastest settings. Sorted by training seconds."""
    done = [r for r in table if r["state"] == "COMPLETE" and r["score"] is not None and r["train_seconds"] is not None]
    keep = [r for r in done if not any(o["score"] >= r["score"] and o["train_seconds"] <= r["train_seconds"]
                                       and (o["score"] > r["score"] or o["train_seconds"] < r["train_seconds"])
                                       for o in done)]
    return sorted(keep, key=lambda r: (r["train_seconds"], -r["score"]))


def _by_score(row: dict) -> tuple:
    """Completed trials by score, best first (a score of 0 is a score), then the rest by number."""
    scored = row["state"] == "COMPLETE" and row["score"] is not None
    return (-row["score"] if scored else math.inf, row["trial"])


def markdown(study, space: Space, table: list[dict]) -> str:
    best = best_numbers(study, space)
    states = {s: sum(r["state"] == s for r in table) for s in ("COMPLETE", "PRUNED", "RUNNING", "FAIL")}
    what = (f"the Pareto front of dev {space.objective[0]} (up) against training seconds (down)" if space.multi
            else f"dev {space.objective[0]} (up)")
    lines = [f"# Search: {space.path.name}", "",
             f"Objective: {what}. Trials: {', '.join(f'{n} {s.lower()}' for s, n in states.items() if n)} "
             f"(budget {space.trials}; sampler {space.sampler}, pruner {space.pruner if not space.multi else 'none'})."
             + _repeats(study, space),
             f"Fixed options: `{space.fixed}`. Score: the trial's kept dev evaluation (pruned: its last one); "
             f"train s: training steps only.", ""]
    if best:
        label = "On the front" if space.multi else "Best"
        lines += [f"{label}: " + ", ".join(f"trial {n}" for n in best) + ". Rerun the best with "
                  f"`python run_multitask.py --config {_run_dir(table, best[0])}/config.json --out-dir runs/best`.", ""]
    names = list(space.params)
    lines += ["| trial | state | " + " | ".join(names) + f" | dev {space.objective[0]} | train s | note |",
              "|---:|---|" + "---|" * len(names) + "---:|---:|---|"]
    for r in sorted(table, key=_by_score):
        mark = " **best**" if r["trial"] in best else ""
        params = " | ".join(_cell(r[f"param:{n}"]) for n in names)
        lines.append(f"| {r['trial']}{mark} | {r['state'].lower()} | {params}"
                     + f" | {_num(r['score'])} | {_num(r['train_seconds'], 1)} | {r['note']} |")
    pareto = front(table)
    if pareto:
        lines += ["", f"Accuracy against cost: the completed trials that no other beats on both dev "
                      f"{space.objective[0]} and training seconds (front.png plots every trial):", "",
                  "| trial | " + " | ".join(names) + f" | dev {space.objective[0]} | train s |",
                  "|---:|" + "---|" * len(names) + "---:|---:|"]
        lines += [f"| {r['trial']} | " + " | ".join(_cell(r[f'param:{n}']) for n in names)
                  + f" | {_num(r['score'])} | {_num(r['train_seconds'], 1)} |" for r in pareto]
    return "\n".join(lines) + "\n"


def _run_dir(table, number) -> str:
    return next(r["run_dir"] for r in table if r["trial"] == number)


def _cell(v) -> str:
    return "none" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))


def _num(v, digits: int = 4) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def write(study, space: Space, out: Path) -> Path:
    table = rows(study, space)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(markdown(study, space, table))
    with open(out / "summary.csv", "w", newline="") as f:
        columns = ["trial", "state", *[f"param:{k}" for k in space.params], "score", "train_seconds", "note",
                   "run_dir"]
        w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        w.writerows(table)
    figures(study, space, out, table)
    return out / "summary.md"


def figures(study, space: Space, out: Path, table: list[dict]) -> list[Path]:
    """Optuna's matplotlib figures: history and importances (one objective) or the Pareto front."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed: no figures (pip install -e '.[plots]')")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm
    if sum(t.state.name == "COMPLETE" for t in study.get_trials(deepcopy=False)) < 2:
        return []
    if space.multi:
        plots = {"pareto_front.png": lambda: ovm.plot_pareto_front(
            study, target_names=[f"dev {space.objective[0]}", "training seconds"])}
    else:
        plots = {"history.png": lambda: ovm.plot_optimization_history(study),
                 "importances.png": lambda: ovm.plot_param_importances(study)}
    written = [front_figure(table, space, out / "front.png", plt)]
    for name, draw in plots.items():
        try:
            with warnings.catch_warnings():  # Optuna marks its matplotlib backend experimental
                warnings.simplefilter("ignore")
                ax = draw()
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.set_size_inches(8, 5)
            fig.tight_layout()
            fig.savefig(out / name, dpi=100)
            plt.close(fig)
            written.append(out / name)
        except (ValueError, RuntimeError) as e:  # e.g. importances of one searched option
            log.warning("no %s: %s", name, e)
    return written


def front_figure(table: list[dict], space: Space, path: Path, plt) -> Path:
    """Every completed (and pruned) trial's dev score against its training seconds, the front joined."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for state, marker in (("COMPLETE", "o"), ("PRUNED", "x")):
        pts = [r for r in table if r["state"] == state and r["score"] is not None and r["train_seconds"] is not None]
        ax.scatter([r["train_seconds"] for r in pts], [r["score"] for r in pts], marker=marker,
                   label=f"{state.lower()} trials", color="C0" if state == "COMPLETE" else "grey")
    pareto = front(table)
    ax.plot([r["train_seconds"] for r in pareto], [r["score"] for r in pareto], "-o", color="C3",
            label="front: fastest for its score")
    for r in pareto:
        ax.annotate(str(r["trial"]), (r["train_seconds"], r["score"]), textcoords="offset points", xytext=(4, 4),
                    fontsize="small")
    ax.set_xlabel("training seconds (steps only)")
    ax.set_ylabel(f"dev {space.objective[0]}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
