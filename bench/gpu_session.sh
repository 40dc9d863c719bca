#!/usr/bin/env bash
# The GPU check, as it ran on the lent H200 (2026-11-26, 460 s in one 10-minute command) and since extended
# (its stages no longer fit one call: STAGES picks them): the full suite on 12 CPU workers beside `env`
# and `cuda-tests` (neither is timed); then, timed and alone, what a new batch length's first steps cost
# (bench/shape_warmup.py, with and without --pad-multiple), the step with each layer's kernels replayed
# as CUDA graphs (precision_compile.py --compile-mode reduce-overhead), what freezing saves there
# (bench/study_cost.py), `train`, `bench`, the step's ops,
# syncs and torch.profiler view (bench/step_ops.py, bf16 and fp32, MiniLM and bert-base's shape), then,
# while time is left before DEADLINE seconds, the best recipe under fp16 and fp32 (bf16 is the `train`
# stage's). Results in /tmp/gpu (summary.md); with $OUT set (the lent machine's folder that comes back),
# a copy as $OUT/gpu.tgz every 15 s and at the end, so that a command cut off still returns what it finished.
#
#   bash bench/gpu_session.sh                     # from the repository root, .gpu/prep carried
#   STAGES="cuda-tests compile shape step-ops train" bash bench/gpu_session.sh   # some stages only
#   GPU_DRY=--dry-run DEV=cpu EXTRA_SIZE="--max-train-examples 24 --epochs 1" bash bench/gpu_session.sh
set -u
cd "$(dirname "$0")/.." || exit 2
# .gpu/prep on the path: the alias minilm-l6 resolves to its copy there (the machine has no wheel, no pip)
export PYTHONUNBUFFERED=1 MINBERT_DATA_DIR=$PWD/.gpu/prep/course_data PYTHONPATH=$PWD:$PWD/.gpu/prep${PYTHONPATH:+:$PYTHONPATH}
DRY=(${GPU_DRY:-})
# the stages, in the order they run (the questions the next GPU owes first); STAGES picks some
STAGES=" ${STAGES:-suite cuda-tests shape compile study-cost train bench step-ops recipes} "
want() { [[ "$STAGES" == *" $1 "* ]]; }
R=/tmp/gpu; mkdir -p "$R"; T0=$(date +%s)
save() {
    [[ -n "${OUT:-}" ]] && tar -C /tmp -czf "$OUT/gpu.tgz.part" gpu 2>/dev/null && mv "$OUT/gpu.tgz.part" "$OUT/gpu.tgz"
    return 0
}
(while sleep 15; do save; done) & SAVER=$!
# the console script `minbert`, which some tests call, without fetching anything
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$R/pip.log" 2>&1 || echo "pip -e failed" >>"$R/pip.log"
SUITE=
if want suite; then
    OMP_NUM_THREADS=2 MINBERT_GPU_PYTEST_ARGS="-n 12 -vv" MINBERT_GPU_TESTS_LIMIT=${SUITE_LIMIT:-210} \
        bash bench/gpu_check.sh "${DRY[@]}" "$R" tests >"$R/suite-driver.out" 2>&1 & SUITE=$!
fi
if want cuda-tests; then bash bench/gpu_check.sh "${DRY[@]}" "$R" env cuda-tests; else bash bench/gpu_check.sh "${DRY[@]}" "$R" env; fi
[[ -n "$SUITE" ]] && wait $SUITE; echo "suite+cuda-tests done at $(( $(date +%s) - T0 )) s"; save
# why the first bf16 epoch took twice the later ones: a new batch length's first steps, fp32 and bf16, padded
# to the longest and to multiples of 32 (--pad-multiple), each arm in a fresh process; on the H100 (2026-11-26)
# bf16 paid 341 ms per new length, in cuDNN's attention: the arms without it ask whether that is all of it
want shape && timeout 200 python3 bench/shape_warmup.py --device "${DEV:-cuda}" --batches 120 \
    --cudnn-attention on off --data-dir "$MINBERT_DATA_DIR" >"$R/shape-warmup.log" 2>&1
echo "shape_warmup done at $(( $(date +%s) - T0 )) s"; save
# CUDA graphs for the launch-bound step: each layer compiled under reduce-overhead (--compile-mode)
want compile && timeout 240 python3 bench/precision_compile.py --device "${DEV:-cuda}" --steps 20 --warmup 5 \
    --compile-mode reduce-overhead --data-dir "$MINBERT_DATA_DIR" >"$R/compile-reduce-overhead.log" 2>&1
