#!/bin/bash
# cli_eval.sh — `ekv eval` end to end on the bundled model and data set:
# --help, a tiny sweep that writes results.csv/json/md with the expected
# rows (full at budget 1 equal to h2o at budget 1), the CSV byte-identical
# on a rerun, --json on stdout, and exit status 1 on bad lists and flags.
# usage: cli_eval.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2; SHARED=$3
cd "$REPO"
. tests/testlib.sh
cli_tmpdir cli_eval

"$EKV" eval --help > "$T/help" 2>&1 && ok || bad "ekv eval --help must exit 0"
grep -q -- "--kv-budget LIST" "$T/help" && grep -q "meaningless" "$T/help" && ok || bad "--help text"

# tiny sweep: 2 items, full + h2o at 0.3 and 1, all metrics
"$EKV" eval --limit 2 -c 512 -n 24 --metric ppl,rouge,kl,hitrate --kv-policy full,h2o --kv-budget 0.3,1 \
  -o "$T/a" --no-plot > "$T/a.md" 2> "$T/a.err"
[ $? -eq 0 ] && ok || { bad "tiny sweep failed"; cat "$T/a.err" >&2; }
[ -s "$T/a/results.csv" ] && [ -s "$T/a/results.json" ] && [ -s "$T/a/results.md" ] && ok || bad "result files missing"
head -1 "$T/a/results.csv" | grep -qx "policy,kv_type,budget,metric,value,n" && ok || bad "CSV header"
# 3 cells (full once) x 11 metrics + header
[ "$(wc -l < "$T/a/results.csv")" -eq 34 ] && ok || bad "CSV rows: $(wc -l < "$T/a/results.csv")"
grep -q "^full,f16,1,kl,0," "$T/a/results.csv" && grep -q "^h2o,f16,1,kl,0," "$T/a/results.csv" && ok || bad "KL at budget 1 must be 0"
fp=$(grep "^full,f16,1,ppl," "$T/a/results.csv" | cut -d, -f5-); hp=$(grep "^h2o,f16,1,ppl," "$T/a/results.csv" | cut -d, -f5-)
[ -n "$fp" ] && [ "$fp" = "$hp" ] && ok || bad "h2o at 1 ppl '$hp' differs from full '$fp'"
grep -q "^h2o,f16,0.3,rouge_l_f," "$T/a/results.csv" && ok || bad "no ROUGE row for h2o 0.3"
grep -q "| h2o | f16 | 0.3 |" "$T/a.md" && cmp -s "$T/a.md" "$T/a/results.md" && ok || bad "Markdown on stdout"
grep -q "100.0%" "$T/a.err" && grep -q "ETA" "$T/a.err" && ok || bad "progress on stderr"
grep -q '"timings"' "$T/a/results.json" && ok || bad "timings in JSON"
grep -qi "second" "$T/a/results.csv" && bad "timings in CSV" || ok

# deterministic: same command, byte-identical CSV; --json on stdout
"$EKV" eval --limit 2 -c 512 -n 24 --metric ppl,rouge,kl,hitrate --kv-policy full,h2o --kv-budget 0.3,1 \
  -o "$T/b" --no-plot --json > "$T/b.json" 2>/dev/null
[ $? -eq 0 ] && cmp -s "$T/a/results.csv" "$T/b/results.csv" && ok || bad "CSV differs on a rerun"
grep -q '"results"' "$T/b.json" && cmp -s "$T/b.json" "$T/b/results.json" && ok || bad "--json stdout"

# --per-item JSONL (one line per unit and cell, the cell's PPL pooled back from
# its lines) and --compare-to (ppl_ratio rows, the baseline's own 1 in [1, 1]; rouge_l_f_diff
# rows, the baseline's own 0 in [0, 0], local's its ROUGE-L minus h2o's, inside its interval)
"$EKV" eval --limit 3 -c 512 -n 24 --metric ppl,kl,rouge --kv-policy h2o,h2o+merge,local --kv-budget 0.3 \
  --compare-to h2o --per-item "$T/pi.jsonl" -o "$T/p" --no-plot > /dev/null 2> "$T/p.err"
