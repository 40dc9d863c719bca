"""Zip a run's prediction files for the course's submission.

    python -m training.submit runs/default         # writes runs/default/cs224n_default_final_project_submission.zip
    python -m training.submit runs/default --zip my-submission.zip

The zip is laid out as the course's own prepare_submit.py lays it out (CS224N default final project
starter code, 2023 and 2024): the prediction files under predictions/ (predictions/sst-dev-output.csv,
... , predictions/sts-test-output.csv), the code's Python files beside them (here run_multitask.py and
the packages minbert/, heads/, data/, training/ with their paths; --no-code leaves them out), named
cs224n_default_final_project_submission.zip.

RUN is a run directory (its predictions/ folder) or a predictions folder. The folder must hold one
model's set: its manifest.json (written with the files by the trainer and by
`python -m training.evaluate --data-dir`; training/inference/predictions.py) lists every prediction file there with
its sha256, and a folder with a file missing, a course-named file the manifest does not list, a file
changed since, or no manifest, is refused. So is a set short of the six files the course expects,
unless --partial.
"""
from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from data.loaders import TASKS
from training.args import Parser, output_file_problem
from training.inference.formats import read_predictions
from training.inference.predictions import MANIFEST, PredictionSetError, check_prediction_set

PROG = "python -m training.submit"
COURSE_ZIP = "cs224n_default_final_project_submission.zip"
COURSE_FILES = [f"{task}-{split}-output.csv" for task in TASKS for split in ("dev", "test")]
CODE_PACKAGES = ("minbert", "heads", "data", "training")
REPO = Path(__file__).resolve().parents[1]


class SubmitError(ValueError):
    """One line for the user."""


def predictions_folder(arg: Path) -> Path:
    """RUN/predictions, or the folder itself where it holds the files (or their manifest)."""
    if (arg / "predictions").is_dir():
        return arg / "predictions"
    if (arg / MANIFEST).is_file() or any(arg.glob("*-output.csv")):
        return arg
    raise SubmitError(f"{arg}: no predictions/ folder and no prediction files (train the run, or write them with "
                      f"python -m training.evaluate {arg} --data-dir DATA --predictions-dir "
                      f"{arg / 'predictions'})")


def checked_files(folder: Path, partial: bool) -> tuple[dict, list[Path]]:
    """The folder's manifest and files, refused unless they are one model's complete set."""
    try:
        manifest, files = check_prediction_set(folder)
    except PredictionSetError as e:
        hint = ("; write the set again with python -m training.evaluate RUN --data-dir DATA "
                f"--predictions-dir {folder}") if "no manifest" in str(e) or "not one run's set" in str(e) else ""
        raise SubmitError(f"{e}{hint}") from None
    missing = [n for n in COURSE_FILES if n not in {p.name for p in files}]
    if missing and not partial:
        raise SubmitError(f"{folder}: the course expects all six prediction files; missing {', '.join(missing)} "
                          f"(a run of fewer tasks, or without test files; --partial zips what there is)")
    for p in files:  # a renamed file would carry another task's header
        try:
            task, _ = read_predictions(p)
        except (ValueError, IndexError) as e:
            raise SubmitError(f"{p}: not a course prediction file ({e})") from None
        if not p.name.startswith(f"{task}-"):
            raise SubmitError(f"{p}: holds {task} predictions (its header) under another task's name")
    return manifest, files


def code_files(root: Path = REPO) -> list[Path]:
    files = [root / "run_multitask.py"] if (root / "run_multitask.py").is_file() else []
    for package in CODE_PACKAGES:
        files += sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)
    return files


def submit(arg: str | Path, out: str | Path | None = None, overwrite: bool = False, code: bool = True,
           partial: bool = False) -> tuple[Path, dict, list[Path]]:
    arg = Path(arg)
    folder = predictions_folder(arg)
    manifest, files = checked_files(folder, partial)
    zip_path = Path(out) if out else (arg if folder != arg else arg.parent) / COURSE_ZIP
    problem = output_file_problem(zip_path)  # a folder there, or a file where its folder goes
    if problem:
        raise SubmitError(f"{zip_path}: {problem}")
    if zip_path.exists() and not overwrite:
        raise SubmitError(f"{zip_path}: exists; pass --overwrite to replace it, or --zip another file")
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = zip_path.with_name(f"{zip_path.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for p in [*files, folder / MANIFEST]:
                z.write(p, f"predictions/{p.name}")
            for p in code_files() if code else []:
                z.write(p, p.relative_to(REPO).as_posix())
        os.replace(tmp, zip_path)
    finally:
        tmp.unlink(missing_ok=True)
    return zip_path, manifest, files


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("run", metavar="RUN", help="a run directory (its predictions/) or a predictions folder")
    p.add_argument("--zip", metavar="FILE.zip", default=None, help=f"the zip to write (default: RUN/{COURSE_ZIP})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing zip")
    p.add_argument("--no-code", dest="code", action="store_false", help="leave the code's .py files out of the zip")
    p.add_argument("--partial", action="store_true", help="zip a set short of the six files the course expects")
    args = p.parse_args(argv)
    try:
        zip_path, manifest, files = submit(args.run, args.zip, args.overwrite, args.code, args.partial)
    except SubmitError as e:
        p.fail(str(e))
    overall = (manifest.get("dev_metrics") or {}).get("overall")
    score = f", dev overall {overall:.4f}" if isinstance(overall, (int, float)) else ""
    print(f"wrote {zip_path}: {len(files)} prediction files of {manifest.get('checkpoint', '?')}{score}"
          + ("" if args.code else ", no code"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
