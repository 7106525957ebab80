#!/usr/bin/env bash
# run.sh — one command that measures ekv's Vulkan GPU backend on a GPU machine
# (written for a machine with an NVIDIA H200: Ubuntu, no network, the NVIDIA
# driver present but no Vulkan loader installed, ~16 CPU cores) and checks it
# against the CPU backend and against llama.cpp's CUDA llama-bench. It exists
# because that machine cannot be reached from the development machines: the
# script brings what it needs (bench/gpu/.deps/, made by bench/gpu/deps.sh;
# llama-bench from $SHARED/tools/gpu or bench/gpu/.llama/) and finishes in
# about 7 minutes, every step under `timeout`. bench/gpu/README.md says more.
#
# Run from the repository root:
#   bash bench/gpu/run.sh
# Through the workplace's device tool, carry the ignored inputs:
#   run(command="bash bench/gpu/run.sh", carry=["build/ekv", "bench/gpu/.deps"], timeout_s=560)
# Environment (all optional):
#   LLAMA_BENCH=FILE, LLAMA_BENCH_XZ=FILE  an unpacked llama-bench, or its .xz
#   EKV=build/ekv               ekv binary (relative paths: to the current directory)
#   SHARED=../shared            the shared data folder (for tools/gpu/llama-bench-cuda-sm90.xz)
#   OUT=DIR                     where logs and JSON go (default bench/gpu/out/<date>, git-ignored)
#   EKV_GPU_BENCH_BUDGET=420    seconds for the whole run; steps are cut/skipped to fit
#   EKV_GPU_BENCH_TMP=DIR       where the synthetic models go (~26 GB; default $TMPDIR or /tmp)
#   EKV_GPU_BENCH_BIG=0         skip the 7B-shape models
#   EKV_GPU_BENCH_KEEP=1        keep the synthetic models and unpacked tools
#   EKV_GPU_BENCH_DEVICE=vulkan the --device of the GPU runs (e.g. vulkan:1)
#   EKV_GPU_BENCH_ICD=JSON      a Vulkan driver JSON to try before the NVIDIA ones found
#   EKV_GPU_BENCH_TEST=FILES    test binaries (build/tests/test_gpu build/tests/test_gpu_kv) to run on the GPU too
#                               (EKV_TEST_DEVICE set; models it cannot find are reported skipped)
#   EKV_GPU_BENCH_DRY=1         plumbing check on any machine: GPU runs on vulkan:0 (lavapipe),
#                               tiny grids, 1-layer synthetic models
# Outputs: two files in $OUT (few, for tools that bring back only a handful):
# run.log, everything printed (tables, MATCH/DIFFER, a summary at the end), and
# detail.tar.gz: ekv bench JSON (bench-*.json), llama-bench tables
# (llama-bench-*.md/.err), generated texts (run-*.txt/.err), mkmodel logs.
# Exit status 0 when every step that ran succeeded (skips are not failures), else 1.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
absp() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }

EKV=$(absp "${EKV:-$repo/build/ekv}")
SHARED=$(absp "${SHARED:-$repo/../shared}")
[ -d "$SHARED" ] || { [ -d "$repo/shared" ] && SHARED=$repo/shared; }
OUT=$(absp "${OUT:-$repo/bench/gpu/out/$(date +%Y%m%d-%H%M%S)}")
export EKV SHARED OUT

# everything to the terminal and to $OUT/run.log
if [ -z "${_EKV_GPU_BENCH_LOGGED:-}" ]; then
    mkdir -p "$OUT" || { echo "run.sh: cannot create OUT=$OUT" >&2; exit 1; }
    export _EKV_GPU_BENCH_LOGGED=1
    bash "$here/run.sh" "$@" > >(tee "$OUT/run.log") 2>&1 &
    inner=$!
    trap 'kill -TERM "$inner" 2> /dev/null' TERM INT HUP    # the run cleans up after itself
    while :; do
        wait "$inner"
        rc=$?
        kill -0 "$inner" 2> /dev/null || break
    done
    sleep 1                                                  # let tee write the last lines
    exit "$rc"
