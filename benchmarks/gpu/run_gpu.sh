#!/bin/bash
# Runs ON THE GPU MACHINE from the repo root, after vLLM 0.26 is installed in /tmp/site
# (../shared/gpu/README.md). Usage: bash benchmarks/gpu/run_gpu.sh det|tput|all
# Logs and results go to $OUT (at most 8 files come back): $OUT/STAGE.log, $OUT/results_STAGE.jsonl.
set -u
STAGE=${1:-all}
OUTD=${OUT:-/tmp/gpu_out}; mkdir -p "$OUTD"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 \
       VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_PLUGINS=no-plugin-on-purpose
B=benchmarks/gpu/gpu_codec_bench.py
PY=${PYTHON:-python3}
RES="$OUTD/results_$STAGE.jsonl"
LOG="$OUTD/$STAGE.log"
: >> "$RES"
nvidia-smi -L 2>&1 | head -1 | tee -a "$LOG"

one() {  # one LIMIT_S BI(0/1) ARGS...
  local limit=$1 bi=$2; shift 2
  local t0=$(date +%s)
  echo "=== $(date -u +%T) BI=$bi $*" | tee -a "$LOG"
  VLLM_BATCH_INVARIANT=$bi timeout "$limit" $PY $B "$@" > /tmp/one.log 2>&1
  local rc=$?
  grep -a "^\[ *[0-9.]*s \|^RESULT\|Error\|error:" /tmp/one.log | grep -v "^RESULT" | cut -c1-600 | tee -a "$LOG"
  grep -a "^RESULT " /tmp/one.log | sed 's/^RESULT //' >> "$RES" || true
  [ $rc = 0 ] || { echo "rc=$rc; last lines:" | tee -a "$LOG"; tail -25 /tmp/one.log | cut -c1-400 | tee -a "$LOG"; }
  echo "=== rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
}

if [ "$STAGE" = det ] || [ "$STAGE" = all ]; then
  M=models/pycoder-23m
  one 120 0 det --model $M --dtype bfloat16
  one 120 1 det --model $M --dtype bfloat16
  one 100 0 det --model $M --dtype float32 --rt-segments 12 --pipeline-bytes 20000
  one 100 1 det --model $M --dtype float32 --rt-segments 12 --pipeline-bytes 20000
  L=/tmp/rand-llama-0.9b
  timeout 90 $PY $B build $L 2>&1 | grep -a "^\[" | tee -a "$LOG"
  one 110 0 det --model $L --dtype bfloat16 --rt-segments 12 --pipeline-bytes 20000
  one 110 1 det --model $L --dtype bfloat16 --rt-segments 12 --pipeline-bytes 20000
fi
if [ "$STAGE" = tput ] || [ "$STAGE" = all ]; then
  one ${TPUT_LIMIT:-540} 1 tput --dtype bfloat16 --window ${WINDOW:-128} --budget-s ${TPUT_BUDGET:-330} --codec-top-k ${TOPK:-64} --bytes ${BYTES:-131072} --texts ${TEXTS:-code prose}
fi
echo "done $(date -u +%T)" | tee -a "$LOG"