[ $? -eq 0 ] && ok || { bad "--per-item/--compare-to run failed"; cat "$T/p.err" >&2; }
[ "$(wc -l < "$T/pi.jsonl")" -eq 9 ] && [ ! -e "$T/pi.jsonl.tmp" ] && ok || bad "per-item lines: $(wc -l < "$T/pi.jsonl")"
pooled=$(grep '"policy":"local"' "$T/pi.jsonl" | sed 's/.*"tokens":\([0-9]*\),"nll":\([-0-9.e+]*\).*/\1 \2/' \
  | awk '{ t += $1; n += $2 } END { printf "%.4f", exp(n / t) }')
csv=$(grep "^local,f16,0.3,ppl," "$T/p/results.csv" | cut -d, -f5)
awk -v a="$pooled" -v b="$csv" 'BEGIN { exit !(a > 0 && (a - b) ^ 2 < 1e-6) }' && ok || bad "per-item pooled ppl $pooled vs $csv"
grep -q "^h2o,f16,0.3,ppl_ratio,1,3$" "$T/p/results.csv" && grep -q "^h2o,f16,0.3,ppl_ratio_lo,1,3$" "$T/p/results.csv" \
  && ok || bad "the baseline's own ratio must be 1 in [1, 1]"
lr=$(grep "^local,f16,0.3,ppl_ratio," "$T/p/results.csv" | cut -d, -f5); hp=$(grep "^h2o,f16,0.3,ppl," "$T/p/results.csv" | cut -d, -f5)
lo=$(grep "^local,f16,0.3,ppl_ratio_lo," "$T/p/results.csv" | cut -d, -f5); hi=$(grep "^local,f16,0.3,ppl_ratio_hi," "$T/p/results.csv" | cut -d, -f5)
awk -v r="$lr" -v p="$csv" -v h="$hp" -v lo="$lo" -v hi="$hi" 'BEGIN { exit !((r - p / h) ^ 2 < 1e-6 && lo <= r && r <= hi) }' \
  && ok || bad "local's ratio $lr in [$lo, $hi] vs $csv / $hp"
grep -q "^h2o,f16,0.3,rouge_l_f_diff,0,3$" "$T/p/results.csv" && grep -q "^h2o,f16,0.3,rouge_l_f_diff_hi,0,3$" "$T/p/results.csv" \
  && ok || bad "the baseline's own ROUGE-L difference must be 0 in [0, 0]"
ld=$(grep "^local,f16,0.3,rouge_l_f_diff," "$T/p/results.csv" | cut -d, -f5)
lf=$(grep "^local,f16,0.3,rouge_l_f," "$T/p/results.csv" | cut -d, -f5); hf=$(grep "^h2o,f16,0.3,rouge_l_f," "$T/p/results.csv" | cut -d, -f5)
lo=$(grep "^local,f16,0.3,rouge_l_f_diff_lo," "$T/p/results.csv" | cut -d, -f5); hi=$(grep "^local,f16,0.3,rouge_l_f_diff_hi," "$T/p/results.csv" | cut -d, -f5)
awk -v d="$ld" -v l="$lf" -v h="$hf" -v lo="$lo" -v hi="$hi" 'BEGIN { exit !(d != "" && (d - (l - h)) ^ 2 < 1e-9 && lo <= d && d <= hi) }' \
  && ok || bad "local's ROUGE-L difference $ld in [$lo, $hi] vs $lf - $hf"
# --compare-to base: X+merge over X, nothing for cells without +merge
"$EKV" eval --limit 3 -c 512 -n 24 --metric ppl --kv-policy h2o,h2o+merge,local --kv-budget 0.3 --compare-to base \
  -o "$T/pb" --no-plot > /dev/null 2>&1