echo "reduce-overhead done at $(( $(date +%s) - T0 )) s"; save
# what freezing saves on a GPU, where a small model's step is bound by launching kernels rather than by
# arithmetic: the freezing study's points end to end, interleaved, each in a fresh process (on the CPU, five
# frozen layers of six ran an epoch 6x faster); STUDY_COST_ARGS shrinks it for a dry run. On the H100 one
# round with the cache off as well took 270 s (about 25 s a run): two rounds fit only without those arms
# shellcheck disable=SC2086  # STUDY_COST_ARGS is a list of flags
want study-cost && timeout 330 python3 bench/study_cost.py --data-dir "$MINBERT_DATA_DIR" \
    ${STUDY_COST_ARGS:---examples 2000 --eval-examples 500 --epochs 2 --rounds 2 --no-cache-off} --points "full fine-tuning" \
    "2/6 of the layers frozen" "half the layers frozen" "5/6 of the layers frozen" "heads only" \
    "LoRA r=8 (all linear maps)" --json "$R/study-cost.json" >"$R/study-cost.log" 2>&1
echo "study_cost done at $(( $(date +%s) - T0 )) s"; save
if want train; then
    MINBERT_GPU_TRAIN_LIMIT=${TRAIN_LIMIT:-240} bash bench/gpu_check.sh "${DRY[@]}" "$R" train
    echo "train done at $(( $(date +%s) - T0 )) s"; save
fi
if want bench; then bash bench/gpu_check.sh "${DRY[@]}" "$R" bench; echo "bench done at $(( $(date +%s) - T0 )) s"; save; fi
# where a step's time goes on the device (issue 42, point 4): its ops, syncs and a torch.profiler view
want step-ops && for prec in bf16 fp32; do
    timeout 120 python3 bench/step_ops.py --device "${DEV:-cuda}" --profile 25 -- --smart --smart-lambda 0 \
        --pooling mean --ema-decay 0.998 --precision $prec --data-dir "$MINBERT_DATA_DIR" >"$R/step-ops-$prec.log" 2>&1
done
# the same at bert-base's shape (random weights, MiniLM's vocabulary): bert-base itself cannot be carried
want step-ops && python3 bench/bert_base_shape.py /tmp/bert-base-shape >"$R/bert-base-shape.log" 2>&1
want step-ops && for prec in bf16 fp32; do
    timeout 150 python3 bench/step_ops.py --device "${DEV:-cuda}" --profile 25 -- --model /tmp/bert-base-shape \
        --smart --smart-lambda 0 --pooling mean --ema-decay 0.998 --precision $prec --data-dir "$MINBERT_DATA_DIR" \
        >"$R/step-ops-bert-base-shape-$prec.log" 2>&1
done
echo "step_ops done at $(( $(date +%s) - T0 )) s"; save
want recipes && for prec in fp16 fp32; do
    left=$(( ${DEADLINE:-540} - ($(date +%s) - T0) ))
    (( left < 90 )) && { echo "no time for $prec ($left s left)"; continue; }
    run=/tmp/gpu-work-$prec; mkdir -p "$R/train-$prec"
    # shellcheck disable=SC2086  # EXTRA_SIZE is a list of flags
    timeout "$left" python3 run_multitask.py --model minilm-l6 --data-dir "$MINBERT_DATA_DIR" --epochs 3 --smart \
        --smart-lambda 0 --pooling mean --ema-decay 0.998 --predict-both-orders --seed 2 --device "${DEV:-cuda}" \
        --precision $prec --out-dir "$run" --predictions-dir "$run/predictions" --overwrite ${EXTRA_SIZE:-} \
        >"$R/train-$prec/stdout.log" 2>&1
    echo "$prec exit $? at $(( $(date +%s) - T0 )) s" | tee -a "$R/train-$prec/stdout.log"
    cp "$run"/{metrics.jsonl,train.log,config.json} "$R/train-$prec/" 2>/dev/null; save
done
kill $SAVER 2>/dev/null; save
cat "$R/summary.md"
cat "$R/shape-warmup.log" "$R/compile-reduce-overhead.log" "$R/study-cost.log" 2>/dev/null
for f in "$R"/step-ops-*.log; do  # not parts of gpu_check.sh: their headline lines here
    [[ -f "$f" ]] && { echo "== $(basename "$f")"; grep -E "^# |^all |host syncs|profiled|device busy" "$f"; }
done
