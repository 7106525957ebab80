#!/bin/bash
# serve_replicas.sh — aggregate requests/s of `ekv serve` replicas behind nginx
# (deploy/nginx/ekv.conf) against one replica, on this machine. A benchmark,
# not a test (tests/cli_deploy.sh checks the deployment itself).
usage() {
    cat <<'EOF'
usage: bench/serve_replicas.sh [options]

Starts replicas of `ekv serve` on free ports and an nginx (as the current user,
files in a temporary folder) running deploy/nginx/ekv.conf with their ports,
then runs C closed-loop clients (each sends one chat completion, waits for the
answer, sends the next; a new X-Session-Id per request, so that the hash
spreads them) for D seconds against, in turn:
  1 replica direct          its own port, no proxy
  1 replica via nginx       ekv.conf with one server line (the proxy's cost)
  3 replicas via nginx      ekv.conf as shipped (ports changed)
  1 replica -t 3T direct    one replica with the threads of the three
and prints requests/s, tokens/s and latency (p50, p99) as a Markdown table.

options:
  -m FILE    model (default: models/stories260K.gguf)
  -t N       threads per replica (default: 1)
  -c N       concurrent clients (default: 8)
  -d S       seconds per row (default: 10)
  -n N       max_tokens per request (default: 32)
  --ekv BIN  the ekv binary (default: build/ekv)
  -h, --help this help
Needs nginx, node and curl (scripts/setup.sh --test). Run it on a quiet
machine: the clients and nginx share its cores with the replicas.
EOF
}
set -eu
HERE=$(cd "$(dirname "$0")/.." && pwd)
MODEL=$HERE/models/stories260K.gguf; THREADS=1; CONC=8; DUR=10; NTOK=32; EKV=$HERE/build/ekv
while [ $# -gt 0 ]; do
    case "$1" in
        -m) MODEL=$2; shift 2 ;;
        -t) THREADS=$2; shift 2 ;;
        -c) CONC=$2; shift 2 ;;
        -d) DUR=$2; shift 2 ;;
        -n) NTOK=$2; shift 2 ;;
        --ekv) EKV=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "serve_replicas.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
NGINX=$(command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || true)
[ -n "$NGINX" ] || { echo "serve_replicas.sh: nginx is not installed (scripts/setup.sh --test)" >&2; exit 1; }
command -v node > /dev/null || { echo "serve_replicas.sh: node is missing" >&2; exit 1; }
T=$(mktemp -d /tmp/ekv_serve_replicas.XXXXXX)
PIDS=""
NG_PID=""
cleanup() {
    [ -z "$NG_PID" ] || { kill -QUIT "$NG_PID" 2>/dev/null; wait "$NG_PID" 2>/dev/null || true; }
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT
[ "$(id -u)" -ne 0 ] || chmod 711 "$T" # root's nginx workers (nobody) reach the temp folders

start_replica() { # start_replica NAME THREADS -> PORT_NAME, PID_NAME
    "$EKV" serve --port 0 -m "$MODEL" -t "$2" --temp 0 > "$T/$1.out" 2> "$T/$1.err" &
    local pid=$! port=""
    PIDS="$PIDS $pid"
    for _ in $(seq 1 600); do
        port=$(sed -n 's|^ekv serve: listening on http://127\.0\.0\.1:\([0-9]*\)$|\1|p' "$T/$1.out")
        [ -n "$port" ] && break
        kill -0 "$pid" 2>/dev/null || { cat "$T/$1.err" >&2; exit 1; }
        sleep 0.1
    done
    [ -n "$port" ] || { echo "serve_replicas.sh: replica $1 did not start" >&2; exit 1; }
    eval "PORT_$1=$port; PID_$1=$pid"
}
stop_replica() {
    local pid; eval "pid=\$PID_$1"
    kill -TERM "$pid"; wait "$pid" || true
    PIDS=$(echo "$PIDS" | sed "s/ $pid\b//")
}
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
start_nginx() { # start_nginx PORT... : ekv.conf with these replicas (the other server lines dropped)
    local p1=$1 p2=${2:-} p3=${3:-} del=""
    [ -n "$p2" ] || del="$del -e /server\\s127\\.0\\.0\\.1:8082\\s/d"
    [ -n "$p3" ] || del="$del -e /server\\s127\\.0\\.0\\.1:8083\\s/d"
    NGPORT=$(free_port)
    sed $del -e "s/127\.0\.0\.1:8081 /127.0.0.1:$p1 /" -e "s/127\.0\.0\.1:8082 /127.0.0.1:$p2 /" \
        -e "s/127\.0\.0\.1:8083 /127.0.0.1:$p3 /" -e "s/^\([[:space:]]*\)listen 8080;/\1listen 127.0.0.1:$NGPORT;/" \
        "$HERE/deploy/nginx/ekv.conf" > "$T/ekv.conf"
    cat > "$T/nginx.conf" <<EOF
worker_processes 1;
pid $T/nginx.pid;
error_log $T/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $T/ng_body;
    proxy_temp_path $T/ng_proxy;
    fastcgi_temp_path $T/ng_fastcgi;
    uwsgi_temp_path $T/ng_uwsgi;
    scgi_temp_path $T/ng_scgi;
    include $T/ekv.conf;
}
EOF
    "$NGINX" -p "$T" -c "$T/nginx.conf" -e "$T/error.log" -g 'daemon off;' > "$T/nginx.out" 2>&1 &
    NG_PID=$!
    for _ in $(seq 1 100); do curl -sf --max-time 2 "http://127.0.0.1:$NGPORT/health" > /dev/null && return 0; sleep 0.1; done
    echo "serve_replicas.sh: nginx did not start: $(cat "$T/error.log")" >&2; exit 1
}
stop_nginx() { kill -QUIT "$NG_PID"; wait "$NG_PID" || true; NG_PID=""; }

