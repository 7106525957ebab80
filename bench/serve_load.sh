#!/bin/bash
# serve_load.sh — the server benchmark of docs/server.md (not a test): starts
# `ekv serve` (and, when LLAMA_SERVER names its binary, llama.cpp's
# llama-server on the same GGUF), runs bench/serve_load.mjs against it, stops
# it, and appends one JSON line per concurrency level to OUT.
#
#   bench/serve_load.sh OUT NAME SERVER [server flags...] -- [serve_load.mjs flags...]
#     SERVER = ekv | llama
# e.g.
#   bench/serve_load.sh out.jsonl elastic-0.2 ekv -m model.gguf -t 2 --kv-mem 256 -np 64 \
#       --kv-policy elastic --kv-budget 0.2 -- --concurrency 64 --duration 200 --warmup 100 \
#       --text data.jsonl --prompt-tokens 2048-3072 --max-tokens 1024
# Run it through /work/notes/bench.sh (one benchmark at a time) on a quiet machine.
set -eu
OUT=$1; NAME=$2; KIND=$3; shift 3
SFLAGS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do SFLAGS+=("$1"); shift; done
[ $# -gt 0 ] && shift
HERE=$(cd "$(dirname "$0")" && pwd)
EKV=${EKV:-$HERE/../build/ekv}
LOG=$(mktemp /tmp/serve_load.XXXXXX)
PID=""
# the server is stopped however this script ends (bash runs EXIT on SIGTERM/INT too)
trap '[ -z "$PID" ] || { kill $PID 2>/dev/null; wait $PID 2>/dev/null; }; rm -f "$LOG" "$LOG.out" "$LOG.err"' EXIT
if [ "$KIND" = ekv ]; then
    "$EKV" serve --port 0 "${SFLAGS[@]}" > "$LOG.out" 2> "$LOG.err" &
    PID=$!
    for _ in $(seq 1 300); do
        PORT=$(sed -n 's|^ekv serve: listening on http://127\.0\.0\.1:\([0-9]*\)$|\1|p' "$LOG.out")
        [ -n "$PORT" ] && break
        sleep 0.1
    done
else
    PORT=${LLAMA_PORT:-18555}
    "${LLAMA_SERVER:?set LLAMA_SERVER to llama.cpp\'s llama-server binary}" --host 127.0.0.1 --port "$PORT" \
        "${SFLAGS[@]}" > "$LOG.out" 2>&1 &
    PID=$!
    for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 0.2; done
fi
[ -n "${PORT:-}" ] || { echo "serve_load.sh: the server did not start" >&2; cat "$LOG.err" >&2; exit 1; }
echo "serve_load.sh: $NAME: $KIND on port $PORT, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
node "$HERE/serve_load.mjs" --url "http://127.0.0.1:$PORT" --pid "$PID" --label "$NAME" "$@" | tee -a "$OUT"
