#!/usr/bin/env bash
# run_targets.sh — the performance targets of docs/performance.md in one go:
# writes a TinyLlama-1.1B-shaped Q8_0 GGUF with random weights (ekv mkmodel)
# unless it exists, measures memory read bandwidth, then runs the ekv bench
# grids (Markdown tables to stdout, JSON files to OUTDIR).
#
#   bench/run_targets.sh [BUILD_DIR=build] [OUTDIR=/tmp/ekv-targets] [THREADS=2]
#
# Long: the 7.5K-token prompts take minutes each on 2 cores.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-/tmp/ekv-targets}
T=${3:-2}
EKV="$BUILD/ekv"
MODEL=${MODEL:-$OUT/tinyllama-1.1b-q8_0.gguf}
mkdir -p "$OUT"
[ -f "$MODEL" ] || "$EKV" mkmodel --preset tinyllama-1.1b --type q8_0 -o "$MODEL"

echo "## machine"
lscpu | grep -E "Model name|^CPU\(s\)" || true
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bench/bench_membw" 1024 1 5
"$BUILD/bench/bench_membw" 1024 "$T" 5

echo "## prompt 512 and decode at empty context (full cache)"
"$EKV" bench -m "$MODEL" -t "$T" -p 0,512 -n 64 -r 3 --json "$OUT/short.json"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "## batched decode at 1K context"
"$EKV" bench -m "$MODEL" -t "$T" -p 1024 -n 16 -b 1,8 -r 1 --json "$OUT/batch.json"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "## 7.5K-token prompt: full cache vs Elastic Cache at budget 0.2"
"$EKV" bench -m "$MODEL" -t "$T" -p 7500 -n 32 -r 1 --kv-policy full,elastic --kv-budget 0.2 \
    --json "$OUT/long.json"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
