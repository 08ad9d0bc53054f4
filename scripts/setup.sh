#!/usr/bin/env bash
# Set-up on a fresh Debian machine: build tools, GoogleTest, then configure and build flashgdn
# (C++ library, every SM90 CUDA kernel for sm_90a when nvcc is present, CPU tests).
#   ./scripts/setup.sh            # build into ./build
#   BUILD_DIR=out ./scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
[ -d /usr/lib/x86_64-linux-gnu/cmake/GTest ] || [ -d /usr/lib/cmake/GTest ] || need+=(libgtest-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}"
fi

# nvcc: on PATH, or the toolkit's default location.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
if command -v nvcc >/dev/null; then
  KERNELS=ON
  echo "setup: $(nvcc --version | tail -1)"
else
  KERNELS=OFF
  echo "setup: nvcc not found; building without CUDA kernels (entry points answer kNotBuilt)"
fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DFLASHGDN_BUILD_KERNELS=$KERNELS ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
