#!/bin/bash
# cli_deploy.sh — the replicas deployment of deploy/ (deploy/README.md): three
# `ekv serve` replicas of the bundled model behind an nginx that runs the
# shipped deploy/nginx/ekv.conf, only its ports changed (the replicas' and the
# listen port; the sed below fails the test if those lines move). Checks:
#   (a) one X-Session-Id: all its requests on one replica (read from the
#       replicas' /metrics: the one whose ekv_prompt_tokens_total moved);
#       12 ids over at least 2 replicas; without the header, the body's key
#       (first message + first user message) keeps a growing conversation on
#       one replica and spreads conversations that share a system prompt;
#   (b) 30 requests (plain and streamed, max_tokens 8) in three waves around
#       a replica's death: it is stopped (SIGSTOP) while wave 2 arrives, so
#       that requests are in flight on it, then killed (SIGKILL), and wave 3
#       comes while it is gone. Every request gets exactly one well-formed
#       answer (200 + JSON with choices, or a stream ending in data: [DONE]),
#       and nginx's log shows the in-flight ones retried (502 then 200);
#   (c) nginx stops (SIGQUIT) with status 0, the two live replicas stop on
#       SIGTERM with status 0.
# A stream whose first bytes already reached the client when its replica dies
# cannot be retried by nginx (deploy/README.md); wave 1 ends before the stop so
# that no such stream exists here and the test is deterministic.
# nginx comes from scripts/setup.sh --test; without it the test fails (as
# the server tests do without curl or node).
# usage: cli_deploy.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2; SHARED=$3
cd "$REPO"
NGINX=$(command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; })
if [ -z "$NGINX" ]; then
    echo "cli_deploy: nginx is missing: run scripts/setup.sh --test" >&2
    exit 1
fi
. tests/testlib.sh
cli_tmpdir cli_deploy
. "$REPO/tests/serve_lib.sh"
NG_PID=""
stop_nginx() { # SIGQUIT: graceful; returns nginx's exit status
    [ -n "$NG_PID" ] || return 0
    kill -QUIT "$NG_PID" 2>/dev/null
    srv_wait "$NG_PID" 30
    local rc=$?
    NG_PID=""
    return $rc
}
trap 'stop_nginx; stop_all; rm -rf "$T"' EXIT
command -v curl > /dev/null || { echo "cli_deploy: curl is missing: run scripts/setup.sh --test" >&2; exit 1; }
command -v node > /dev/null || { echo "cli_deploy: node is missing: run scripts/setup.sh --test" >&2; exit 1; }
t0=$(date +%s)

# ---- three replicas, ports from --port 0 ----
R="r1 r2 r3"
for r in $R; do
    start_server "$r" -m "$REPO/models/stories260K.gguf" -t 1 --temp 0 || exit 1
done
port_of() { eval "echo \$PORT_$1"; }

