// Device KV regions for the device transport tests: every layer's K and V in
// one cudaMalloc allocation (so IPC export needs offsets), filled with 0xff
// (the emulation's poison) at first, with a block allocator as HostKv's.
// Built against the emulation (gpu_emulated) and the CUDA runtime (gpu).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/cuda/base/cuda_compat.h"
#include "engine/runtime/model_runner.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_blocks.h"
#include "kvtransfer/transport.h"
#include "test_util.h"

namespace pdserve::kvtransfer::testing {

class DeviceKv : public BlockAllocator {
 public:
  DeviceKv(const TransferSpec& spec, int num_blocks, int block_size, uint32_t seed, int device = 0)
      : BlockAllocator(num_blocks, block_size, seed),
        token_bytes_(static_cast<int64_t>(spec.TokenBytes())) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    const int64_t stride = token_bytes_ * block_size;
    const int64_t per_side = stride * num_blocks;
    bytes_ = static_cast<size_t>(2 * per_side * spec.num_layers);
    EXPECT_EQ(cudaMalloc(&base_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemset(base_, 0xff, bytes_), cudaSuccess);
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      std::byte* k = base_ + 2 * per_side * layer;
      regions_.push_back({.layer = layer,
                          .memory = engine::MemoryKind::kDevice,
                          .device = device,
                          .k_base = k,
                          .v_base = k + per_side,
                          .block_stride_bytes = stride,
                          .num_blocks = num_blocks,
                          .block_size = block_size,
                          .num_kv_heads = spec.num_kv_heads,
                          .head_dim = spec.head_dim,
                          .dtype = DtypeOf(spec)});
    }
  }
  ~DeviceKv() { cudaFree(base_); }
  DeviceKv(const DeviceKv&) = delete;
  DeviceKv& operator=(const DeviceKv&) = delete;

  std::span<const engine::KvRegion> regions() const { return regions_; }

  // Copies `payload` (K rows then V rows of tokens [0, n)) into the blocks
  // on `stream` (async: the payload must outlive the copy); with a null
  // stream, synchronously.
  void WriteLayer(int layer, const std::vector<int32_t>& table, std::span<const std::byte> payload,
                  cudaStream_t stream = nullptr) {
    const int n = static_cast<int>(payload.size() / (2 * token_bytes_));
    std::vector<std::span<std::byte>> rows;
    AppendRowSpans(regions_[layer], table, 0, n, &rows);
    for (std::span<std::byte> r : rows) {
      if (stream == nullptr) {
        EXPECT_EQ(cudaMemcpy(r.data(), payload.data(), r.size(), cudaMemcpyHostToDevice),
                  cudaSuccess);
      } else {
        EXPECT_EQ(
            cudaMemcpyAsync(r.data(), payload.data(), r.size(), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
      }
      payload = payload.subspan(r.size());
    }
  }
  // K rows then V rows of tokens [0, n) of a layer, read back to the host.
  std::vector<std::byte> ReadLayer(int layer, const std::vector<int32_t>& table, int n) const {
    std::vector<std::span<std::byte>> rows;
    AppendRowSpans(regions_[layer], table, 0, n, &rows);
    std::vector<std::byte> out(2 * static_cast<size_t>(token_bytes_) * n);
    size_t at = 0;
    for (std::span<std::byte> r : rows) {
      EXPECT_EQ(cudaMemcpy(out.data() + at, r.data(), r.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      at += r.size();
    }
    return out;
  }

 private:
  const int64_t token_bytes_;
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<engine::KvRegion> regions_;
};
using DeviceSide = SideOf<DeviceKv>;

// The transfer shape of the tests whose peer runs in another process.
inline TransferSpec PeerShape() {
  TransferSpec s = SmallSpec(4, 24);
  s.dtype = "bf16";
  s.bytes_per_element = 2;
  return s;
}

}  // namespace pdserve::kvtransfer::testing
