// The load generator's workload: when each request is sent and how long its
// prompt and output are. Planned up front from a seed, so two systems can be
// measured under exactly the same requests. Pure: no clock, no I/O.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::loadgen {

// A length distribution over tokens, written as
//   "fixed:N"                 always N
//   "uniform:LO:HI"           uniform integer in [LO, HI]
//   "normal:MEAN:STD[:LO:HI]" rounded normal, clamped to [LO, HI]
//                             (default [1, MEAN + 4 STD])
//   "exponential:MEAN[:LO:HI]" rounded exponential (a long tail, like
//                             lengths that end at a stop token), clamped to
//                             [LO, HI] (default [1, 10 MEAN])
struct LengthDistribution {
  enum class Kind { kFixed, kUniform, kNormal, kExponential };
  Kind kind = Kind::kFixed;
  double a = 1;  // fixed value, uniform low, normal mean
  double b = 0;  // uniform high, normal standard deviation
  int lo = 1;    // clamp (normal)
  int hi = 1;

  static absl::StatusOr<LengthDistribution> Parse(const std::string& spec);
  int Sample(std::mt19937_64& rng) const;
  int max() const;  // the largest value Sample can return
  std::string ToString() const;
};

enum class Arrival {
  kPoisson,  // exponential gaps with mean 1 / rate
  kFixed,    // gaps of exactly 1 / rate
  kBurst,    // every request at time 0 (closed loop: the concurrency cap paces)
};
absl::StatusOr<Arrival> ParseArrival(const std::string& name);
const char* ArrivalName(Arrival arrival);

struct WorkloadOptions {
  Arrival arrival = Arrival::kPoisson;
  double rate = 1.0;           // requests per second (ignored for kBurst)
  double duration_s = 60;      // requests are sent during [0, duration_s)
  int max_requests = 0;        // 0: no cap; kBurst needs a cap
  LengthDistribution prompt_len;
  LengthDistribution output_len;
  int vocab_size = 256;        // prompt token ids are drawn from [1, vocab_size)
  uint64_t seed = 1;
  // Shared prefixes (system prompts): with shared_prefix_len > 0 every
  // prompt is one of num_shared_prefixes fixed prefixes of that many tokens,
  // picked uniformly, followed by prompt_len tokens of its own.
  int shared_prefix_len = 0;
  int num_shared_prefixes = 1;
};

struct PlannedRequest {
  int index = 0;
  double send_at_s = 0;        // offset from the start of the run
  std::vector<int32_t> prompt;
  int output_len = 1;          // max_tokens (the run sets ignore_eos)
  int prefix_index = -1;       // which shared prefix it starts with; -1: none
};

// INVALID_ARGUMENT for a non-positive rate or duration, kBurst without
// max_requests, or a negative shared prefix (or fewer than one of them).
absl::StatusOr<std::vector<PlannedRequest>> PlanWorkload(const WorkloadOptions& options);

}  // namespace pdserve::loadgen