mr=$(grep "^h2o+merge,f16,0.3,ppl_ratio," "$T/pb/results.csv" | cut -d, -f5)
mp=$(grep "^h2o+merge,f16,0.3,ppl," "$T/pb/results.csv" | cut -d, -f5)
awk -v r="$mr" -v p="$mp" -v h="$hp" 'BEGIN { exit !(r > 0 && (r - p / h) ^ 2 < 1e-6) }' \
  && ! grep -q "^local,f16,0.3,ppl_ratio" "$T/pb/results.csv" && ok || bad "--compare-to base: $mr vs $mp / $hp"
# --per-type: the first 4 items typed a, b, a, b; each type's rows pool back to the whole cell's (ROUGE-L a mean over items, PPL over tokens)
head -4 data/tinystories_eval.jsonl | awk '{ t = (NR % 2) ? "a" : "b"; sub(/^\{/, "{\"type\": \"" t "\", "); print }' > "$T/typed.jsonl"
"$EKV" eval -f "$T/typed.jsonl" -c 512 -n 16 --metric ppl,rouge --kv-policy h2o --kv-budget 0.3 --per-type \
  -o "$T/ty" --no-plot > /dev/null 2> "$T/ty.err" && ok || { bad "--per-type run failed"; cat "$T/ty.err" >&2; }
awk -F, '$1 == "h2o" { v[$4] = $5; n[$4] = $6 }
  END { ra = v["rouge_l_f.a"] * n["rouge_l_f.a"] + v["rouge_l_f.b"] * n["rouge_l_f.b"];
        lp = log(v["ppl.a"]) * n["ppl.a"] + log(v["ppl.b"]) * n["ppl.b"];
        exit !(n["rouge_l_f.a"] == 2 && n["rouge_l_f.b"] == 2 && (ra / 4 - v["rouge_l_f"]) ^ 2 < 1e-12 &&
               n["ppl.a"] + n["ppl.b"] == n["ppl"] && (exp(lp / n["ppl"]) - v["ppl"]) ^ 2 < 1e-9 &&
               !("kv_frac.a" in v) && !("rouge_l_p.a" in v)) }' "$T/ty/results.csv" \
  && ok || bad "--per-type rows do not pool to the cell's: $(grep '\.[ab],' "$T/ty/results.csv" | tr '\n' ' ')"
sed -e '1s/"type": "a"/"type": "x y"/' -e '3s/"type": "a"/"type": "x_y"/' "$T/typed.jsonl" > "$T/clash.jsonl"
"$EKV" eval -f "$T/clash.jsonl" -c 512 -n 4 --metric ppl --kv-policy h2o --kv-budget 0.3 --per-type -o "$T/cl" \
  --no-plot > /dev/null 2> "$T/cl.err"
[ $? -eq 1 ] && grep -q "same name 'x_y'" "$T/cl.err" && ok || bad "--per-type: types that clash must exit 1"
"$EKV" eval --limit 1 -c 512 --kv-policy h2o,local --compare-to snapkv -o "$T/bad" --no-plot > /dev/null 2> "$T/bad.err"
[ $? -eq 1 ] && grep -q "snapkv" "$T/bad.err" && ok || bad "--compare-to a policy outside the list must exit 1"

# storage types as a grid axis: kv_type column, real bytes (f16 half of f32), the Pareto plot script
"$EKV" eval --limit 2 -c 512 --metric ppl --kv-policy full,h2o --kv-budget 0.5 --kv-type f32,f16 -o "$T/t" \
  > "$T/t.md" 2> "$T/t.err"
rc=$?
[ $rc -eq 0 ] || [ $rc -eq 2 ] && ok || { bad "kv-type sweep failed"; cat "$T/t.err" >&2; }
b32=$(grep "^full,f32,1,kv_bytes," "$T/t/results.csv" | cut -d, -f5); b16=$(grep "^full,f16,1,kv_bytes," "$T/t/results.csv" | cut -d, -f5)
[ -n "$b32" ] && [ -n "$b16" ] && awk -v a="$b32" -v b="$b16" 'BEGIN { exit !(a == 2 * b) }' && ok || bad "kv_bytes f32 '$b32' vs f16 '$b16'"
grep -q "^h2o,f16,0.5,kv_bytes_frac,0.2" "$T/t/results.csv" && grep -q "| h2o | f32 | 0.5 |" "$T/t.md" && ok || bad "h2o rows by type"
[ -s "$T/t/pareto_ppl.gp" ] && grep -q "kv_bytes_frac\|fraction of a full f32 cache" "$T/t/pareto_ppl.gp" && ok || bad "no Pareto plot script"
"$EKV" eval --kv-type f16,bogus -o "$T/bad" --no-plot > /dev/null 2> "$T/bad.err"
[ $? -eq 1 ] && grep -q "bogus" "$T/bad.err" && ok || bad "unknown --kv-type must exit 1 naming it"

