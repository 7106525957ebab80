#!/bin/bash
# serve_soak.sh — issue 23's soak of `ekv serve` (a benchmark, not a test):
# starts the server on loopback, drives it for DURATION seconds with C
# concurrent connections of mixed requests (bench/serve_soak.mjs: normal,
# streaming, cancelled, slowly read, never read, malformed and oversized),
# samples its RSS, open file descriptors and threads each SAMPLE seconds,
# stops it with SIGTERM (exit status 0 required) and plots the samples.
#
#   bench/serve_soak.sh OUTDIR [DURATION=3600] [C=32] [SAMPLE=60] [-- server flags...]
# Writes OUTDIR/soak.csv (one row per sample), soak.json (summary and
# samples), soak.png (gnuplot: RSS and fds; latency) and server.err. The
# model is ../shared's ekv-ref-28m when present, else the bundled
# stories260K; prompts come from data/longctx/cont_1k.jsonl.
# Passes (exit 0) when every request was answered once as expected, no 5xx
# but 503 server_busy, RSS grew < 5% and the
# open file descriptors ended where they began (RSS growth: from the first
# sample after a twelfth of the run to the last).
set -eu
OUT=${1:?usage: bench/serve_soak.sh OUTDIR [DURATION] [C] [SAMPLE] [-- server flags]}
shift
DUR=3600; CONC=32; SAMPLE=60
[ $# -gt 0 ] && [ "$1" != "--" ] && { DUR=$1; shift; }
[ $# -gt 0 ] && [ "$1" != "--" ] && { CONC=$1; shift; }
[ $# -gt 0 ] && [ "$1" != "--" ] && { SAMPLE=$1; shift; }
[ $# -gt 0 ] && shift
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
EKV=${EKV:-$REPO/build/ekv}
MODEL=$REPO/models/stories260K.gguf
[ -f "$REPO/../shared/models/ekv-ref-28m-f16.gguf" ] && MODEL=$REPO/../shared/models/ekv-ref-28m-f16.gguf
MAXBODY=1048576
mkdir -p "$OUT"
rm -f "$OUT/soak.csv"
PID=""
trap '[ -z "$PID" ] || { kill $PID 2>/dev/null; wait $PID 2>/dev/null; }' EXIT
"$EKV" serve --port 0 -m "$MODEL" -c 2048 -t 2 -np 8 --queue 16 --kv-mem 48 --prefix-cache 8 \
    --max-body $MAXBODY --timeout 20 "$@" > "$OUT/server.out" 2> "$OUT/server.err" &
PID=$!
PORT=""
for _ in $(seq 1 300); do
    PORT=$(sed -n 's|^ekv serve: listening on http://127\.0\.0\.1:\([0-9]*\)$|\1|p' "$OUT/server.out")
    [ -n "$PORT" ] && break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "serve_soak.sh: the server did not start" >&2; cat "$OUT/server.err" >&2; exit 1; }
echo "serve_soak.sh: $(basename "$MODEL") on port $PORT, $DUR s, $CONC connections, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
rc=0
node "$HERE/serve_soak.mjs" --url "http://127.0.0.1:$PORT" --pid "$PID" --duration "$DUR" --concurrency "$CONC" \
    --sample "$SAMPLE" --max-body $MAXBODY --csv "$OUT/soak.csv" --json "$OUT/soak.json" \
    --text "$REPO/data/longctx/cont_1k.jsonl" || rc=$?
kill -TERM $PID
src=0
wait $PID || src=$?
PID=""
[ $src -eq 0 ] || { echo "serve_soak.sh: the server exited with status $src" >&2; rc=1; }
if command -v gnuplot > /dev/null; then
    gnuplot <<GP || echo "serve_soak.sh: gnuplot failed" >&2
set terminal png size 1000,700
set output "$OUT/soak.png"
set datafile separator ","
set key autotitle columnhead
set multiplot layout 2,1 title "ekv serve soak: $(basename "$MODEL"), $CONC connections"
set xlabel "seconds"
set ylabel "RSS MiB"
set y2label "open fds / threads"
set y2tics
set yrange [0:*]
set y2range [0:*]
plot "$OUT/soak.csv" using 1:2 with linespoints title "RSS MiB", "" using 1:3 axes x1y2 with linespoints title "fds", \
     "" using 1:4 axes x1y2 with lines title "threads"
set ylabel "ms"
unset y2label
unset y2tics
plot "$OUT/soak.csv" using 1:8 with lines title "completion p50", "" using 1:9 with lines title "completion p95", \
     "" using 1:10 with lines title "stream TTFT p50", "" using 1:11 with lines title "stream TTFT p95"
unset multiplot
GP
fi
exit $rc
