#!/usr/bin/env bash
# compare_llama.sh — issue 13's table: ekv and llama.cpp side by side on
# this machine. Every figure runs ekv then llama.cpp, ROUNDS times, the
# rounds interleaved over all figures (so a busy minute hits both tools);
# medians, ratios and the load average of each run go to a Markdown table
# on stdout and every raw number to OUT/raw.tsv.
#
#   bench/compare_llama.sh [BUILD=build] [LLAMA_BIN=../llama.cpp/build/bin]
#                          [MODELS=models-bench] [ROUNDS=3] [OUT=/tmp/ekv-compare]
#
# It only runs binaries: llama.cpp is not part of ekv and nothing here
# builds it (docs/performance.md gives the exact commands to build it
# yourself, outside this repository; LLAMA_BIN points at its build/bin).
# FIGS="tl8_pp tl8_tg ..." restricts the figures (names below). BENCH=CMD
# prefixes every timed command (on a shared machine a wrapper that takes a
# benchmark lock); the 1-minute load average is read just before each timed
# command starts, inside BENCH. Synthetic models are written with
# `ekv mkmodel` when missing; ekv-ref-28m comes from ../shared (REF=path).
# The Elastic row reuses the llama.cpp full-cache run of the same round.
# Needs python3 (JSON parsing).
set -uo pipefail
BUILD=${1:-build}
LB=${2:-../llama.cpp/build/bin}
MODELS=${3:-models-bench}
ROUNDS=${4:-3}
OUT=${5:-/tmp/ekv-compare}
EKV="$BUILD/ekv"
BENCH=${BENCH:-}
T=${THREADS:-2}
mkdir -p "$OUT" "$MODELS"
REF=${REF:-$(dirname "$0")/../../shared/models/ekv-ref-28m-f16.gguf}
TL8=$MODELS/tinyllama-1.1b-q8_0.gguf
TL4=$MODELS/tinyllama-1.1b-q4_0.gguf
TL16=$MODELS/tinyllama-1.1b-f16.gguf
SM8=$MODELS/smollm2-135m-q8_0.gguf
for spec in "tinyllama-1.1b q8_0 $TL8" "tinyllama-1.1b q4_0 $TL4" "tinyllama-1.1b f16 $TL16" "smollm2-135m q8_0 $SM8"; do
    set -- $spec
    [ -f "$3" ] || "$EKV" mkmodel --preset "$1" --type "$2" -o "$3" >&2 || exit 1
done

# figure: name | label | ekv arguments | llama.cpp tool | llama.cpp arguments | what the number is
FIGS_ALL="tl8_pp tl8_tg tl4_pp tl4_tg tl16_pp tl16_tg tl8_d4096 sm8_tg1024 sm8_pp1024 sm8_b8 ref_pp ref_tg el_d4096"
FIGS=${FIGS:-$FIGS_ALL}
fig() {
    case $1 in
    tl8_pp) echo "TinyLlama-1.1B Q8_0 prompt 512|-m $TL8 -p 512 -n 0|bench|-m $TL8 -p 512 -n 0|prompt" ;;
    tl8_tg) echo "TinyLlama-1.1B Q8_0 decode, empty context|-m $TL8 -p 0 -n 64|bench|-m $TL8 -p 0 -n 64|decode" ;;
    tl4_pp) echo "TinyLlama-1.1B Q4_0 prompt 512|-m $TL4 -p 512 -n 0|bench|-m $TL4 -p 512 -n 0|prompt" ;;
    tl4_tg) echo "TinyLlama-1.1B Q4_0 decode, empty context|-m $TL4 -p 0 -n 64|bench|-m $TL4 -p 0 -n 64|decode" ;;
    tl16_pp) echo "TinyLlama-1.1B F16 prompt 512|-m $TL16 -p 512 -n 0|bench|-m $TL16 -p 512 -n 0|prompt" ;;
    tl16_tg) echo "TinyLlama-1.1B F16 decode, empty context|-m $TL16 -p 0 -n 32|bench|-m $TL16 -p 0 -n 32|decode" ;;
    tl8_d4096) echo "TinyLlama Q8_0 decode at depth 4096, full cache|-m $TL8 -p 0 -n 32 -d 4096|bench|-m $TL8 -p 0 -n 32 -d 4096 -fa 1|decode" ;;
    sm8_tg1024) echo "SmolLM2-135M Q8_0 decode, 1 sequence after 1,024 tokens|-m $SM8 -p 0 -n 128 -d 1024|bench|-m $SM8 -p 0 -n 128 -d 1024|decode" ;;
    sm8_pp1024) echo "SmolLM2-135M Q8_0 prompt 1,024|-m $SM8 -p 1024 -n 0|bench|-m $SM8 -p 1024 -n 0|prompt" ;;
    sm8_b8) echo "SmolLM2-135M Q8_0 decode, 8 sequences after 1,024 tokens each|-m $SM8 -p 1024 -n 32 -b 8|batched|-m $SM8 -c 9216 -b 2048 -ub 512 -npp 1024 -ntg 32 -npl 8|decode" ;;
    ref_pp) echo "ekv-ref-28m F16 prompt 512|-m $REF -p 512 -n 0|bench|-m $REF -p 512 -n 0|prompt" ;;
    ref_tg) echo "ekv-ref-28m F16 decode 128|-m $REF -p 0 -n 128|bench|-m $REF -p 0 -n 128|decode" ;;
    el_d4096) echo "TinyLlama Q8_0 decode at depth 4096: ekv Elastic 0.2 vs llama.cpp full|-m $TL8 -p 0 -n 32 -d 4096 --kv-policy elastic --kv-budget 0.2|same:tl8_d4096||decode" ;;
    *) echo "unknown figure $1" >&2; return 1 ;;
    esac
}

