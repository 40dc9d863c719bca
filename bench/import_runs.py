"""Add to a study's record the runs another copy of it finished elsewhere (a lent GPU, another machine).

    python bench/import_runs.py /tmp/gpu/study/whole docs/freezing-study/whole   # FROM INTO

Appends to INTO/results.jsonl each record of FROM/results.jsonl whose run (tasks, depth, size, seed, arm)
INTO lacks, with its dev predictions, and leaves the runs INTO holds alone. Every record to import must
have been trained with INTO's settings (the same check a study makes before it trains into a results
file), so that a study never mixes runs of other settings; the machine is not a setting: the records
name it (cpu, gpu) and the report counts the runs per machine. Nothing is written unless every record to
import passes. Then rewrite the report (`minbert study RECIPE --out INTO --report-only`).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from common import REPO  # noqa: F401  (puts the repository on sys.path)

from training.experiments.sweep.records import RunKey, append_result, completed_settings, read_results, settings_clash


def new_runs(source: list[dict], target: list[dict]) -> list[dict]:
    """The records of source whose run target does not hold (the first of each, in source's order)."""
    seen = {RunKey.of(r) for r in target}
    out = []
    for record in source:
        if RunKey.of(record) not in seen:
            seen.add(RunKey.of(record))
            out.append(record)
    return out


def import_runs(source: Path, target: Path) -> list[dict]:
    """Append source's new runs to target (results and dev predictions); returns them. ValueError, naming
    the file, where a record's settings or dev predictions do not fit."""
    target_records = read_results(target / "results.jsonl")
    if not target_records:
        raise ValueError(f"{target / 'results.jsonl'}: no records to import into")
    records = new_runs(read_results(source / "results.jsonl"), target_records)
    # the record's settings completed as a study completes them: its runs may predate options added since
    clash = settings_clash(records, completed_settings(target_records[0]["settings"]), source / "results.jsonl",
                           then=f" than {target / 'results.jsonl'}'s")
    if clash:
        raise ValueError(clash)
    missing = [r["dev_predictions"] for r in records if r.get("dev_predictions")
               and not (source / r["dev_predictions"]).is_file()]
    if missing:
        raise ValueError(f"{source / missing[0]}: missing ({len(missing)} dev prediction file(s) in all)")
    for record in records:
        if record.get("dev_predictions"):
            (target / record["dev_predictions"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / record["dev_predictions"], target / record["dev_predictions"])
        append_result(target / "results.jsonl", record)
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("source", type=Path,
                   help="the study folder the runs were trained into (results.jsonl, dev-predictions/)")
    p.add_argument("target", type=Path, help="the study's record to add them to")
    args = p.parse_args(argv)
    try:
        records = import_runs(args.source, args.target)
    except (ValueError, OSError) as e:
        print(f"import_runs: {e}", file=sys.stderr)
        return 2
    print(f"{len(records)} run(s) added to {args.target / 'results.jsonl'}"
          + "".join(f"\n  {RunKey.of(r).name}" for r in records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
