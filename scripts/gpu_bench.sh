#!/usr/bin/env bash
# The GPU measurements of docs/PERF.md in one call, on a machine with an NVIDIA GPU, from a
# build made with CUDA on (scripts/test.sh builds one):
#
#   scripts/gpu_bench.sh [BUILD_DIR] [OUT_DIR]        (defaults: build, gpu-results)
#
# Writes one log per measurement into OUT_DIR (with the commit, date and GPU on top) and a
# summary of the tables to stdout. Each measurement has its own time limit, so one slow step
# does not cost the others. Random weights (--load-format dummy style): no checkpoint needed.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-gpu-results}
DECODE="$BUILD/bench/bench_decode"
KERNELS="$BUILD/bench/bench_kernels"
for b in "$DECODE" "$KERNELS"; do
  if [ ! -x "$b" ]; then
    echo "gpu_bench: $b is missing: build with CUDA on (cmake -S . -B $BUILD; cmake --build $BUILD)" >&2
    exit 2
  fi
done
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_bench: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 2
fi
mkdir -p "$OUT"
HEADER="commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)'), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
C122=bench/configs/qwen3.5-122b-a10b.json
C35=bench/configs/qwen3.5-35b-a3b.json

# run NAME LIMIT_SECONDS COMMAND...: logs the command line and its output to OUT/NAME.log.
run() {
  local name=$1 limit=$2
  shift 2
  {
    echo "# $HEADER"
    echo "# $*"
  } >"$OUT/$name.log"
  timeout "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name (exit $rc): $*"
  grep -E '^(batch|prefill|sum of ops|fmt|fp8|bf16|int8|context|tokens| *M )|^ *[0-9]+ ' "$OUT/$name.log" | sed 's/^/   /'
}

run decode_122b 240 "$DECODE" --config "$C122" --weights hybrid-int4-fp8 --int8-lm-head \
  --batch 1,8 --context 512 --steps 16 --prefill 1024,8192
# Sampled decode steps (Qwen's sampling defaults) against the greedy ones above.
run decode_122b_sampled 240 "$DECODE" --config "$C122" --weights hybrid-int4-fp8 --int8-lm-head \
  --batch 1,8 --context 512 --steps 16 --prefill '' --temperature 0.7 --top-k 20 --top-p 0.95
run decode_122b_b64 240 "$DECODE" --config "$C122" --weights hybrid-int4-fp8 --int8-lm-head \
  --batch 64 --context 128 --steps 8 --prefill 16
# The same at serve's default context limit for the 122B (262,144 tokens: block-table rows of 16,384).
run decode_122b_b64_long 240 "$DECODE" --config "$C122" --weights hybrid-int4-fp8 --int8-lm-head \
  --batch 1,64 --context 128 --steps 8 --prefill '' --max-model-len 262144
run decode_35b 240 "$DECODE" --config "$C35" --weights bf16 --batch 1,8,64 --context 512 --steps 16 \
  --prefill 1024,8192
# Where a batch-1 and a batch-8 step's time goes inside the graph (CUPTI kernel timeline; the
# recording itself adds a little to each step, so the ms/step of this run is not the headline).
if "$DECODE" --help | grep -q -- --kernel-timeline; then
  run timeline_122b 240 "$DECODE" --config "$C122" --weights hybrid-int4-fp8 --int8-lm-head \
    --batch 1,8 --context 512 --steps 8 --prefill '' --kernel-timeline "$OUT/timeline_122b.csv"
  python3 bench/step_timeline.py "$OUT/timeline_122b.csv" --list 24 >"$OUT/timeline_122b.txt" 2>&1 &&
    grep -E '^\[|^step GPU|^host call' "$OUT/timeline_122b.txt" | sed 's/^/   /'
fi
run kernels_122b 120 "$KERNELS" --config "$C122" --weights hybrid-int4-fp8 --batch 1,8
run kernels_35b 120 "$KERNELS" --config "$C35" --weights bf16 --batch 1,8
# Prefill kernels, tensor cores against CUDA cores (the ops prompt tokens take).
for b in bench_mma_gemm bench_moe_mma bench_attention_prefill bench_gdn_prefill; do
  [ -x "$BUILD/bench/$b" ] && run "$b" 120 "$BUILD/bench/$b"
done
echo "logs in $OUT/"
