// Device peaks (see cuda_peaks.h).
#include "engine/cuda/cuda_peaks.h"

#include <algorithm>
#include <cstdint>

#include "engine/cuda/base/cuda_handles.h"
#include "engine/cuda/base/cuda_status.h"
#include "engine/cuda/base/device_memory.h"
#include "engine/cuda/linear.h"

namespace pdserve::cuda {
namespace {

// Milliseconds `run` takes on `stream`, timed with events.
template <typename Fn>
absl::StatusOr<double> TimeOnStream(cudaStream_t stream, Fn run) {
  absl::StatusOr<UniqueEvent> start = NewEvent(cudaEventDefault);
  if (!start.ok()) return start.status();
  absl::StatusOr<UniqueEvent> stop = NewEvent(cudaEventDefault);
  if (!stop.ok()) return stop.status();
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), stream));
  if (absl::Status s = run(); !s.ok()) return s;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop->get(), stream));
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop->get()));
  float ms = 0;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start->get(), stop->get()));
  return static_cast<double>(ms);
}

absl::Status UseDevice(int device) {
  int count = 0;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError("no such CUDA device");
  }
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> DeviceMemoryBandwidth(int device) {
  if (absl::Status s = UseDevice(device); !s.ok()) return s;
  int clock_khz = 0, bus_bits = 0;
  PDSERVE_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device));
  PDSERVE_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  if (clock_khz <= 0 || bus_bits <= 0) {
    return absl::UnavailableError("the device reports no memory clock or bus width");
  }
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0);
}

absl::StatusOr<double> MeasureBf16GemmFlops(int device, absl::Duration budget) {
  if (absl::Status s = UseDevice(device); !s.ok()) return s;
  absl::StatusOr<UniqueStream> stream = NewNonBlockingStream();
  if (!stream.ok()) return stream.status();
  absl::StatusOr<UniqueCublas> cublas = NewCublas(stream->get());
  if (!cublas.ok()) return cublas.status();
  const double budget_ms = std::max(absl::ToDoubleMilliseconds(budget), 1.0);
  constexpr int kMaxN = 8192;
  int n = 256;
  DeviceAllocation buffers;
  double ms = 0;
  auto gemm = [&](int reps) {
    return [&, reps]() -> absl::Status {
      const size_t elems = size_t{1} * n * n;
      const auto* a = buffers.as<__nv_bfloat16>();
      const auto* b = buffers.as<__nv_bfloat16>(elems * 2);
      auto* c = buffers.as<__nv_bfloat16>(elems * 4);
      for (int i = 0; i < reps; ++i) {
        if (absl::Status s = Linear(cublas->get(), a, b, c, CUDA_R_16BF, n, n, n); !s.ok())
          return s;
      }
      return absl::OkStatus();
    };
  };
  while (true) {
    const size_t bytes = size_t{3} * n * n * sizeof(__nv_bfloat16);
    buffers.Reset();
    absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Create(bytes, "GEMM peak");
    if (!a.ok()) return a.status();
    buffers = *std::move(a);
    // Small non-zero values (bf16 0x3c3c, about 0.0115).
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffers.get(), 0x3c, bytes, stream->get()));
    if (absl::StatusOr<double> warm = TimeOnStream(stream->get(), gemm(1)); !warm.ok()) {
      return warm.status();
    }
    absl::StatusOr<double> once = TimeOnStream(stream->get(), gemm(1));
    if (!once.ok()) return once.status();
    ms = *once;
    if (ms >= budget_ms / 16 || n >= kMaxN) break;
    n *= 2;
  }
  const int reps = static_cast<int>(std::clamp(budget_ms / std::max(ms, 1e-3), 1.0, 1000.0));
  absl::StatusOr<double> total = TimeOnStream(stream->get(), gemm(reps));
  if (!total.ok()) return total.status();
  if (!(*total > 0)) return absl::InternalError("the GEMM measurement timed nothing");
  return 2.0 * n * n * double{1.0 * n} * reps / (*total * 1e-3);
}

absl::StatusOr<double> MeasureCopyBandwidth(int device, absl::Duration budget, size_t bytes) {
  if (absl::Status s = UseDevice(device); !s.ok()) return s;
  absl::StatusOr<UniqueStream> stream = NewNonBlockingStream();
  if (!stream.ok()) return stream.status();
  absl::StatusOr<DeviceAllocation> buffers = DeviceAllocation::Create(2 * bytes, "copy peak");
  if (!buffers.ok()) return buffers.status();
  void* src = buffers->get();
  void* dst = buffers->as<char>(bytes);
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src, 0, bytes, stream->get()));
  auto copies = [&](int reps) {
    return [&, reps]() -> absl::Status {
      for (int i = 0; i < reps; ++i) {
        PDSERVE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream->get()));
      }
      return absl::OkStatus();
    };
  };
  if (absl::StatusOr<double> warm = TimeOnStream(stream->get(), copies(1)); !warm.ok()) {
    return warm.status();
  }
  absl::StatusOr<double> once = TimeOnStream(stream->get(), copies(1));
  if (!once.ok()) return once.status();
  const double budget_ms = std::max(absl::ToDoubleMilliseconds(budget), 1.0);
  const int reps = static_cast<int>(std::clamp(budget_ms / std::max(*once, 1e-3), 1.0, 1000.0));
  absl::StatusOr<double> total = TimeOnStream(stream->get(), copies(reps));
  if (!total.ok()) return total.status();
  if (!(*total > 0)) return absl::InternalError("the copy measurement timed nothing");
  return 2.0 * static_cast<double>(bytes) * reps / (*total * 1e-3);
}

}  // namespace pdserve::cuda
