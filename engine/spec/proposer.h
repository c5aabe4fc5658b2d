// The proposer interface of speculative decoding: for each decoding
// sequence, up to k tokens that likely follow it, which one target step then
// verifies (engine/spec/rejection_sampler.h, engine/spec/spec_decoder.h).
// Implementations: prompt-lookup n-grams (ngram_proposer.h) and a smaller
// draft model (draft_proposer.h).
//
// Called from the engine thread only, between steps.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/types/sampling_params.h"

namespace pdserve::engine::spec {

struct ProposalRequest {
  SeqId id = 0;
  // The sequence's tokens: prompt, then generated; the last one is the
  // newest, not yet in the target's cache.
  std::span<const int32_t> tokens;
  int prompt_len = 0;
  const SamplingParams* sampling = nullptr;
  int max_tokens = 0;  // propose at most this many (>= 1)
};

struct Proposal {
  std::vector<int32_t> tokens;  // empty: no proposal
  // [tokens.size(), vocab]: the distribution each token was drawn from;
  // empty when the tokens are deterministic (one-hot).
  std::vector<float> probs;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // Sets out[i] (resized to requests.size()) for requests[i]. A failure
  // leaves every sequence without a proposal; decoding goes on.
  virtual absl::Status Propose(std::span<const ProposalRequest> requests,
                               std::vector<Proposal>& out) = 0;
  // The sequence is gone (finished, cancelled, preempted): drop its state.
  virtual void Forget(SeqId id) {}
  // Tokens of `tokens` (a sequence's, as in ProposalRequest) the proposer
  // must compute before it can propose for it: a draft model's catch-up
  // over what its cache does not hold. 0 for proposers that keep no state.
  virtual int CatchUpTokens(SeqId id, std::span<const int32_t> tokens) const { return 0; }
};

}  // namespace pdserve::engine::spec
