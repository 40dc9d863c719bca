#!/usr/bin/env bash
# Train a study's missing runs on a lent GPU, for its record kept elsewhere (bench/README.md, "A study's
# runs on a lent GPU"). Here, first: copy the record's results.jsonl, baselines.json and dev-predictions/
# (the report after each run reads them; 1.4 MiB for the whole-file study) into .gpu/study/NAME/ for
# each study, with .gpu/prep from bench/gpu_prepare.py, then carry .gpu. There: the carried course files
# are linked at DATA_AS, the record's data folder, so that the runs' settings are the record's; WORKERS
# workers per study share the one GPU (MiniLM's step leaves it mostly idle: on an H100 two workers
# trained full fine-tuning's whole-file runs in 78-105 s each, four SMART's in 219-233 s); each stops DEADLINE seconds after the
# start (it writes the report before it exits; killed 20 s later). What finished comes back in
# $OUT/study.tgz (saved every 15 s, so that a command cut off still returns it): add it here with
# bench/import_runs.py. A worker with nothing it can claim while others train waits for them (their
# tuning runs may release reporting runs) and stops when the study is complete; should one stop with
# status 0 before that (a checkout from before 2026-11-28, whose workers stopped with nothing to claim),
# its slot starts another 20 s later, until the study is complete or the deadline is a minute away
# (RETRY_S: that wait). THREADS: torch threads per worker (default 1: the
# host only dispatches). STUDY_DIR: where the studies train (default /tmp/study, its runs in STUDY_DIR-runs).
#
#   STUDIES="whole=whole" WORKERS=2 DEADLINE=520 DATA_AS=/work/shared/data/cs224n bash bench/gpu_study.sh
#   STUDIES="whole=whole whole-size=whole-size" WORKERS=2 ...   # two studies at once, WORKERS each
#   STUDIES="whole=whole:5 whole-size=whole-size:7" ...   # :N, that study's workers (else WORKERS)
#   (each NAME=RECIPE: the folder under .gpu/study/ holding the record, and a built-in recipe or a recipe file)
set -u
cd "$(dirname "$0")/.." || exit 2
: "${STUDIES:?NAME=RECIPE pairs, e.g. whole=whole}" "${DATA_AS:?the data folder the records name: settings.data_dir}"
for study in $STUDIES; do
    [[ "$study" == *=* && -f ".gpu/study/${study%%=*}/results.jsonl" ]] \
        || { echo "gpu_study: STUDIES: $study: not NAME=RECIPE with .gpu/study/NAME/results.jsonl" >&2; exit 2; }
done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/prep
mkdir -p "$(dirname "$DATA_AS")" && { [[ -e "$DATA_AS" ]] || ln -s "$PWD/.gpu/prep/course_data" "$DATA_AS"; } || exit 2
R=${STUDY_DIR:-/tmp/study}; mkdir -p "$R"; T0=$(date +%s)
save() { [[ -n "${OUT:-}" ]] && tar -C "$(dirname "$R")" -czf "$OUT/study.tgz.part" "$(basename "$R")" 2>/dev/null \
    && mv "$OUT/study.tgz.part" "$OUT/study.tgz"; return 0; }
(while sleep 15; do save; done) >/dev/null 2>&1 & SAVER=$!  # its sleep outlives the kill: not on our stdout
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git rev-parse HEAD; date -u; } >"$R/machine.txt" 2>&1
slot() {  # one worker after another on study $1 (recipe $2), log $3, until complete, failed or near the deadline
    local left rc
    while left=$(( ${DEADLINE:-520} - ($(date +%s) - T0) )); (( left > 60 )); do
        timeout -k 20 "$left" python3 -m training.experiments.study "$2" --out "$R/$1" --runs-dir "$R-runs/$1" \
            --data-dir "$DATA_AS" --threads "${THREADS:-1}" --keep-going >>"$3" 2>&1
        rc=$?
        (( rc == 0 )) || { echo "slot: worker exited $rc" >>"$3"; return; }
        tail -n 3 "$3" | grep -q "sweep complete" && return
        sleep "${RETRY_S:-20}"
    done
}
PIDS=()
for study in $STUDIES; do
    name=${study%%=*}; recipe=${study#*=}; workers=${WORKERS:-2}
    [[ "$recipe" =~ ^(.*):([0-9]+)$ ]] && { recipe=${BASH_REMATCH[1]}; workers=${BASH_REMATCH[2]}; }
    [[ -d "$R/$name" ]] || cp -r ".gpu/study/$name" "$R/$name"  # a warm machine's second call goes on from the first's
    for w in $(seq "$workers"); do
        slot "$name" "$recipe" "$R/$name-worker$w.log" & PIDS+=($!)
        sleep 3  # each worker claims its own run
    done
done
wait "${PIDS[@]}"
echo "workers done at $(( $(date +%s) - T0 )) s" | tee -a "$R/machine.txt"
kill $SAVER; save
grep -h "finished in" "$R"/*worker*.log || echo "gpu_study: no run finished"
