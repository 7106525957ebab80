#!/bin/bash
# cli_mkmodel.sh — `ekv mkmodel`: tiny-vlm writes a language model and an
# mmproj, the same seed gives the same bytes and another seed other bytes,
# every weight type works, and bad arguments fail with status 1 and a
# message. Usage: bash cli_mkmodel.sh <ekv> <repo-dir> <shared-dir>
set -u
EKV=$1
SHARED=$3
TMP=$(mktemp -d /tmp/ekv_cli_mkmodel_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
nonempty() { [ -s "$1" ] && ok "$1 exists, $(stat -c %s "$1") bytes" || bad "$1 missing or empty"; }

# tiny-vlm with the stories260K vocabulary: two files.
if "$EKV" mkmodel --preset tiny-vlm -o "$TMP/a.gguf" --mmproj-out "$TMP/a-mmproj.gguf" \
      --vocab "$SHARED/models/stories260K.gguf" --seed 3 > "$TMP/out.txt"; then
    ok "tiny-vlm written"
else
    bad "tiny-vlm failed: $(cat "$TMP/out.txt")"
fi
nonempty "$TMP/a.gguf"
nonempty "$TMP/a-mmproj.gguf"
grep -q "tokenizer.ggml.tokens" "$TMP/a.gguf" && ok "vocabulary copied" || bad "no tokenizer.ggml.tokens in the model"
grep -q "v.blk.2.ffn_up.weight" "$TMP/a-mmproj.gguf" && ok "mmproj has the ViT tensors" || bad "mmproj lacks v.blk.2.ffn_up.weight"

# Determinism: same seed, same bytes; another seed, other bytes.
"$EKV" mkmodel --preset tiny-vlm -o "$TMP/b.gguf" --mmproj-out "$TMP/b-mmproj.gguf" \
    --vocab "$SHARED/models/stories260K.gguf" --seed 3 > /dev/null || bad "second run failed"
cmp -s "$TMP/a.gguf" "$TMP/b.gguf" && ok "same seed, same model bytes" || bad "same seed gave different model bytes"
cmp -s "$TMP/a-mmproj.gguf" "$TMP/b-mmproj.gguf" && ok "same seed, same mmproj bytes" || bad "same seed gave different mmproj bytes"
"$EKV" mkmodel --preset tiny-vlm -o "$TMP/c.gguf" --vocab "$SHARED/models/stories260K.gguf" --seed 4 > /dev/null || bad "seed 4 failed"
cmp -s "$TMP/a.gguf" "$TMP/c.gguf" && bad "seeds 3 and 4 gave the same bytes" || ok "another seed, other bytes"
# Without --mmproj-out the tower goes beside the model.
nonempty "$TMP/c.mmproj.gguf"

# Every weight type; a generated vocabulary when --vocab is absent.
for t in f32 f16 q8_0 q4_0; do
    if "$EKV" mkmodel --preset tiny-vlm --type $t -o "$TMP/t_$t.gguf" > /dev/null; then
        nonempty "$TMP/t_$t.gguf"
        nonempty "$TMP/t_$t.mmproj.gguf"
    else
        bad "--type $t failed"
    fi
done
s32=$(stat -c %s "$TMP/t_f32.gguf"); s4=$(stat -c %s "$TMP/t_q4_0.gguf")
[ "$s4" -lt "$s32" ] && ok "q4_0 ($s4 B) smaller than f32 ($s32 B)" || bad "q4_0 not smaller than f32"

# A non-vision preset at a real size (SmolLM2-135M, about 100 MB at q4_0 with its 49k vocabulary).
if "$EKV" mkmodel --preset smollm2-135m --type q4_0 -o "$TMP/smol.gguf" > /dev/null; then
    nonempty "$TMP/smol.gguf"
else
    bad "smollm2-135m failed"
fi

# every_policy NAME PREFIX POLICIES: `ekv eval` of the two image items (one image, then two in one
# prompt) on PREFIX.gguf + PREFIX.mmproj.gguf with every policy at budgets 0.2 and 1; at budget 1
# each must equal the full cache, and every policy but full must give a row at 0.2.
every_policy() {
    local name=$1 pre=$2 pols=$3 k
    k=$(echo "$pols" | tr ',' '\n' | wc -l)
    if "$EKV" eval -m "$pre.gguf" --mmproj "$pre.mmproj.gguf" --image-dir "$IMGDIR" -f "$TMP/items.jsonl" \
        -n 4 --metric ppl,kl --kv-policy "$pols" --kv-budget 0.2,1 -o "$pre.eval" --no-plot -t 1 > /dev/null 2> "$pre.eval.err"; then
        full=$(grep "^full,f16,1,ppl," "$pre.eval/results.csv" | cut -d, -f5-)
        n=$(grep -c ",f16,1,ppl,$full\$" "$pre.eval/results.csv"); n2=$(grep -c ",f16,0.2,ppl," "$pre.eval/results.csv")
        [ -n "$full" ] && [ "$n" -eq "$k" ] && [ "$n2" -eq $((k - 1)) ] \
            && ok "$name: $((k - 1)) policies at 0.2; at 1 all equal full" \
            || bad "$name eval: $n of $k at budget 1 equal full, $n2 rows at 0.2"
    else
        bad "$name eval: $(cat "$pre.eval.err")"
    fi
}
IMGDIR="$2/data/images"
printf '%s\n' '{"id":"a","instruction":"Describe.","answer":"A person in a white suit.","image":"astronaut_crop.png"}' \
    '{"id":"b","instruction":"Compare <image> with <image>.","answer":"The same picture.","images":["astronaut_crop.jpg","astronaut_crop.png"]}' \
    > "$TMP/items.jsonl"
POLS=full,local,h2o,scissorhands,tova,roco,snapkv,pyramidkv,vlcache,random,elastic,elastic-v2,h2o+merge,snapkv+adakv

# SmolVLM (idefics3 mmproj): ekv run picks the model's own chat template (smolvlm) with an image,
# and the 320x200 photo becomes 2 x 2 tiles + the overview of 4 rows each with 13 separators.
if "$EKV" mkmodel --preset tiny-smolvlm --type f16 --seed 3 -o "$TMP/sv.gguf" > /dev/null; then
    nonempty "$TMP/sv.mmproj.gguf"
    "$EKV" run -m "$TMP/sv.gguf" --mmproj "$TMP/sv.mmproj.gguf" --image "$2/data/images/astronaut_crop.png" \
        -p "Describe" -n 2 --temp 0 --json > "$TMP/sv.json" 2> "$TMP/sv.err"
    grep -q '"image_tokens":[[:space:]]*33' "$TMP/sv.json" && ok "tiny-smolvlm run: 33 image positions" \
        || bad "tiny-smolvlm run: $(cat "$TMP/sv.err")"
    "$EKV" info -m "$TMP/sv.gguf" 2>&1 | grep -q "smolvlm" && ok "smolvlm template detected" || bad "template not detected"
    every_policy tiny-smolvlm "$TMP/sv" "$POLS"
else
    bad "tiny-smolvlm failed"
fi

# Qwen2-VL (M-RoPE decoder, qwen2vl_merger mmproj): the 320x200 photo at its own resolution is a
# 20 x 13 grid (260 rows) between <|vision_start|> and <|vision_end|>; every policy runs on one image
# and on two in one prompt (the second image's positions start after the first's grid), and at
# budget 1 each equals the full cache.
if "$EKV" mkmodel --preset tiny-qwen2vl --type f16 --seed 3 -o "$TMP/qv.gguf" > /dev/null; then
    nonempty "$TMP/qv.mmproj.gguf"
    "$EKV" run -m "$TMP/qv.gguf" --mmproj "$TMP/qv.mmproj.gguf" --image "$2/data/images/astronaut_crop.png" \
        -p "Describe" -n 2 --temp 0 --json > "$TMP/qv.json" 2> "$TMP/qv.err"
    grep -q '"image_tokens":[[:space:]]*262' "$TMP/qv.json" && ok "tiny-qwen2vl run: 262 image positions" \
        || bad "tiny-qwen2vl run: $(cat "$TMP/qv.err")"
    "$EKV" info -m "$TMP/qv.gguf" 2>&1 | grep -q "M-RoPE: pairs per position component time 2, height 3, width 3" \
        && ok "qwen2vl: M-RoPE sections shown" || bad "qwen2vl: no M-RoPE line in ekv info"
    every_policy tiny-qwen2vl "$TMP/qv" "$POLS,elastic-v2:key=rotate"
else
    bad "tiny-qwen2vl failed"
fi
# Qwen2.5-VL (qwen2.5vl_merger: RMSNorm, SwiGLU, window attention): the same 262 positions, and
# every policy on the same items (at budget 1 each equal to the full cache)
if "$EKV" mkmodel --preset tiny-qwen2.5vl --type f16 --seed 3 -o "$TMP/q25.gguf" > /dev/null; then
    "$EKV" run -m "$TMP/q25.gguf" --mmproj "$TMP/q25.mmproj.gguf" --image "$2/data/images/astronaut_crop.png" \
        -p "Describe" -n 2 --temp 0 --kv-policy elastic-v2:key=rotate --kv-budget 0.2 --json > "$TMP/q25.json" 2> "$TMP/q25.err"
    grep -q '"image_tokens":[[:space:]]*262' "$TMP/q25.json" && ok "tiny-qwen2.5vl run: 262 image positions" \
        || bad "tiny-qwen2.5vl run: $(cat "$TMP/q25.err")"
    every_policy tiny-qwen2.5vl "$TMP/q25" "$POLS,elastic-v2:key=rotate"
else
    bad "tiny-qwen2.5vl failed"
fi

# Errors: status 1 and a message.
expect_fail() {
    local what=$1 needle=$2; shift 2
    "$EKV" mkmodel "$@" > "$TMP/o.txt" 2> "$TMP/e.txt"
    local rc=$?
    if [ $rc -eq 1 ] && grep -q -- "$needle" "$TMP/e.txt"; then ok "$what -> 1"; else bad "$what: status $rc, stderr: $(cat "$TMP/e.txt")"; fi
}
expect_fail "unknown preset" "tiny-vlm" --preset no-such-model -o "$TMP/x.gguf"
expect_fail "missing preset" "preset" -o "$TMP/x.gguf"
expect_fail "missing output" "-o FILE" --preset tiny-vlm
expect_fail "bad type" "q4_0" --preset tiny-vlm --type q3_k -o "$TMP/x.gguf"
expect_fail "bad seed" "seed" --preset tiny-vlm --seed -5 -o "$TMP/x.gguf"
expect_fail "unknown option" "unknown option" --preset tiny-vlm --frobnicate 1 -o "$TMP/x.gguf"
expect_fail "mmproj for a text model" "no vision tower" --preset qwen2-0.5b --mmproj-out "$TMP/m.gguf" -o "$TMP/x.gguf"
expect_fail "missing vocabulary file" "nope.gguf" --preset tiny-vlm --vocab "$TMP/nope.gguf" -o "$TMP/x.gguf"
[ -e "$TMP/x.gguf" ] && bad "a failed run left $TMP/x.gguf" || ok "failed runs leave no file"
"$EKV" mkmodel --help > "$TMP/h.txt" && grep -q "llava-1.5-7b" "$TMP/h.txt" && ok "--help lists presets" || bad "--help"

exit $fail
