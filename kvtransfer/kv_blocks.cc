// Token-row addressing in paged KV regions; see kv_blocks.h.
#include "kvtransfer/kv_blocks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pdserve::kvtransfer {

std::vector<KvRun> RunsOf(std::span<const int32_t> block_table, int block_size, int begin,
                          int count) {
  std::vector<KvRun> runs;
  for (int t = begin; t < begin + count;) {
    const int slot = t % block_size;
    const int n = std::min(block_size - slot, begin + count - t);
    runs.push_back(
        {.block = block_table[t / block_size], .slot = slot, .num_tokens = n, .offset = t - begin});
    t += n;
  }
  return runs;
}

absl::Status CheckBlockTable(const engine::KvRegion& region, std::span<const int32_t> block_table,
                             int end) {
  if (region.block_size <= 0) return absl::InvalidArgumentError("kv region has no blocks");
  const int64_t needed = (int64_t{end} + region.block_size - 1) / region.block_size;
  if (static_cast<int64_t>(block_table.size()) < needed) {
    return absl::InvalidArgumentError(absl::StrCat("block table of ", block_table.size(),
                                                   " blocks does not cover ", end,
                                                   " tokens (block size ", region.block_size, ")"));
  }
  for (int64_t i = 0; i < needed; ++i) {
    if (block_table[i] < 0 || block_table[i] >= region.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("block id ", block_table[i], " outside [0, ", region.num_blocks, ")"));
    }
  }
  return absl::OkStatus();
}

void AppendRowSpans(const engine::KvRegion& region, std::span<const int32_t> block_table, int begin,
                    int count, std::vector<std::span<std::byte>>* out) {
  const int64_t row = region.token_bytes();
  const std::vector<KvRun> runs = RunsOf(block_table, region.block_size, begin, count);
  for (std::byte* base : {region.k_base, region.v_base}) {
    for (const KvRun& r : runs) {
      std::byte* p = base + int64_t{r.block} * region.block_stride_bytes + r.slot * row;
      out->emplace_back(p, static_cast<size_t>(r.num_tokens * row));
    }
  }
}

std::span<const int32_t> BlocksCovering(std::span<const int32_t> block_table, int block_size,
                                        int begin, int count) {
  if (count <= 0) return {};
  const int first = begin / block_size;
  const int last = (begin + count - 1) / block_size;
  return block_table.subspan(first, last - first + 1);
}

}  // namespace pdserve::kvtransfer