# ---- nginx with the shipped ekv.conf ----
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
[ "$(id -u)" -ne 0 ] || chmod 711 "$T" # as root nginx's workers run as nobody: let them reach $T's temp folders
start_nginx() {
    NGPORT=$(free_port)
    sed -e "s/127\.0\.0\.1:8081 /127.0.0.1:$PORT_r1 /" -e "s/127\.0\.0\.1:8082 /127.0.0.1:$PORT_r2 /" \
        -e "s/127\.0\.0\.1:8083 /127.0.0.1:$PORT_r3 /" \
        -e "s/^\([[:space:]]*\)listen 8080;/\1listen 127.0.0.1:$NGPORT;/" deploy/nginx/ekv.conf > "$T/ekv.conf"
    # the shipped file must still have exactly these lines: 3 servers, one listen
    [ "$(grep -cE "^[[:space:]]*server 127\.0\.0\.1:($PORT_r1|$PORT_r2|$PORT_r3) " "$T/ekv.conf")" = 3 ] &&
        [ "$(grep -cE '^[[:space:]]*server [0-9]' "$T/ekv.conf")" = 3 ] &&
        [ "$(grep -cE "^[[:space:]]*listen 127\.0\.0\.1:$NGPORT;" "$T/ekv.conf")" = 1 ] &&
        [ "$(grep -cE '^[[:space:]]*listen ' "$T/ekv.conf")" = 1 ] ||
        { echo "cli_deploy: deploy/nginx/ekv.conf no longer has the lines 'server 127.0.0.1:808[123] ...' and 'listen 8080;'" >&2; return 2; }
    # the stand-alone part (what deploy/nginx/nginx.conf does), every path under $T;
    # the access log (test only) names the replicas tried and their statuses
    cat > "$T/nginx.conf" <<EOF
worker_processes 1;
pid $T/nginx.pid;
error_log $T/error.log warn;
events { worker_connections 512; }
http {
    log_format up '\$status "\$upstream_addr" "\$upstream_status" "\$http_x_session_id" \$request_uri';
    access_log $T/access.log up;
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
    ( srv_watchdog "$NG_PID" ) < /dev/null > /dev/null 2>&1 &
    NG="http://127.0.0.1:$NGPORT"
    for _ in $(seq 1 100); do
        [ "$(curl -s --max-time 5 "$NG/health" 2>/dev/null | jget status 2>/dev/null)" = ok ] && return 0
        kill -0 "$NG_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$NG_PID" 2>/dev/null && { kill -KILL "$NG_PID"; wait "$NG_PID" 2>/dev/null; }
    NG_PID=""
    return 1
}
started=0
for _ in 1 2 3; do # the free port may be taken between free_port and nginx's bind: try another
    start_nginx; rc=$?
    [ $rc -eq 0 ] && { started=1; break; }
    [ $rc -eq 2 ] && break
done
[ $started -eq 1 ] && ok || { bad "nginx did not start: $(cat "$T/nginx.out" "$T/error.log" 2>/dev/null | tail -5)"; exit 1; }

# ---- which replica answered: the one whose prompt-token counter moved ----
ptok() { curl -s --max-time 10 "http://127.0.0.1:$(port_of "$1")/metrics" | sed -n 's/^ekv_prompt_tokens_total //p'; }
snap() { local r; for r in $R; do printf '%s ' "$(ptok "$r")"; done; }
moved() { # moved "BEFORE" "AFTER" -> the names of the replicas whose counter changed
    local b=($1) a=($2) i=0 r out=""
    for r in $R; do [ "${b[$i]}" != "${a[$i]}" ] && out="$out $r"; i=$((i + 1)); done
    echo $out
}
chat() { # chat SESSION_ID|- BODY -> HTTP status; answer in $T/r
    local h=()
    [ "$1" = - ] || h=(-H "X-Session-Id: $1")
    curl -s --max-time 60 -o "$T/r" -w '%{http_code}' "${h[@]}" -H 'Content-Type: application/json' \
        "$NG/v1/chat/completions" -d "$2"
}
one() { # one SESSION_ID|- BODY -> ONE: the replica that answered (empty and a FAIL unless one did)
    local b a code
    ONE=""
    b=$(snap); code=$(chat "$1" "$2"); a=$(snap)
    [ "$code" = 200 ] || { bad "session $1: HTTP $code: $(head -c 300 "$T/r")"; return; }
    ONE=$(moved "$b" "$a")
    [ "$(echo $ONE | wc -w)" = 1 ] || { bad "session $1: answered by [$ONE]"; ONE=""; }
}

# ---- (a) a session stays on one replica; sessions spread ----
b=$(snap)
for i in 1 2 3 4 5 6; do # different bodies, one session: the header decides
    code=$(chat sess-alpha '{"messages": [{"role": "user", "content": "Turn '"$i"' of the story: once upon a time"}], "max_tokens": 8, "temperature": 0}')
    [ "$code" = 200 ] && jget choices.0.message.content < "$T/r" > /dev/null || bad "sess-alpha request $i: HTTP $code"
done
m=$(moved "$b" "$(snap)")
[ "$(echo $m | wc -w)" = 1 ] && ok || bad "6 requests of one X-Session-Id went to [$m], not one replica"
declare -A ON
for i in $(seq 1 12); do
    one sid-$i '{"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 8, "temperature": 0}'
    ON[sid-$i]=$ONE
done
used=$(printf '%s\n' "${ON[@]}" | grep -v '^$' | sort -u | wc -l)
[ "$used" -ge 2 ] && ok || bad "12 session ids all on $used replica"
# the same ids again: the same replicas
same=0
for i in 1 5 9; do
    one sid-$i '{"messages": [{"role": "user", "content": "Something else"}], "max_tokens": 8, "temperature": 0}'
    [ -n "$ONE" ] && [ "$ONE" = "${ON[sid-$i]}" ] && same=$((same + 1))
done
[ $same = 3 ] && ok || bad "a session id came back on another replica ($same of 3 on theirs)"

# no header: a conversation that grows stays where it started
SYS='{"role": "system", "content": "You tell short stories to children."}'
one - '{"messages": ['"$SYS"', {"role": "user", "content": "Tell me about a red ball"}], "max_tokens": 8, "temperature": 0}'; conv=$ONE
one - '{"messages": ['"$SYS"', {"role": "user", "content": "Tell me about a red ball"}, {"role": "assistant", "content": "The ball was red."}, {"role": "user", "content": "And then?"}], "max_tokens": 8, "temperature": 0}'; c2=$ONE
one - '{"messages": ['"$SYS"', {"role": "user", "content": "Tell me about a red ball"}, {"role": "assistant", "content": "The ball was red."}, {"role": "user", "content": "And then?"}, {"role": "assistant", "content": "It rolled."}, {"role": "user", "content": "Where?"}], "max_tokens": 8, "temperature": 0}'; c3=$ONE
[ -n "$conv" ] && [ "$c2" = "$conv" ] && [ "$c3" = "$conv" ] && ok || bad "a growing conversation without X-Session-Id moved: $conv, $c2, $c3"
# ... and conversations sharing that system prompt spread (the first user message is in the key)
declare -A BYBODY
for i in $(seq 1 12); do
    one - '{"messages": ['"$SYS"', {"role": "user", "content": "Tell me about friend number '"$i"'"}], "max_tokens": 8, "temperature": 0}'
    BYBODY[$i]=$ONE
done
used=$(printf '%s\n' "${BYBODY[@]}" | grep -v '^$' | sort -u | wc -l)
[ "$used" -ge 2 ] && ok || bad "12 conversations with one system prompt all on $used replica"
# /v1/completions: the prompt is the key
p1=$(b=$(snap); curl -s --max-time 60 -o "$T/r" "$NG/v1/completions" -d '{"prompt": "The little dog", "max_tokens": 8}'; moved "$b" "$(snap)")
p2=$(b=$(snap); curl -s --max-time 60 -o "$T/r" "$NG/v1/completions" -d '{"prompt": "The little dog", "max_tokens": 4}'; moved "$b" "$(snap)")
[ -n "$p1" ] && [ "$p1" = "$p2" ] && ok || bad "one completions prompt on two replicas: $p1, $p2"

# ---- (b) a replica dies under load: every request answered once ----
# the victim: the replica with the most of the 12 ids (so that wave 2 has requests for it)
victim=$(printf '%s\n' "${ON[@]}" | grep -v '^$' | sort | uniq -c | sort -rn | awk 'NR==1{print $2}')
VPORT=$(port_of "$victim"); eval "VPID=\$PID_$victim"
mkdir -p "$T/b"
JOBS=()
fire() { # fire N SESSION_ID stream|plain : one background request
    local n=$1 sid=$2 kind=$3 s=false
    [ "$kind" = stream ] && s=true
    echo "$sid $kind" > "$T/b/$n.what"
    ( curl -sN --max-time 90 -o "$T/b/$n.body" -w '%{http_code}' -H "X-Session-Id: $sid" -H 'Content-Type: application/json' \
        "$NG/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "Once upon a time '"$n"'"}], "max_tokens": 8, "temperature": 0, "stream": '"$s"'}' \
        > "$T/b/$n.code"; echo $? > "$T/b/$n.rc" ) &
    JOBS+=($!)
}
kind_of() { [ $(($1 % 2)) = 0 ] && echo stream || echo plain; }
n=0
# wave 1 (10): before anything happens, sessions everywhere
for i in $(seq 1 10); do n=$((n + 1)); fire $n "sid-$(( (i - 1) % 12 + 1 ))" "$(kind_of $n)"; done
for j in "${JOBS[@]}"; do wait "$j"; done
# wave 2 (12): the victim is stopped; its sessions' requests hang on it
kill -STOP "$VPID"
vids=(); oids=()
for i in $(seq 1 12); do [ "${ON[sid-$i]}" = "$victim" ] && vids+=("sid-$i") || oids+=("sid-$i"); done
[ ${#vids[@]} -gt 0 ] || { bad "no session id on the victim $victim"; exit 1; }
nv=0
for i in $(seq 0 11); do
    n=$((n + 1))
    if [ $((i % 2)) = 0 ] || [ ${#oids[@]} = 0 ]; then fire $n "${vids[$(( (i / 2) % ${#vids[@]} ))]}" "$(kind_of $((i / 2)))"; nv=$((nv + 1))
    else fire $n "${oids[$(( (i / 2) % ${#oids[@]} ))]}" "$(kind_of $((i / 2)))"; fi
done
# wait (at most 10 s) until nginx holds that many connections to the victim
hexport=$(printf '%04X' "$VPORT")
for _ in $(seq 1 100); do
    [ "$(awk -v p=":$hexport" 'NR > 1 && substr($3, length($3) - 4) == p && $4 == "01"' /proc/net/tcp | wc -l)" -ge "$nv" ] && break
    sleep 0.1
done
sleep 0.3
disown "$VPID" # no "Killed" notice from bash
kill -KILL "$VPID"
# wave 3 (8): the victim is gone
for i in $(seq 1 8); do n=$((n + 1)); fire $n "sid-$i" "$(kind_of $n)"; done
for j in "${JOBS[@]}"; do wait "$j"; done
for _ in $(seq 1 50); do kill -0 "$VPID" 2>/dev/null || break; sleep 0.1; done
SRV_PIDS=$(echo "$SRV_PIDS" | sed "s/ $VPID\b//"); eval "PID_$victim="

good=0
for i in $(seq 1 $n); do
    read -r sid kind < "$T/b/$i.what"
    code=$(cat "$T/b/$i.code" 2>/dev/null); rc=$(cat "$T/b/$i.rc" 2>/dev/null)
    f="$T/b/$i.body"
    if [ "$code" != 200 ] || [ "$rc" != 0 ]; then bad "load request $i ($sid, $kind): HTTP $code, curl $rc: $(head -c 200 "$f" 2>/dev/null)"; continue; fi
    if [ "$kind" = stream ]; then
        # one stream: ends in [DONE] (jget checks every event), once, every chunk of one completion
        jget --sse < "$f" > /dev/null 2>"$T/b/$i.err" && [ "$(grep -c '^data: \[DONE\]$' "$f")" = 1 ] &&
            [ "$(grep -o '"id":"[^"]*"' "$f" | sort -u | wc -l)" = 1 ] || { bad "load request $i ($sid, stream): $(cat "$T/b/$i.err")"; continue; }
    else
        jget choices.0.message.content < "$f" > /dev/null 2>"$T/b/$i.err" || { bad "load request $i ($sid, plain): $(cat "$T/b/$i.err")"; continue; }
    fi
    good=$((good + 1))
done
[ $good = $n ] && ok || bad "$good of $n load requests answered well"
[ $n = 30 ] && ok || bad "$n load requests, not 30"
# nginx retried the requests that were in flight on the victim: "127.0.0.1:VICTIM, 127.0.0.1:OTHER" "502, 200"
retried=$(grep -c "\"127\.0\.0\.1:$VPORT, 127\.0\.0\.1:[0-9]*\" \"502, 200\"" "$T/access.log")
[ "$retried" -ge 1 ] && ok || bad "no request retried after the victim's death (access log: $(grep -c . "$T/access.log") lines)"
[ "$(awk '$1 != 200' "$T/access.log" | wc -l)" = 0 ] && ok || bad "nginx answered non-200: $(awk '$1 != 200' "$T/access.log" | head -3)"
[ "$(curl -s --max-time 10 "$NG/health" | jget status)" = ok ] && ok || bad "/health through nginx after the death"

# ---- (c) everything stops cleanly ----
stop_nginx && ok || bad "nginx did not exit 0 on SIGQUIT"
grep -E '\[(emerg|alert|crit)\]' "$T/error.log" && bad "nginx error log has emerg/alert/crit" || ok
for r in $R; do [ "$r" = "$victim" ] || { stop_server "$r" && ok || bad "replica $r did not exit 0 on SIGTERM"; }; done
echo "cli_deploy: victim $victim (port $VPORT), $nv of wave 2 on it, $retried retried by nginx; $(( $(date +%s) - t0 )) s"
cli_finish cli_deploy
