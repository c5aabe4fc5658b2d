#include "common/spec_decode_metrics.h"

#include "common/metrics_server.h"

namespace pdserve {

SpecDecodeMetrics::SpecDecodeMetrics(prometheus::Registry& r)
    : proposed_tokens(MakeCounter(r, "pdserve_spec_decode_proposed_tokens_total",
                                  "Proposed tokens verified by speculative decoding")),
      accepted_tokens(MakeCounter(r, "pdserve_spec_decode_accepted_tokens_total",
                                  "Proposed tokens that verification kept")),
      verifications(MakeCounter(r, "pdserve_spec_decode_verifications_total",
                                "Sequence steps that verified proposals")),
      acceptance_length(MakeHistogram(
          r, "pdserve_spec_decode_acceptance_length",
          "Per verification: proposed tokens kept (each verification also yields one token "
          "of its own)",
          prometheus::Histogram::BucketBoundaries{0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16})) {}

void SpecDecodeMetrics::Record(int proposed, std::span<const int> accepted_lengths) {
  if (accepted_lengths.empty()) return;
  proposed_tokens.Increment(proposed);
  verifications.Increment(static_cast<double>(accepted_lengths.size()));
  for (int n : accepted_lengths) {
    accepted_tokens.Increment(n);
    acceptance_length.Observe(n);
  }
}

}  // namespace pdserve
