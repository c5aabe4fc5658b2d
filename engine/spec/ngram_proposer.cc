// Prompt-lookup proposals: see ngram_proposer.h.
#include "engine/spec/ngram_proposer.h"

#include <algorithm>

namespace pdserve::engine::spec {

std::vector<int32_t> NgramLookup(std::span<const int32_t> tokens, int min_n, int max_n,
                                 int max_tokens) {
  const int len = static_cast<int>(tokens.size());
  min_n = std::max(min_n, 1);
  for (int n = std::min(max_n, len - 1); n >= min_n; --n) {
    const std::span<const int32_t> suffix = tokens.last(n);
    // The most recent earlier occurrence; it may overlap the suffix. Past
    // the end it reads the tokens it has proposed: the continuation repeats
    // with the match's period (len - n - start), so a loop is proposed whole.
    for (int start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      std::vector<int32_t> proposal;
      proposal.reserve(max_tokens);
      for (int i = 0; i < max_tokens; ++i) {
        const int at = start + n + i;
        proposal.push_back(at < len ? tokens[at] : proposal[at - len]);
      }
      return proposal;
    }
  }
  return {};
}

absl::Status NgramProposer::Propose(std::span<const ProposalRequest> requests,
                                    std::vector<Proposal>& out) {
  out.assign(requests.size(), Proposal{});
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].tokens =
        NgramLookup(requests[i].tokens, options_.min_n, options_.max_n, requests[i].max_tokens);
  }
  return absl::OkStatus();
}

}  // namespace pdserve::engine::spec
