#!/bin/bash
# cli_run.sh — the ekv command on the bundled model: golden greedy output
# from GGUF and from the llama2.c files, --json, --help on every command,
# and exit status 1 with a message on bad flags.
# usage: cli_run.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2; SHARED=$3
cd "$REPO"
. tests/testlib.sh
# The quoted sentence is the first 57 generated tokens; tokens 58-60 are "\nLily".
GOLD="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.
Lily"
GOLD57="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high."

out=$("$EKV" run -p "Once upon a time" -n 60 --temp 0 -t 2 2>/tmp/ekv_cli_err.$$)
[ "$out" = "$GOLD" ] && ok || bad "GGUF greedy output: '$out'"
out=$("$EKV" run -p "Once upon a time" -n 57 --temp 0 2>/dev/null)
[ "$out" = "$GOLD57" ] && ok || bad "GGUF greedy 57 tokens: '$out'"
grep -q "tok/s" /tmp/ekv_cli_err.$$ && ok || bad "no report line on stderr"

out=$("$EKV" run -m "$SHARED/models/stories260K.bin" -p "Once upon a time" -n 60 --temp 0 2>/dev/null)
[ "$out" = "$GOLD" ] && ok || bad "llama2.c greedy output: '$out'"

# default model found from another directory (next to the executable or source tree)
out=$(cd / && "$EKV" run -p "Once upon a time" -n 60 --temp 0 2>/dev/null)
[ "$out" = "$GOLD" ] && ok || bad "default model from / : '$out'"

json=$("$EKV" run -p "Once upon a time" -n 8 --temp 0 --json 2>/dev/null)
echo "$json" | grep -q '"generated_tokens":[[:space:]]*8' && ok || bad "--json: $json"

for c in run info; do
  "$EKV" $c --help >/dev/null 2>&1 && ok || bad "ekv $c --help"
done
"$EKV" --help >/dev/null && ok || bad "ekv --help"
"$EKV" run --no-such-flag >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "unknown flag must exit 1"
"$EKV" run --temp abc >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "bad --temp must exit 1"
"$EKV" run --kv-budget 1.5 >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "--kv-budget 1.5 must exit 1"
"$EKV" run --kv-policy nonsense -n 1 >/dev/null 2>/tmp/ekv_cli_err.$$; [ $? -eq 1 ] && grep -q nonsense /tmp/ekv_cli_err.$$ && ok || bad "unknown policy must exit 1 naming it"
"$EKV" run -m /nonexistent.gguf -n 1 >/dev/null 2>&1; [ $? -eq 1 ] && ok || bad "missing model must exit 1"
"$EKV" info >/tmp/ekv_cli_out.$$ 2>&1 && grep -q "token_embd.weight" /tmp/ekv_cli_out.$$ && grep -q "KV cache: 640 bytes per token (K+V, f16" /tmp/ekv_cli_out.$$ && ok || bad "ekv info"
for v in llama-spm gpt-2 phi-3; do
  "$EKV" info -m "$SHARED/models/vocab/ggml-vocab-$v.gguf" >/dev/null 2>&1 && ok || bad "ekv info on vocab $v"
done
rm -f /tmp/ekv_cli_err.$$ /tmp/ekv_cli_out.$$
cli_finish cli_run
