// KV cache manager: paged-KV bookkeeping shared by every role. Block ids,
// reference counts, per-sequence block tables, and the metadata a prefix
// cache needs: the chained content hash of each full block (block_hash.h)
// and an
// evictable list of free blocks that still hold known content. No tensors and
// no I/O: the ModelRunner owns KV memory (engine/runtime/model_runner.h).
//
// Free blocks come in two kinds. Plain free blocks (no known content) are
// handed out first, lowest id first on a fresh manager. Evictable blocks are
// free (reference count 0) but remember the hash of the tokens they hold;
// they count as free and are reused least recently freed first, losing their
// hash. A hashed block can be shared by several sequences (reference count
// > 1) and is read-only for all of them.
//
// Not thread-safe: one owner (an engine thread, under its lock) calls it.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kvcache/block_hash.h"

namespace pdserve::engine {

using SeqId = uint64_t;

// Chain positions (0-based block index within a sequence) whose hashes a
// digest carries: the first four, then every eighth. A digest hit at
// position i says at least i + 1 blocks are cached; the estimate is short by
// at most seven blocks, and a digest is about an eighth of the cache.
constexpr bool IsDigestPosition(int block_index) {
  return block_index < 4 || (block_index + 1) % 8 == 0;
}
// The most hashes a digest holds (8 KiB on the wire).
inline constexpr int kMaxDigestHashes = 1024;

class KvCacheManager {
 public:
  // Sizes come from validated options; num_blocks >= 0, block_size >= 1.
  KvCacheManager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  // Plain free plus evictable blocks: what an allocation can take.
  int num_free_blocks() const { return static_cast<int>(free_.size() + evictable_.size()); }
  int num_evictable_blocks() const { return static_cast<int>(evictable_.size()); }
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
  // Rolls `seq` back to the blocks that hold its first `num_tokens` tokens
  // (speculative decoding: the KV of rejected proposals). Blocks past them
  // go back to the pool, last first; a block keeps a hash only if one was
  // committed for it (its content stays valid), so the prefix cache never
  // names the rejected tokens. NOT_FOUND for an unknown sequence.
  absl::Status Truncate(SeqId seq, int num_tokens);
  // Makes `dst` share all blocks of `src` (reference counts go up).
  absl::Status Fork(SeqId src, SeqId dst);
  // Drops `seq`'s references; a block whose count reaches zero is free again
  // (evictable if it holds hashed content). Freeing an unknown sequence is a
  // no-op.
  void Free(SeqId seq);
  bool Contains(SeqId seq) const;
  // Tokens `seq` has room for (blocks * block_size); 0 if unknown.
  int Capacity(SeqId seq) const;
  // Empty if unknown. Valid until the next call that changes `seq`.
  std::span<const int32_t> BlockTable(SeqId seq) const;
  int RefCount(int32_t block) const { return blocks_[block].ref_count; }
  size_t num_sequences() const { return tables_.size(); }

  // ---- content hashes (prefix caching) ----

  // Leading entries of `hashes` whose blocks are cached (in use or evictable).
  int NumCachedBlocks(std::span<const BlockHash> hashes) const;
  // Blocks a new sequence of `num_tokens` tokens whose leading full blocks
  // have `hashes` would take from the free pool: fresh blocks for the
  // uncached part plus cached blocks that are currently evictable.
  int FreeBlocksNeeded(std::span<const BlockHash> hashes, int num_tokens) const;
  // Creates `seq` like Allocate, sharing the cached blocks of the leading
  // hashes. Returns how many leading blocks were cached (their tokens need no
  // computation). RESOURCE_EXHAUSTED, changing nothing, if blocks run out.
  absl::StatusOr<int> AllocateCached(SeqId seq, std::span<const BlockHash> hashes, int num_tokens);
  // Records that the first hashes.size() blocks of `seq` hold the content of
  // `hashes` (they are full and computed). A hash already held by another
  // block keeps that block; this sequence's copy stays unhashed.
  absl::Status CommitBlockHashes(SeqId seq, std::span<const BlockHash> hashes);
  // Routing digests (BlockHash::digest) of cached blocks (in use or
  // evictable) at digest positions, at most `max_hashes`: blocks in use
  // first, then evictable ones, most recently freed first.
  std::vector<uint64_t> CachedHashDigest(int max_hashes = kMaxDigestHashes) const;

 private:
  struct Block {
    int32_t ref_count = 0;
    std::optional<BlockHash> hash;
    int32_t position = 0;                        // block index within the chain of `hash`
    std::list<int32_t>::iterator evictable_pos;  // valid while evictable
  };
  // Takes one block from the free pool: plain first, else the least
  // recently freed evictable one (its hash forgotten). Pool must not be empty.
  int32_t TakeFree();
  // Takes `block`, cached with content, for one more user.
  void Acquire(int32_t block);
  void Release(int32_t block);

  int num_blocks_;
  int block_size_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;     // stack of plain free block ids
  std::list<int32_t> evictable_;  // free hashed blocks, least recently freed first
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;  // hash -> block holding it
  std::unordered_map<SeqId, std::vector<int32_t>> tables_;
};

}  // namespace pdserve::engine
