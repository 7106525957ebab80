#!/bin/bash
# cli_hostile.sh — hostile model files through the CLI: the bundled GGUF
# truncated at many offsets, a flipped magic, absurd tensor/key counts,
# absurd dimensions and string lengths, a tensor offset past the end, and
# broken llama2.c files. Each must give exit status 1 with an error message
# and no crash (run under ASan/UBSan in CI: a sanitizer report exits non-1).
# usage: cli_hostile.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2; SHARED=$3
SRC="$REPO/models/stories260K.gguf"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail=0; pass=0
size=$(stat -c %s "$SRC")

expect_error() { # file label
  local rc
  "$EKV" run -m "$1" -n 1 -p "Hi" >/dev/null 2>"$T/err"; rc=$?
  if [ $rc -eq 1 ] && grep -q "error" "$T/err"; then pass=$((pass+1)); else
    fail=$((fail+1)); echo "FAIL ($2): run exit $rc: $(head -c 300 "$T/err")" >&2; fi
  "$EKV" info -m "$1" >/dev/null 2>"$T/err"; rc=$?
  if [ $rc -eq 1 ]; then pass=$((pass+1)); else
    fail=$((fail+1)); echo "FAIL ($2): info exit $rc: $(head -c 300 "$T/err")" >&2; fi
}
u64le() { # value -> 8 raw bytes little-endian
  local v=$1 i s=""
  for i in 0 1 2 3 4 5 6 7; do s="$s\\x$(printf %02x $(( (v >> (8*i)) & 255 )))"; done
  printf "$s"
}
u32le() { local v=$1 i s=""; for i in 0 1 2 3; do s="$s\\x$(printf %02x $(( (v >> (8*i)) & 255 )))"; done; printf "$s"; }
patch() { # file offset bytes-producing-command...
  local f=$1 off=$2; shift 2
  "$@" | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
}

# truncations through the CLI: one cut per distinct place in the file (every
# offset below the tensor data, and a spread through it, are cut in-process by
# tests/test_model_hostile.c: a process per cut took ~10 minutes under ASan)
tinfo=$(grep -obUa "token_embd.weight" "$SRC" | head -1 | cut -d: -f1)
vocab=$(grep -obUa "tokenizer.ggml.tokens" "$SRC" | head -1 | cut -d: -f1)
offs="0 2 4 6 8 12 16 20 24 28 32 40 48 64 96 128 160"        # magic, version, counts, first key and value
offs="$offs $((vocab + 10)) $((vocab + 40)) $((vocab + 400))"  # the vocabulary array
offs="$offs $((tinfo - 4)) $((tinfo + 3)) $((tinfo + 20)) $((tinfo + 30))"  # tensor infos
offs="$offs $((size / 2)) $((size - 32)) $((size - 1))"        # tensor data
for o in $offs; do head -c "$o" "$SRC" > "$T/trunc.gguf"; expect_error "$T/trunc.gguf" "truncated at $o"; done

cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" 0 printf 'GGUX'; expect_error "$T/m.gguf" "flipped magic"
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" 4 u32le 1; expect_error "$T/m.gguf" "version 1"
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" 4 u32le 99; expect_error "$T/m.gguf" "version 99"
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" 8 u64le $((1<<62)); expect_error "$T/m.gguf" "absurd tensor count"
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" 16 u64le $((1<<40)); expect_error "$T/m.gguf" "absurd kv count"
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" 24 u64le $((1<<62)); expect_error "$T/m.gguf" "absurd key length"

# tensor infos: locate the name of token_embd.weight (its info follows the metadata)
off=$(grep -obUa "token_embd.weight" "$SRC" | head -1 | cut -d: -f1)
ninfo=$((off + 17))            # u32 n_dims, then u64 ne[n_dims], u32 type, u64 offset
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" $ninfo u32le 9; expect_error "$T/m.gguf" "n_dims 9"
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" $((ninfo+4)) u64le $((1<<40)); patch "$T/m.gguf" $((ninfo+12)) u64le $((1<<40)); expect_error "$T/m.gguf" "absurd dims"
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" $((ninfo+20)) u32le 200; expect_error "$T/m.gguf" "unknown type"
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" $((ninfo+24)) u64le $((1<<50)); expect_error "$T/m.gguf" "offset past end"
# a structurally valid GGUF whose token_embd no longer matches the metadata:
# `info` may still list it, `run` must refuse it
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" $((ninfo+4)) u64le 65
"$EKV" run -m "$T/m.gguf" -n 1 -p Hi >/dev/null 2>"$T/err"
if [ $? -eq 1 ] && grep -q "token_embd.weight" "$T/err"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL (shape mismatch)" >&2; fi
cp "$SRC" "$T/m.gguf"; patch "$T/m.gguf" $((off-8)) u64le $((1<<61)); expect_error "$T/m.gguf" "absurd tensor name length"

# llama2.c checkpoints
B="$SHARED/models/stories260K.bin"
for o in 0 4 27 28 1000 500000 $(( $(stat -c %s "$B") - 4 )); do
  head -c "$o" "$B" > "$T/trunc.bin"; cp "$SHARED/models/tok512.bin" "$T/tok512.bin"; expect_error "$T/trunc.bin" "llama2.c truncated at $o"
done
cp "$B" "$T/h.bin"; patch "$T/h.bin" 0 u32le $(( (1<<31) - 1 )); expect_error "$T/h.bin" "llama2.c absurd dim"
cp "$B" "$T/h.bin"; patch "$T/h.bin" 12 u32le 0; expect_error "$T/h.bin" "llama2.c zero heads"
cp "$B" "$T/ok.bin"; head -c 100 "$SHARED/models/tok512.bin" > "$T/tok512.bin"; expect_error "$T/ok.bin" "truncated tokenizer"
: > "$T/empty.gguf"; expect_error "$T/empty.gguf" "empty file"
expect_error "$T/does-not-exist.gguf" "missing file"

echo "cli_hostile: $pass passed, $fail failed"
[ $fail -eq 0 ]
