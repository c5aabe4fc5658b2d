// pdserve_block_hash_bench: what a prefix-cache block hash costs per block,
// the chained SHA-256 of engine/kvcache/block_hash.h against the FNV-1a
// chain it replaced (kept here for the comparison only), for block sizes 16
// and 32. Each round hashes --blocks chained blocks of random token ids with
// each hash in turn (A/B alternated, so a busy machine slows both alike);
// reported: ns per block, the median and the fastest of --rounds rounds (on
// a shared machine the fastest is the better estimate of the cost itself).
//   pdserve_block_hash_bench [--blocks=20000] [--rounds=9]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/kvcache/block_hash.h"

ABSL_FLAG(int, blocks, 20000, "chained blocks hashed per round");
ABSL_FLAG(int, rounds, 9, "timed rounds per hash and block size");

namespace {

// The FNV-1a chain the prefix cache used before (64 bits, no collision
// resistance): the baseline.
uint64_t FnvChainBlockHash(uint64_t parent, std::span<const int32_t> block_tokens) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(parent);
  for (int32_t t : block_tokens) mix(static_cast<uint32_t>(t));
  h ^= h >> 31;
  h *= 0x7fb5d329728ea185ull;
  return h ^ (h >> 27);
}

// Seconds `fn` takes.
template <typename Fn>
double Time(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Fastest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int blocks = absl::GetFlag(FLAGS_blocks), rounds = absl::GetFlag(FLAGS_rounds);
  if (blocks < 1 || rounds < 1) {
    std::fprintf(stderr, "--blocks and --rounds must be >= 1\n");
    return 1;
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0, 151935);
  uint64_t sink = 0;
  std::printf("%-10s %21s %21s %8s\n", "block_size", "fnv1a_ns median/best",
              "sha256_ns median/best", "ratio");
  for (int block_size : {16, 32}) {
    std::vector<int32_t> tokens(static_cast<size_t>(blocks) * block_size);
    for (int32_t& t : tokens) t = token(rng);
    const std::span<const int32_t> all(tokens);
    std::vector<double> fnv, sha;
    for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
      const double a = Time([&] {
        uint64_t parent = 0x6a09e667f3bcc908ull;
        for (int b = 0; b < blocks; ++b) {
          parent = FnvChainBlockHash(parent, all.subspan(size_t{b} * block_size, block_size));
        }
        sink += parent;
      });
      const double s = Time([&] {
        pdserve::engine::BlockHash parent = pdserve::engine::kNoParentHash;
        for (int b = 0; b < blocks; ++b) {
          parent = pdserve::engine::ChainBlockHash(parent,
                                                   all.subspan(size_t{b} * block_size, block_size));
        }
        sink += parent.lo;
      });
      if (round > 0) {
        fnv.push_back(a / blocks * 1e9);
        sha.push_back(s / blocks * 1e9);
      }
    }
    const double f = Median(fnv), s = Median(sha);
    std::printf("%-10d %13.1f / %5.1f %13.1f / %5.1f %7.1fx\n", block_size, f, Fastest(fnv), s,
                Fastest(sha), s / f);
  }
  std::printf("(checksum %016llx)\n", static_cast<unsigned long long>(sink));
  return 0;
}
