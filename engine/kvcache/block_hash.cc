// Chained SHA-256 block hashes (see block_hash.h), on OpenSSL's libcrypto.
#include "engine/kvcache/block_hash.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace pdserve::engine {
namespace {

// SHA-256, fetched once; one digest context per thread, reused.
const EVP_MD* Sha256() {
  static const EVP_MD* md = [] {
    EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (fetched == nullptr) {
      std::fprintf(stderr, "block_hash: OpenSSL has no SHA-256\n");
      std::abort();  // libcrypto without its default provider: a broken install
    }
    return fetched;
  }();
  return md;
}

struct ContextDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

EVP_MD_CTX* ThreadContext() {
  thread_local std::unique_ptr<EVP_MD_CTX, ContextDeleter> ctx(EVP_MD_CTX_new());
  return ctx.get();
}

void PutBigEndian(uint64_t v, unsigned char* out) {
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<unsigned char>(v);
}

uint64_t GetBigEndian(const unsigned char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | in[i];
  return v;
}

}  // namespace

BlockHash ChainBlockHash(const BlockHash& parent, std::span<const int32_t> block_tokens) {
  // One update for the parent and up to 64 tokens at a time.
  unsigned char buf[16 + 4 * 64];
  PutBigEndian(parent.hi, buf);
  PutBigEndian(parent.lo, buf + 8);
  size_t used = 16;
  EVP_MD_CTX* ctx = ThreadContext();
  bool ok = ctx != nullptr && EVP_DigestInit_ex2(ctx, Sha256(), nullptr) == 1;
  for (int32_t token : block_tokens) {
    const auto t = static_cast<uint32_t>(token);
    buf[used] = static_cast<unsigned char>(t);
    buf[used + 1] = static_cast<unsigned char>(t >> 8);
    buf[used + 2] = static_cast<unsigned char>(t >> 16);
    buf[used + 3] = static_cast<unsigned char>(t >> 24);
    used += 4;
    if (used == sizeof buf) {
      ok = ok && EVP_DigestUpdate(ctx, buf, used) == 1;
      used = 0;
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  ok = ok && EVP_DigestUpdate(ctx, buf, used) == 1 && EVP_DigestFinal_ex(ctx, digest, &size) == 1;
  if (!ok || size < 16) {
    // Only an allocation failure inside OpenSSL gets here.
    std::fprintf(stderr, "block_hash: SHA-256 failed\n");
    std::abort();
  }
  return BlockHash{GetBigEndian(digest), GetBigEndian(digest + 8)};
}

std::vector<BlockHash> ChainBlockHashes(std::span<const int32_t> tokens, int block_size) {
  std::vector<BlockHash> out;
  if (block_size < 1) return out;
  out.reserve(tokens.size() / block_size);
  BlockHash parent = kNoParentHash;
  for (size_t at = 0; at + block_size <= tokens.size(); at += block_size) {
    parent = ChainBlockHash(parent, tokens.subspan(at, block_size));
    out.push_back(parent);
  }
  return out;
}

std::vector<uint64_t> BlockHashDigests(std::span<const int32_t> tokens, int block_size) {
  std::vector<uint64_t> out;
  for (const BlockHash& h : ChainBlockHashes(tokens, block_size)) out.push_back(h.digest());
  return out;
}

}  // namespace pdserve::engine
