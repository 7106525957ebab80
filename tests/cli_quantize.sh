#!/bin/bash
# cli_quantize.sh — `ekv quantize` end to end: --help, a conversion of the
# bundled model that `ekv run` then uses, exit status 1 with a message (and
# no output file) on missing flags, an unknown type, a quantised input and
# the output equal to the input.
# usage: cli_quantize.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2
cd "$REPO"
. tests/testlib.sh
cli_tmpdir cli_quantize

"$EKV" quantize --help > "$T/help" 2>&1 && grep -q -- "--type T" "$T/help" && ok || bad "--help"
"$EKV" --help | grep -q "quantize" && ok || bad "quantize not listed by ekv --help"

"$EKV" quantize -m models/stories260K.gguf -o "$T/q8.gguf" > "$T/out" 2>&1 && ok || { bad "q8_0 conversion"; cat "$T/out" >&2; }
grep -q "37 matrices\|32 matrices to q8_0" "$T/out" && ok || bad "summary: $(cat "$T/out")"
"$EKV" info -m "$T/q8.gguf" --no-metadata 2>/dev/null | grep -q "q8_0" && ok || bad "info does not show q8_0 tensors"
"$EKV" run -m "$T/q8.gguf" -p "Once upon a time" -n 12 --temp 0 > "$T/run" 2>/dev/null && grep -q "Lily" "$T/run" \
  && ok || bad "the q8_0 model does not tell the story: $(cat "$T/run")"

for args in "-m models/stories260K.gguf" "-o $T/x.gguf" "-m models/stories260K.gguf -o $T/x.gguf --type q3_k" \
            "-m $T/q8.gguf -o $T/x.gguf" "-m models/stories260K.gguf -o models/stories260K.gguf" \
            "-m /nonexistent.gguf -o $T/x.gguf" "-m models/stories260K.gguf -o $T/x.gguf --bogus"; do
  "$EKV" quantize $args > /dev/null 2> "$T/err"
  rc=$?
  [ $rc -eq 1 ] && [ -s "$T/err" ] && [ ! -e "$T/x.gguf" ] && [ ! -e "$T/x.gguf.tmp" ] && ok \
    || bad "'ekv quantize $args' exited $rc: $(cat "$T/err")"
done
grep -q "already quantised" <("$EKV" quantize -m "$T/q8.gguf" -o "$T/x.gguf" 2>&1) && ok || bad "quantised input message"
cmp -s models/stories260K.gguf <(git -C "$REPO" show HEAD:models/stories260K.gguf 2>/dev/null || cat models/stories260K.gguf) \
  && ok || bad "the input was modified"

cli_finish cli_quantize