fi
cd "$repo" || exit 1

DRY=${EKV_GPU_BENCH_DRY:-0}
BUDGET=${EKV_GPU_BENCH_BUDGET:-420}
BIG=${EKV_GPU_BENCH_BIG:-1}
KEEP=${EKV_GPU_BENCH_KEEP:-0}
DEPS=$here/.deps
D=$OUT/detail                   # detail files; packed into $OUT/detail.tar.gz at exit
mkdir -p "$D"
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET))
NCPU=$(nproc 2>/dev/null || echo 16)
CPU_T=16; [ "$NCPU" -lt 16 ] && CPU_T=$NCPU
if [ "$DRY" = 1 ]; then
    VK_DEV=${EKV_GPU_BENCH_DEVICE:-vulkan:0}
    REF_GRID=(-p 16 -n 4 -d "0,16" -r 1)
    RUN_N=16
    SMALL_P=32 SMALL_N=8 SMALL_R=1
    BIG_P=32 BIG_N=8 BIG_R=1
    NLAYER=(--n-layer 1)
else
    VK_DEV=${EKV_GPU_BENCH_DEVICE:-vulkan}
    REF_GRID=(-p 512 -n 128 -d "0,4096" -r 3)
    RUN_N=64
    SMALL_P=512 SMALL_N=128 SMALL_R=3
    BIG_P=512 BIG_N=64 BIG_R=2
    NLAYER=()
fi

exec 3>&1                       # step banners go here even when a step's output is redirected
SUMMARY=""
FAILED=0
now() { date +%s; }
secs_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
note() { printf '%s\n' "$*" >&3; }
record() { # record NAME STATUS SECONDS
    SUMMARY+=$(printf '%-44s %-10s %8s' "$1" "$2" "$3")$'\n'
    case $2 in ok | skipped | MATCH) ;; *) FAILED=1 ;; esac
}
skip() { note "== $1: SKIPPED ($2)"; record "$1" skipped -; }

# step NAME LIMIT CMD...: runs CMD under timeout (LIMIT, cut to the time left
# before DEADLINE), prints elapsed seconds, returns CMD's status (125: skipped).
step() {
    local name=$1 lim=$2 left t rc el st
    shift 2
    left=$((DEADLINE - $(now)))
    if [ "$left" -lt 5 ]; then skip "$name" "time budget spent"; return 125; fi
    [ "$lim" -gt "$left" ] && lim=$left
    note "== $name (limit ${lim}s)"
    t=$(date +%s.%N)
    timeout -k 5 "$lim" "$@"
    rc=$?
    el=$(secs_since "$t")
    case $rc in 0) st=ok ;; 124 | 137) st=TIMEOUT ;; *) st="rc=$rc" ;; esac
    note "== $name: $st, ${el}s"
    record "$name" "$st" "$el"
    return $rc
}

# background steps (the synthetic models are written while other steps run)
declare -A BG_PID BG_T0
bg_start() { # bg_start NAME LIMIT CMD... (output to $D/NAME.log)
    local name=$1 lim=$2
    shift 2
    note "== $name: started in the background (limit ${lim}s, log detail/${name// /_}.log)"
    BG_T0[$name]=$(date +%s.%N)
    rm -f "$D/.end-${name// /_}"
    # the job notes its own end time (elapsed is then its own, not when it was waited for);
    # timeout signals its whole process group, so killing its pid ends the job
    timeout -k 5 "$lim" bash -c '"$@"; rc=$?; date +%s.%N > "$0"; exit $rc' "$D/.end-${name// /_}" "$@" \
        > "$D/${name// /_}.log" 2>&1 &
    BG_PID[$name]=$!
}
bg_wait() { # bg_wait NAME: waits, records, returns its status
    local name=$1 rc el st
    [ -n "${BG_PID[$name]:-}" ] || return 125
    wait "${BG_PID[$name]}"
    rc=$?
    unset "BG_PID[$name]"
    if [ -s "$D/.end-${name// /_}" ]; then
        el=$(awk -v a="${BG_T0[$name]}" -v b="$(cat "$D/.end-${name// /_}")" 'BEGIN { printf "%.1f", b - a }')
        rm -f "$D/.end-${name// /_}"
    else
        el=$(secs_since "${BG_T0[$name]}")
    fi
    case $rc in 0) st=ok ;; 124 | 137) st=TIMEOUT ;; *) st="rc=$rc" ;; esac
    note "== $name (background): $st, ${el}s; $(tail -n 2 "$D/${name// /_}.log" | tr '\n' ' ')"
    record "$name (bg)" "$st" "$el"
    return $rc
}

