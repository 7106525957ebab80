#!/bin/bash
# cli_longctx.sh — data/longctx/: the scripts that make the long-context
# sets (make_longctx.py, make_ruler.py) reproduce them (a prefix of every set, regenerated from
# ../shared/data/longctx/heldout_dev.jsonl with ekv's tokenizer, equals the
# shipped files line for line), and `ekv eval --metric acc` (the retrieval
# set's metric) reports an exact-match rate per item and is refused where it
# cannot apply. The regeneration needs ../shared and python3 (installed by
# scripts/setup.sh); without ../shared it says "skipped: ../shared absent".
# usage: cli_longctx.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2; SHARED=$3
cd "$REPO"
. tests/testlib.sh
cli_tmpdir cli_longctx

# acc on the bundled model and set: one value in [0, 1] over the items
"$EKV" eval --limit 3 -c 512 --metric acc,ppl --kv-policy full,local --kv-budget 0.5 -o "$T/acc" --no-plot \
  > /dev/null 2> "$T/acc.err" && ok || { bad "eval --metric acc"; cat "$T/acc.err" >&2; }
awk -F, '$NF ~ /^[0-9]+$/ && $(NF-2) == "acc" { n++; if ($(NF-1) < 0 || $(NF-1) > 1 || $NF != 3) bad++ }
         END { exit !(n == 2 && bad == 0) }' "$T/acc/results.csv" 2>/dev/null && ok \
  || bad "acc rows: $(grep acc "$T/acc/results.csv" 2>/dev/null)"
# an answer that is the model's own greedy continuation scores 1, a wrong one 0
# (the shipped ekv-ref-28m Q8_0: byte-level BPE, so the answer tokenises as generated)
Q8=models/ekv-ref-28m-q8_0.gguf
gen=$("$EKV" run -m $Q8 -p "static int __init" -n 4 --temp 0 --no-display-prompt 2>/dev/null)
printf '{"instruction": "static int __init", "answer": "%s"}\n{"instruction": "static int __init", "answer": " zebra quantum zebra"}\n' \
  "$gen" > "$T/own.jsonl"
"$EKV" eval -m $Q8 -f "$T/own.jsonl" --metric acc --kv-policy full -o "$T/own" --no-plot > /dev/null 2>&1
grep -q "^full,.*,acc,0.5,2$" "$T/own/results.csv" && ok || bad "own greedy answer + wrong answer must give acc 0.5 ('$gen'): $(cat "$T/own/results.csv")"
# "score_from": the answer's first tokens (a cue) are fed, not scored. A wrong
# cue followed by the model's own greedy continuation of it scores 1 and
# its PPL counts only the tokens after the cue; without score_from, 0
cue=" zebra quantum"
ncue=$("$EKV" tokenize -m $Q8 -p "$cue" --no-bos --json | sed -n 's/^{"n_tokens": \([0-9]*\),.*/\1/p')
gen2=$("$EKV" run -m $Q8 -p "static int __init$cue" -n 4 --temp 0 --no-display-prompt 2>/dev/null)
printf '{"instruction": "static int __init", "answer": "%s%s", "score_from": %s}\n' "$cue" "$gen2" "$ncue" > "$T/sf.jsonl"
printf '{"instruction": "static int __init", "answer": "%s%s"}\n' "$cue" "$gen2" > "$T/nosf.jsonl"
"$EKV" eval -m $Q8 -f "$T/sf.jsonl" --metric acc,ppl --kv-policy full -o "$T/sf" --no-plot > /dev/null 2>&1
"$EKV" eval -m $Q8 -f "$T/nosf.jsonl" --metric acc,ppl --kv-policy full -o "$T/nosf" --no-plot > /dev/null 2>&1
[ -n "$ncue" ] && grep -q "^full,.*,acc,1,1$" "$T/sf/results.csv" && grep -q "^full,.*,ppl,.*,3$" "$T/sf/results.csv" \
  && grep -q "^full,.*,acc,0,1$" "$T/nosf/results.csv" && ok \
  || bad "score_from $ncue ('$gen2'): $(cat "$T/sf/results.csv" "$T/nosf/results.csv" 2>&1)"
