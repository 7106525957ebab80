#!/bin/sh
# The README's first command: install, build, run the bundled stories260K model.
set -eu
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh build
./build/ekv run -p "Once upon a time" -n 60 --temp 0
