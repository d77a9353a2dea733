#!/usr/bin/env bash
# Installs what is missing, builds, and runs every CPU test (the README's test command).
# GPU tests are labelled "gpu" and run on a machine with a GPU: scripts/test.sh -L gpu
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
if [ $# -eq 0 ]; then set -- -LE gpu; fi
ctest --output-on-failure -j "$JOBS" "$@"
