#!/usr/bin/env bash
# payoff.sh — what a compressed cache is worth on a GPU, in one call: decode
# at depth with the full cache against compressing policies at 0.2 of the
# entries (issue 20's table), TinyLlama-1.1B's shape (and, with
# EKV_PAYOFF_BIG=1, Mistral-7B's, the 8B-class layer shapes), batch 1 / 16
# / 64, depth 32K and 8K, f16 storage (q4_0 and kivi4 too at 8K); aggregate decode
# tokens/s from `ekv bench`, and the sessions one fixed amount of KV memory
# admits: floor(kv_mem / bytes one sequence's cache holds) (ekv bench's
# kv_bytes; on the GPU a compressed cache's buffers follow what it keeps).
# The depth is read once per policy and depth and every sequence starts as a
# copy of it (ekv bench, ekv_seq_copy): a 32K prompt is read 4 times, not
# 4 x 81 times.
#
# Also, where they apply:
# - the policy's cost in decode: the full cache at depth 0.2 x d holds as
#   many entries as a policy at 0.2 of d, so decode tok/s of the two differ
#   by what the policy does per step (statistics, plans, compaction);
# - SnapKV re-selecting every 32 steps (--kv-recompress 32) at depth 8K;
# - llama.cpp's CUDA llama-bench on the same file, same depths, batch 1,
#   `-fa on` with f16 and q8_0 caches, when EKV_PAYOFF_LLAMA names the
#   binary (bench/gpu/deps.sh --llama splits it into pieces a device call
#   can carry; EKV_PAYOFF_LLAMA_XZ: its .xz).
#
# Run from the repository root on the GPU machine (bench/gpu/README.md: the
# Vulkan loader from .deps/, the NVIDIA ICD):
#   bash bench/gpu/payoff.sh
# Environment: EKV (build/ekv), EKV_PAYOFF_BUDGET (seconds, 540),
#   EKV_PAYOFF_DEPTHS (32768,8192; the first is the deep one),
#   EKV_PAYOFF_BATCH (1,16,64), EKV_PAYOFF_N (decode steps, 32),
#   EKV_PAYOFF_POLICIES (elastic-v2,snapkv,local: against full),
#   EKV_PAYOFF_KVMEM (GiB for the sessions column, 16), EKV_PAYOFF_BIG=1,
#   EKV_PAYOFF_MODEL (an existing GGUF instead of mkmodel's TinyLlama),
#   EKV_PAYOFF_KEEP (a folder that keeps the model between calls),
#   EKV_PAYOFF_PHASES (llama,deep,over,profile,shallow,recompress: which to
#   run; profile: EKV_VK_PROFILE=1, device time by shader over the decode
#   steps at the shallow depth, batch 16), EKV_PAYOFF_TEST (test binaries to
#   run on the GPU first, each BINARY[:PARTS], PARTS as EKV_GPU_TEST_ONLY,
#   default copy: "build/tests/test_gpu_kv:attn_read build/tests/test_gpu_policy:copy,stats"),
#   EKV_GPU_BENCH_TMP, EKV_GPU_BENCH_DRY=1 (plumbing check on lavapipe:
#   1-layer model, tiny grid), EKV_PAYOFF_BASE (another build's ekv: in the
#   deep phase each of its rows runs just before the same row of EKV, labelled
#   "(base)" in the tables, for a before/after in one call),
#   EKV_PAYOFF_BASE_POLICIES (the policies the base build runs besides full;
#   default all of EKV_PAYOFF_POLICIES), EKV_PAYOFF_BASE_BATCH (its batches;
#   default EKV_PAYOFF_BATCH).
# KIVI storage with a compressing policy runs on the GPU since 2026-11-28
# (backend_vk_kivi.c): the kivi4 rows at 8K.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo" || exit 1
DRY=${EKV_GPU_BENCH_DRY:-0}
DEPS=$here/.deps
EKV=${EKV:-$repo/build/ekv}
BUDGET=${EKV_PAYOFF_BUDGET:-540}
DEPTHS=${EKV_PAYOFF_DEPTHS:-32768,8192}
BATCH=${EKV_PAYOFF_BATCH:-1,16,64}
POLICIES=${EKV_PAYOFF_POLICIES:-elastic-v2,snapkv,local}
KVMEM_GIB=${EKV_PAYOFF_KVMEM:-16}
PHASES=${EKV_PAYOFF_PHASES:-llama,deep,over,profile,shallow,recompress}
N=${EKV_PAYOFF_N:-32}
REPS=3
T0=$(date +%s)
left() { echo $((T0 + BUDGET - $(date +%s))); }
WORK=$(mktemp -d "${EKV_GPU_BENCH_TMP:-${TMPDIR:-/tmp}}/ekv-payoff.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
. "$here/vkenv.sh"
command -v ldd > /dev/null && fill_missing "$EKV"
BASE=${EKV_PAYOFF_BASE:-}
[ -n "$BASE" ] && command -v ldd > /dev/null && fill_missing "$BASE"
BASE_POLICIES=${EKV_PAYOFF_BASE_POLICIES:-$POLICIES}
VK=vulkan
NL=()
if [ "$DRY" = 1 ]; then VK=vulkan:0 NL=(--n-layer 1) DEPTHS=40,24 BATCH=1,2 N=2 REPS=1 POLICIES=h2o,snapkv; fi
DEEP=${DEPTHS%%,*}
SHALLOW=${DEPTHS#*,}
[ "$SHALLOW" = "$DEPTHS" ] && SHALLOW=""
has() { case ",$PHASES," in *",$1,"*) return 0 ;; esac; return 1; }
echo "# ekv payoff on the GPU ($(date -u +%Y-%m-%dT%H:%M:%SZ)), budget ${BUDGET}s, phases $PHASES"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
env "LD_LIBRARY_PATH=$EKV_LD" "$EKV" info --devices 2>&1 | head -n 4

for t in ${EKV_PAYOFF_TEST:-}; do # BINARY[:PARTS] (PARTS: EKV_GPU_TEST_ONLY, default copy)
    tb=${t%%:*} parts=copy
    [ "$tb" != "$t" ] && parts=${t#*:}
    echo "## $tb (EKV_GPU_TEST_ONLY=$parts) on the GPU"
    env "LD_LIBRARY_PATH=$EKV_LD" EKV_VK_VALIDATE=0 EKV_TEST_DEVICE="$VK" EKV_GPU_TEST_ONLY="$parts" \
        EKV_TEST_SOURCE_DIR="$repo" EKV_TEST_BINARY_DIR="$(dirname "$EKV")" timeout 120 \
        "$tb" 2>&1 | grep -v '^$' | tail -n 6 | sed 's/^/  /'
done
JSONS=()
# bench_one NAME SECONDS ekv-bench-args...: one ekv bench call, its JSON kept for the tables
bench_one() {
    local name=$1 secs=$2
    shift 2
    local l
    l=$(left)
    [ "$l" -gt 20 ] || { echo "($name skipped: budget)"; return; }
    [ "$secs" -gt "$l" ] && secs=$l
    echo "## $name (limit ${secs}s): ekv bench $*"
    local t=$(date +%s) bin=$EKV
    case $name in *-base) bin=$BASE ;; esac
    env "LD_LIBRARY_PATH=$EKV_LD" timeout -k 5 "$secs" "$bin" bench --device "$VK" -r "$REPS" --json "$WORK/$name.json" "$@" \
        2>&1 | grep -v '^ekv bench: t=.*\.\.\.$' | sed 's/^/  /'
    echo "  ($name: $(( $(date +%s) - t )) s)"
    [ -s "$WORK/$name.json" ] && JSONS+=("$WORK/$name.json")
}

models=("tinyllama-1.1b")
[ "${EKV_PAYOFF_BIG:-0}" = 1 ] && models+=("mistral-7b")
KEEP=${EKV_PAYOFF_KEEP:-$WORK}
mkdir -p "$KEEP"
for preset in "${models[@]}"; do
    f=${EKV_PAYOFF_MODEL:-$KEEP/$preset-f16${NL[*]:+-dry}.gguf}
    extra=()
    [ "$preset" = mistral-7b ] && extra=(--sliding-window 0)
    if [ ! -s "$f" ]; then
        t=$(date +%s)
        env "LD_LIBRARY_PATH=$EKV_LD" timeout 300 "$EKV" mkmodel --preset "$preset" --type f16 "${NL[@]}" "${extra[@]}" \
            -o "$f.tmp" > "$WORK/mk.log" 2>&1 && mv "$f.tmp" "$f" ||
            { echo "mkmodel $preset failed: $(tail -n 2 "$WORK/mk.log")"; rm -f "$f.tmp"; continue; }
        echo "mkmodel $preset F16: $(( $(date +%s) - t )) s, $(du -h "$f" | cut -f1)"
    fi
    if has llama; then
        LB=${EKV_PAYOFF_LLAMA:-}
        if [ -z "$LB" ] && [ -n "${EKV_PAYOFF_LLAMA_XZ:-}" ] && [ -s "$EKV_PAYOFF_LLAMA_XZ" ]; then
            { xz -dc "$EKV_PAYOFF_LLAMA_XZ" > "$WORK/llama-bench" 2> /dev/null ||
                python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
                    "$EKV_PAYOFF_LLAMA_XZ" "$WORK/llama-bench"; } && chmod +x "$WORK/llama-bench" && LB=$WORK/llama-bench
        fi
        if [ -n "$LB" ] && [ -x "$LB" ]; then
            for ct in f16 q8_0; do
                [ "$(left)" -gt 60 ] || break
                echo "## llama.cpp CUDA llama-bench, $preset F16, cache $ct, depths $DEPTHS, batch 1"
                env "LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                    timeout -k 5 150 "$LB" -m "$f" -p 0 -n "$N" -d "$DEPTHS" -fa on -ctk "$ct" -ctv "$ct" -r "$REPS" 2>&1 |
                    grep -E '^\||error|failed' | sed 's/^/  /'
            done
        else
            echo "(llama-bench: not given; EKV_PAYOFF_LLAMA or EKV_PAYOFF_LLAMA_XZ)"
        fi
    fi
    C=$((DEEP + N + 8))
    # deep: the full cache, then each policy at 0.2 (one call each: a slow one does not take the others' time)
    if has deep; then
        BB=${EKV_PAYOFF_BASE_BATCH:-$BATCH}
        [ -n "$BASE" ] && bench_one "$preset-d$DEEP-full-base" 150 -m "$f" -c "$C" -p 0 -n "$N" -d "$DEEP" -b "$BB" \
            --kv-policy full --kv-type f16
        bench_one "$preset-d$DEEP-full" 150 -m "$f" -c "$C" -p 0 -n "$N" -d "$DEEP" -b "$BATCH" --kv-policy full --kv-type f16
        for pol in ${POLICIES//,/ }; do
            case ",$BASE_POLICIES," in
            *",$pol,"*) [ -n "$BASE" ] && bench_one "$preset-d$DEEP-$pol-base" 150 -m "$f" -c "$C" -p 0 -n "$N" -d "$DEEP" \
                -b "$BB" --kv-policy "$pol" --kv-budget 0.2 --kv-type f16 ;;
            esac
            bench_one "$preset-d$DEEP-$pol" 150 -m "$f" -c "$C" -p 0 -n "$N" -d "$DEEP" -b "$BATCH" --kv-policy "$pol" \
                --kv-budget 0.2 --kv-type f16
        done
    fi
    # the policy's cost: the full cache holding as many entries as the policies keep
    if has over; then
        d5=$(( (DEEP + 4) / 5 ))
        [ -n "$SHALLOW" ] && d5="$d5,$(( (SHALLOW + 4) / 5 ))"
        bench_one "$preset-full-at-0.2" 90 -m "$f" -c "$C" -p 0 -n "$N" -d "$d5" -b "$BATCH" --kv-policy full --kv-type f16
    fi
    if has profile && [ -n "$SHALLOW" ] && [ "$(left)" -gt 60 ]; then
        pb=16
        [ "$DRY" = 1 ] && pb=2
        echo "## profile: EKV_VK_PROFILE=1, depth $SHALLOW, batch $pb, device time of the decode steps by shader"
        env "LD_LIBRARY_PATH=$EKV_LD" EKV_VK_PROFILE=1 timeout -k 5 "$(( $(left) < 120 ? $(left) : 120 ))" "$EKV" bench \
            --device "$VK" -r 1 -m "$f" -c "$((SHALLOW + N + 8))" -p 0 -n "$N" -d "$SHALLOW" -b "$pb" \
            --kv-policy "full,$POLICIES" --kv-budget 0.2 --kv-type f16 2>&1 | grep -v '^|' | sed 's/^/  /'
    fi
    if has shallow && [ -n "$SHALLOW" ]; then
        bench_one "$preset-d$SHALLOW" 150 -m "$f" -c "$((SHALLOW + N + 8))" -p 0 -n "$N" -d "$SHALLOW" -b "$BATCH" \
            --kv-policy "full,$POLICIES" --kv-budget 0.2 --kv-type f16,q4_0,kivi4
    fi
    if has recompress && [ -n "$SHALLOW" ]; then
        bench_one "$preset-d$SHALLOW-recompress" 60 -m "$f" -c "$((SHALLOW + 2 * N + 8))" -p 0 -n "$((2 * N))" -d "$SHALLOW" \
            -b "${BATCH%%,*}" --kv-policy snapkv --kv-budget 0.2 --kv-type f16 --kv-recompress 32
    fi
    [ -z "${EKV_PAYOFF_MODEL:-}" ] && [ "$KEEP" = "$WORK" ] && rm -f "$f"
done

# the tables: every row; sessions in KV_MEM and decode against the full cache of the same depth and batch
python3 - "$KVMEM_GIB" "${JSONS[@]}" << 'EOF' 2> "$WORK/py.err" || { echo "(no tables: $(tail -n 1 "$WORK/py.err"))"; }
import json, sys
gib = float(sys.argv[1])
rows = []
for p in sys.argv[2:]:
    for r in json.load(open(p))["results"]:
        if "recompress" in p:
            r["policy"] += " (recompress 32)"
        r["build"] = "base" if p.endswith("-base.json") else ""
        rows.append(r)
ok = [r for r in rows if not r["failed"]]
def key(r): return (r["build"], r["depth"], r["batch"], r["kv_type"])
full = {key(r): r for r in ok if r["policy"] == "full"}
def name(r): return r["policy"] + (" (base)" if r["build"] else "")
def held(r): return r["kv_bytes"] / max(r["batch"], 1)
def alloc(r): return r.get("kv_alloc_bytes", r["kv_bytes"]) / max(r["batch"], 1)
print(f"\n# payoff: sessions in {gib:g} GiB of KV memory (by the bytes one sequence holds; by what its buffers")
print("# have allocated after the prompt in brackets), aggregate decode tok/s of the batch")
print("| policy | kv | depth | batch | MiB/seq held (allocated) | sessions (by allocated) | x full f16 | decode tok/s | x full |")
print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
for r in sorted(rows, key=lambda r: (-r["depth"], r["kv_type"], r["policy"] != "full", r["policy"], r["build"] == "", r["batch"])):
    if r["failed"]:
        print(f"| {name(r)} | {r['kv_type']} | {r['depth']} | {r['batch']} | failed | | | | |")
        continue
    f = full.get(key(r))
    f16 = full.get((r["build"], r["depth"], r["batch"], "f16"))
    sess = int(gib * 2**30 / held(r)) if held(r) > 0 else 0
    sa = int(gib * 2**30 / alloc(r)) if alloc(r) > 0 else 0
    fs = int(gib * 2**30 / held(f16)) if f16 and held(f16) > 0 else 0
    fa = int(gib * 2**30 / alloc(f16)) if f16 and alloc(f16) > 0 else 0
    tps = r["decode_tps_median"]
    ft = f["decode_tps_median"] if f else 0
    print(f"| {name(r)} | {r['kv_type']} | {r['depth']} | {r['batch']} | {held(r) / 2**20:.1f} ({alloc(r) / 2**20:.1f}) | "
          f"{sess} ({sa}) | {sess / fs if fs else 0:.2f} ({sa / fa if fa else 0:.2f}) | {tps:.1f} | {tps / ft if ft else 0:.2f} |")
# the policy's cost: a policy at depth d against the full cache at d/5 (as many entries)
print("\n# policy cost in decode: policy at 0.2 of depth d vs the full cache at depth d/5 (same entries)")
print("| policy | depth | batch | entries/head | decode tok/s | full at d/5 tok/s | cost |")
print("|---|--:|--:|--:|--:|--:|--:|")
for r in ok:
    if r["policy"] == "full" or r["kv_type"] != "f16" or r["failed"]:
        continue
    f = full.get(("", (r["depth"] + 4) // 5, r["batch"], "f16"))
    if not f:
        continue
    print(f"| {name(r)} | {r['depth']} | {r['batch']} | {(r['depth'] + 4) // 5} | {r['decode_tps_median']:.1f} | "
          f"{f['decode_tps_median']:.1f} | {1 - r['decode_tps_median'] / f['decode_tps_median']:+.1%} |")
# before/after: the same row of the base build (EKV_PAYOFF_BASE), run just before
base = {(r["policy"], r["kv_type"], r["depth"], r["batch"]): r for r in ok if r["build"]}
if base:
    print("\n# this build against the base build (EKV_PAYOFF_BASE), decode tok/s of the same row")
    print("| policy | kv | depth | batch | base | this build | x base |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for r in ok:
        b = base.get((r["policy"], r["kv_type"], r["depth"], r["batch"]))
        if r["build"] or not b:
            continue
        print(f"| {r['policy']} | {r['kv_type']} | {r['depth']} | {r['batch']} | {b['decode_tps_median']:.1f} | "
              f"{r['decode_tps_median']:.1f} | {r['decode_tps_median'] / b['decode_tps_median']:.2f} |")
EOF
echo "payoff.sh: done in $(( $(date +%s) - T0 )) s"