WORK=$(mktemp -d "${EKV_GPU_BENCH_TMP:-${TMPDIR:-/tmp}}/ekv-gpu-bench.XXXXXX") || exit 1
cleanup() {
    local p
    for p in "${BG_PID[@]}"; do kill "$p" 2>/dev/null; done
    if [ "$KEEP" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
    if [ -d "$D" ] && tar -czf "$OUT/detail.tar.gz" -C "$OUT" detail 2>/dev/null; then
        [ "$KEEP" = 1 ] || rm -rf "$D"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "# ekv GPU benchmark ($(date -u +%Y-%m-%dT%H:%M:%SZ)), budget ${BUDGET}s$([ "$DRY" = 1 ] && echo ', DRY RUN (lavapipe, tiny grids)')"
echo "repo $repo; ekv $EKV; shared $SHARED; out $OUT; work $WORK; GPU device $VK_DEV"

# ------------------------------------------------------------------ setup
echo
echo "## setup"
[ -x "$EKV" ] || { echo "run.sh: no ekv binary at $EKV (build it, or set EKV)"; exit 1; }

# the Vulkan loader, ekv's missing libraries and the NVIDIA Vulkan driver
# (EKVCMD, EKV_LD, fill_missing, gpu_seen): bench/gpu/vkenv.sh
. "$here/vkenv.sh"


# llama.cpp's CUDA llama-bench (prebuilt in $SHARED/tools/gpu; not built here)
LB=""
CUDA_LD="/usr/local/cuda/lib64:/usr/local/cuda/lib:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# where: $LLAMA_BENCH (unpacked), $LLAMA_BENCH_XZ, $SHARED/tools/gpu, ./shared/tools/gpu,
# or bench/gpu/.llama/ (git-ignored: the .xz, or its pieces .xz.part* joined in name order)
LBXZ=""
for f in "${LLAMA_BENCH_XZ:-}" "$SHARED/tools/gpu/llama-bench-cuda-sm90.xz" \
    "$repo/shared/tools/gpu/llama-bench-cuda-sm90.xz" "$here/.llama/llama-bench-cuda-sm90.xz"; do
    [ -n "$f" ] && [ -f "$f" ] && { LBXZ=$f; break; }
done
if [ -z "$LBXZ" ] && [ -d "$here/.llama" ]; then     # pieces, possibly carried in separate calls
    parts=$(find "$here/.llama" -name 'llama-bench-cuda-sm90.xz.part-*' | awk -F/ '{ print $NF "\t" $0 }' | sort | cut -f2)
    if [ -n "$parts" ]; then
        echo "llama-bench pieces: $(echo "$parts" | sed "s|$here/||" | tr '\n' ' ')"
        echo "$parts" | while read -r f; do cat "$f"; done > "$WORK/llama-bench-cuda-sm90.xz"
        if command -v xz > /dev/null && ! xz -t "$WORK/llama-bench-cuda-sm90.xz" 2> /dev/null; then
            echo "WARNING: the joined pieces are not a whole .xz (a piece missing?)"
        else
            LBXZ=$WORK/llama-bench-cuda-sm90.xz
        fi
    fi
fi
if [ -n "${LLAMA_BENCH:-}" ] && [ -x "$LLAMA_BENCH" ]; then
    LB=$(absp "$LLAMA_BENCH")
    echo "llama-bench: $LB"
elif [ -n "$LBXZ" ]; then
    echo "llama-bench: from $LBXZ"
    if command -v xz > /dev/null; then
        step "unpack llama-bench" 60 sh -c 'xz -dc "$1" > "$2"' sh "$LBXZ" "$WORK/llama-bench"
    else
        step "unpack llama-bench (python lzma)" 60 python3 -c \
            'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$LBXZ" "$WORK/llama-bench"
    fi && chmod +x "$WORK/llama-bench" && LB=$WORK/llama-bench
else
    skip "unpack llama-bench" "no llama-bench-cuda-sm90.xz in $SHARED/tools/gpu, ./shared/tools/gpu or bench/gpu/.llama"
fi
LB_REF="llama.cpp CUDA reference measured earlier (shared/tools/gpu/README.md: one H200, driver 580.159.04,
  2026-11-26, -fa on, random F16 weights from ekv mkmodel): TinyLlama-1.1B F16 decode 765 tok/s at depth 0
  (684 at 4096), Q8_0 783 tok/s; prompt of 4096 tokens 69,100 tok/s"
LBCMD=(env "LD_LIBRARY_PATH=$CUDA_LD" "$LB")

# ------------------------------------------------------------------ machine
echo
echo "## machine"
date
uname -srm
(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")
echo "CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1), $NCPU cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
free -g 2>/dev/null | sed -n 2p
echo "ekv: $(ls -l "$EKV" | awk '{ print $5, $6, $7, $8 }') bytes/date, md5 $(md5sum < "$EKV" | cut -c1-32); git $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi > /dev/null; then
    step "nvidia-smi" 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
else
    skip "nvidia-smi" "not installed"
fi
step "ekv info --devices" 60 "${EKVCMD[@]}" info --devices
if ! gpu_seen; then
    echo "no Vulkan GPU seen by ekv; the loader's messages:"
    VK_LOADER_DEBUG=error,warn,driver timeout 60 "${EKVCMD[@]}" info --devices 2>&1 | tail -n 40
fi

# ------------------------------------------------------------------ CPU speed first, on a quiet machine
echo
echo "## ekv bench, CPU, ekv-ref-28m-q8_0 (-t $CPU_T)"
REF28=models/ekv-ref-28m-q8_0.gguf
MANIFEST=$D/manifest.tsv
: > "$MANIFEST"
step "bench 28m-q8_0 cpu t$CPU_T" 120 "${EKVCMD[@]}" bench -m "$REF28" --device cpu -t "$CPU_T" "${REF_GRID[@]}" \
    --json "$D/bench-28m-q8_0-cpu.json"
printf '%s\t%s\t%s\n' "ekv cpu t$CPU_T 28m-q8_0" "$D/bench-28m-q8_0-cpu.json" "$REF28" >> "$MANIFEST"

# ------------------------------------------------------------------ synthetic models, written in the background
echo
echo "## synthetic models (ekv mkmodel, random weights) -> $WORK"
free_gb=$(df -Pk "$WORK" | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
echo "free space there: ${free_gb} GiB (TinyLlama F16+Q8_0 need ~3.5, 7B F16 ~14.5, 7B Q8_0 ~7.7)"
# TinyLlama-1.1B; for Llama-3-8B there is no preset: mistral-7b has its layer shapes (4096 wide,
# 32 layers, 32/8 heads, FFN 14336) with a 32k vocabulary; --sliding-window 0 makes it plain Llama attention.
declare -A MODEL
MODEL[tl-f16]=$WORK/tinyllama-1.1b-f16.gguf
MODEL[tl-q8_0]=$WORK/tinyllama-1.1b-q8_0.gguf
MODEL[7b-f16]=$WORK/mistral-7b-shape-f16.gguf
MODEL[7b-q8_0]=$WORK/mistral-7b-shape-q8_0.gguf
MK_TL=$(( BUDGET * 2 / 5 ))                       # 168 s of 420
MK_7B=$(( DEADLINE - $(now) - 100 ))              # leave ~100 s for the 7B benches
if [ "$free_gb" -ge 5 ]; then
    bg_start "mkmodel tinyllama-1.1b f16" "$MK_TL" "${EKVCMD[@]}" mkmodel --preset tinyllama-1.1b --type f16 "${NLAYER[@]}" -o "${MODEL[tl-f16]}"
    bg_start "mkmodel tinyllama-1.1b q8_0" "$MK_TL" "${EKVCMD[@]}" mkmodel --preset tinyllama-1.1b --type q8_0 "${NLAYER[@]}" -o "${MODEL[tl-q8_0]}"
else
    skip "mkmodel tinyllama-1.1b" "only ${free_gb} GiB free in $WORK"
fi
if [ "$BIG" != 1 ]; then
    skip "mkmodel mistral-7b shape" "EKV_GPU_BENCH_BIG=$BIG"
elif [ "$MK_7B" -lt 60 ]; then
    skip "mkmodel mistral-7b shape" "time budget"
else
    if [ "$free_gb" -ge 14 ]; then
        bg_start "mkmodel mistral-7b-shape q8_0" "$MK_7B" "${EKVCMD[@]}" mkmodel --preset mistral-7b --sliding-window 0 --type q8_0 "${NLAYER[@]}" -o "${MODEL[7b-q8_0]}"
    else
        skip "mkmodel mistral-7b-shape q8_0" "only ${free_gb} GiB free in $WORK"
    fi
    if [ "$free_gb" -ge 30 ]; then
        bg_start "mkmodel mistral-7b-shape f16" "$MK_7B" "${EKVCMD[@]}" mkmodel --preset mistral-7b --sliding-window 0 --type f16 "${NLAYER[@]}" -o "${MODEL[7b-f16]}"
    else
        skip "mkmodel mistral-7b-shape f16" "only ${free_gb} GiB free in $WORK"
    fi
fi

# ------------------------------------------------------------------ correctness
echo
echo "## correctness: greedy text, --device cpu against --device $VK_DEV"
same_text() { # same_text NAME MODEL PROMPT
    local name=$1 model=$2 prompt=$3 d ok=1
    for d in cpu "$VK_DEV"; do
        step "run $name $d" 90 "${EKVCMD[@]}" run -m "$model" -p "$prompt" -n "$RUN_N" --temp 0 --device "$d" \
            > "$D/run-$name-${d/:/_}.txt" 2> "$D/run-$name-${d/:/_}.err" || ok=0
        tail -n 1 "$D/run-$name-${d/:/_}.err"
    done
    if [ "$ok" != 1 ]; then
        echo "RESULT $name: NOT COMPARED (a run failed):"
        tail -n 5 "$D/run-$name-${VK_DEV/:/_}.err"
        record "compare $name" "FAILED" -
    elif cmp -s "$D/run-$name-cpu.txt" "$D/run-$name-${VK_DEV/:/_}.txt"; then
        echo "RESULT $name: MATCH ($(wc -c < "$D/run-$name-cpu.txt") bytes of text)"
        record "compare $name" "MATCH" -
    else
        echo "RESULT $name: DIFFER ($(cmp "$D/run-$name-cpu.txt" "$D/run-$name-${VK_DEV/:/_}.txt" | head -n 1))"
        echo "--- cpu:";         cat "$D/run-$name-cpu.txt"; echo
        echo "--- $VK_DEV:";     cat "$D/run-$name-${VK_DEV/:/_}.txt"; echo
        record "compare $name" "DIFFER" -
    fi
}
same_text stories260K models/stories260K.gguf "Once upon a time"
same_text 28m-q8_0 "$REF28" "static int"
for tb in ${EKV_GPU_BENCH_TEST:-}; do # one or more test binaries
    tb=$(absp "$tb")
    command -v ldd > /dev/null && fill_missing "$tb"
    step "test binary $(basename "$tb") on $VK_DEV" 240 env "LD_LIBRARY_PATH=$EKV_LD" "EKV_TEST_DEVICE=$VK_DEV" EKV_VK_VALIDATE=0 \
        "EKV_TEST_SOURCE_DIR=$repo" "EKV_TEST_BINARY_DIR=$(cd "$(dirname "$tb")/.." && pwd)" "$tb" \
        > "$D/test-gpu-$(basename "$tb").txt" 2>&1
    grep -v ' ok ' "$D/test-gpu-$(basename "$tb").txt" | tail -n 25
done

# per-shader device time of a greedy run (EKV_VK_PROFILE=1)
profile() { # profile NAME MODEL
    step "profile $1 $VK_DEV" 120 env EKV_VK_PROFILE=1 "${EKVCMD[@]}" run -m "$2" -p "Once upon a time" -n 128 \
        --temp 0 --device "$VK_DEV" > /dev/null 2> "$D/profile-$1.err"
    grep -A 30 -E 'prompt .* tokens in|device time by shader' "$D/profile-$1.err" | grep -v '^ekv run: kv'
}
profile 28m-q8_0 "$REF28"

# ------------------------------------------------------------------ GPU speed
echo
echo "## ekv bench, $VK_DEV, ekv-ref-28m-q8_0"
step "bench 28m-q8_0 $VK_DEV" 120 "${EKVCMD[@]}" bench -m "$REF28" --device "$VK_DEV" "${REF_GRID[@]}" \
    --json "$D/bench-28m-q8_0-gpu.json"
printf '%s\t%s\t%s\n' "ekv $VK_DEV 28m-q8_0" "$D/bench-28m-q8_0-gpu.json" "$REF28" >> "$MANIFEST"

lb_run() { # lb_run KEY P N R
    local key=$1 f=${MODEL[$1]} p=$2 n=$3 r=$4
    [ -n "$LB" ] || { skip "llama-bench $key" "no llama-bench"; return; }
    bg_note
    step "llama-bench CUDA $key" 120 "${LBCMD[@]}" -m "$f" -p "$p" -n "$n" -fa on -r "$r" -o md \
        > "$D/llama-bench-$key.md" 2> "$D/llama-bench-$key.err"
    [ $? = 125 ] && return          # skipped: no time left
    cat "$D/llama-bench-$key.md"
    if grep -q 'ggml_cuda_init: found' "$D/llama-bench-$key.err"; then
        grep -m 2 -E 'ggml_cuda_init: found|Device 0' "$D/llama-bench-$key.err"
    else
        echo "WARNING: llama-bench did not report a CUDA device (its numbers may be CPU ones); its stderr:"
        tail -n 8 "$D/llama-bench-$key.err"
    fi
}
bg_note() { [ "${#BG_PID[@]}" -gt 0 ] && echo "(note: ${#BG_PID[@]} mkmodel job(s) still writing in the background: ${!BG_PID[*]})"; }
ekv_gpu() { # ekv_gpu KEY P N R
    local key=$1 f=${MODEL[$1]} p=$2 n=$3 r=$4
    bg_note
    # -c as llama-bench sizes its context (depth + prompt + generated)
    step "bench $key $VK_DEV" 180 "${EKVCMD[@]}" bench -m "$f" --device "$VK_DEV" -p "$p" -n "$n" -d 0 -r "$r" \
        -c $((p + n)) --json "$D/bench-$key-gpu.json"
    printf '%s\t%s\t%s\n' "ekv $VK_DEV $key" "$D/bench-$key-gpu.json" "$f" >> "$MANIFEST"
}

echo
echo "## TinyLlama-1.1B shape (random weights): ekv $VK_DEV and llama.cpp CUDA, -p $SMALL_P -n $SMALL_N -r $SMALL_R"
for key in tl-f16 tl-q8_0; do
    name="mkmodel tinyllama-1.1b ${key#tl-}"
    if [ -z "${BG_PID[$name]:-}" ]; then continue; fi
    if bg_wait "$name"; then
        ls -l "${MODEL[$key]}" | awk '{ print $5, $NF }'
        ekv_gpu "$key" "$SMALL_P" "$SMALL_N" "$SMALL_R"
        lb_run "$key" "$SMALL_P" "$SMALL_N" "$SMALL_R"
        [ "$key" = tl-f16 ] && profile "$key" "${MODEL[$key]}"
    else
        echo "mkmodel failed or timed out for $key: skipped"
    fi
done

echo
echo "## 7B shape (mistral-7b preset, Llama-3-8B's layers, 32k vocab): ekv $VK_DEV, -p $BIG_P -n $BIG_N -r $BIG_R"
lb_big=()
for key in 7b-f16 7b-q8_0; do
    name="mkmodel mistral-7b-shape ${key#7b-}"
    if [ -z "${BG_PID[$name]:-}" ]; then continue; fi
    if bg_wait "$name"; then
        ls -l "${MODEL[$key]}" | awk '{ print $5, $NF }'
        ekv_gpu "$key" "$BIG_P" "$BIG_N" "$BIG_R"
        lb_big+=("$key")
    else
        echo "mkmodel failed or timed out for $key: skipped"
    fi
done
# llama.cpp on the 7B shapes only with time to spare (not part of the required set)
for key in "${lb_big[@]}"; do
    if [ $((DEADLINE - $(now))) -ge 60 ]; then
        lb_run "$key" "$BIG_P" "$BIG_N" "$BIG_R"
    else
        skip "llama-bench CUDA $key" "optional, under 60 s left"
    fi
done

# ------------------------------------------------------------------ summary
echo
echo "## summary (ekv rates are medians over repetitions; GB/s = model file bytes x decode tok/s, weights only)"
if command -v python3 > /dev/null; then
    python3 - "$MANIFEST" << 'EOF'
import json, os, sys
print(f"{'run':34} {'p':>5} {'n':>4} {'depth':>5} {'prompt tok/s':>13} {'decode tok/s':>13} {'GB/s':>7}")
for line in open(sys.argv[1]):
    label, path, model = line.rstrip('\n').split('\t')
    if not os.path.exists(path):
        print(f"{label:34} (no results)")
        continue
    size = os.path.getsize(model) if os.path.exists(model) else 0
    try:
        results = json.load(open(path))['results']
    except Exception as e:
        print(f"{label:34} (unreadable JSON: {e})")
        continue
    for r in results:
        if r.get('failed'):
            print(f"{label:34} {r['n_prompt']:>5} {r['n_gen']:>4} {r['depth']:>5}  FAILED")
            continue
        dec = r['decode_tps_median']
        print(f"{label:34} {r['n_prompt']:>5} {r['n_gen']:>4} {r['depth']:>5} {r['prompt_tps_median']:>13.1f}"
              f" {dec:>13.1f} {size * dec / 1e9:>7.0f}")
EOF
fi
[ -n "$LB" ] || echo "no llama-bench run here; $LB_REF"
for f in "$D"/llama-bench-*.md; do
    [ -f "$f" ] && grep -E '^\| .*(pp|tg)[0-9]' "$f" | sed "s|^|$(basename "$f" .md): |"
done
echo
echo "step                                         status      seconds"
printf '%s' "$SUMMARY"
echo "total $(( $(now) - T0 ))s of a ${BUDGET}s budget; $OUT/run.log, and JSON etc. in $OUT/detail.tar.gz"
[ "$FAILED" = 0 ]
