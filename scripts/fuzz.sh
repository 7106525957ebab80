#!/bin/sh
# Builds the libFuzzer targets (tests/fuzz, clang + ASan/UBSan, build-fuzz/)
# and runs them:
#   scripts/fuzz.sh smoke              every target 10 s on its seed corpus
#                                      (gguf, request, tokenizer, chat, jsonl, image, model, kvfile, mmproj)
#                                      (part of scripts/test.sh)
#   scripts/fuzz.sh run SECONDS [JOBS] every target SECONDS, JOBS processes
#                                      each, corpora kept in build-fuzz/corpus-*
#   scripts/fuzz.sh coverage           line coverage of the files each target
#                                      exercises: its corpus (committed seeds, and
#                                      build-fuzz/corpus-* from a run) replayed by a
#                                      clang coverage build (build-cov/, llvm-cov)
# A crash stops the run with libFuzzer's report and the input saved as
# build-fuzz/crash-*; minimise it (`build-fuzz/fuzz_X -minimize_crash=1 FILE`),
# fix the bug, and commit the input to the target's corpus folder
# (tests/fuzz/corpus/<target>/, named bad_* or ok_* for the request target)
# so that ctest replays it. tests/fuzz/README.md says more.
set -eu
cd "$(dirname "$0")/.."
MODE=${1:-smoke}
case $MODE in
    smoke) SECS=10 JOBS=1 ;;
    run) SECS=${2:?usage: scripts/fuzz.sh run SECONDS [JOBS]} JOBS=${3:-1} ;;
    coverage) ;;
    *) echo "usage: scripts/fuzz.sh smoke | run SECONDS [JOBS] | coverage" >&2; exit 2 ;;
esac
command -v clang > /dev/null || { echo "fuzz.sh: clang is missing: run scripts/setup.sh --test" >&2; exit 1; }
if [ "$MODE" = coverage ]; then
    # target: the source files it is there to exercise
    FILES_gguf="src/model/gguf.c"
    FILES_request="tools/ekv/serve_request.c tools/ekv/serve_native.c tools/ekv/serve_json.c tools/ekv/serve_frame.c"
    FILES_tokenizer="src/model/tokenizer_bpe.c src/model/tokenizer_spm.c src/model/vocab.c src/model/unicode.c"
    FILES_chat="src/engine/chat.c"
    FILES_jsonl="src/eval/dataset.c"
    FILES_image="src/vision/image.c"
    FILES_model="src/model/model.c"
    FILES_kvfile="src/engine/seqfile.c"
    FILES_mmproj="src/vision/clip.c"
    ALL="gguf request tokenizer chat jsonl image model kvfile mmproj"
    CC=clang cmake -S . -B build-cov -DCMAKE_BUILD_TYPE=Debug -DEKV_COVERAGE=ON > /dev/null
    tg="test_gguf_hostile"
    for t in $ALL; do tg="$tg fuzz_${t}_replay"; done
    # shellcheck disable=SC2086 # a list of targets
    cmake --build build-cov --target $tg -j"$(nproc)" > /dev/null
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    mkdir -p "$WORK/gguf"
    LLVM_PROFILE_FILE="$WORK/hostile.profraw" EKV_HOSTILE_DIR="$WORK/gguf" build-cov/tests/test_gguf_hostile > /dev/null
    cp models/stories260K.gguf "$WORK/gguf/"
    printf '%-10s %8s %7s  %s\n' target inputs "lines" "files (line coverage of all of them together)"
    for t in $ALL; do
        dirs=""
        [ -d "tests/fuzz/corpus/$t" ] && dirs="tests/fuzz/corpus/$t"
        [ "$t" = gguf ] && dirs="$WORK/gguf"
        [ "$t" = model ] && dirs="$dirs $WORK/gguf"
        [ "$t" = mmproj ] && dirs="$dirs $WORK/gguf"
        [ -d "build-fuzz/corpus-$t" ] && dirs="$dirs build-fuzz/corpus-$t"
        n=0
        for d in $dirs; do n=$((n + $(find "$d" -type f | wc -l))); done
        # shellcheck disable=SC2086 # lists of folders
        LLVM_PROFILE_FILE="$WORK/$t-%p.profraw" EKV_DEVICE=cpu "build-cov/tests/fuzz_${t}_replay" $dirs \
            > "$WORK/$t.log" 2>&1 || echo "fuzz.sh: $t: the replay reported a problem (see below)" >&2
        llvm-profdata merge -sparse "$WORK/$t"-*.profraw -o "$WORK/$t.profdata"
        eval "files=\$FILES_$t"
        # shellcheck disable=SC2086 # a list of files
        cov=$(llvm-cov report "build-cov/tests/fuzz_${t}_replay" -instr-profile="$WORK/$t.profdata" $files |
            awk '$1 == "TOTAL" { print $(NF-3) }')
        [ -n "$cov" ] || cov=$(llvm-cov report "build-cov/tests/fuzz_${t}_replay" -instr-profile="$WORK/$t.profdata" $files |
            awk 'NR > 2 && NF > 8 { print $(NF-3); exit }')
        printf '%-10s %8s %7s  %s\n' "$t" "$n" "$cov" "$files"
        grep -E 'ERROR|not as their names say' "$WORK/$t.log" | grep -v ' 0 unreadable' >&2 || true
    done
    exit 0
