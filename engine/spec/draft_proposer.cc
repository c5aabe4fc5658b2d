// Draft-model proposals: see draft_proposer.h.
#include "engine/spec/draft_proposer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/runtime/sampling_draw.h"
#include "engine/spec/rejection_sampler.h"

namespace pdserve::engine::spec {

absl::StatusOr<std::unique_ptr<DraftProposer>> DraftProposer::Create(
    std::unique_ptr<ModelRunner> draft, const ModelConfig& target) {
  const ModelConfig& c = draft->config();
  if (c.vocab_size != target.vocab_size || c.eos_token_ids != target.eos_token_ids ||
      c.bos_token_id != target.bos_token_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the draft model's vocabulary (", c.vocab_size, " tokens, BOS ", c.bos_token_id,
        ") or EOS ids differ from the target's (", target.vocab_size, " tokens, BOS ",
        target.bos_token_id, "): it must share the target's tokenizer"));
  }
  return std::unique_ptr<DraftProposer>(new DraftProposer(std::move(draft)));
}

DraftProposer::DraftProposer(std::unique_ptr<ModelRunner> draft)
    : draft_(std::move(draft)), kv_(draft_->num_kv_blocks(), draft_->kv_block_size()) {}

void DraftProposer::Forget(SeqId id) {
  kv_.Free(id);
  cached_.erase(id);
}

int DraftProposer::CachedTokens(SeqId id, std::span<const int32_t> tokens) const {
  auto it = cached_.find(id);
  if (it == cached_.end()) return 0;
  const int common = static_cast<int>(
      std::mismatch(it->second.begin(), it->second.end(), tokens.begin(), tokens.end()).first -
      it->second.begin());
  return std::min(common, std::max(0, static_cast<int>(tokens.size()) - 1));
}

int DraftProposer::CatchUpTokens(SeqId id, std::span<const int32_t> tokens) const {
  return std::max(0, static_cast<int>(tokens.size()) - 1 - CachedTokens(id, tokens));
}

void DraftProposer::Draw(const ProposalRequest& request, Drafting& d, std::span<const float> logits,
                         Proposal& proposal) {
  const SamplingParams& params = *request.sampling;
  const std::span<const int32_t> context(d.context);
  const TokenHistory history{.prompt = context.first(request.prompt_len),
                             .generated = context.subspan(request.prompt_len)};
  const int step = static_cast<int>(history.generated.size());
  std::span<const float> processed = logits;
  if (params.HasPenalties() || step < params.min_tokens) {
    scratch_.assign(logits.begin(), logits.end());
    ApplyLogitsProcessors(scratch_, params, history, draft_->config().eos_token_ids);
    processed = scratch_;
  }
  int32_t token;
  if (!(params.temperature > 0.0f)) {
    token = SampleToken(processed, params, step);  // the argmax
  } else {
    // x ~ q on the draft stream, and q itself for the verifier.
    SamplingDistribution(processed, params, dist_);
    const double u = UniformForStep(params.seed ^ kDraftStreamSalt, step);
    double cum = 0.0;
    token = dist_.back().token;
    for (const TokenProb& t : dist_) {
      cum += t.prob;
      if (u < cum) {
        token = t.token;
        break;
      }
    }
    const size_t vocab = logits.size();
    const size_t at = proposal.probs.size();
    proposal.probs.resize(at + vocab, 0.0f);
    for (const TokenProb& t : dist_) proposal.probs[at + t.token] = static_cast<float>(t.prob);
  }
  proposal.tokens.push_back(token);
  d.context.push_back(token);
}

absl::Status DraftProposer::Propose(std::span<const ProposalRequest> requests,
                                    std::vector<Proposal>& out) {
  out.assign(requests.size(), Proposal{});
  const int max_context = draft_->config().max_position_embeddings;
  std::vector<Drafting> drafting;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ProposalRequest& r = requests[i];
    const int len = static_cast<int>(r.tokens.size());
    // The draft computes up to the one before its last proposal.
    const int needed = len + r.max_tokens - 1;
    if (needed > max_context) continue;
    const int num_cached = CachedTokens(r.id, r.tokens);
    absl::Status room = kv_.Contains(r.id) ? kv_.Reserve(r.id, needed) : kv_.Allocate(r.id, needed);
    if (!room.ok()) {
      Forget(r.id);  // no room now: rebuilt when there is
      continue;
    }
    Drafting d{.request = i, .num_cached = num_cached, .max_tokens = r.max_tokens};
    d.context.assign(r.tokens.begin(), r.tokens.end());
    drafting.push_back(std::move(d));
  }

  // Step j computes each sequence's uncomputed tokens (the first: its
  // catch-up, then one drafted token) and draws its next proposal.
  for (int j = 0; !drafting.empty(); ++j) {
    StepBatch batch;
    batch.return_logits = true;
    static const SamplingParams kLogitsOnly{};
    for (Drafting& d : drafting) {
      batch.seqs.push_back({.tokens = std::span<const int32_t>(d.context).subspan(d.num_cached),
                            .num_cached = d.num_cached,
                            .block_table = kv_.BlockTable(requests[d.request].id),
                            .sampling = &kLogitsOnly});
    }
    absl::StatusOr<StepOutput> result = draft_->Step(std::move(batch));
    if (!result.ok()) {
      for (const Drafting& d : drafting) Forget(requests[d.request].id);
      out.assign(requests.size(), Proposal{});
      return absl::InternalError(absl::StrCat("draft step: ", result.status().message()));
    }
    const size_t vocab = static_cast<size_t>(draft_->config().vocab_size);
    std::vector<Drafting> next;
    for (size_t s = 0; s < drafting.size(); ++s) {
      Drafting& d = drafting[s];
      const ProposalRequest& r = requests[d.request];
      d.num_cached = static_cast<int>(d.context.size());
      Draw(r, d, std::span<const float>(result->logits).subspan(s * vocab, vocab), out[d.request]);
      if (static_cast<int>(out[d.request].tokens.size()) < d.max_tokens) {
        next.push_back(std::move(d));
      } else {
        // Its cache holds the context but the last proposal.
        d.context.pop_back();
        cached_[r.id] = std::move(d.context);
      }
    }
    drafting = std::move(next);
  }
  return absl::OkStatus();
}

}  // namespace pdserve::engine::spec
