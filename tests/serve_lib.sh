# serve_lib.sh — sourced by the server tests (cli_serve*.sh): start `ekv
# serve` on a free 127.0.0.1 port, stop it with SIGTERM and require a clean
# exit (status 0: under ASan this is also the leak check), JSON field access
# through tests/node/jget.mjs.
# Needs: EKV (the binary), REPO, T (a temporary folder).

SRV_PIDS=""
# start_server NAME ARGS... : sets PORT_<NAME> and URL (of the last one started)
start_server() {
    local name=$1; shift
    "$EKV" serve --port 0 "$@" > "$T/$name.out" 2> "$T/$name.err" &
    local pid=$!
    SRV_PIDS="$SRV_PIDS $pid"
    eval "PID_$name=$pid"
    local port=""
    for _ in $(seq 1 1200); do # up to 120 s: a sanitizer build loads slowly
        port=$(sed -n 's|^ekv serve: listening on http://127\.0\.0\.1:\([0-9]*\)$|\1|p' "$T/$name.out")
        [ -n "$port" ] && break
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "server $name died at start:" >&2
            cat "$T/$name.err" >&2
            return 1
        fi
        sleep 0.1
    done
    [ -n "$port" ] || { echo "server $name did not start" >&2; return 1; }
    eval "PORT_$name=$port"
    URL="http://127.0.0.1:$port"
}

# stop_server NAME : SIGTERM, then the exit status must be 0
stop_server() {
    local pid
    eval "pid=\$PID_$1"
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    local rc=$?
    SRV_PIDS=$(echo "$SRV_PIDS" | sed "s/ $pid\b//")
    eval "PID_$1="
    if [ $rc -ne 0 ]; then
        echo "server $1 exited with status $rc:" >&2
        tail -40 "$T/$1.err" >&2
        return 1
    fi
}

stop_all() {
    for pid in $SRV_PIDS; do kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
}

jget() { node "$REPO/tests/node/jget.mjs" "$@"; }
