#!/usr/bin/env bash
# Installs what is missing, builds once, and runs every test with ctest.
# The CUDA kernels' tests run on the CPU emulation (label gpu_emulated).
# Where a CUDA toolkit is installed (/usr/local/cuda), nvcc also compiles
# and links the CUDA targets (preset cuda, ./build-cuda, target
# pdserve_cuda_all: only those, not the project twice), and their tests
# (label gpu) run, skipping themselves where no GPU is present.
# PDSERVE_SKIP_CUDA_BUILD=1 leaves the nvcc build out.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/local/build.sh
cuda=0
if [ -x /usr/local/cuda/bin/nvcc ] && [ "${PDSERVE_SKIP_CUDA_BUILD:-0}" != 1 ]; then
  cuda=1
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda --target pdserve_cuda_all -j "$(nproc)"
fi
ctest --preset default -j "$(nproc)" "$@"
if [ "$cuda" = 1 ]; then
  ctest --test-dir build-cuda -L '^gpu$' --output-on-failure
fi
