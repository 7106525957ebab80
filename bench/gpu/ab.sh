#!/usr/bin/env bash
# ab.sh — interleaved A/B rounds of several ekv builds on the GPU machine, then
# the KV-cache storage types at depth, in one call of a few minutes. It
# exists because device time is scarce: run.sh measures one build against
# llama.cpp; this measures what a change to the shaders is worth, build
# against build, in the same session, rounds interleaved (the order rotates
# each round), so drift of the machine falls on every build alike.
#
# Run from the repository root, each build's ekv named NAME=PATH (the first
# also writes the synthetic models and runs the storage-type grid):
#   EKV_AB="base=build-base/ekv new=build/ekv" bash bench/gpu/ab.sh
# Environment (optional): EKV_AB_ROUNDS (3), EKV_AB_BUDGET (seconds, 420),
#   EKV_AB_KV=0 (skip the storage-type grid), EKV_GPU_BENCH_TEST=FILES (test
#   binaries to run on the GPU first, EKV_TEST_DEVICE set), EKV_GPU_BENCH_TMP,
#   EKV_GPU_BENCH_DRY=1 (plumbing check on lavapipe with tiny models).
# Prints everything (the tool that runs it keeps only stdout); exit 0 when
# every step ran.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo" || exit 1
DRY=${EKV_GPU_BENCH_DRY:-0}
DEPS=$here/.deps
ROUNDS=${EKV_AB_ROUNDS:-3}
BUDGET=${EKV_AB_BUDGET:-420}
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET))
left() { echo $((DEADLINE - $(date +%s))); }
WORK=$(mktemp -d "${EKV_GPU_BENCH_TMP:-${TMPDIR:-/tmp}}/ekv-ab.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
FAILED=0

declare -a NAMES BINS
for nb in ${EKV_AB:-base=build/ekv}; do
    NAMES+=("${nb%%=*}")
    case ${nb#*=} in /*) BINS+=("${nb#*=}") ;; *) BINS+=("$repo/${nb#*=}") ;; esac
done
EKV=${BINS[0]}
for b in "${BINS[@]}"; do [ -x "$b" ] || { echo "ab.sh: no ekv at $b"; exit 1; }; done
echo "# ekv A/B on the GPU ($(date -u +%Y-%m-%dT%H:%M:%SZ)), budget ${BUDGET}s, ${ROUNDS} rounds"
for i in "${!NAMES[@]}"; do echo "${NAMES[$i]}: ${BINS[$i]} ($(md5sum < "${BINS[$i]}" | cut -c1-12))"; done

. "$here/vkenv.sh"
for b in "${BINS[@]}"; do command -v ldd > /dev/null && fill_missing "$b"; done
run_bin() { local b=$1; shift; env "LD_LIBRARY_PATH=$EKV_LD" timeout -k 5 "$@" 2>&1 | sed "s|^|  |"; }
VK=vulkan
[ "$DRY" = 1 ] && VK=vulkan:0
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
env "LD_LIBRARY_PATH=$EKV_LD" "$EKV" info --devices 2>&1 | head -n 8

for tb in ${EKV_GPU_BENCH_TEST:-}; do # one or more test binaries
    case $tb in /*) ;; *) tb=$repo/$tb ;; esac
    command -v ldd > /dev/null && fill_missing "$tb"
    echo "## $tb on $VK"
    env "LD_LIBRARY_PATH=$EKV_LD" "EKV_TEST_DEVICE=$VK" EKV_VK_VALIDATE=0 "EKV_TEST_SOURCE_DIR=$repo" \
        "EKV_TEST_BINARY_DIR=$(cd "$(dirname "$tb")/.." && pwd)" timeout -k 5 240 "$tb" > "$WORK/test.txt" 2>&1
    echo "exit $?"
    grep -v '^  ' "$WORK/test.txt" | grep -v ' ok$' | tail -n 40
done

# synthetic models (random weights), written with the first build
TLF=$WORK/tl-f16.gguf TLQ=$WORK/tl-q8_0.gguf
NL=()
[ "$DRY" = 1 ] && NL=(--n-layer 1)
env "LD_LIBRARY_PATH=$EKV_LD" timeout 200 "$EKV" mkmodel --preset tinyllama-1.1b --type f16 "${NL[@]}" -o "$TLF" > "$WORK/mk1.log" 2>&1 &
mk1=$!
env "LD_LIBRARY_PATH=$EKV_LD" timeout 200 "$EKV" mkmodel --preset tinyllama-1.1b --type q8_0 "${NL[@]}" -o "$TLQ" > "$WORK/mk2.log" 2>&1 &
mk2=$!
wait $mk1 || { echo "mkmodel f16 failed: $(tail -n 2 "$WORK/mk1.log")"; FAILED=1; }
wait $mk2 || { echo "mkmodel q8_0 failed: $(tail -n 2 "$WORK/mk2.log")"; FAILED=1; }

# one bench: NAME-INDEX MODEL-KEY MODEL ARGS... -> $WORK/r<round>-<name>-<key>.json
P=512 N=128 NPROF=128
[ "$DRY" = 1 ] && P=16 N=4 NPROF=4
bench() {
    local i=$1 key=$2 model=$3 out=$4
    shift 4
    [ "$(left)" -gt 20 ] || { echo "  (skipped: budget)"; return; }
    env "LD_LIBRARY_PATH=$EKV_LD" timeout -k 5 120 "${BINS[$i]}" bench -m "$model" --device "$VK" "$@" --json "$out" \
        > /dev/null 2> "$out.err" || { echo "  ${NAMES[$i]} $key failed: $(tail -n 2 "$out.err" | tr '\n' ' ')"; FAILED=1; }
}
echo
echo "## rounds: each build, ekv-ref-28m-q8_0 and TinyLlama-1.1B shape F16 / Q8_0, -p $P -n $N -r 1"
for r in $(seq 1 "$ROUNDS"); do
    n=${#NAMES[@]}
    for k in $(seq 0 $((n - 1))); do
        i=$(( (k + r) % n ))    # the order rotates
        bench "$i" 28m models/ekv-ref-28m-q8_0.gguf "$WORK/r$r-$i-28m.json" -p $P -n $N -r 1
        [ -s "$TLF" ] && bench "$i" tl-f16 "$TLF" "$WORK/r$r-$i-tl-f16.json" -p $P -n $N -r 1 -c $((P + N))
        [ -s "$TLQ" ] && bench "$i" tl-q8_0 "$TLQ" "$WORK/r$r-$i-tl-q8_0.json" -p $P -n $N -r 1 -c $((P + N))
    done
    echo "round $r done, $(left)s left"
done
python3 - "$WORK" "${NAMES[@]}" << 'EOF'
import glob, json, os, statistics, sys
work, names = sys.argv[1], sys.argv[2:]
print(f"{'build':10} {'model':8} {'prompt tok/s (median, rounds)':>44} {'decode tok/s (median, rounds)':>44}")
for i, name in enumerate(names):
    for key in ('28m', 'tl-f16', 'tl-q8_0'):
        p, d = [], []
        for f in sorted(glob.glob(f"{work}/r*-{i}-{key}.json")):
            try:
                for r in json.load(open(f))['results']:
                    if not r.get('failed'):
                        p.append(r['prompt_tps_median']); d.append(r['decode_tps_median'])
            except Exception:
                pass
        if d:
            fmt = lambda v: f"{statistics.median(v):9.1f} (" + ' '.join(f"{x:.0f}" for x in v) + ")"
            print(f"{name:10} {key:8} {fmt(p):>44} {fmt(d):>44}")
EOF

# per-shader device time, first and last build, TinyLlama F16 greedy 128 tokens
for i in 0 $((${#NAMES[@]} - 1)); do
    [ -s "$TLF" ] && [ "$(left)" -gt 30 ] || continue
    echo "## profile ${NAMES[$i]}: TinyLlama F16, ekv run -n $NPROF"
    env "LD_LIBRARY_PATH=$EKV_LD" EKV_VK_PROFILE=1 timeout 60 "${BINS[$i]}" run -m "$TLF" -p "Once upon a time" -n $NPROF \
        --temp 0 --device "$VK" 2>&1 > /dev/null | grep -A 24 'device time by shader' | head -n 24
    [ "${#NAMES[@]}" = 1 ] && break
done

if [ "${EKV_AB_KV:-1}" = 1 ] && [ -s "$TLF" ]; then
    last=$((${#NAMES[@]} - 1))
    D1=4096 D2=16384 NG=64
    [ "$DRY" = 1 ] && D1=32 D2=64 NG=4
    echo
    echo "## KV storage types, ${NAMES[$last]}, TinyLlama F16: decode at depth 0 / $D1 / $D2 (-n $NG -r 1)"
    bench "$last" kv "$TLF" "$WORK/kv.json" -p 0 -n $NG -d 0,$D1,$D2 -r 1 -c $((D2 + NG + 8)) --kv-type f16,q8_0,q4_0,kivi4
    echo "## batched decode, ${NAMES[$last]}, TinyLlama F16 and Q8_0, f16 cache, depth 0: -b 1,8,32 -n $NG"
    bench "$last" batch "$TLF" "$WORK/batch-f16.json" -p 0 -n $NG -b 1,8,32 -r 1 -c 256
    bench "$last" batch "$TLQ" "$WORK/batch-q8_0.json" -p 0 -n $NG -b 1,8,32 -r 1 -c 256
    python3 - "$WORK" << 'EOF'
import json, os, sys
for name in ('kv.json', 'batch-f16.json', 'batch-q8_0.json'):
    f = os.path.join(sys.argv[1], name)
    if not os.path.exists(f):
        continue
    print(name)
    for r in json.load(open(f))['results']:
        if r.get('failed'):
            print(f"  {r['kv_type']:6} depth {r['depth']:>6} batch {r['batch']:>3}  FAILED")
            continue
        print(f"  {r['kv_type']:6} depth {r['depth']:>6} batch {r['batch']:>3}  decode {r['decode_tps_median']:9.1f} tok/s"
              f"  KV {r['kv_bytes'] / 2**20:8.1f} MiB")
EOF
fi
echo "total $(( $(date +%s) - T0 ))s; failed=$FAILED"
[ "$FAILED" = 0 ]
