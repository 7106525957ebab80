#!/bin/bash
# cli_kvsave.sh — saved caches and prefix reuse (issue 22), from outside:
# `ekv run --kv-save/--kv-load` (a full cache loaded and continued gives the
# text of the uninterrupted run; a compressed one keeps its policy; corrupt,
# truncated, foreign and other-model files refused with a clear message and
# status 1; no partial file), and `ekv serve --prefix-cache` with
# llama-server's /slots: a prefix hit gives the text of the miss (and, for a
# full cache, of a server without prefix reuse), streamed or not, counted in
# usage.prompt_tokens_details.cached_tokens and /metrics; slots saved,
# erased, restored (into a fresh server too) and hit again; file names that
# could leave --slot-save-path refused; 501 without it. Every server must
# exit 0 on SIGTERM.
# usage: cli_kvsave.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2; SHARED=$3
cd "$REPO"
. tests/testlib.sh
cli_tmpdir cli_kvsave
. "$REPO/tests/serve_lib.sh"
trap 'stop_all; rm -rf "$T"' EXIT
command -v curl > /dev/null || { echo "cli_kvsave: curl is missing: run scripts/setup.sh --test" >&2; exit 1; }
command -v node > /dev/null || { echo "cli_kvsave: node is missing: run scripts/setup.sh --test" >&2; exit 1; }
M=models/stories260K.gguf
D="Once upon a time there was a little girl named Lily. She loved to play outside with her dog Max. One day"

