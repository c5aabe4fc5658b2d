// Speculative decoding's metrics (engine/spec), for any process that decodes
// with it: tokens proposed and accepted, and per verification how many
// proposals stood. Registered once on the process's registry.
#pragma once

#include <span>

#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve {

struct SpecDecodeMetrics {
  explicit SpecDecodeMetrics(prometheus::Registry& registry);

  // One step: the tokens it verified, and per verification the proposals
  // that stood.
  void Record(int proposed, std::span<const int> accepted_lengths);

  prometheus::Counter& proposed_tokens;      // pdserve_spec_decode_proposed_tokens_total
  prometheus::Counter& accepted_tokens;      // pdserve_spec_decode_accepted_tokens_total
  prometheus::Counter& verifications;        // pdserve_spec_decode_verifications_total
  prometheus::Histogram& acceptance_length;  // pdserve_spec_decode_acceptance_length
};

}  // namespace pdserve