# text format: streaming ppl over the TinyStories sample
"$EKV" eval -f "$SHARED/data/perplexity/tinystories_sample.txt" --doc-sep '<|endoftext|>' --limit 1 -c 512 \
  --metric ppl,kl --stride 64 --kv-policy local --kv-budget 0.5 -o "$T/c" --no-plot > /dev/null 2>&1
[ $? -eq 0 ] && grep -q "^local,f16,0.5,ppl," "$T/c/results.csv" && ok || bad "text ppl"

# images: the tiny-vlm preset (random weights of a real layout) with its mmproj;
# an image item without --mmproj is refused, with it every metric runs and
# VL-Cache at budget 1 equals the full cache
"$EKV" mkmodel --preset tiny-vlm --seed 7 -o "$T/vlm.gguf" --mmproj-out "$T/vlm-mmproj.gguf" > /dev/null 2>&1 \
  && ok || bad "mkmodel tiny-vlm"
cat > "$T/img.jsonl" <<'JSONL'
{"id":"img-1","instruction":"What is in the picture?","answer":"A person in a white suit holds a helmet.","image":"astronaut_crop.jpg"}
{"id":"txt-1","instruction":"Describe a quiet morning.","answer":"The sun rose over the hills and the birds sang."}
JSONL
"$EKV" eval -m "$T/vlm.gguf" -f "$T/img.jsonl" -o "$T/img0" --no-plot > /dev/null 2> "$T/img0.err"
[ $? -eq 1 ] && grep -q -- "--mmproj" "$T/img0.err" && ok || bad "image item without --mmproj must exit 1"
"$EKV" eval -m "$T/vlm.gguf" --mmproj "$T/vlm-mmproj.gguf" --image-dir "$REPO/data/images" -f "$T/img.jsonl" \
  -n 8 --metric ppl,rouge,kl,hitrate --kv-policy full,vlcache,h2o --kv-budget 0.5,1 -o "$T/img" --no-plot \
  > /dev/null 2> "$T/img.err"
[ $? -eq 0 ] && ok || { bad "image eval failed"; cat "$T/img.err" >&2; }
fp=$(grep "^full,f16,1,ppl," "$T/img/results.csv" | cut -d, -f5-); vp=$(grep "^vlcache,f16,1,ppl," "$T/img/results.csv" | cut -d, -f5-)
[ -n "$fp" ] && [ "$fp" = "$vp" ] && grep -q "^vlcache,f16,1,kl,0," "$T/img/results.csv" && ok || bad "vlcache at 1 with an image: '$vp' vs '$fp'"
grep -q "^vlcache,f16,0.5,hit_rate," "$T/img/results.csv" && ok || bad "no hit rate with images"
# the cells ran as one group (a shared prompt with the image, batched decode steps):
# each alone (--share 1) gives the same file, byte for byte
"$EKV" eval -m "$T/vlm.gguf" --mmproj "$T/vlm-mmproj.gguf" --image-dir "$REPO/data/images" -f "$T/img.jsonl" \
  -n 8 --metric ppl,rouge,kl,hitrate --kv-policy full,vlcache,h2o --kv-budget 0.5,1 -o "$T/img1" --no-plot \
  --share 1 > /dev/null 2>&1
