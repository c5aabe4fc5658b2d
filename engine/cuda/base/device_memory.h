// Owned CUDA allocations: device memory (cudaMalloc) and page-locked host
// memory (cudaMallocHost), freed on destruction, move-only. Allocation
// failures are statuses (RESOURCE_EXHAUSTED for out of memory), never an
// abort; a failed free at destruction is ignored (the device is lost then).
#pragma once

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/cuda/base/cuda_compat.h"

namespace pdserve::cuda {

template <bool kDevice>
class CudaAllocation {
 public:
  CudaAllocation() = default;
  CudaAllocation(CudaAllocation&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  CudaAllocation& operator=(CudaAllocation&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;
  ~CudaAllocation() { Reset(); }

  // `bytes` (> 0) of device or pinned host memory; `what` names it in the
  // error.
  static absl::StatusOr<CudaAllocation> Create(size_t bytes, absl::string_view what);

  void* get() const { return ptr_; }
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + byte_offset);
  }
  size_t size() const { return bytes_; }

  void Reset() {
    if (ptr_ != nullptr) {
      if constexpr (kDevice) {
        cudaFree(ptr_);
      } else {
        cudaFreeHost(ptr_);
      }
    }
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceAllocation = CudaAllocation<true>;
using PinnedAllocation = CudaAllocation<false>;

// Offsets of consecutive sub-buffers inside one allocation, each aligned to
// 256 bytes (what cudaMalloc guarantees).
class ArenaLayout {
 public:
  // Reserves `bytes` and returns the reservation's offset.
  size_t Take(size_t bytes) {
    const size_t at = end_;
    end_ = (end_ + bytes + kAlignment - 1) / kAlignment * kAlignment;
    return at;
  }
  size_t size() const { return end_; }

 private:
  static constexpr size_t kAlignment = 256;
  size_t end_ = 0;
};

}  // namespace pdserve::cuda
