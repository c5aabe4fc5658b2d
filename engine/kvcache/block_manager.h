// Paged KV-cache bookkeeping: block ids, reference counts and per-sequence
// block tables. No tensors and no I/O: the ModelRunner owns KV memory.
// Not thread-safe: one owner (an engine thread) calls it.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"

namespace pdserve::engine {

using SeqId = uint64_t;

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int num_free_blocks() const { return static_cast<int>(free_.size()); }
  int num_used_blocks() const { return num_blocks_ - num_free_blocks(); }
  // Used blocks / all blocks, in [0, 1].
  double usage_ratio() const;
  int BlocksForTokens(int num_tokens) const;
  bool CanAllocate(int num_tokens) const;

  // Creates `seq` with room for `num_tokens` tokens. ALREADY_EXISTS if the
  // sequence exists; RESOURCE_EXHAUSTED (nothing allocated) if blocks run out.
  absl::Status Allocate(SeqId seq, int num_tokens);
  // Grows `seq` so it holds at least `num_tokens` tokens.
  absl::Status Reserve(SeqId seq, int num_tokens);
  // Makes `dst` share all blocks of `src` (reference counts go up).
  absl::Status Fork(SeqId src, SeqId dst);
  // Drops `seq`'s references; blocks whose count reaches zero are free again.
  // Freeing an unknown sequence is a no-op.
  void Free(SeqId seq);
  bool Contains(SeqId seq) const;
  // Tokens `seq` has room for (blocks * block_size); 0 if unknown.
  int Capacity(SeqId seq) const;
  // Empty if unknown. Valid until the next call that changes `seq`.
  std::span<const int32_t> BlockTable(SeqId seq) const;
  int RefCount(int32_t block) const { return ref_counts_[block]; }
  size_t num_sequences() const { return tables_.size(); }

 private:
  int num_blocks_;
  int block_size_;
  std::vector<int32_t> free_;        // stack of free block ids
  std::vector<int32_t> ref_counts_;  // per block
  std::unordered_map<SeqId, std::vector<int32_t>> tables_;
};

}  // namespace pdserve::engine
