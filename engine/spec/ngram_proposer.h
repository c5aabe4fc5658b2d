// Prompt-lookup decoding: proposes the tokens that followed the most recent
// earlier occurrence of the sequence's last n tokens (n from max_n down to
// min_n, the longest match first) in its own prompt and output. No model:
// it wins when the output copies its input (summaries, edits, code, quoted
// text) and proposes nothing otherwise.
#pragma once

#include "engine/spec/proposer.h"

namespace pdserve::engine::spec {

struct NgramOptions {
  int min_n = 2;
  int max_n = 4;
};

// The continuation (at most `max_tokens`) after the most recent earlier
// occurrence of tokens' last n tokens, for the largest n in [min_n, max_n]
// that has one; empty if none.
std::vector<int32_t> NgramLookup(std::span<const int32_t> tokens, int min_n, int max_n,
                                 int max_tokens);

class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(NgramOptions options) : options_(options) {}
  std::string_view name() const override { return "ngram"; }
  absl::Status Propose(std::span<const ProposalRequest> requests,
                       std::vector<Proposal>& out) override;

 private:
  const NgramOptions options_;
};

}  // namespace pdserve::engine::spec
