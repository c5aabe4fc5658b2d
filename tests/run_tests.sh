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
#
#   tests/run_tests.sh [ctest args...]
#   tests/run_tests.sh --sanitize [ctest args...]
#
# --sanitize builds with AddressSanitizer and UBSan instead (preset
# sanitize, ./build-sanitize, -O1, no benchmarks) and runs the labels unit,
# integration and gpu_emulated under them (test preset sanitize); a report
# of either fails its test (UBSan halts, LeakSanitizer reports at exit).
# Left out there, each for time, not for a finding:
#   - labels reference (PyTorch and npm references check numerics and text
#     through the same code the unit tests cover), deploy (manifests,
#     promtool: little project code runs), gpu (no device);
#   - cuda_runner_test_emulated and runner_cuda_test_emulated: tiny models
#     stepped through the emulated kernels, one fiber per GPU thread, run
#     15-30 times slower under ASan (one case took 257 s); the same kernels
#     run under ASan in cuda_kernels/attention/sampling_test_emulated, and
#     the runner in cuda_cluster_emulated_test;
#   - FaultTest.HeartbeatsGoOnWhileAWorkerComputes: it proves heartbeats go
#     on through multi-second steps with a 500 ms worker ttl, calibrated to
#     release builds; under ASan the worker misses the ttl before its first
#     step.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  shift
  deploy/local/install_deps.sh
  cmake --preset sanitize >/dev/null
  cmake --build --preset sanitize -j "$(nproc)"
  exec ctest --preset sanitize -j "$(nproc)" "$@"
fi
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
