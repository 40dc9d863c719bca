"""minbert study RECIPE: run a study's missing runs, then write its report.

    minbert study depth --out studies/minilm --data-dir data --threads 1
    minbert study depth --out studies/minilm --report-only   # the report from the results so far
    minbert study whole --out studies/bert-base --model bert-base-uncased --data-dir data

RECIPE is one of the built-in recipes (training/experiments/study/recipes/: whole, whole-size, whole-rates
and whole-size-rates (the near ties of whole and of whole-size at their runner-up rate), the clean protocol
on the whole training files; mpnet-depth and mpnet-scale-minilm, the 12-layer study on MPNet-base and MiniLM
at its scale, 1000 examples per task, each recipe naming its model; depth, size, seed-report and schedules,
the small study) or a JSON file of one's own. Each finished run is appended to OUT/results.jsonl at once
(the sweep's format, training/experiments/sweep/records.py), so a killed study loses only the run in
progress, and rerunning the command goes on where it stopped. Start the same command in a second shell to
train on two workers: each run is claimed by one. The report (report.md, report.csv and the figures) is
rewritten after every run, in OUT/<the recipe's report folder>. The project's own record is --out
docs/freezing-study (the small studies) and docs/freezing-study/whole (the whole-file study).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from data.loaders import load_task_file
from training.args import Parser, add_option
from training.common.errors import ConfigError
from training.common.progress import setup_logging
from training.config.train_config import TrainConfig, validate
from training.experiments.study.arms_cost import measured_where, read_cost, remaining_work
from training.experiments.study.figures import FIGURES
from training.experiments.study.protocol import ArmOverrides, foreign_run, role_of
from training.experiments.study.recipe import Recipe, available, load_recipe
from training.experiments.study.tables import MARKDOWN, write_csv
from training.experiments.sweep.engine import Workers, default_runs_dir, model_layers, work, writable_problem
from training.experiments.sweep.records import RESULTS, RunKey, read_results, settings_clash, settings_of
from training.experiments.sweep.subsets import Grid, training_subsets, tuning_count
from training.run.signals import exit_on_sigterm

log = logging.getLogger(__name__)
PROG = "python -m training.experiments.study"


def build_parser(prog: str = PROG) -> Parser:
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("recipe", help=f"a built-in recipe ({', '.join(available())}) or a recipe file (JSON)")
    add_option(p, TrainConfig.__dataclass_fields__["data_dir"], help_suffix=" (default: %(default)s)")
    add_option(p, TrainConfig.__dataclass_fields__["model"], help_suffix=" (default: the recipe's \"model\" in its "
               f"\"train\", else {TrainConfig.model})")
    p.set_defaults(model=None)  # given or not: a recipe may name its model (study_model)
    p.add_argument("--out", default=None, help="folder for results.jsonl and the report (default: the recipe's "
                   "\"results\" if it names one, else runs/study)")
    p.add_argument("--runs-dir", default=None, help="folder for the run directories (default: runs/<name of "
                   "RESULTS>-<hash of its path>-runs, as training.experiments.sweep)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's choice); "
                   "for two workers on two cores, 1 each")
    p.add_argument("--report-only", action="store_true", help="train nothing: write the report from the results so far")
    p.add_argument("--dry-run", action="store_true", help="list the runs, done or to do, and stop")
    p.add_argument("--keep-going", action="store_true", help="after a failed run, go on with the others")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's best.pt and checkpoint")
    p.add_argument("--in-process", action="store_true", help="train in this process (no peak-memory figure)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def study_model(recipe: Recipe, given: str | None) -> str:
    """The model a study trains: --model where given, else the recipe's (its "train" may name one, as
    mpnet-depth.json does, so that a worker started without --model, bench/gpu_study.sh's, trains the
    recipe's model), else TrainConfig's default."""
    return given or recipe.train.get("model") or TrainConfig.model


def study_layers(recipe: Recipe, given: str | None, layers: int | None = None,
                 fix: str = "give a model whose config.json is here with --model") -> int:
    """The depth of the model the study's runs train (study_model's), read from its config.json unless the
    caller was given it (`layers`); one line naming the model and `fix` (how the caller's user gives it)
    where it cannot be read."""
    if layers:
        return layers
    model = study_model(recipe, given)
    found = model_layers(model)
    if found is None:
        raise ConfigError(f"{model}: cannot read its config.json (num_hidden_layers); {fix}")
    return found


def base_config(recipe: Recipe, args) -> TrainConfig:
    """What every run of the study gets: the recipe's options over TrainConfig's defaults, the model
    study_model's, checkpoints at epoch ends only, no test predictions."""
    return TrainConfig(**{"save_every": 0, "keep_last": 1, "log_every": 2, "test_predictions": False,
                          "data_dir": args.data_dir, **recipe.train, "model": study_model(recipe, args.model)})


def check(recipe: Recipe, base: TrainConfig) -> list[str]:
    """Every arm's configuration, checked as run_multitask.py checks its flags."""
    base_errors = validate(base)
    errors = [f"{recipe.path}: train: {e}" for e in base_errors]
    for arm, overrides in recipe.all_arms().items():  # what an arm's overrides add
        errors += [f"{recipe.path}: arm {arm!r}: {e}" for e in validate(TrainConfig(**{**base.to_dict(), **overrides}))
                   if e not in base_errors]
    return errors


def write_report(recipe: Recipe, results: Path, report: Path, data_dir: str | None = None) -> Path:
    if recipe.kind == "arms":  # the dev labels (for the bootstrap) from data_dir
        from training.experiments.study.arms_report import write_arms_report
        return write_arms_report(recipe, results, report, data_dir)
    records = read_results(results / RESULTS)
    report.mkdir(parents=True, exist_ok=True)
    (report / "report.md").write_text(MARKDOWN[recipe.kind](recipe, records))
    write_csv(recipe, records, report / "report.csv")
    FIGURES[recipe.kind](recipe, records, report)
    return report / "report.md"


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    exit_on_sigterm()
    try:
        recipe = load_recipe(args.recipe)
        recipe.resolve(study_layers(recipe, args.model))  # the depths resolve on the model the runs train
        base = base_config(recipe, args)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        print(f"{prog}: error: --threads must be >= 1, not {args.threads}", file=sys.stderr)
        return 2
    errors = check(recipe, base)
    results = Path(args.out or recipe.results or "runs/study")
    report = results / (recipe.report or recipe.path.stem)
    records = read_results(results / RESULTS, repair=not (args.dry_run or args.report_only))
    if not (args.report_only or args.dry_run):  # reading the records is safe; only training must not mix settings
        errors += [e for e in [settings_clash(records, settings_of(base), results / RESULTS)] if e]
    if recipe.kind == "arms":  # nor may a report, or a plan, take another recipe's runs for this one's
        foreign = foreign_run(recipe, records)
        errors += [f"{results / RESULTS}: {foreign}: another recipe's run; use another --out"] if foreign else []
    if errors:
        print(f"{prog}: error: {errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
              file=sys.stderr)
        return 2
    if not args.report_only:
        warn_if_emulated(recipe, base)
    if args.dry_run:
        finished = {RunKey.of(r) for r in records}
        for k in recipe.plan(records):
            print(f"{'done' if k in finished else 'todo'}  {k.name}")
        if recipe.kind == "arms":
            print_remaining(recipe, records, read_cost(results), files_examples(recipe, base))
        return 0
    rc = 0
    if not args.report_only:
        rc = train(recipe, base, args, results, report, prog)
        if rc == 2:  # refused before training: no new result to report
            return rc
    try:
        path = write_report(recipe, results, report, base.data_dir)
    except ValueError as e:  # an arms study's dev files are not the ones its runs were scored on
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    log.info("report: %s", path)
    return rc


def warn_if_emulated(recipe: Recipe, base: TrainConfig) -> None:
    """Say once, before any run, where the recipe's precision is one this machine only emulates (bf16 on a
    CPU without AMX or AVX512-BF16): every run, and the dry run's estimates, are then many times slower."""
    from training.common.device import emulated_precision, pick_device  # torch, once there is work

    arms, device = recipe.all_arms().values(), pick_device(base.device)
    for precision in dict.fromkeys([base.precision, *(a["precision"] for a in arms if "precision" in a)]):
        slow = emulated_precision(precision, device)
        if slow:
            log.warning("%s trains its runs so: %s. Copy the recipe with \"precision\": \"auto\" to train in "
                        "what this machine computes fastest (with another --out: results of other settings "
                        "do not mix)", recipe.path, slow)


def files_examples(recipe: Recipe, base) -> int:
    """The training examples a run on the whole files trains on, counted from the files (the tuning split
    held out): what a dry run plans the whole files' points with before any of their runs says it."""
    share = (recipe.tuning_split or {}).get("share")
    counts = [len(load_task_file(base.file(task, "train"), task, labelled=True).examples) for task in recipe.tasks]
    return sum(n - (tuning_count(n, share) if share else 0) for n in counts)


def print_remaining(recipe: Recipe, records: list[dict], measurements: list[dict],
                    whole_files: int | None = None) -> None:
    """What is left of an arms study, point by point, with its cost where the cost benchmark measured it
    (whole_files: the whole files' training examples, for their points' estimate before any run)."""
    rows, known = remaining_work(recipe, records, measurements, whole_files), 0.0
    print("\nleft to do (planned so far + reporting runs waiting for their point's rate):")
    for r in rows:
        hours = ("no estimate (not measured, or no run yet gives the files' size)" if r["seconds"] is None
                 else f"{'at most' if r['at_most'] else 'about'} {r['seconds'] / 3600:.1f} h of one idle core"
                 + (" (a schedule: costed as if it froze nothing)" if r["at_most"] else ""))
        print(f"  {r['label']}: {r['todo']} + {r['waiting']} runs, {hours}")
        known += r["seconds"] or 0
    print(f"  in all: about {known / 3600:.1f} h of one idle core for the measured points (cost/*.json beside the "
          "results; a planning figure: grid extensions not foreseen)")
    if measurements:
        print(measured_on_line(measurements))
    from training.experiments.study.arms import point_rows, twins_due  # scipy: once there is work

    due = twins_due(recipe, point_rows(recipe, records, None))
    if due:
        print(f"  and a longer twin is due (most reporting runs kept their last evaluation) for: {'; '.join(due)}: "
              "add it to the recipe")


def measured_on_line(measurements: list[dict]) -> str:
    """The machines the estimates' cost was measured on, and this one where it is none of them: the hours are
    theirs (MPNet's bf16 training step took 27x its fp32 one on an AVX2-only EPYC; MiniLM's bf16 step took half
    its fp32 one on an EPYC with AVX512-BF16)."""
    from training.common.device import machine_name  # torch, once there is work

    here = machine_name()
    line = f"  the hours are those of the machine that measured the cost: {measured_where(measurements)}"
    if here not in {m.get("machine") for m in measurements}:
        line += f"; this machine ({here}) is another, whose hours differ"
    return line


def train(recipe: Recipe, base: TrainConfig, args, results: Path, report: Path, prog: str = PROG) -> int:
    arms_study = recipe.kind == "arms"
    seeds = recipe.seeds + (recipe.lr_grid["tuning_seeds"] if arms_study else [])
    grid = Grid(recipe.tasks, recipe.sizes, seeds, recipe.tuning_split)
    workers = Workers(args.threads, args.in_process, args.keep_going, args.keep_checkpoints)
    runs_dir = Path(args.runs_dir or default_runs_dir(results))
    problem = writable_problem({f"{recipe.path}: results": results, f"{recipe.path}: report": report,
                                "--runs-dir": runs_dir})
    subsets = problem or training_subsets(grid, base, flag=f"{recipe.path}: sizes")
    if isinstance(subsets, str):
        print(f"{prog}: error: {subsets}", file=sys.stderr)
        return 2
    arms, annotate = recipe.all_arms(), None
    if arms_study:
        from training.experiments.study.baselines import write_baselines
        write_baselines(recipe, base, subsets, results)
        arms, annotate = ArmOverrides(recipe), lambda key: {"seed_role": role_of(recipe, key)}
    return work(grid, workers, base, recipe.plan, arms, subsets, results, runs_dir,
                after_each=lambda: write_report(recipe, results, report, base.data_dir), annotate=annotate)