# ---- ekv run: a full cache saved, loaded, continued = the uninterrupted run ----
"$EKV" run -m $M -p "$D" -n 0 --kv-save "$T/full.ekvc" > /dev/null 2> "$T/e" && [ -s "$T/full.ekvc" ] && ok || bad "--kv-save: $(cat "$T/e")"
grep -Eq "saved [0-9]+ positions to $T/full.ekvc" "$T/e" && ok || bad "save report: $(cat "$T/e")"
[ ! -e "$T/full.ekvc.tmp" ] && ok || bad "a .tmp file was left"
want=$("$EKV" run -m $M -p "$D, they went to the park" -n 24 --temp 0 2>/dev/null)
got=$("$EKV" run -m $M -p "$D, they went to the park" -n 24 --temp 0 --kv-load "$T/full.ekvc" 2> "$T/e")
[ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "full cache loaded: '$got' != '$want'"
grep -Eq "begins with the [0-9]+ saved tokens" "$T/e" && ok || bad "prefix report: $(cat "$T/e")"
# ---- a compressed cache keeps its policy; a prompt that does not begin with the saved tokens follows them ----
"$EKV" run -m $M -p "$D" -n 0 --kv-policy snapkv --kv-budget 0.3 --kv-save "$T/snap.ekvc" > /dev/null 2>&1 || bad "save snapkv"
a=$("$EKV" run -m $M -p ", they went to the park" -n 24 --temp 0 --kv-load "$T/snap.ekvc" --json 2> "$T/e")
b=$("$EKV" run -m $M -p ", they went to the park" -n 24 --temp 0 --kv-load "$T/snap.ekvc" --json 2>/dev/null)
[ "$(echo "$a" | jget text)" = "$(echo "$b" | jget text)" ] && [ -n "$(echo "$a" | jget text)" ] && ok || bad "loaded runs differ"
[ "$(echo "$a" | jget kv.policy)" = snapkv ] && [ "$(echo "$a" | jget kv.budget)" = 0.3 ] && ok || bad "loaded policy: $a"
[ "$(echo "$a" | jget kv_reused_prompt_tokens)" = 0 ] && [ "$(echo "$a" | jget kv_loaded_positions)" -gt 20 ] && ok || bad "json: $a"
grep -Eq "follows the [0-9]+ saved positions" "$T/e" && ok || bad "continuation report: $(cat "$T/e")"
# saved after generating, loaded, saved again: positions add up
"$EKV" run -m $M -p "$D" -n 6 --temp 0 --kv-policy h2o --kv-budget 0.5 --kv-save "$T/h.ekvc" > /dev/null 2> "$T/e1" || bad "save h2o"
np=$("$EKV" run -m $M -p " and" -n 4 --temp 0 --ignore-eos --kv-load "$T/h.ekvc" --kv-save "$T/h2.ekvc" --json 2> "$T/e2" | jget prompt_tokens)
n1=$(sed -n 's/.*saved \([0-9]*\) positions.*/\1/p' "$T/e1"); n2=$(sed -n 's/.*saved \([0-9]*\) positions.*/\1/p' "$T/e2")
[ -n "$n1" ] && [ -n "$np" ] && [ "$n2" = $((n1 + np + 3)) ] && ok || bad "positions $n1 then $n2 (want + $np prompt + 3 fed tokens)"

# ---- files refused ----
refuse() { # refuse FILE WHAT
    "$EKV" run -m $M -p "x" -n 2 --kv-load "$1" > /dev/null 2> "$T/e"; local rc=$?
    [ $rc = 1 ] && grep -q "$2" "$T/e" && ok || bad "$1: status $rc, '$(cat "$T/e")' (wanted '$2')"
}
cp "$T/snap.ekvc" "$T/bad.ekvc"
printf '\x55' | dd of="$T/bad.ekvc" bs=1 seek=300 conv=notrunc 2>/dev/null
refuse "$T/bad.ekvc" "checksum mismatch"
head -c 2000 "$T/snap.ekvc" > "$T/cut.ekvc"
refuse "$T/cut.ekvc" "truncated"
refuse $M "not a saved ekv cache"
refuse "$T/none.ekvc" "cannot open"
printf '\x02' | dd of="$T/v2.ekvc" bs=1 count=1 2>/dev/null; cp "$T/snap.ekvc" "$T/v2.ekvc"
printf '\x02' | dd of="$T/v2.ekvc" bs=1 seek=8 conv=notrunc 2>/dev/null
refuse "$T/v2.ekvc" "format version 2; this ekv reads version 1"
"$EKV" mkmodel --preset tiny-llama3 --n-layer 1 --type f16 -o "$T/other.gguf" > /dev/null 2>&1 || bad "mkmodel"
"$EKV" run -m "$T/other.gguf" -p "x" -n 2 --kv-load "$T/snap.ekvc" > /dev/null 2> "$T/e"
[ $? = 1 ] && grep -q "saved for another model" "$T/e" && ok || bad "other model: $(cat "$T/e")"
"$EKV" run -m $M -p "$D" -n 0 --kv-save /nonexistent-dir/x.ekvc > /dev/null 2> "$T/e"
[ $? = 1 ] && grep -q "cannot create" "$T/e" && ok || bad "unwritable: $(cat "$T/e")"
"$EKV" run -m $M --chat --kv-save "$T/c.ekvc" < /dev/null > /dev/null 2> "$T/e"
[ $? != 0 ] && grep -q "not available with --chat" "$T/e" && ok || bad "--chat: $(cat "$T/e")"
"$EKV" run --help 2>&1 | grep -q -- "--kv-load FILE" && ok || bad "--help"

# ---- ekv serve --prefix-cache: hits equal misses ----
post() { # post PATH BODY -> body in $T/r, status echoed
    curl -s -o "$T/r" -w '%{http_code}' -H 'Content-Type: application/json' "$URL$1" -d "$2"
}
chat() { # chat QUESTION [EXTRA JSON FIELDS]
    echo '{"messages": [{"role": "system", "content": "'"$D"'"}, {"role": "user", "content": "'"$1"'"}],
           "max_tokens": 24, "temperature": 0'"${2:-}"'}'
}
mkdir -p "$T/slots"
start_server pc -m $M -t 1 --prefix-cache 16 --slot-save-path "$T/slots" --kv-policy snapkv --kv-budget 0.5 || exit 1
post /v1/chat/completions "$(chat 'Where did they go?')" > /dev/null; cp "$T/r" "$T/miss"
post /v1/chat/completions "$(chat 'Where did they go?')" > /dev/null; cp "$T/r" "$T/hit"
npre=$(jget usage.prompt_tokens_details.cached_tokens < "$T/hit")
[ "$(jget usage.prompt_tokens_details.cached_tokens < "$T/miss")" = 0 ] && [ "$npre" -gt 20 ] && ok || bad "cached_tokens 0 then $npre"
[ "$(jget choices.0.message.content < "$T/hit")" = "$(jget choices.0.message.content < "$T/miss")" ] && ok || bad "hit text != miss text"
curl -s -N "$URL/v1/chat/completions" -d "$(chat 'Where did they go?' ', "stream": true')" > "$T/sse"
streamed=$(node -e 'const t=require("fs").readFileSync(process.argv[1],"utf8");let s="";for(const l of t.split("\n"))if(l.startsWith("data: {")){const c=JSON.parse(l.slice(6)).choices[0];if(c&&c.delta&&c.delta.content)s+=c.delta.content;}process.stdout.write(s)' "$T/sse")
[ "$streamed" = "$(jget choices.0.message.content < "$T/hit")" ] && tail -c 20 "$T/sse" | grep -q '\[DONE\]' && ok || bad "streamed hit '$streamed'"
post /v1/chat/completions "$(chat 'Who is Max?')" > /dev/null
[ "$(jget usage.prompt_tokens_details.cached_tokens < "$T/r")" = "$npre" ] && ok || bad "another question does not hit"
post /v1/chat/completions "$(chat 'Who is Max?' ', "cache_prompt": false')" > /dev/null
[ "$(jget usage.prompt_tokens_details.cached_tokens < "$T/r")" = 0 ] && ok || bad "cache_prompt false"
met=$(curl -s "$URL/metrics")
echo "$met" | grep -q '^ekv_prefix_cache_hits_total 3$' && echo "$met" | grep -q '^ekv_prefix_cache_misses_total 1$' && \
    echo "$met" | grep -q '^ekv_prefix_cache_entries 1$' && ok || bad "metrics: $(echo "$met" | grep prefix_cache)"
