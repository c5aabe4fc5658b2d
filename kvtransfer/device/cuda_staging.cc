// Host staging of device KV regions; see cuda_staging.h.
#include "kvtransfer/device/cuda_staging.h"

#include "absl/strings/str_cat.h"
#include "engine/cuda/base/cuda_status.h"
#include "kvtransfer/device/kv_copy.cuh"

namespace pdserve::kvtransfer::device {
namespace {

KvRows Paged(const engine::KvRegion& region, std::span<const int32_t> block_table, int begin) {
  return {.k = region.k_base,
          .v = region.v_base,
          .block_stride = region.block_stride_bytes,
          .block_size = region.block_size,
          .blocks = block_table,
          .first_token = begin};
}

KvRows Contiguous(std::byte* buffer, int count, int64_t row_bytes) {
  return {.k = buffer, .v = buffer + int64_t{count} * row_bytes};
}

absl::Status CheckSize(const engine::KvRegion& region, int count, size_t bytes) {
  if (count <= 0 || bytes != 2 * static_cast<size_t>(region.token_bytes()) * count) {
    return absl::InvalidArgumentError(absl::StrCat("staging ", count, " tokens needs ",
                                                   2 * region.token_bytes() * count,
                                                   " bytes, buffer has ", bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<CudaKvStaging>> CudaKvStaging::Create() {
  cudaStream_t stream = nullptr;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::shared_ptr<CudaKvStaging>(new CudaKvStaging(stream));
}

CudaKvStaging::~CudaKvStaging() {
  if (buffer_ != nullptr) cudaFree(buffer_);
  cudaStreamDestroy(stream_);
}

absl::StatusOr<std::byte*> CudaKvStaging::Buffer(size_t bytes) {
  if (bytes > capacity_) {
    if (buffer_ != nullptr) PDSERVE_CUDA_RETURN_IF_ERROR(cudaFree(buffer_));
    buffer_ = nullptr;
    capacity_ = 0;
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer_, bytes));
    capacity_ = bytes;
  }
  return buffer_;
}

absl::Status CudaKvStaging::ToHost(const engine::KvRegion& region,
                                   std::span<const int32_t> block_table, int begin, int count,
                                   std::span<std::byte> out) {
  if (absl::Status s = CheckSize(region, count, out.size()); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  absl::StatusOr<std::byte*> buffer = Buffer(out.size());
  if (!buffer.ok()) return buffer.status();
  PDSERVE_CUDA_RETURN_IF_ERROR(CopyKvRows(Paged(region, block_table, begin),
                                          Contiguous(*buffer, count, region.token_bytes()), count,
                                          region.token_bytes(), stream_));
  PDSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), *buffer, out.size(), cudaMemcpyDeviceToHost, stream_));
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaKvStaging::FromHost(const engine::KvRegion& region,
                                     std::span<const int32_t> block_table, int begin, int count,
                                     std::span<const std::byte> in) {
  if (absl::Status s = CheckSize(region, count, in.size()); !s.ok()) return s;
  absl::MutexLock l(&mu_);
  absl::StatusOr<std::byte*> buffer = Buffer(in.size());
  if (!buffer.ok()) return buffer.status();
  PDSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(*buffer, in.data(), in.size(), cudaMemcpyHostToDevice, stream_));
  PDSERVE_CUDA_RETURN_IF_ERROR(CopyKvRows(Contiguous(*buffer, count, region.token_bytes()),
                                          Paged(region, block_table, begin), count,
                                          region.token_bytes(), stream_));
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace pdserve::kvtransfer::device