# runs "$@" under $BENCH, the load average read inside it into $OUT/load
timed() { $BENCH sh -c 'cut -d" " -f1 /proc/loadavg > "$0"; exec "$@"' "$OUT/load" "$@"; }
load() { cat "$OUT/load" 2>/dev/null || echo nan; }

# ekv: one repetition, the figure's rate from --json
run_ekv() { # args what
    local j="$OUT/ekv.json"
    timed "$EKV" bench -t "$T" -r 1 $1 --json "$j" >/dev/null 2>"$OUT/ekv.err" || { echo nan; return; }
    python3 -c "import json,sys; r=json.load(open('$j'))['results'][0]; print(r['prompt_tps_median'] if '$2'=='prompt' else r['decode_tps_median'])"
}

run_llama() { # tool args what
    if [ "$1" = batched ]; then
        timed "$LB/llama-batched-bench" -t "$T" $2 --output-format jsonl >"$OUT/llama.jsonl" 2>"$OUT/llama.err" || { echo nan; return; }
        python3 -c "
import json
for l in open('$OUT/llama.jsonl'):
    l = l.strip()
    if l.startswith('{') and 'speed_tg' in l: r = json.loads(l)
print(r['speed_tg'])"
    else
        timed "$LB/llama-bench" -t "$T" -r 1 $2 -o json >"$OUT/llama.json" 2>"$OUT/llama.err" || { echo nan; return; }
        python3 -c "import json; print(json.load(open('$OUT/llama.json'))[0]['avg_ts'])"
    fi
}

RAW="$OUT/raw.tsv"
: > "$OUT/labels"
for f in $FIGS; do IFS='|' read -r label _ <<<"$(fig "$f")"; echo "$f|$label" >> "$OUT/labels"; done
echo -e "figure\tround\ttool\ttok_s\tload\tutc" > "$RAW"
for r in $(seq 1 "$ROUNDS"); do
    for f in $FIGS; do
        IFS='|' read -r label eargs ltool largs what <<<"$(fig "$f")"
        rm -f "$OUT/load"; v=$(run_ekv "$eargs" "$what")
        echo -e "$f\t$r\tekv\t$v\t$(load)\t$(date -u +%H:%M:%S)" >> "$RAW"
        if [ "${ltool#same:}" != "$ltool" ]; then # the llama.cpp run of another figure, this round
            awk -F'\t' -v f="${ltool#same:}" -v r="$r" -v g="$f" 'BEGIN{OFS="\t"} $1==f && $2==r && $3=="llama.cpp" {$1=g; print}' "$RAW" > "$OUT/same"
            cat "$OUT/same" >> "$RAW"
        else
            rm -f "$OUT/load"; v=$(run_llama "$ltool" "$largs" "$what")
            echo -e "$f\t$r\tllama.cpp\t$v\t$(load)\t$(date -u +%H:%M:%S)" >> "$RAW"
        fi
        echo "round $r $f done" >&2
    done
done

# table
python3 - "$RAW" "$OUT/labels" $FIGS <<'EOF'
import sys, statistics
raw, labf, figs = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = [l.rstrip('\n').split('\t') for l in open(raw)][1:]
labels = dict(l.rstrip('\n').split('|', 1) for l in open(labf))
print("| figure | llama.cpp tok/s | ekv tok/s | ekv/llama.cpp | loads (1-min avg at each run) |")
print("|---|--:|--:|--:|---|")
for f in figs:
    e = [float(r[3]) for r in rows if r[0] == f and r[2] == 'ekv' and r[3] != 'nan']
    l = [float(r[3]) for r in rows if r[0] == f and r[2] == 'llama.cpp' and r[3] != 'nan']
    loads = [r[4] for r in rows if r[0] == f]
    lf = sorted(float(x) for x in loads if x != "nan")
    lr = f"{lf[0]:.2f}-{lf[-1]:.2f}" if lf else "?"
    if not e or not l: # one tool failed (or is not built): the other's median still shown
        me = f"{statistics.median(e):.2f}" if e else "- (failed)"
        ml = f"{statistics.median(l):.2f}" if l else "- (failed)"
        print(f"| {labels[f]} | {ml} | {me} | - | {lr} |"); continue
    me, ml = statistics.median(e), statistics.median(l)
    print(f"| {labels[f]} | {ml:.2f} | {me:.2f} | {me/ml:.2f} | {lr} |")
EOF
