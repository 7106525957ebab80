#!/usr/bin/env bash
# payoff.sh — what a compressed cache is worth on a GPU, in one call: decode
# at depth with the full cache against compressing policies at 0.2 of the
# entries (issue 20's table), TinyLlama-1.1B's shape (and, with
# EKV_PAYOFF_BIG=1, Mistral-7B's, the 8B-class layer shapes), batch 1 / 16
# / 64, depth 8K and 32K (or what fits the model's context), f16 storage;
# aggregate decode tokens/s from `ekv bench`, and the sessions one fixed
# amount of KV memory admits: floor(kv_mem / bytes one sequence's cache
# holds) (ekv bench's kv_bytes; on the GPU a compressed cache's buffers
# follow what it keeps, backend_vk_policy.c, and the peak while its prompt
# is read is printed beside).
#
# Run from the repository root on the GPU machine (bench/gpu/README.md: the
# Vulkan loader from .deps/, the NVIDIA ICD):
#   bash bench/gpu/payoff.sh
# Environment: EKV (build/ekv), EKV_PAYOFF_BUDGET (seconds, 540),
#   EKV_PAYOFF_DEPTHS (8192,32768), EKV_PAYOFF_BATCH (1,16,64),
#   EKV_PAYOFF_POLICIES (full,elastic-v2,snapkv,local), EKV_PAYOFF_KVMEM
#   (GiB for the sessions column, 16), EKV_PAYOFF_BIG=1, EKV_GPU_BENCH_TMP,
#   EKV_GPU_BENCH_DRY=1 (plumbing check on lavapipe: 1-layer model, tiny grid).
# KIVI storage with a compressing policy stays on the CPU in this version
# (ekv_vk_mg_supported), so kivi4 rows are the full cache's only.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo" || exit 1
DRY=${EKV_GPU_BENCH_DRY:-0}
DEPS=$here/.deps
EKV=${EKV:-$repo/build/ekv}
BUDGET=${EKV_PAYOFF_BUDGET:-540}
DEPTHS=${EKV_PAYOFF_DEPTHS:-8192,32768}
BATCH=${EKV_PAYOFF_BATCH:-1,16,64}
POLICIES=${EKV_PAYOFF_POLICIES:-full,elastic-v2,snapkv,local}
KVMEM_GIB=${EKV_PAYOFF_KVMEM:-16}
T0=$(date +%s)
left() { echo $((T0 + BUDGET - $(date +%s))); }
WORK=$(mktemp -d "${EKV_GPU_BENCH_TMP:-${TMPDIR:-/tmp}}/ekv-payoff.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
. "$here/vkenv.sh"
command -v ldd > /dev/null && fill_missing "$EKV"
VK=vulkan
NL=()
N=64
if [ "$DRY" = 1 ]; then VK=vulkan:0 NL=(--n-layer 1) DEPTHS=32 BATCH=1,2 N=2 POLICIES=full,h2o; fi
echo "# ekv payoff on the GPU ($(date -u +%Y-%m-%dT%H:%M:%SZ)), budget ${BUDGET}s"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
env "LD_LIBRARY_PATH=$EKV_LD" "$EKV" info --devices 2>&1 | head -n 4

models=("tinyllama-1.1b")
[ "${EKV_PAYOFF_BIG:-0}" = 1 ] && models+=("mistral-7b")
for preset in "${models[@]}"; do
    f=$WORK/$preset.gguf
    extra=()
    [ "$preset" = mistral-7b ] && extra=(--sliding-window 0)
    env "LD_LIBRARY_PATH=$EKV_LD" timeout 300 "$EKV" mkmodel --preset "$preset" --type f16 "${NL[@]}" "${extra[@]}" \
        -o "$f" > "$WORK/mk.log" 2>&1 || { echo "mkmodel $preset failed: $(tail -n 2 "$WORK/mk.log")"; continue; }
    for d in ${DEPTHS//,/ }; do
        [ "$(left)" -gt 60 ] || { echo "($preset depth $d skipped: budget)"; continue; }
        echo "## $preset F16, depth $d, batch $BATCH, decode $N, f16 storage"
        env "LD_LIBRARY_PATH=$EKV_LD" timeout -k 5 "$(left)" "$EKV" bench -m "$f" --device "$VK" -c $((d + N + 8)) \
            -p 1 -n "$N" -d "$d" -b "$BATCH" -r 1 --kv-policy "$POLICIES" --kv-budget 0.2 --kv-type f16 \
            --json "$WORK/b-$preset-$d.json" 2>&1 | grep -v '^ekv bench: t=' | sed 's/^/  /'
        # sessions a fixed KV memory admits, by policy (KV MiB per sequence at this depth)
        python3 - "$WORK/b-$preset-$d.json" "$KVMEM_GIB" <<'EOF' 2>/dev/null || echo "  (no sessions table: python3 missing?)"
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
gib = float(sys.argv[2])
def per_seq(r):  # bytes of one sequence's cache: held (the steady state), and allocated at peak
    b = max(r.get("batch", 1), 1)
    return r["kv_bytes"] / b, r["kv_peak_alloc_bytes"] / b
full = {r["batch"]: r for r in rows if r["policy"] == "full" and not r["failed"]}
print(f"  sessions in {gib:g} GiB of KV memory (by bytes held), aggregate decode tok/s; x = against full at that batch:")
for r in rows:
    if r["failed"]:
        print(f"    {r['policy']:12s} b={r['batch']:<3d} failed")
        continue
    held, peak = per_seq(r)
    f = full.get(r["batch"])
    sess = int(gib * 2**30 / held) if held > 0 else 0
    fs = int(gib * 2**30 / per_seq(f)[0]) if f else 0
    tps = r["decode_tps_median"]
    ft = f["decode_tps_median"] if f else 0
    print(f"    {r['policy']:12s} b={r['batch']:<3d} {held / 2**20:9.1f} MiB/seq held ({peak / 2**20:9.1f} at peak)  "
          f"sessions {sess:7d} ({sess / fs if fs else 0:.2f}x)  decode {tps:9.1f} tok/s ({tps / ft if ft else 0:.2f}x)")
EOF
    done
    rm -f "$f"
done
echo "payoff.sh: done in $(( $(date +%s) - T0 )) s"
