#!/usr/bin/env bash
# Installs what is missing, builds once, and runs every test with ctest.
# The CUDA kernels' tests run on the CPU emulation (label gpu_emulated).
# Where a CUDA toolkit is installed (/usr/local/cuda), nvcc also compiles
# and links the CUDA targets (preset cuda, ./build-cuda: pdserve_cuda_all
# and the GPU run kit's other binaries, not the project twice), and
# tests/gpu/make_kit.sh packs them into ./gpukit with their libraries;
# then the gpu tests run (skipping themselves where no GPU is present) and
# gpu_kit checks that the kit is self-contained and its run script works
# (tests/gpu/README.md). PDSERVE_SKIP_CUDA_BUILD=1 leaves the nvcc build out.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/local/build.sh
cuda=0
if [ -x /usr/local/cuda/bin/nvcc ] && [ "${PDSERVE_SKIP_CUDA_BUILD:-0}" != 1 ]; then
  cuda=1
  tests/gpu/make_kit.sh
fi
ctest --preset default -j "$(nproc)" "$@"
if [ "$cuda" = 1 ]; then
  ctest --test-dir build-cuda -L '^gpu$' --output-on-failure
  ctest --test-dir build-cuda -L '^gpu_kit$' --output-on-failure
fi
