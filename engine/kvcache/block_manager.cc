// Paged KV-cache bookkeeping (see block_manager.h). The free list is a stack
// initialised so that block 0 is handed out first; with the same sequence of
// calls the same block ids come back, on any machine. Every operation that can
// fail checks first and mutates after, so a failed call changes nothing.
#include "engine/kvcache/block_manager.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace pdserve::engine {

BlockManager::BlockManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  // Sizes come from validated options at start-up; bad ones are a bug.
  if (num_blocks < 0 || block_size <= 0) {
    std::fprintf(stderr, "BlockManager: bad sizes num_blocks=%d block_size=%d\n", num_blocks,
                 block_size);
    std::abort();
  }
  ref_counts_.assign(num_blocks_, 0);
  free_.reserve(num_blocks_);
  for (int32_t b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);
}

double BlockManager::usage_ratio() const {
  if (num_blocks_ == 0) return 0.0;
  return static_cast<double>(num_used_blocks()) / num_blocks_;
}

int BlockManager::BlocksForTokens(int num_tokens) const {
  if (num_tokens <= 0) return 0;
  return static_cast<int>((int64_t{num_tokens} + block_size_ - 1) / block_size_);
}

bool BlockManager::CanAllocate(int num_tokens) const {
  return num_tokens >= 0 && BlocksForTokens(num_tokens) <= num_free_blocks();
}

absl::Status BlockManager::Allocate(SeqId seq, int num_tokens) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate: num_tokens must be >= 0, got ", num_tokens));
  }
  if (tables_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrCat("Allocate: sequence ", seq, " already exists"));
  }
  const int needed = BlocksForTokens(num_tokens);
  if (needed > num_free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: sequence ", seq, " needs ", needed, " blocks for ", num_tokens,
                     " tokens, ", num_free_blocks(), " of ", num_blocks_, " free"));
  }
  std::vector<int32_t>& table = tables_[seq];
  table.reserve(needed);
  for (int i = 0; i < needed; ++i) {
    const int32_t block = free_.back();
    free_.pop_back();
    ref_counts_[block] = 1;
    table.push_back(block);
  }
  return absl::OkStatus();
}

absl::Status BlockManager::Reserve(SeqId seq, int num_tokens) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Reserve: num_tokens must be >= 0, got ", num_tokens));
  }
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("Reserve: unknown sequence ", seq));
  }
  std::vector<int32_t>& table = it->second;
  const int have = static_cast<int>(table.size());
  const int needed = BlocksForTokens(num_tokens) - have;
  if (needed <= 0) return absl::OkStatus();
  if (needed > num_free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: sequence ", seq, " needs ", needed, " more blocks for ",
                     num_tokens, " tokens, ", num_free_blocks(), " of ", num_blocks_, " free"));
  }
  for (int i = 0; i < needed; ++i) {
    const int32_t block = free_.back();
    free_.pop_back();
    ref_counts_[block] = 1;
    table.push_back(block);
  }
  return absl::OkStatus();
}

absl::Status BlockManager::Fork(SeqId src, SeqId dst) {
  auto it = tables_.find(src);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("Fork: unknown source sequence ", src));
  }
  if (tables_.contains(dst)) {
    return absl::AlreadyExistsError(absl::StrCat("Fork: sequence ", dst, " already exists"));
  }
  // Shared blocks are read-only for both: a caller that will write into a
  // partly filled shared last block must copy it first (copy-on-write is the
  // scheduler's job; this class only counts references).
  for (int32_t block : it->second) ++ref_counts_[block];
  tables_.emplace(dst, it->second);  // node-based map: `it` stays valid
  return absl::OkStatus();
}

void BlockManager::Free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const std::vector<int32_t>& table = it->second;
  // Push in reverse so the sequence's first block is the next one handed out.
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    if (--ref_counts_[*b] == 0) free_.push_back(*b);
  }
  tables_.erase(it);
}

bool BlockManager::Contains(SeqId seq) const { return tables_.contains(seq); }

int BlockManager::Capacity(SeqId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  return static_cast<int>(it->second.size()) * block_size_;
}

std::span<const int32_t> BlockManager::BlockTable(SeqId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second;
}

}  // namespace pdserve::engine