# the load: closed-loop clients, one keep-alive connection each
cat > "$T/load.mjs" <<'EOF'
import http from 'node:http';
const [url, conc, dur, ntok] = [process.argv[2], +process.argv[3], +process.argv[4], +process.argv[5]];
const agent = new http.Agent({ keepAlive: true, maxSockets: conc });
const u = new URL('/v1/chat/completions', url);
let sid = 0, ok = 0, bad = 0, toks = 0;
const lat = [];
function one() {
  return new Promise((resolve) => {
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: ntok, temperature: 0 });
    const t0 = process.hrtime.bigint();
    const req = http.request(u, { method: 'POST', agent, headers: { 'Content-Type': 'application/json',
      'X-Session-Id': `bench-${sid++}`, 'Content-Length': Buffer.byteLength(body) } }, (res) => {
      let s = '';
      res.on('data', (d) => (s += d));
      res.on('end', () => {
        if (res.statusCode === 200) { ok++; toks += JSON.parse(s).usage.completion_tokens; lat.push(Number(process.hrtime.bigint() - t0) / 1e6); }
        else bad++;
        resolve();
      });
    });
    req.on('error', () => { bad++; resolve(); });
    req.end(body);
  });
}
const end = Date.now() + dur * 1000;
const t0 = Date.now();
await Promise.all(Array.from({ length: conc }, async () => { while (Date.now() < end) await one(); }));
const secs = (Date.now() - t0) / 1000;
lat.sort((a, b) => a - b);
const q = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : NaN);
console.log([(ok / secs).toFixed(1), (toks / secs).toFixed(0), q(0.5).toFixed(1), q(0.99).toFixed(1), ok, bad].join(' '));
agent.destroy();
EOF
ROWS=()
run() { # run LABEL URL
    node "$T/load.mjs" "$2" 2 1 "$NTOK" > /dev/null # warm-up
    local r; r=$(node "$T/load.mjs" "$2" "$CONC" "$DUR" "$NTOK")
    set -- "$1" $r
    ROWS+=("| $1 | $2 | $3 | $4 | $5 | $6 | $7 |")
    echo "serve_replicas.sh: $1: $2 requests/s" >&2
}
echo "serve_replicas.sh: $(nproc) cores, $(basename "$MODEL"), -t $THREADS per replica, $CONC clients, $DUR s per row, max_tokens $NTOK, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
start_replica a "$THREADS"; start_replica b "$THREADS"; start_replica c "$THREADS"
run "1 replica direct (-t $THREADS)" "http://127.0.0.1:$PORT_a"
start_nginx "$PORT_a"
run "1 replica via nginx" "http://127.0.0.1:$NGPORT"
stop_nginx
start_nginx "$PORT_a" "$PORT_b" "$PORT_c"
run "3 replicas via nginx (-t $THREADS each)" "http://127.0.0.1:$NGPORT"
stop_nginx
stop_replica a; stop_replica b; stop_replica c
start_replica d $((THREADS * 3))
run "1 replica direct (-t $((THREADS * 3)))" "http://127.0.0.1:$PORT_d"
echo
echo "$(nproc) cores; $(basename "$MODEL"); $CONC clients, closed loop, $DUR s; chat, max_tokens $NTOK, temperature 0"
echo
echo "| setup | requests/s | tokens/s | p50 ms | p99 ms | requests | failed |"
echo "|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
