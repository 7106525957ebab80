#!/bin/bash
# cli_options.sh — the one option table (tools/ekv/common.c) as every command
# sees it: shared spellings mean the same thing in run, eval and bench
# (-c/--ctx-size, -t, -m, --kv-*), -s is the sampling seed, old spellings
# still work (eval --ctx), --name=value equals --name value, comma lists are
# checked item by item (range, duplicates, empty items, policy names through
# the library's registry), help is generated from the table, and every bad
# value exits 1 with a message naming the option.
# usage: cli_options.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2
cd "$REPO"
. tests/testlib.sh
cli_tmpdir cli_opts

# -s is the sampling seed: same seed, same text; another seed, another text (temperature 1)
a=$("$EKV" run -n 40 --temp 1 -s 11 2>/dev/null); b=$("$EKV" run -n 40 --temp 1 --seed 11 2>/dev/null)
c=$("$EKV" run -n 40 --temp 1 -s 12 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "-s and --seed differ"
[ "$a" != "$c" ] && ok || bad "-s 11 and -s 12 give the same sampled text"
# eval has no sampling: -s says so and names --kv-seed
"$EKV" eval -s 3 > /dev/null 2> "$T/e"; [ $? -eq 1 ] && grep -q -- "--kv-seed" "$T/e" && ok || bad "eval -s"

# --name=value is --name value
a=$("$EKV" run -n 12 --temp 0 --kv-policy h2o --kv-budget 0.5 2>/dev/null)
b=$("$EKV" run -n 12 --temp=0 --kv-policy=h2o --kv-budget=0.5 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "--name=value"
"$EKV" run --ignore-eos=1 > /dev/null 2> "$T/e"; [ $? -eq 1 ] && grep -q "takes no value" "$T/e" && ok || bad "flag=value"

# -c/--ctx-size everywhere; eval keeps --ctx as an old spelling
"$EKV" run -c 16 -p "Once upon a time" -n 100 --temp 0 > /dev/null 2> "$T/e" && ok || bad "run -c 16"
grep -q "generated 1[0-9] tokens\|generated [0-9] tokens" "$T/e" && ok || bad "run -c 16 must stop at the context: $(tail -1 "$T/e")"
for c in "-c 512" "--ctx-size 512" "--ctx 512"; do
  "$EKV" eval --limit 1 $c -n 4 --metric ppl --kv-policy full -o "$T/ev" --no-plot > /dev/null 2>&1 && ok || bad "eval $c"
done
"$EKV" bench -c 64 -p 8 -n 2 -r 1 -t 1 > /dev/null 2>&1 && ok || bad "bench -c"

# lists: one parser, item by item
for args in "-p 8,8" "-p 8,,16" "-p 8,x" "-b 0" "-t 1,300" "--kv-policy full,nosuch" "--kv-budget 0.5,0" \
            "--kv-budget 0.5,0.5" "--kv-policy ''"; do
  eval "\"$EKV\" bench $args -r 1" > /dev/null 2> "$T/e"; rc=$?
  opt=${args%% *}
  [ $rc -eq 1 ] && grep -q -- "$opt" "$T/e" && ok || bad "bench $args: rc $rc, $(head -1 "$T/e")"
done
"$EKV" eval --kv-policy h2o,elastic,nope -o "$T/x" > /dev/null 2> "$T/e"
[ $? -eq 1 ] && grep -q "nope" "$T/e" && grep -q "elastic" "$T/e" && ok || bad "eval policy list check"

# single values: ranges and names, the same row in every command that takes it
for cmd in run eval bench; do
  for args in "--kv-budget 1.5" "--kv-budget nan" "--kv-pool 4" "--kv-pool-type med" "--kv-compat x" \
              "--kv-sinks -2" "-t 0" "-c -1" "--no-such-flag" "-m"; do
    "$EKV" $cmd $args > /dev/null 2> "$T/e"; rc=$?
    opt=${args%% *}
    [ $rc -eq 1 ] && grep -q -- "$opt" "$T/e" && ok || bad "$cmd $args: rc $rc, $(head -1 "$T/e")"
  done
done
"$EKV" run --kv-policy nonsense -n 1 > /dev/null 2> "$T/e"
[ $? -eq 1 ] && grep -q "unknown KV policy 'nonsense'" "$T/e" && ok || bad "run policy check"
"$EKV" run --chat-template nope -n 1 > /dev/null 2> "$T/e"
[ $? -eq 1 ] && grep -q "chatml" "$T/e" && ok || bad "chat template check lists the known ones"
"$EKV" mkmodel --preset tiny-vlm -o "$T/m.gguf" --seed -1 > /dev/null 2> "$T/e"
[ $? -eq 1 ] && grep -q -- "--seed" "$T/e" && ok || bad "mkmodel --seed -1"

# help from the table: each command lists what it takes, with defaults, and nothing else
"$EKV" run --help > "$T/h" && grep -q -- "-s, --seed N .*sampling seed (default: 3776)" "$T/h" \
  && grep -q -- "--kv-policy NAME" "$T/h" && ! grep -q -- "--n-prompt" "$T/h" && ok || bad "run --help"
"$EKV" bench --help > "$T/h" && grep -q -- "-p, --n-prompt LIST" "$T/h" && grep -q -- "-t, --threads LIST" "$T/h" \
  && ! grep -q -- "--seed" "$T/h" && grep -q "elastic " "$T/h" && ok || bad "bench --help"
"$EKV" eval --help > "$T/h" && grep -q -- "--kv-policy LIST .*(default: full,local,h2o,elastic)" "$T/h" \
  && ! grep -q -- "-s, --seed" "$T/h" && ok || bad "eval --help"
"$EKV" info --help | grep -q -- "--no-tensors" && ok || bad "info --help"
# the CPU kernels chosen for this host, and EKV_ISA capping them (ekv_cpu_kernels)
k=$("$EKV" info --devices | sed -n 's/^cpu: .*, kernels \([a-z0-9]*\) .*/\1/p')
case $k in avx512|avxvnni|avx2|reference) ok ;; *) bad "info --devices names no CPU kernels: '$k'" ;; esac
k=$(EKV_ISA=reference "$EKV" info --devices | sed -n 's/^cpu: .*, kernels \([a-z0-9]*\) .*/\1/p')
[ "$k" = reference ] && ok || bad "EKV_ISA=reference gives kernels '$k'"
k=$(EKV_ISA=avx2 "$EKV" info -m "$REPO/models/stories260K.gguf" --no-metadata | sed -n 's/^  CPU kernels on this host: \([a-z0-9]*\) .*/\1/p')
case $k in avx2|reference) ok ;; *) bad "info -m names no CPU kernels (EKV_ISA=avx2): '$k'" ;; esac
"$EKV" bench -p 8 -n 2 -r 1 -t 1 --json - 2>/dev/null | grep -q '"cpu_kernels":' && ok || bad "bench --json has no cpu_kernels"
# llama.cpp's -ngl as a device: 0 = the CPU; N > 0 = the GPU (runs there, or fails naming
# device 'vulkan' on a host without one); the last of -ngl and --device wins; bad values refused
"$EKV" run -p hi -n 2 -dev vulkan:0 -ngl 0 > "$T/o" 2>&1 && ! grep -q vulkan "$T/o" && ok \
  || bad "-ngl 0 after --device must mean the CPU: $(tail -n 2 "$T/o")"
