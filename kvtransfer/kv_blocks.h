// Addressing token rows in a paged KV region (engine::KvRegion), shared by
// every transport: token t of a sequence lives in block
// block_table[t / block_size], slot t % block_size, and a run of consecutive
// tokens inside one block is one contiguous span of rows. The wire and
// staging layout of a chunk is K[n, H, D] then V[n, H, D].
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/runtime/model_runner.h"

namespace pdserve::kvtransfer {

// Consecutive tokens inside one block: slots [slot, slot + num_tokens) of
// block `block`; `offset` is the first token's index within the range.
struct KvRun {
  int32_t block = 0;
  int slot = 0;
  int num_tokens = 0;
  int offset = 0;
};

// The runs covering tokens [begin, begin + count) of a sequence whose blocks
// (from token 0, `block_size` tokens each) are `block_table`. The table
// must cover the range (CheckBlockTable).
std::vector<KvRun> RunsOf(std::span<const int32_t> block_table, int block_size, int begin,
                          int count);

// INVALID_ARGUMENT unless `block_table` covers tokens [0, end) and every
// block id it uses lies in [0, region.num_blocks).
absl::Status CheckBlockTable(const engine::KvRegion& region, std::span<const int32_t> block_table,
                             int end);

// Host regions: the spans of K rows, then of V rows, of tokens
// [begin, begin + count), in token order (an iovec list in the wire layout).
void AppendRowSpans(const engine::KvRegion& region, std::span<const int32_t> block_table, int begin,
                    int count, std::vector<std::span<std::byte>>* out);

// The blocks of `block_table` covering tokens [begin, begin + count).
std::span<const int32_t> BlocksCovering(std::span<const int32_t> block_table, int block_size,
                                        int begin, int count);

}  // namespace pdserve::kvtransfer