fi
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DEKV_FUZZ=ON -DEKV_SANITIZE=ON > /dev/null
TARGETS="fuzz_gguf fuzz_request fuzz_tokenizer fuzz_chat fuzz_jsonl fuzz_image fuzz_model fuzz_kvfile fuzz_mmproj"
# shellcheck disable=SC2086 # a list of targets
cmake --build build-fuzz --target $TARGETS -j"$(nproc)"
B=$(pwd)/build-fuzz
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
C=$WORK/c
[ "$MODE" = run ] && C=$B/corpus
CG=$C-gguf CR=$C-request
mkdir -p "$CG" "$CR"
# seeds: the hostile GGUF files test_gguf_hostile writes, a real model; the request corpus
cmake --build build-fuzz --target test_gguf_hostile -j"$(nproc)" > /dev/null
EKV_HOSTILE_DIR="$CG" "$B/tests/test_gguf_hostile" > /dev/null
cp models/stories260K.gguf "$CG/"
cp tests/fuzz/corpus/request/* "$CR/"
for t in tokenizer chat jsonl image model kvfile mmproj; do # the other targets: their committed seeds
    mkdir -p "$C-$t"
    cp tests/fuzz/corpus/$t/* "$C-$t/"
done
cp "$CG"/* "$C-model/" # model construction: the hostile GGUF files too
cp "$CG"/* "$C-mmproj/" # and the vision tower loader
cd "$B"  # crash-* files land here
run() { # run NAME CORPUS MAXLEN
    echo "fuzz.sh: $1, ${SECS}s x $JOBS job(s), corpus $2"
    par=""
    [ "$JOBS" -gt 1 ] && par="-jobs=$JOBS -workers=$JOBS"
    rc=0
    # shellcheck disable=SC2086 # par is two words or none
    "$B/$1" -max_len="$3" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 $par "$2" \
        > "$WORK/$1.log" 2>&1 || rc=$?
    grep -E '^(stat::|Done|==|SUMMARY|.*ERROR|.*Test unit written)' "$WORK/$1.log" || true
    # a failure: a non-zero status, or (parallel jobs) a crash-*/leak-*/timeout-* file
    if [ "$rc" -ne 0 ] || ls "$B"/crash-* "$B"/leak-* "$B"/timeout-* > /dev/null 2>&1; then
        tail -n 40 "$WORK/$1.log" >&2
        echo "fuzz.sh: $1 failed (status $rc); the input is in $B (see the report above)" >&2
        exit 1
    fi
}
rm -f "$B"/crash-* "$B"/leak-* "$B"/timeout-*
run fuzz_gguf "$CG" 65536
run fuzz_request "$CR" 4096
run fuzz_tokenizer "$C-tokenizer" 4096
run fuzz_chat "$C-chat" 4096
run fuzz_jsonl "$C-jsonl" 8192
run fuzz_image "$C-image" 65536
run fuzz_model "$C-model" 262144
run fuzz_kvfile "$C-kvfile" 32768
run fuzz_mmproj "$C-mmproj" 262144
echo "fuzz.sh: no crash, leak or timeout"
