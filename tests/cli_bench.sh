#!/bin/bash
# cli_bench.sh — `ekv bench` on the bundled model: the grid has one row per
# combination (the full cache once, whatever the budgets), JSON with every
# repetition, the overhead column against the full cache, KV ratio of a
# compressing policy below 1, and exit status 1 with a message on bad flags.
# usage: cli_bench.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2
cd "$REPO"
. tests/testlib.sh
J=/tmp/ekv_cli_bench.$$.json
out=$("$EKV" bench -p 24 -n 4 -r 2 -b 1,2 -t 2 --kv-policy full,h2o --kv-budget 0.5,0.25 --json "$J" 2>/dev/null)
rc=$?
[ $rc -eq 0 ] && ok || bad "bench exit status $rc"
rows=$(printf '%s\n' "$out" | grep -c '^| 2 |')
[ "$rows" -eq 6 ] && ok || bad "expected 6 table rows (full x2 batches, h2o x2 budgets x2 batches), got $rows"
printf '%s\n' "$out" | grep -q '^| 2 | full | f16 | 1 | 24 | 4 | 0 | 2 |' && ok || bad "full row with b=2 missing"
# h2o keeps half (or a quarter) of 28 tokens: KV/full well below 1, overhead column filled
h2o=$(printf '%s\n' "$out" | grep '^| 2 | h2o | f16 | 0.25 | 24 | 4 | 0 | 1 |')
ratio=$(printf '%s' "$h2o" | awk -F'|' '{gsub(/ /,"",$14); print $14}')
awk -v r="$ratio" 'BEGIN { exit !(r > 0.1 && r < 0.5) }' && ok || bad "h2o 0.25 KV/full '$ratio'"
printf '%s' "$h2o" | grep -Eq '\| [+-][0-9]+\.[0-9]%' && ok || bad "no stats overhead in '$h2o'"
[ -s "$J" ] && ok || bad "no JSON written"
[ "$(grep -c '"policy"' "$J")" -eq 6 ] && ok || bad "JSON results: $(grep -c '"policy"' "$J")"
grep -q '"decode_s":' "$J" && grep -q '"cpu_share":' "$J" && ok || bad "JSON lacks per-repetition times"
rm -f "$J"
# storage types as a grid axis: f32 holds twice the bytes of f16
out=$("$EKV" bench -p 16 -n 2 -r 1 -t 1 --kv-type f32,f16 2>/dev/null)
m32=$(printf '%s\n' "$out" | grep '^| 1 | full | f32 |' | awk -F'|' '{gsub(/ /,"",$13); print $13}')
m16=$(printf '%s\n' "$out" | grep '^| 1 | full | f16 |' | awk -F'|' '{gsub(/ /,"",$13); print $13}')
[ -n "$m32" ] && [ -n "$m16" ] && ok || bad "kv-type rows missing: '$m32' '$m16'"
J2=/tmp/ekv_cli_bench2.$$.json
"$EKV" bench -p 16 -n 2 -r 1 -t 1 --kv-type f32,f16 --json "$J2" >/dev/null 2>&1
# rows in grid order (f32 then f16): the first kv_bytes is twice the second
b=$(grep -E '"kv_bytes":' "$J2" | grep -oE '[0-9]+' | tr '\n' ' ')
t=$(grep -c '"kv_type":' "$J2")
set -- $b
[ "$t" -eq 2 ] && [ $# -eq 2 ] && [ "$1" -gt 0 ] && [ "$1" -eq $((2 * $2)) ] && ok || bad "JSON kv_type / kv_bytes by type: $t types, bytes '$b'"
rm -f "$J2"
# --json - prints JSON only
"$EKV" bench -p 8 -n 2 -r 1 --json - 2>/dev/null | head -1 | grep -q '^{' && ok || bad "--json - is not JSON"
# bad flags: exit 1 and a message naming the problem
for args in "-p abc" "-b 0" "-r 0" "--kv-policy nosuch" "--kv-budget 2" "--frobnicate" "--kv-type f16,bad"; do
    err=$("$EKV" bench $args 2>&1 >/dev/null); rc=$?
    [ $rc -eq 1 ] && [ -n "$err" ] && ok || bad "bench $args: rc=$rc err='$err'"
done
"$EKV" bench --help | grep -q -- "--depth" && ok || bad "help lacks --depth"
cli_finish cli_bench
