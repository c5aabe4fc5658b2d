// Host staging of device KV regions, for transports that move bytes through
// host memory (TCP). Implemented by the device transport library
// (device/cuda_staging.h) with a gather/scatter kernel and one copy per
// chunk; transports without one refuse device regions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "engine/runtime/model_runner.h"

namespace pdserve::kvtransfer {

class KvDeviceStaging {
 public:
  virtual ~KvDeviceStaging() = default;
  // Copies the K rows, then the V rows, of tokens [begin, begin + count) of
  // a sequence (blocks `block_table`, from token 0) out of a device region
  // into `out` (2 * count * region.token_bytes() bytes). Returns once the
  // bytes are in `out`. Thread-safe.
  virtual absl::Status ToHost(const engine::KvRegion& region, std::span<const int32_t> block_table,
                              int begin, int count, std::span<std::byte> out) = 0;
  // The reverse: `in` (K rows then V rows) into the sequence's blocks.
  // Returns once the rows are in device memory.
  virtual absl::Status FromHost(const engine::KvRegion& region,
                                std::span<const int32_t> block_table, int begin, int count,
                                std::span<const std::byte> in) = 0;
};

}  // namespace pdserve::kvtransfer
