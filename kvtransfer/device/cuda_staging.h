// KvDeviceStaging on the CUDA runtime: the TCP transport's path for device
// KV regions. A chunk's rows are gathered by the copy kernel into a device
// staging buffer and copied to host memory in one piece (and the reverse),
// on a stream of its own. One chunk at a time per object (a mutex), which is
// what a connection's writer or handler needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/cuda/base/cuda_compat.h"
#include "kvtransfer/device_staging.h"

namespace pdserve::kvtransfer::device {

class CudaKvStaging final : public KvDeviceStaging {
 public:
  // FAILED_PRECONDITION (via the CUDA error) where no device is usable.
  static absl::StatusOr<std::shared_ptr<CudaKvStaging>> Create();
  ~CudaKvStaging() override;

  absl::Status ToHost(const engine::KvRegion& region, std::span<const int32_t> block_table,
                      int begin, int count, std::span<std::byte> out) override;
  absl::Status FromHost(const engine::KvRegion& region, std::span<const int32_t> block_table,
                        int begin, int count, std::span<const std::byte> in) override;

 private:
  explicit CudaKvStaging(cudaStream_t stream) : stream_(stream) {}
  // A device buffer of at least `bytes`.
  absl::StatusOr<std::byte*> Buffer(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const cudaStream_t stream_;
  absl::Mutex mu_;
  std::byte* buffer_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t capacity_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pdserve::kvtransfer::device
