#!/usr/bin/env bash
# CPU tests: (re)builds what changed, then runs every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
[ -f "$BUILD_DIR/build.ninja" ] || ./scripts/setup.sh
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}"