# ---- /slots: list, save, traversal refused, erase, restore ----
[ "$(curl -s "$URL/slots" | jget 0.n_past)" = "$npre" ] && ok || bad "GET /slots: $(curl -s "$URL/slots")"
id=$(curl -s "$URL/slots" | jget 0.id)
[ "$(post "/slots/$id?action=save" '{"filename": "lily.ekvc"}')" = 200 ] && [ -s "$T/slots/lily.ekvc" ] && \
    [ "$(jget n_saved < "$T/r")" = "$npre" ] && ok || bad "save: $(cat "$T/r")"
for f in '../x.ekvc' 'a/b' '.hidden' '' '/tmp/x' '..' "$(printf 'a%.0s' $(seq 1 210))"; do
    code=$(post "/slots/$id?action=save" '{"filename": "'"$f"'"}')
    [ "$code" = 400 ] && [ "$(jget error.code < "$T/r")" = invalid_filename ] && ok || bad "filename '$f': $code $(cat "$T/r")"
done
[ ! -e "$T/x.ekvc" ] && [ "$(ls "$T/slots")" = lily.ekvc ] && ok || bad "a file was written outside the folder"
[ "$(post "/slots/$id" '{"filename": "a.ekvc"}')" = 400 ] && ok || bad "no action"
[ "$(post "/slots/$id?action=fly" '{}')" = 400 ] && ok || bad "unknown action"
[ "$(post "/slots/999?action=save" '{"filename": "n.ekvc"}')" = 404 ] && ok || bad "unknown slot"
[ "$(post "/slots/$id?action=erase" '')" = 200 ] && [ "$(curl -s "$URL/slots")" = "[]" ] && ok || bad "erase: $(cat "$T/r")"
[ "$(post "/slots/7?action=restore" '{"filename": "nope.ekvc"}')" = 404 ] && ok || bad "restore of a missing file"
cp "$T/bad.ekvc" "$T/slots/bad.ekvc"
[ "$(post "/slots/7?action=restore" '{"filename": "bad.ekvc"}')" = 400 ] && grep -q checksum "$T/r" && ok || bad "corrupt restore: $(cat "$T/r")"
[ "$(post "/slots/7?action=restore" '{"filename": "lily.ekvc"}')" = 200 ] && [ "$(jget n_restored < "$T/r")" = "$npre" ] && \
    [ "$(curl -s "$URL/slots" | jget 0.id)" = 7 ] && ok || bad "restore: $(cat "$T/r")"