# a score_from that is not a whole number is refused, naming the field; one
# that leaves nothing to score skips the item with the reason
for v in -1 1.5 '"2"' 1e9; do
  printf '{"instruction": "static int __init", "answer": " x y z", "score_from": %s}\n' "$v" > "$T/badsf.jsonl"
  "$EKV" eval -m $Q8 -f "$T/badsf.jsonl" --metric acc --kv-policy full -o "$T/badsf" --no-plot > /dev/null 2> "$T/badsf.err"
  [ $? -eq 1 ] && grep -q 'score_from' "$T/badsf.err" && ok || bad "score_from $v must be refused: $(cat "$T/badsf.err")"
done
printf '{"instruction": "static int __init", "answer": " x y z", "score_from": 9}\n' > "$T/bigsf.jsonl"
"$EKV" eval -m $Q8 -f "$T/bigsf.jsonl" --metric acc --kv-policy full -o "$T/bigsf" --no-plot > /dev/null 2> "$T/bigsf.err"
grep -q 'score_from 9 leaves no scored token' "$T/bigsf.err" && ok || bad "score_from past the answer must skip the item: $(cat "$T/bigsf.err")"
printf 'one two three four five six seven eight nine ten eleven twelve\n' > "$T/doc.txt"
"$EKV" eval -f "$T/doc.txt" --format text -c 512 --metric acc --kv-policy full -o "$T/t" --no-plot \
  > /dev/null 2> "$T/t.err"
[ $? -eq 1 ] && grep -q "acc need a JSONL" "$T/t.err" && ok || bad "acc on a text set must be refused: $(cat "$T/t.err")"

if [ ! -f "$SHARED/data/longctx/heldout_dev.jsonl" ]; then
  echo "cli_longctx: skipped: ../shared absent (regeneration of data/longctx)"
else
  if ! command -v python3 > /dev/null; then
    bad "python3 is missing (scripts/setup.sh installs it)"
  else
    python3 data/longctx/make_longctx.py --ekv "$EKV" --model models/ekv-ref-28m-q8_0.gguf \
      --src "$SHARED/data/longctx/heldout_dev.jsonl" --out "$T/sets" --n-cont 2 --n-recall 2 --n-retrieval 3 \
      2> "$T/make.err" && ok || { bad "make_longctx.py"; cat "$T/make.err" >&2; }
    for f in cont_1k:2 cont_2k:2 cont_3.5k:2 recall:2 retrieval:3; do
      name=${f%%:*}; n=${f##*:}
      [ "$(wc -l < "$T/sets/$name.jsonl" 2>/dev/null)" -eq "$n" ] && \
        head -n "$n" "data/longctx/$name.jsonl" | cmp -s - "$T/sets/$name.jsonl" && ok \
        || bad "$name: the script does not reproduce the shipped set's first $n items"
    done
    # the question-after-context sets (make_ruler.py): a prefix of each
    python3 data/longctx/make_ruler.py --ekv "$EKV" --model models/ekv-ref-28m-q8_0.gguf \
      --src "$SHARED/data/longctx/heldout_dev.jsonl" --out "$T/rsets" --n-retrieval-q 5 --n-ruler 2 \
      2> "$T/make_ruler.err" && ok || { bad "make_ruler.py"; cat "$T/make_ruler.err" >&2; }
    for f in retrieval_q:5 ruler_niah_single:2 ruler_niah_multikey:2; do
      name=${f%%:*}; n=${f##*:}
      [ "$(wc -l < "$T/rsets/$name.jsonl" 2>/dev/null)" -eq "$n" ] && \
        head -n "$n" "data/longctx/$name.jsonl" | cmp -s - "$T/rsets/$name.jsonl" && ok \
        || bad "$name: make_ruler.py does not reproduce the shipped set's first $n items"
    done
  fi
fi
cli_finish cli_longctx
