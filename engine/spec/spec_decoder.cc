// Speculative decoding around the scheduler's steps: see spec_decoder.h.
#include "engine/spec/spec_decoder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pdserve::engine::spec {

std::string_view SpecMethodName(SpecMethod method) {
  switch (method) {
    case SpecMethod::kOff:
      return "off";
    case SpecMethod::kNgram:
      return "ngram";
    case SpecMethod::kDraft:
      return "draft";
  }
  return "unknown";
}

absl::StatusOr<SpecMethod> ParseSpecMethod(std::string_view name) {
  for (SpecMethod m : {SpecMethod::kOff, SpecMethod::kNgram, SpecMethod::kDraft}) {
    if (name == SpecMethodName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("speculative method \"", std::string(name), "\": expected off, ngram or draft"));
}

PricedK BestPricedK(double alpha, int max_k, double row_cost, double proposal_cost) {
  PricedK best;
  double expected = 1.0;  // tokens a verification of k proposals yields
  double power = 1.0;     // alpha^k
  for (int k = 1; k <= max_k; ++k) {
    power *= alpha;
    expected += power;
    const double speedup = expected / (1.0 + (row_cost + proposal_cost) * k);
    if (speedup > best.speedup) best = {.k = k, .speedup = speedup};
  }
  return best;
}

SpecDecoder::SpecDecoder(SpecOptions options, std::unique_ptr<Proposer> proposer)
    : options_(options), proposer_(std::move(proposer)) {}

SpecDecoder::SeqState& SpecDecoder::StateOf(SeqId id) {
  auto [it, inserted] = states_.try_emplace(id);
  if (inserted) {
    it->second.k = options_.num_speculative_tokens;
    it->second.next_cooldown = options_.min_cooldown_steps;
  }
  return it->second;
}

int SpecDecoder::NextK(SeqId id) const {
  auto it = states_.find(id);
  if (it == states_.end()) return options_.num_speculative_tokens;
  return it->second.cooldown_left > 0 ? 0 : it->second.k;
}

absl::Status SpecDecoder::ProposeFor(Scheduler& scheduler) {
  // Sequences freed outside a step (cancelled between steps) left no update.
  std::erase_if(states_, [&](const auto& entry) {
    if (scheduler.Find(entry.first) != nullptr) return false;
    proposer_->Forget(entry.first);
    return true;
  });
  const int max_context = scheduler.config().max_position_embeddings;
  requests_.clear();
  const std::vector<SeqId> decoding = scheduler.DecodingSequences();
  if (options_.max_batch > 0 && static_cast<int>(decoding.size()) > options_.max_batch) {
    return absl::OkStatus();
  }
  for (SeqId id : decoding) {
    const Scheduler::Sequence& seq = *scheduler.Find(id);
    // Structured output: the verifier draws each row without the grammar's
    // mask, so a constrained sequence decodes one token a step.
    if (seq.sampling.constraint != nullptr) continue;
    SeqState& state = StateOf(id);
    if (state.cooldown_left > 0) {
      --state.cooldown_left;
      continue;
    }
    // A verification yields up to k + 1 tokens: never past max_tokens or
    // the context.
    const int num_tokens = static_cast<int>(seq.tokens.size());
    const int k = std::min(
        {state.k, seq.sampling.max_tokens - seq.num_generated() - 1, max_context - num_tokens});
    if (k <= 0) continue;
    if (options_.catch_up_cost > 0 && options_.proposal_cost > 0 && !state.verified &&
        !CatchUpPays(state, seq, proposer_->CatchUpTokens(id, seq.tokens))) {
      continue;
    }
    requests_.push_back({.id = id,
                         .tokens = seq.tokens,
                         .prompt_len = seq.prompt_len,
                         .sampling = &seq.sampling,
                         .max_tokens = k});
  }
  if (requests_.empty()) return absl::OkStatus();
  if (absl::Status s = proposer_->Propose(requests_, proposals_); !s.ok()) return s;
  for (size_t i = 0; i < requests_.size(); ++i) {
    Proposal& p = proposals_[i];
    if (p.tokens.empty()) continue;
    if (static_cast<int>(p.tokens.size()) > requests_[i].max_tokens) {
      return absl::InternalError(absl::StrCat(std::string(proposer_->name()), " proposed ",
                                              p.tokens.size(), " tokens, more than ",
                                              requests_[i].max_tokens));
    }
    if (absl::Status s =
            scheduler.SetProposal(requests_[i].id, std::move(p.tokens), std::move(p.probs));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

SpecStepStats SpecDecoder::Observe(std::span<const SequenceUpdate> updates) {
  SpecStepStats stats;
  for (const SequenceUpdate& u : updates) {
    if (u.freed) {
      states_.erase(u.id);
      proposer_->Forget(u.id);
    }
    if (u.num_proposed == 0) continue;
    ++stats.verifications;
    stats.proposed += u.num_proposed;
    stats.accepted += u.num_accepted;
    stats.accepted_lengths.push_back(u.num_accepted);
    if (u.freed) continue;
    SeqState& state = StateOf(u.id);
    state.verified = true;
    if (!options_.adaptive) continue;
    const double rate = static_cast<double>(u.num_accepted) / u.num_proposed;
    state.acceptance = (1 - options_.acceptance_smoothing) * state.acceptance +
                       options_.acceptance_smoothing * rate;
    if (u.num_accepted == u.num_proposed) {
      state.k = std::min(options_.num_speculative_tokens, state.k + 1);
    } else {
      state.k = std::max(1, u.num_accepted + 1);
    }
    const double s = options_.acceptance_smoothing;
    const int decided = u.num_accepted + (u.num_accepted < u.num_proposed ? 1 : 0);
    state.stood = (1 - s) * state.stood + s * u.num_accepted;
    state.decided = (1 - s) * state.decided + s * decided;
    bool priced_out = false;
    if (options_.proposal_cost > 0 || options_.price_rows) {
      const PricedK best = BestPricedK(state.stood / state.decided, options_.num_speculative_tokens,
                                       options_.row_cost, options_.proposal_cost);
      priced_out = best.speedup < options_.min_speedup;
      state.k = std::min(state.k, best.k);
    }
    if (priced_out && state.next_cooldown > options_.min_cooldown_steps) {
      // Priced out again after a probe: each probe costs the draft's
      // catch-up over the steps it skipped, so the sequence stops for the
      // longest cool-down at once.
      state.next_cooldown = options_.max_cooldown_steps;
      CoolDown(state);
    } else if (state.acceptance < options_.min_acceptance || priced_out) {
      CoolDown(state);
    } else if (state.acceptance >= 2 * options_.min_acceptance) {
      state.next_cooldown = options_.min_cooldown_steps;
    }
  }
  return stats;
}

bool SpecDecoder::CatchUpPays(const SeqState& state, const Scheduler::Sequence& seq,
                              int catch_up) const {
  if (catch_up <= 0) return true;
  // Every token left saves at most 1 - 1 / S plain steps at the priced
  // speed-up S of the sequence's acceptance so far.
  const double speedup = BestPricedK(state.stood / state.decided, options_.num_speculative_tokens,
                                     options_.row_cost, options_.proposal_cost)
                             .speedup;
  const int left = seq.sampling.max_tokens - seq.num_generated();
  return speedup > 1.0 && left * (1.0 - 1.0 / speedup) >= catch_up * options_.catch_up_cost;
}

void SpecDecoder::CoolDown(SeqState& state) const {
  state.cooldown_left = state.next_cooldown;
  state.next_cooldown = std::min(options_.max_cooldown_steps, 2 * state.next_cooldown);
  state.k = 1;
  state.acceptance = options_.min_acceptance;  // the probe starts at the line
}

}  // namespace pdserve::engine::spec
