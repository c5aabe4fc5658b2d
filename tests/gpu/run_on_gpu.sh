#!/usr/bin/env bash
# The CUDA backend on a real GPU, in one command, on a Debian 12 machine with
# an NVIDIA driver and the CUDA toolkit at /usr/local/cuda:
#   1. installs missing build dependencies (deploy/local/install_deps.sh);
#   2. builds the `cuda` preset (./build-cuda: nvcc for sm_80 and sm_90, the
#      CUDA backend built into the workers);
#   3. runs every gpu-labelled test (the sources CI runs under the emulation)
#      with PDSERVE_REQUIRE_GPU=1, so a missing device fails them instead of
#      skipping them;
#   4. runs pdserve_cuda_bench on Llama-3.2-1B- and Llama-3.1-8B-shaped
#      random bf16 models (made in memory) and prints its tables, also
#      saved to build-cuda/cuda_bench.md with the machine and date.
# A machine without a package manager or network (only the CUDA toolkit,
# CMake and Python) takes the prebuilt kit instead: tests/gpu/run_kit.sh
# (tests/gpu/README.md).
# The default benchmark needs about 55 GB of device memory (the 8B model's
# weights plus 64 sequences x 4096 tokens of KV); on a smaller GPU pass e.g.
# --batches=1,8,32. Arguments are passed to the benchmark.
#   tests/gpu/run_on_gpu.sh [--shapes=llama-1b] [--batches=...] ...
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! nvidia-smi >/dev/null 2>&1; then
  echo "run_on_gpu.sh: nvidia-smi finds no usable GPU" >&2
  exit 1
fi
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "run_on_gpu.sh: no CUDA toolkit at /usr/local/cuda" >&2
  exit 1
fi
deploy/local/install_deps.sh
cmake --preset cuda
cmake --build --preset cuda -j "$(nproc)"

PDSERVE_REQUIRE_GPU=1 ctest --test-dir build-cuda -L '^gpu$' --output-on-failure

out=build-cuda/cuda_bench.md
{
  echo "# pdserve_cuda_bench, $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  echo '```'
  echo
  build-cuda/bench/pdserve_cuda_bench "$@"
} | tee "$out"
echo "saved to $out"
