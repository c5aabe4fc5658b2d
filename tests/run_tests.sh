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
# sanitize, ./build-sanitize, -O1, no benchmarks), only the test binaries
# it runs (and the servers they start), and runs under them (test preset
# sanitize) every test labelled unit or gpu_emulated and the integration
# tests labelled sanitize: cluster_test (the disaggregated flow through
# real processes and KV transfer), openai_http_test (the HTTP front end),
# auth_test (TLS and tokens), drain_exit_test (shutdown paths),
# subprocess_test (a crashed test ends its servers). A report of
# either sanitizer fails its test (UBSan halts, LeakSanitizer reports at
# exit). Left out, for CI's time (the whole CI run must stay under an hour
# on 2 cores; docs/performance.md, "Sanitizer run"), not for a finding:
#   - the other integration tests (faults, scaling, prometheus, colocated,
#     scheduling, demo model, emulated CUDA cluster, overload and limits,
#     planner, deploy): under ASan they take 20-330 s each and mostly run
#     the same serving code as cluster_test; labels reference and deploy
#     (little project code), gpu (no device);
#   - cuda_runner_test_emulated and runner_cuda_test_emulated: tiny models
#     stepped through the emulated kernels, one fiber per GPU thread, run
#     15-30 times slower under ASan (one case took 257 s); the same kernels
#     run under ASan in cuda_kernels/attention/sampling_test_emulated.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  shift
  deploy/local/install_deps.sh
  cmake --preset sanitize >/dev/null
  # The binaries of the tests the preset selects (their servers come as
  # dependencies); a test that is a script has no target of its own.
  mapfile -t tests < <(ctest --preset sanitize -N | awk '/Test +#/ { print $3 }')
  mapfile -t known < <(cmake --build --preset sanitize --target help | awk -F: '{ print $1 }')
  targets=()
  for t in "${tests[@]}"; do
    if printf '%s\n' "${known[@]}" | grep -qx "$t"; then targets+=("$t"); fi
  done
  cmake --build --preset sanitize -j "$(nproc)" --target "${targets[@]}"
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
