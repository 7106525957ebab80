# serve_lib.sh — sourced by the server tests (cli_serve*.sh): start `ekv
# serve` on a free 127.0.0.1 port, stop it with SIGTERM and require a clean
# exit (status 0: under ASan this is also the leak check), JSON field access
# through tests/node/jget.mjs.
# Needs: EKV (the binary), REPO, T (a temporary folder). The test sets
# `trap 'stop_all; rm -rf "$T"' EXIT` (bash runs it on exit and on SIGTERM/INT);
# each server also gets a watchdog that stops it within a second when the test
# shell is gone without doing so (SIGKILL, e.g. a killed ctest), so no test
# ever leaves an `ekv serve` behind.

SRV_PIDS=""
SRV_TEST_PID=$$
SRV_ENV=() # VAR=VALUE words for the next start_server

# watchdog PID : runs in the background while the test shell and the server
# both live; stops the server (TERM, then KILL) if the test shell dies first
srv_watchdog() {
    local pid=$1
    while kill -0 "$SRV_TEST_PID" 2>/dev/null && kill -0 "$pid" 2>/dev/null; do sleep 1; done
    kill -0 "$SRV_TEST_PID" 2>/dev/null && return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
}

# srv_wait PID SECONDS : waits for the server to exit; KILLs it after SECONDS;
# returns its exit status (137 when it had to be killed)
srv_wait() {
    local pid=$1 i
    for i in $(seq 1 $(( $2 * 10 ))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "server $pid did not exit within $2 s of SIGTERM: killed" >&2
        kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid"
}
# start_server NAME ARGS... : sets PORT_<NAME> and URL (of the last one started)
start_server() {
    local name=$1; shift
    env "${SRV_ENV[@]}" "$EKV" serve --port 0 "$@" > "$T/$name.out" 2> "$T/$name.err" &
    local pid=$!
    SRV_PIDS="$SRV_PIDS $pid"
    ( srv_watchdog "$pid" ) < /dev/null > /dev/null 2>&1 &
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
    srv_wait "$pid" 120
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
    local pid
    for pid in $SRV_PIDS; do kill -TERM "$pid" 2>/dev/null; done
    for pid in $SRV_PIDS; do srv_wait "$pid" 30 2>/dev/null; done
    SRV_PIDS=""
}

jget() { node "$REPO/tests/node/jget.mjs" "$@"; }
