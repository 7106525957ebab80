#!/bin/sh
# The README's second command: install, build and run the whole test suite,
# then the same suite under AddressSanitizer + UndefinedBehaviorSanitizer,
# then the tests of shared threads under ThreadSanitizer (ctest label tsan),
# then the fuzz smoke (scripts/fuzz.sh).
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh --test
./scripts/build.sh build
(cd build && ctest --output-on-failure -j2)
./scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DEKV_SANITIZE=ON
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j2)
# the server's threads and the thread pool (tests/CMakeLists.txt: EKV_TSAN_TESTS, tests/tsan.supp)
./scripts/build.sh build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEKV_TSAN=ON
(cd build-tsan && ctest --output-on-failure -j2 -L tsan)
# every libFuzzer target 30 s on its seed corpus (clang, ASan + UBSan)
./scripts/fuzz.sh smoke
