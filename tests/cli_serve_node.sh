#!/bin/bash
# cli_serve_node.sh — `ekv serve` against Node clients (tests/node, installed
# by scripts/setup.sh --test): the official OpenAI SDK (sdk.mjs), determinism under
# load (determinism.mjs: 32 concurrent mixed-policy requests at temperature 0
# give exactly the texts each gives alone), and robustness (malformed.mjs:
# over 1,000 malformed requests each answered with a 4xx JSON error, then a
# normal answer exactly as before; image cases on a tiny synthetic
# vision-language model), and llama-server's native /completion as its
# clients use it (native.mjs: answers, streams, stop types, mixed prompts,
# n_probs, samplers, images as multimodal_data). Every server must exit 0 on
# SIGTERM.
# usage: cli_serve_node.sh EKV REPO SHARED
set -u
EKV=$1; REPO=$2
cd "$REPO"
. tests/testlib.sh
cli_tmpdir cli_serve_node
. "$REPO/tests/serve_lib.sh"
trap 'stop_all; rm -rf "$T"' EXIT
command -v node > /dev/null || { echo "cli_serve_node: node is missing: run scripts/setup.sh --test" >&2; exit 1; }
[ -f tests/node/node_modules/openai/package.json ] || { echo "cli_serve_node: the OpenAI SDK is missing: run scripts/setup.sh --test" >&2; exit 1; }

start_server sdk -c 512 -t 2 --api-key sdk-test-key || exit 1
node tests/node/sdk.mjs "$URL" sdk-test-key && ok || bad "OpenAI SDK"
stop_server sdk && ok || bad "sdk server exit"

start_server load -c 512 -t 2 --parallel 32 || exit 1
node tests/node/determinism.mjs "$URL" && ok || bad "determinism under load"
stop_server load && ok || bad "load server exit"

"$EKV" mkmodel --preset tiny-vlm --seed 3 -o "$T/vlm.gguf" --mmproj-out "$T/vlm-mmproj.gguf" > /dev/null || bad "mkmodel tiny-vlm"
start_server bad -c 512 -t 2 --max-body 65536 || exit 1
start_server vlm -m "$T/vlm.gguf" --mmproj "$T/vlm-mmproj.gguf" -c 512 -t 2 || exit 1
node tests/node/malformed.mjs "http://127.0.0.1:$PORT_bad" 65536 "http://127.0.0.1:$PORT_vlm" && ok || bad "malformed requests"
stop_server bad && ok || bad "server exit after the malformed requests"
start_server native -c 512 -t 2 || exit 1
node tests/node/native.mjs "http://127.0.0.1:$PORT_native" "http://127.0.0.1:$PORT_vlm" data/images/astronaut_crop.png \
  && ok || bad "llama-server's native /completion"
stop_server native && ok || bad "native server exit"
stop_server vlm && ok || bad "vlm server exit"

cli_finish cli_serve_node
