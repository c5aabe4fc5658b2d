#include "engine/cpu/roofline.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_gemm_float.h"

namespace pdserve::engine::cpu {
namespace {

int ResolveThreads(int threads) { return threads > 0 ? threads : omp_get_num_procs(); }

// Total size of the distinct last-level caches of the CPUs this process may
// run on (sysfs cache/index*/ with the highest level); 0 when unknown.
int64_t ReachableLastLevelCacheBytes() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return 0;
  int top_level = 0;
  int64_t total = 0;
  std::set<std::string> seen;  // "level/id" of caches already counted
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    for (int index = 0; index < 8; ++index) {
      const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache/index" +
                              std::to_string(index) + "/";
      int level = 0;
      std::string id, size;
      if (!(std::ifstream(dir + "level") >> level)) break;
      if (!(std::ifstream(dir + "size") >> size)) continue;
      if (!(std::ifstream(dir + "id") >> id)) std::ifstream(dir + "shared_cpu_list") >> id;
      if (level < top_level) continue;
      if (level > top_level) {
        top_level = level;
        total = 0;
        seen.clear();
      }
      if (!seen.insert(id).second) continue;
      int64_t bytes = std::stoll(size);  // "32768K"
      if (size.back() == 'K') bytes <<= 10;
      if (size.back() == 'M') bytes <<= 20;
      total += bytes;
    }
  }
  return total;
}

}  // namespace

RooflineMeasurement MeasureTriadBandwidth(int threads, absl::Duration budget) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + budget;
  RooflineMeasurement out;
  out.threads = ResolveThreads(threads);
  constexpr int64_t kMiB = int64_t{1} << 20;
  // Three arrays of the caches' total size each: every pass streams from memory.
  const int64_t bytes = std::clamp(ReachableLastLevelCacheBytes(), 16 * kMiB, 256 * kMiB);
  const int64_t n = bytes / static_cast<int64_t>(sizeof(double));
  std::unique_ptr<double[]> a(new double[n]), b(new double[n]), c(new double[n]);
  // First touch by the threads that run the triad (NUMA placement).
#pragma omp parallel for num_threads(out.threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.0;
    b[i] = 1.0;
    c[i] = 2.0;
  }
  const double scalar = 3.0;
  absl::Duration pass = absl::ZeroDuration();
  while (out.passes == 0 || absl::Now() + pass <= deadline) {
    const absl::Time t0 = absl::Now();
#pragma omp parallel for num_threads(out.threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + scalar * c[i];
    pass = absl::Now() - t0;
    ++out.passes;
    const double seconds = absl::ToDoubleSeconds(pass);
    if (seconds > 0) out.per_second = std::max(out.per_second, 24.0 * n / seconds);
  }
  out.elapsed = absl::Now() - start;
  return out;
}

RooflineMeasurement MeasureSgemmFlops(int threads, absl::Duration budget) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + budget;
  RooflineMeasurement out;
  out.threads = ResolveThreads(threads);
  InitBlasThreading();  // one OpenBLAS thread per caller, as in the runner
  constexpr int kN = 512;
  const bool panels = HasFloatGemmPanels();
  constexpr double kFlopsPerCall = 2.0 * kN * kN * kN;
  // One pass: every thread runs one sgemm at the same time.
  std::vector<std::vector<float>> matrices(static_cast<size_t>(out.threads));
  std::atomic<bool> stop{false};
  absl::Duration pass = absl::ZeroDuration();
#pragma omp parallel num_threads(out.threads)
  {
    std::vector<float>& m = matrices[static_cast<size_t>(omp_get_thread_num())];
    m.resize(3 * kN * kN);
    for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i % 7) * 0.125f;
    const float* x = m.data();
    const float* w = x + kN * kN;
    float* y = m.data() + 2 * kN * kN;
    while (true) {
#pragma omp barrier
#pragma omp single
      {
        // The first pass always runs; later ones while the last fits.
        if (out.passes > 0 && absl::Now() + pass > deadline) stop.store(true);
      }
      // (the implicit barrier of `single` publishes `stop`)
      if (stop.load()) break;
      absl::Time t0;
#pragma omp master
      t0 = absl::Now();
      if (panels) {
        GemmF32Panels(w, kN, kN, x, kN, kN, y, kN);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kN, kN, kN, 1.0f, x, kN, w, kN, 0.0f,
                    y, kN);
      }
#pragma omp barrier
#pragma omp master
      {
        pass = absl::Now() - t0;
        ++out.passes;
        const double seconds = absl::ToDoubleSeconds(pass);
        if (seconds > 0) {
          out.per_second = std::max(out.per_second, kFlopsPerCall * out.threads / seconds);
        }
      }
    }
  }
  out.elapsed = absl::Now() - start;
  return out;
}

}  // namespace pdserve::engine::cpu
