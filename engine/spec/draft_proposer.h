// Draft-model proposals: a smaller model of the target's vocabulary, run by
// the decode worker on its own ModelRunner and KV cache, proposes k tokens
// per sequence by decoding k steps ahead (batched over the sequences).
//
// Its KV is rebuilt on this worker from the tokens: on a sequence's first
// proposal the draft computes the prompt and output so far (one prompt-like
// step), and afterwards only what verification added. A prefill worker does
// not run the draft, and the transfer carries only the target's KV: moving a
// second cache would tie the two pools' configurations together for a
// prompt the draft computes in a fraction of the target's time.
//
// Rollback: the draft remembers which tokens its cache holds per sequence;
// the next proposal keeps the longest prefix they share with the sequence
// (the tokens verification kept) and overwrites the rest.
//
// Greedy requests get the draft's argmax (deterministic proposals). Sampled
// requests get tokens drawn from the draft's distribution under the
// request's own sampling parameters (on the draft stream of its seed), and
// that distribution with them, for rejection sampling
// (rejection_sampler.h). A sequence the draft cache has no room for, or
// past the draft's context, gets no proposal.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/runtime/model_runner.h"
#include "engine/spec/proposer.h"

namespace pdserve::engine::spec {

class DraftProposer final : public Proposer {
 public:
  // INVALID_ARGUMENT when the draft's vocabulary or special tokens differ
  // from the target's.
  static absl::StatusOr<std::unique_ptr<DraftProposer>> Create(std::unique_ptr<ModelRunner> draft,
                                                               const ModelConfig& target);

  std::string_view name() const override { return "draft"; }
  absl::Status Propose(std::span<const ProposalRequest> requests,
                       std::vector<Proposal>& out) override;
  void Forget(SeqId id) override;
  // The tokens after the longest prefix the draft cache shares with
  // `tokens`, less the newest (which every proposal computes).
  int CatchUpTokens(SeqId id, std::span<const int32_t> tokens) const override;

  const ModelRunner& draft() const { return *draft_; }
  // Sequences whose KV the draft cache holds; for tests.
  size_t num_sequences() const { return kv_.num_sequences(); }

 private:
  explicit DraftProposer(std::unique_ptr<ModelRunner> draft);

  // One sequence being drafted in this call.
  struct Drafting {
    size_t request = 0;            // index into the requests
    std::vector<int32_t> context;  // its tokens, then the drafted ones
    int num_cached = 0;            // tokens of `context` in the draft cache
    int max_tokens = 0;
  };
  // Tokens of `tokens` the draft cache holds for `id` (its longest common
  // prefix), at most all but the newest, which every proposal computes.
  int CachedTokens(SeqId id, std::span<const int32_t> tokens) const;
  // Draws the next draft token of `d` from `logits` (greedy or sampled)
  // into `proposal`.
  void Draw(const ProposalRequest& request, Drafting& d, std::span<const float> logits,
            Proposal& proposal);

  const std::unique_ptr<ModelRunner> draft_;
  KvCacheManager kv_;
  std::unordered_map<SeqId, std::vector<int32_t>> cached_;  // tokens in the draft cache
  std::vector<float> scratch_;
  std::vector<TokenProb> dist_;
};

}  // namespace pdserve::engine::spec
