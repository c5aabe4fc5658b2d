// Paged KV-cache bookkeeping (see kv_cache_manager.h). The plain free list is
// a stack initialised so that block 0 is handed out first; with the same
// sequence of calls the same block ids come back, on any machine. Every
// operation that can fail checks first and mutates after, so a failed call
// changes nothing.
#include "engine/kvcache/kv_cache_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace pdserve::engine {

KvCacheManager::KvCacheManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  // Sizes come from validated options at start-up; bad ones are a bug.
  if (num_blocks < 0 || block_size <= 0) {
    std::fprintf(stderr, "KvCacheManager: bad sizes num_blocks=%d block_size=%d\n", num_blocks,
                 block_size);
    std::abort();
  }
  blocks_.resize(num_blocks_);
  free_.reserve(num_blocks_);
  for (int32_t b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);
}

double KvCacheManager::usage_ratio() const {
  if (num_blocks_ == 0) return 0.0;
  return static_cast<double>(num_used_blocks()) / num_blocks_;
}

int KvCacheManager::BlocksForTokens(int num_tokens) const {
  if (num_tokens <= 0) return 0;
  return static_cast<int>((int64_t{num_tokens} + block_size_ - 1) / block_size_);
}

bool KvCacheManager::CanAllocate(int num_tokens) const {
  return num_tokens >= 0 && BlocksForTokens(num_tokens) <= num_free_blocks();
}

int32_t KvCacheManager::TakeFree() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else {
    block = evictable_.front();
    evictable_.pop_front();
    cached_.erase(*blocks_[block].hash);
    blocks_[block].hash.reset();
  }
  blocks_[block].ref_count = 1;
  return block;
}

void KvCacheManager::Acquire(int32_t block) {
  Block& b = blocks_[block];
  if (b.ref_count == 0) evictable_.erase(b.evictable_pos);  // a cached block is never plain free
  ++b.ref_count;
}

void KvCacheManager::Release(int32_t block) {
  Block& b = blocks_[block];
  if (--b.ref_count > 0) return;
  if (b.hash.has_value()) {
    b.evictable_pos = evictable_.insert(evictable_.end(), block);
  } else {
    free_.push_back(block);
  }
}

absl::Status KvCacheManager::Allocate(SeqId seq, int num_tokens) {
  return AllocateCached(seq, {}, num_tokens).status();
}

absl::Status KvCacheManager::Reserve(SeqId seq, int num_tokens) {
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
  for (int i = 0; i < needed; ++i) table.push_back(TakeFree());
  return absl::OkStatus();
}

absl::Status KvCacheManager::Truncate(SeqId seq, int num_tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("Truncate: unknown sequence ", seq));
  }
  std::vector<int32_t>& table = it->second;
  const size_t keep = static_cast<size_t>(BlocksForTokens(std::max(num_tokens, 0)));
  while (table.size() > keep) {
    Release(table.back());
    table.pop_back();
  }
  return absl::OkStatus();
}

absl::Status KvCacheManager::Fork(SeqId src, SeqId dst) {
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
  for (int32_t block : it->second) Acquire(block);
  tables_.emplace(dst, it->second);  // node-based map: `it` stays valid
  return absl::OkStatus();
}

void KvCacheManager::Free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const std::vector<int32_t>& table = it->second;
  // Release in reverse: the sequence's first plain block is the next one
  // handed out, and its last cached blocks (the least shareable) are the
  // first evicted.
  for (auto b = table.rbegin(); b != table.rend(); ++b) Release(*b);
  tables_.erase(it);
}

bool KvCacheManager::Contains(SeqId seq) const { return tables_.contains(seq); }

int KvCacheManager::Capacity(SeqId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  return static_cast<int>(it->second.size()) * block_size_;
}

std::span<const int32_t> KvCacheManager::BlockTable(SeqId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second;
}

int KvCacheManager::NumCachedBlocks(std::span<const BlockHash> hashes) const {
  int n = 0;
  while (n < static_cast<int>(hashes.size()) && cached_.contains(hashes[n])) ++n;
  return n;
}

int KvCacheManager::FreeBlocksNeeded(std::span<const BlockHash> hashes, int num_tokens) const {
  const int total = BlocksForTokens(num_tokens);
  const int cached = std::min(NumCachedBlocks(hashes), total);
  int evictable_hits = 0;
  for (int i = 0; i < cached; ++i) {
    if (blocks_[cached_.at(hashes[i])].ref_count == 0) ++evictable_hits;
  }
  return total - cached + evictable_hits;
}

absl::StatusOr<int> KvCacheManager::AllocateCached(SeqId seq, std::span<const BlockHash> hashes,
                                                   int num_tokens) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate: num_tokens must be >= 0, got ", num_tokens));
  }
  if (tables_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrCat("Allocate: sequence ", seq, " already exists"));
  }
  const int total = BlocksForTokens(num_tokens);
  const int needed = FreeBlocksNeeded(hashes, num_tokens);
  if (needed > num_free_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: sequence ", seq, " needs ", needed, " blocks for ", num_tokens,
                     " tokens, ", num_free_blocks(), " of ", num_blocks_, " free"));
  }
  const int cached = std::min(NumCachedBlocks(hashes), total);
  std::vector<int32_t>& table = tables_[seq];
  table.reserve(total);
  // Cached blocks first, so that taking fresh ones cannot evict them.
  for (int i = 0; i < cached; ++i) {
    const int32_t block = cached_.at(hashes[i]);
    Acquire(block);
    table.push_back(block);
  }
  for (int i = cached; i < total; ++i) table.push_back(TakeFree());
  return cached;
}

absl::Status KvCacheManager::CommitBlockHashes(SeqId seq, std::span<const BlockHash> hashes) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("CommitBlockHashes: unknown sequence ", seq));
  }
  const std::vector<int32_t>& table = it->second;
  if (hashes.size() > table.size()) {
    return absl::InvalidArgumentError(absl::StrCat("CommitBlockHashes: ", hashes.size(),
                                                   " hashes for ", table.size(), " blocks"));
  }
  for (size_t i = 0; i < hashes.size(); ++i) {
    Block& b = blocks_[table[i]];
    if (b.hash.has_value()) continue;           // cached already (shared, or committed before)
    if (cached_.contains(hashes[i])) continue;  // another block holds this content
    b.hash = hashes[i];
    b.position = static_cast<int32_t>(i);
    cached_.emplace(hashes[i], table[i]);
  }
  return absl::OkStatus();
}

std::vector<uint64_t> KvCacheManager::CachedHashDigest(int max_hashes) const {
  std::vector<uint64_t> out;
  auto add = [&](int32_t block) {
    const Block& b = blocks_[block];
    if (static_cast<int>(out.size()) < max_hashes && IsDigestPosition(b.position)) {
      out.push_back(b.hash->digest());
    }
  };
  for (const auto& [hash, block] : cached_) {
    if (blocks_[block].ref_count > 0) add(block);
  }
  for (auto it = evictable_.rbegin(); it != evictable_.rend(); ++it) add(*it);
  return out;
}

}  // namespace pdserve::engine