post /v1/chat/completions "$(chat 'Where did they go?')" > /dev/null
[ "$(jget usage.prompt_tokens_details.cached_tokens < "$T/r")" = "$npre" ] && \
    [ "$(jget choices.0.message.content < "$T/r")" = "$(jget choices.0.message.content < "$T/miss")" ] && ok || bad "restored slot: no hit or other text"
# a conversation that grows: each turn starts from the prefix the turn before cached
conv() { # conv N: the conversation after N exchanges, then a question
    local m='{"role": "system", "content": "'"$D"'"}' i
    for i in $(seq 1 "$1"); do
        m="$m"', {"role": "user", "content": "Question '"$i"'?"}, {"role": "assistant", "content": "Answer '"$i"'."}'
    done
    echo '{"messages": ['"$m"', {"role": "user", "content": "And then?"}], "max_tokens": 16, "temperature": 0}'
}
post /v1/chat/completions "$(conv 1)" > /dev/null; c1=$(jget usage.prompt_tokens_details.cached_tokens < "$T/r")
post /v1/chat/completions "$(conv 2)" > /dev/null; c2=$(jget usage.prompt_tokens_details.cached_tokens < "$T/r")
cp "$T/r" "$T/turn3"
[ "$c1" = "$npre" ] && [ "$c2" -gt "$c1" ] && ok || bad "a growing conversation: cached_tokens $c1 then $c2"
stop_server pc && ok || bad "server pc exit status"
# a fresh server restores the file and answers as the first did
start_server pc2 -m $M -t 1 --prefix-cache 16 --slot-save-path "$T/slots" --kv-policy snapkv --kv-budget 0.5 || exit 1
[ "$(post "/slots/0?action=restore" '{"filename": "lily.ekvc"}')" = 200 ] && ok || bad "restore in a fresh server"
post /v1/chat/completions "$(chat 'Where did they go?')" > /dev/null
[ "$(jget usage.prompt_tokens_details.cached_tokens < "$T/r")" = "$npre" ] && \
    [ "$(jget choices.0.message.content < "$T/r")" = "$(jget choices.0.message.content < "$T/miss")" ] && ok || bad "fresh server: no hit or other text"
post /v1/chat/completions "$(conv 2)" > /dev/null # not cached here: read message by message from the start
[ "$(jget usage.prompt_tokens_details.cached_tokens < "$T/r")" = "$npre" ] && \
    [ "$(jget choices.0.message.content < "$T/r")" = "$(jget choices.0.message.content < "$T/turn3")" ] && ok || bad "turn 3: other text than with its history cached"
stop_server pc2 && ok || bad "server pc2 exit status"
# ---- a full cache: prefix reuse gives the text of no reuse at all; no --slot-save-path: 501 ----
start_server plain -m $M -t 1 || exit 1
post /v1/chat/completions "$(chat 'Where did they go?' ', "kv": {"policy": "full"}')" > /dev/null; cp "$T/r" "$T/plain"
[ "$(post "/slots/0?action=save" '{"filename": "a.ekvc"}')" = 501 ] && ok || bad "slots without --slot-save-path: $(cat "$T/r")"
stop_server plain && ok || bad "server plain exit status"
start_server pcf -m $M -t 1 --prefix-cache 4 || exit 1
post /v1/chat/completions "$(chat 'Where did they go?' ', "kv": {"policy": "full"}')" > /dev/null
post /v1/chat/completions "$(chat 'Where did they go?' ', "kv": {"policy": "full"}')" > /dev/null
[ "$(jget usage.prompt_tokens_details.cached_tokens < "$T/r")" -gt 0 ] && \
    [ "$(jget choices.0.message.content < "$T/r")" = "$(jget choices.0.message.content < "$T/plain")" ] && ok || bad "full-cache hit != no reuse"
stop_server pcf && ok || bad "server pcf exit status"
cli_finish cli_kvsave