cmp -s "$T/img/results.csv" "$T/img1/results.csv" && ok || bad "--share 1 and grouped cells differ (images)"
# two images in one item ("images", one marker each): 2 x 16 image positions; VL-Cache at 1 is full;
# a marker count that does not match the images is refused
cat > "$T/img2.jsonl" <<'JSONL'
{"id":"two","instruction":"Compare <image> with <image>.","answer":"The same person twice, in colour.","images":["astronaut_crop.jpg","astronaut_crop.png"]}
JSONL
"$EKV" eval -m "$T/vlm.gguf" --mmproj "$T/vlm-mmproj.gguf" --image-dir "$REPO/data/images" -f "$T/img2.jsonl" \
  -n 4 --metric ppl,kl,hitrate --kv-policy full,vlcache --kv-budget 0.5,1 -o "$T/img2" --no-plot \
  > /dev/null 2> "$T/img2.err"
[ $? -eq 0 ] && ok || { bad "two-image eval failed"; cat "$T/img2.err" >&2; }
fp=$(grep "^full,f16,1,ppl," "$T/img2/results.csv" | cut -d, -f5-); vp=$(grep "^vlcache,f16,1,ppl," "$T/img2/results.csv" | cut -d, -f5-)
[ -n "$fp" ] && [ "$fp" = "$vp" ] && ok || bad "vlcache at 1 with two images: '$vp' vs '$fp'"
sed 's/"images":\["astronaut_crop.jpg",/"images":["astronaut_crop.jpg","astronaut_crop.jpg",/' "$T/img2.jsonl" > "$T/img3.jsonl"
"$EKV" eval -m "$T/vlm.gguf" --mmproj "$T/vlm-mmproj.gguf" --image-dir "$REPO/data/images" -f "$T/img3.jsonl" \
  -n 4 --metric ppl -o "$T/img3" --no-plot > /dev/null 2> "$T/img3.err"
[ $? -eq 1 ] && grep -q "2 <image> markers for 3 image" "$T/img3.err" && ok || bad "3 images for 2 markers: $(cat "$T/img3.err")"
"$EKV" eval --share 0 -o "$T/bad" --no-plot > /dev/null 2> "$T/bad.err"
[ $? -eq 1 ] && grep -q -- "--share" "$T/bad.err" && ok || bad "--share 0 must be refused"

# bad input: exit 1 with a message
for args in "--kv-budget 0.5,abc" "--kv-budget 0,0.5" "--kv-budget 1.5" "--kv-budget 0.5,0.5" \
            "--kv-policy h2o,nonsense" "--metric ppl,bleu" "--rouge x" "--format xml" "--no-such-flag" \
            "-f /nonexistent.jsonl" "--mmproj x.gguf"; do
  "$EKV" eval $args -o "$T/bad" --no-plot > /dev/null 2> "$T/bad.err"
  rc=$?
  [ $rc -eq 1 ] && [ -s "$T/bad.err" ] && ok || bad "'ekv eval $args' exited $rc"
done
"$EKV" eval -f "$SHARED/data/perplexity/tinystories_sample.txt" --metric rouge -o "$T/bad" > /dev/null 2> "$T/bad.err"
[ $? -eq 1 ] && grep -q "JSONL" "$T/bad.err" && ok || bad "rouge on text must exit 1"
# --kv-compat ref belongs to elastic: refused before any work for other policies
"$EKV" eval --limit 1 -c 512 --kv-policy elastic,h2o --kv-compat ref -o "$T/bad" --no-plot > /dev/null 2> "$T/bad.err"
[ $? -eq 1 ] && grep -q "h2o.*elastic only" "$T/bad.err" && ! grep -q "unit 0" "$T/bad.err" && ok \
  || bad "--kv-compat ref with h2o must be refused up front"
"$EKV" eval --limit 1 -c 512 -n 8 --kv-policy elastic --kv-budget 0.5 --kv-compat ref -o "$T/cref" --no-plot \
  > /dev/null 2>&1 && grep -q "^elastic,[a-z0-9_/]*,0.5,ppl," "$T/cref/results.csv" && ok || bad "elastic --kv-compat ref"

cli_finish cli_eval
