// Content hashes of full KV blocks, chained over a sequence: what the prefix
// cache (kv_cache_manager.h) keys blocks by, and what the router's
// prefix-aware routing compares with the workers' digests.
//
// A block's hash is SHA-256 over its parent's hash and its token ids,
// truncated to 128 bits, so equal hashes mean equal prefixes. Clients choose
// their prompts (token ids included), so the hash must resist collisions
// made on purpose: a collision would serve one prefix's KV for another
// prefix. At 128 bits a birthday search costs about 2^64 SHA-256 evaluations
// (out of reach); a targeted second preimage 2^128. FNV-1a, used before,
// could be collided in seconds. The decision and the measured cost:
// docs/decisions/scheduling.md ("Block hashes a client cannot collide on
// purpose"), docs/performance.md ("Prefix-cache block hashes").
//
// The routing digest (BlockHash::digest, 64 bits) travels in each worker's
// load report (WorkerLoad.cached_block_hashes, fixed64). It is only a hint:
// a digest collision sends a prompt to a worker that turns out not to hold
// the prefix, which then computes it; KV is shared only on a full match.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace pdserve::engine {

struct BlockHash {
  uint64_t hi = 0;  // bytes 0..7 of the SHA-256 digest, big-endian
  uint64_t lo = 0;  // bytes 8..15

  // The 64 bits a routing digest carries.
  uint64_t digest() const { return hi; }

  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

// For hash maps keyed by BlockHash: its bits are already uniform.
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo); }
};

// The parent of a sequence's first block.
inline constexpr BlockHash kNoParentHash{0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull};

// SHA-256(parent.hi, parent.lo as 8 big-endian bytes each, then each token
// id as 4 little-endian bytes), truncated to 128 bits.
BlockHash ChainBlockHash(const BlockHash& parent, std::span<const int32_t> block_tokens);

// The chained hashes of every full block of `tokens` (block_size >= 1).
std::vector<BlockHash> ChainBlockHashes(std::span<const int32_t> tokens, int block_size);

// Their routing digests: what the router compares with the workers' cached
// block digests (KvCacheManager::CachedHashDigest).
std::vector<uint64_t> BlockHashDigests(std::span<const int32_t> tokens, int block_size);

}  // namespace pdserve::engine
