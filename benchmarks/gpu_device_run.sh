#!/bin/bash
# The one prepared device script of issue 25 (run from a copy of the repository root on a machine
# with one CUDA GPU; everything it measures lands under $OUT, incrementally, so a cut-off run still
# returns data). Carried wheels (.whl/) give what the image lacks: pydantic (shardplan itself),
# bitsandbytes (QLoRA), trl + datasets (SFTTrainer).
#   OUT=/some/dir bash benchmarks/gpu_device_run.sh
# CAL=0 skips the calibrate commands (their outputs from an earlier device session are committed);
# ONLY="i j ..." runs those grid indices in that order (the most wanted first: a cut-off run keeps them).
set -u
export PYTHONUNBUFFERED=1 SP_CKPT_ROOT=/tmp
LOG=$OUT/log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >>"$LOG" 2>&1 || { echo "wheel install failed" >>"$LOG"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv;
  python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|peft|accelerate|bitsandbytes|trl|datasets|pydantic) "; } >>"$LOG" 2>&1
step() { echo "== $(date -u +%T) $*" >>"$LOG"; }
# one dtype per call: the overlay merges, and a refused fit of one dtype leaves the others written
for dt in $([ "${CAL:-1}" = 0 ] || echo bfloat16 float8_e4m3fn tf32); do
  step calibrate compute $dt
  timeout 40 python3 -m shardplan calibrate compute --out "$OUT/calibration.json" --dtype $dt --iters 30 \
    $([ $dt = bfloat16 ] || echo --no-bandwidth) >>"$LOG" 2>&1
done
step userscripts
timeout "${USER_S:-250}" python3 benchmarks/gpu_campaign.py userscripts --out "$OUT" --timeout 60 ${ONLY:+--only $ONLY} \
  $([ -z "${ONLY:-}" ] && echo --unmeasured) >>"$LOG" 2>&1
[ "${CAL:-1}" = 0 ] && { step done; tail -c 3000 "$LOG"; exit 0; }
step calibrate fsdp
timeout 80 python3 -m shardplan calibrate fsdp --launch fake --device cuda --world-size 8 --world-size 64 \
  --ac none --ac full --timeout 40 --out "$OUT/calibrate_fsdp.jsonl" >>"$LOG" 2>&1
step calibrate compare
timeout 30 python3 -m shardplan calibrate compare "$OUT/calibrate_fsdp.jsonl" --csv "$OUT/calibrate_compare.csv" \
  --md "$OUT/calibrate_compare.md" >>"$LOG" 2>&1
step done
tail -c 3000 "$LOG"
