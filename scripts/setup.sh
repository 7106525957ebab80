#!/bin/sh
# Installs what ekv needs, from Debian's packages only (apt-get).
#   scripts/setup.sh         to build and run ekv (scripts/demo.sh): compiler,
#                            CMake, cJSON, stb, libmicrohttpd, gnuplot, and for
#                            the GPU backend the Vulkan headers, volk, glslc and
#                            the loader (libvulkan1)
#   scripts/setup.sh --test  also what the test suite needs (scripts/test.sh):
#                            curl, python3 (tests/cli_longctx.sh), clang (the
#                            fuzz smoke, scripts/fuzz.sh), lavapipe
#                            (mesa-vulkan-drivers) and the Khronos validation
#                            layer for the GPU tests, Node.js and npm, and with npm the official
#                            OpenAI SDK for Node, pinned by
#                            tests/node/package-lock.json, into tests/node/node_modules
# Safe to run again: what is present is skipped.
set -eu
cd "$(dirname "$0")/.."
TEST=0
case "${1:-}" in
    --test) TEST=1 ;;
    "") ;;
    *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac
PKGS="build-essential cmake pkg-config libcjson-dev libstb-dev libmicrohttpd-dev gnuplot-nox"
PKGS="$PKGS libvulkan-dev libvulkan-volk-dev glslc libvulkan1"
[ $TEST -eq 0 ] || PKGS="$PKGS curl python3" # python3: tests/cli_longctx.sh rebuilds data/longctx
[ $TEST -eq 0 ] || PKGS="$PKGS clang" # the libFuzzer targets' smoke run (scripts/fuzz.sh)
[ $TEST -eq 0 ] || PKGS="$PKGS mesa-vulkan-drivers vulkan-validationlayers" # lavapipe + validation: GPU tests
[ $TEST -eq 0 ] || PKGS="$PKGS nginx" # tests/cli_deploy.sh: replicas behind nginx (deploy/; Debian 12+: the binary package)
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ $TEST -eq 1 ]; then
    # Node.js and npm from Debian, unless a node and npm are installed already
    # (NodeSource's nodejs package brings its own npm and conflicts with Debian's)
    command -v node >/dev/null 2>&1 || missing="$missing nodejs"
    command -v npm >/dev/null 2>&1 || missing="$missing npm"
fi
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "ekv setup: installing$missing" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
if [ $TEST -eq 1 ] && [ ! -f tests/node/node_modules/openai/package.json ]; then
    echo "ekv setup: installing the OpenAI SDK for the server tests (npm, tests/node)" >&2
    (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
fi
