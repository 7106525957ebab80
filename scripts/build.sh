#!/bin/sh
# Configures and builds ekv into ./build (or $1), Release, with ctest tests.
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift 2>/dev/null || true
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