"$EKV" run -p hi -n 2 -ngl 5 -dev cpu > "$T/o" 2>&1 && ! grep -q vulkan "$T/o" && ok || bad "--device cpu after -ngl 5"
"$EKV" run -p hi -n 2 -ngl 0 -dev vulkan:0 2>&1 | grep -q "vulkan:0" && ok || bad "--device vulkan:0 after -ngl 0"
"$EKV" run -p hi -n 2 -ngl 7 2>&1 | grep -q "vulkan" && ok || bad "-ngl 7 must ask for the GPU"
for v in x -2 3.5 ""; do
  "$EKV" run -p hi -n 2 -ngl "$v" > /dev/null 2> "$T/e" && bad "-ngl '$v' accepted" \
    || { grep -q -- "-ngl expects a number of layers" "$T/e" && ok || bad "-ngl '$v': $(cat "$T/e")"; }
done
# -l TOKEN(+|-)BIAS (llama.cpp's): 383 = ' there' banned changes the greedy text, the same
# token twice sums (+3 +1 = +4), bad spellings and tokens outside the vocabulary refused
t0=$("$EKV" run -p "Once upon a time" -n 12 --temp 0 --no-display-prompt 2>/dev/null)
t1=$("$EKV" run -p "Once upon a time" -n 12 --temp 0 --no-display-prompt -l 383-inf -l 317+4 2>/dev/null)
t2=$("$EKV" run -p "Once upon a time" -n 12 --temp 0 --no-display-prompt -l 383-inf -l 317+3 -l 317+1 2>/dev/null)
[ -n "$t1" ] && [ "$t1" != "$t0" ] && [ "$t1" = "$t2" ] && case $t1 in *there*) false ;; esac && ok \
  || bad "-l: '$t0' / '$t1' / '$t2'"
for v in 383 x-1 383*2 383+inf -5+1 383-nan 383-1e999 "383+" ""; do
  "$EKV" run -p hi -n 2 -l "$v" > /dev/null 2> "$T/e" && bad "-l '$v' accepted" \
    || { grep -q -- "-l expects TOKEN+BIAS" "$T/e" && ok || bad "-l '$v': $(cat "$T/e")"; }
done
"$EKV" run -p hi -n 2 -l 512+1 > /dev/null 2> "$T/e" && bad "-l 512+1 accepted" \
  || { grep -q "token 512 is not in the model's vocabulary" "$T/e" && ok || bad "-l 512+1: $(cat "$T/e")"; }
"$EKV" mkmodel --help | grep -q -- "--preset NAME" && ok || bad "mkmodel --help"

cli_finish cli_options
