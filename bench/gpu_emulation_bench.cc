// pdserve_gpu_emulation_bench: what an emulated kernel launch costs on this
// machine, to size the gpu_emulated tests (gpu_emulation/README.md). A
// kernel whose threads pass --barriers __syncthreads and one warp-shuffle
// reduction each is launched on --blocks x --threads; reported, as the
// median of --runs launches after one warm-up:
//   per thread-phase  wall time / (threads x (barriers + 1))
//   per block         wall time / blocks
// for PDSERVE_GPUEMU_THREADS worker threads (default: the cores).
//   pdserve_gpu_emulation_bench [--blocks=1000] [--threads=256] [--barriers=1] [--runs=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/cuda/base/cuda_compat.h"

ABSL_FLAG(int, blocks, 1000, "blocks per launch");
ABSL_FLAG(int, threads, 256, "threads per block (a multiple of 32)");
ABSL_FLAG(int, barriers, 1, "__syncthreads per thread");
ABSL_FLAG(int, runs, 5, "timed launches");

namespace {

__global__ void BarrierKernel(float* out, int barriers) {
  float v = static_cast<float>(threadIdx.x);
  for (int i = 0; i < barriers; ++i) __syncthreads();
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int blocks = absl::GetFlag(FLAGS_blocks), threads = absl::GetFlag(FLAGS_threads);
  const int barriers = absl::GetFlag(FLAGS_barriers), runs = absl::GetFlag(FLAGS_runs);
  float* out = nullptr;
  if (cudaMalloc(&out, sizeof(float) * blocks) != cudaSuccess) return 1;
  std::vector<double> seconds;
  for (int run = 0; run <= runs; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const pdserve::cuda::LaunchDims dims{static_cast<unsigned>(blocks),
                                         static_cast<unsigned>(threads)};
    if (pdserve::cuda::Launch(BarrierKernel, dims, out, barriers) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      std::fprintf(stderr, "launch failed: %s\n", pdserve::gpuemu::LastFailureMessage());
      return 1;
    }
    if (run > 0) {
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  const double phases = static_cast<double>(blocks) * threads * (barriers + 1);
  std::printf("blocks %d, threads %d, barriers %d: %.3f s per launch (median of %d)\n", blocks,
              threads, barriers, median, runs);
  std::printf("per thread-phase %.3f us, per block %.1f us\n", median / phases * 1e6,
              median / blocks * 1e6);
  cudaFree(out);
  return 0;
}
