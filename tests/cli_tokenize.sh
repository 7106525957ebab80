#!/bin/bash
# cli_tokenize.sh — `ekv tokenize`: the ids of known strings under the
# bundled stories260K vocabulary (SPM, BOS added) and the shipped reference
# model (byte-level BPE, no BOS), llama-tokenize's "id -> 'piece'" lines,
# --json offsets that cut the input at token boundaries, stdin input, and
# exit status 1 on bad usage.
# usage: cli_tokenize.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2
fail=0; pass=0
ok()  { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }
cd "$REPO"
REF=models/ekv-ref-28m-q8_0.gguf

"$EKV" tokenize --help | grep -q -- "--json" && ok || bad "--help"
[ "$("$EKV" tokenize -p "Once upon" --ids)" = "[1, 403, 407]" ] && ok || bad "stories ids: $("$EKV" tokenize -p "Once upon" --ids)"
[ "$("$EKV" tokenize -m $REF -p "static int __init" --ids)" = "[384, 369, 497, 608]" ] && ok || bad "reference ids"
"$EKV" tokenize -m $REF -p "static int __init" | grep -q "^   497 -> ' __'$" && ok || bad "piece lines"
"$EKV" tokenize -m $REF -p "x" --ids --show-count | grep -q "Total number of tokens: 1" && ok || bad "--show-count"
j=$(printf 'int main(void)\n{\n\treturn 0;\n}\n' | "$EKV" tokenize -m $REF -f - --json)
echo "$j" | grep -q '"offsets": \[0, ' && echo "$j" | grep -q '"n_bytes": 30}' && ok || bad "json: $j"
for args in "" "-p a -f b" "-p a --bogus" "-p a --ids --json" "-m /nonexistent.gguf -p a" "-f /nonexistent.txt"; do
  "$EKV" tokenize $args > /dev/null 2>&1
  [ $? -eq 1 ] && ok || bad "'ekv tokenize $args' must exit 1"
done
echo "cli_tokenize: $pass passed, $fail failed"
[ $fail -eq 0 ]
