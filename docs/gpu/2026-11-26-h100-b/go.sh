#!/usr/bin/env bash
# One device call (2026-11-26, session 24): the owed cuDNN-attention question, then the whole-file study's
# full fine-tuning reporting seeds on the GPU (two workers sharing it), results tarred into $OUT every 15 s.
set -u
export PYTHONUNBUFFERED=1 MINBERT_DATA_DIR=$PWD/.gpu/prep/course_data PYTHONPATH=$PWD:$PWD/.gpu/prep
R=/tmp/g; mkdir -p $R; cp -r .gpu/study/out $R/study
# the CPU's tuning records name the CPU's data folder; .gpu/prep/course_data holds the same files (MANIFEST.json's sha256)
python3 - "$R/study/results.jsonl" "$MINBERT_DATA_DIR" <<'PY'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
for rec in recs:
    rec["settings"]["data_dir"] = sys.argv[2]
open(sys.argv[1], "w").writelines(json.dumps(rec) + "\n" for rec in recs)
PY
 T0=$(date +%s)
save() { tar -C /tmp -czf "$OUT/g.tgz.part" g 2>/dev/null && mv "$OUT/g.tgz.part" "$OUT/g.tgz"; }
(while sleep 15; do save; done) & SAVER=$!
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch,sys;print(sys.version.split()[0],torch.__version__,torch.version.cuda,torch.cuda.get_device_name())" >> $R/gpu.txt 2>&1
git rev-parse HEAD >> $R/gpu.txt 2>&1; nproc >> $R/gpu.txt
[[ -z "${NO_SHAPE:-}" ]] && timeout 150 python3 bench/shape_warmup.py --device ${DEV:-cuda} --batches ${BATCHES:-120} --multiples 1 \
    --cudnn-attention on off --data-dir "$MINBERT_DATA_DIR" > $R/shape-warmup.log 2>&1
echo "shape done at $(( $(date +%s) - T0 )) s" | tee -a $R/times.txt; save
left=$(( ${DEADLINE:-520} - ($(date +%s) - T0) ))
PIDS=()
(( left < 60 )) && left=60
for w in $(seq ${WORKERS:-2}); do
  timeout $left python3 -m training.study .gpu/study/${RECIPE:-full-on-gpu}.json --out $R/study --runs-dir /tmp/runs \
      --data-dir "$MINBERT_DATA_DIR" --keep-going > $R/worker$w.log 2>&1 & PIDS+=($!)
  sleep 5
done
wait "${PIDS[@]}"
echo "study done at $(( $(date +%s) - T0 )) s" | tee -a $R/times.txt
nvidia-smi >> $R/gpu.txt 2>&1
kill $SAVER; save; ls -la $R $R/study
