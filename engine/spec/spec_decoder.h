// Speculative decoding around the scheduler's steps: before each step a
// Proposer proposes up to k tokens for every decoding sequence
// (Scheduler::SetProposal); the step verifies them in one target pass, with
// the KV of rejected tokens rolled back (Scheduler::Complete); afterwards
// this class counts what was proposed and accepted and adapts each
// sequence's k.
//
// Large batches (max_batch) propose nothing: see SpecOptions.
//
// Back-off (per sequence, so a sequence's proposals depend only on its own
// history): k grows by one after a verification whose proposals all stood
// and falls to one more than the accepted count otherwise; when the
// acceptance rate (an exponential average over verifications) drops below
// min_acceptance, the sequence stops proposing for a cool-down of steps that
// doubles each time it happens again (up to max_cooldown_steps), then probes
// with k = 1. Verifying poor proposals costs compute a step at a large batch
// cannot spare; proposing nothing costs nothing.
//
// Proposals that cost work of their own (a draft model: proposal_cost > 0),
// and free ones whose verification rows are priced (price_rows: n-grams),
// are also priced (Leviathan et al. 2023, section 3.3, with the target's
// verification rows priced too): with a per-token acceptance alpha (an
// exponential average of tokens that stood over tokens decided), a
// verification of k proposals yields E(k) = (1 - alpha^(k+1)) / (1 - alpha)
// tokens for 1 + (row_cost + proposal_cost) * k plain target steps. k is
// capped at the k that maximises E(k) / cost(k), and when even that
// predicts less than min_speedup the sequence cools down as above; priced
// out again after its probe, it cools down for max_cooldown_steps at once
// (each probe costs the draft a catch-up over the steps it skipped). The
// first catch-up is priced too (catch_up_cost > 0): a sequence that has
// never verified, whose proposer must first compute its context (the
// draft's cache does not hold its prompt yet), proposes only if its tokens
// left, each saving at most 1 - 1/S plain steps at the priced speed-up S,
// repay that computing; otherwise it decodes plainly (at the tail of a
// batch, the last long sequence no longer pays for a draft to read its
// whole context for a few tokens). Later catch-ups (after a cool-down) are
// the probes' price, which the cool-downs above already bound. Every input is counted, none
// timed, so a seeded request proposes the same tokens in every run.
//
// Usage, on the engine thread under the engine's lock (the decode role:
// EnginePolicy::BeforePlan and its step's Apply, engine/core/engine_core.h):
//   decoder.ProposeFor(scheduler); step = scheduler.Schedule(); ... run ...
//   updates = scheduler.Complete(step, output); decoder.Observe(updates);
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/scheduler/scheduler.h"
#include "engine/spec/proposer.h"

namespace pdserve::engine::spec {

enum class SpecMethod { kOff, kNgram, kDraft };
std::string_view SpecMethodName(SpecMethod method);
// "off", "ngram", "draft"; INVALID_ARGUMENT otherwise.
absl::StatusOr<SpecMethod> ParseSpecMethod(std::string_view name);

struct SpecOptions {
  int num_speculative_tokens = 4;     // k at most, >= 1
  bool adaptive = true;               // the back-off above; false: always k
  double min_acceptance = 0.25;       // below it, the cool-down
  double acceptance_smoothing = 0.3;  // weight of the newest verification
  int min_cooldown_steps = 8;
  int max_cooldown_steps = 256;
  // No proposals in a step with more decoding sequences than this (0: no
  // limit): a large batch makes the step compute-bound, where verifying 1 + k
  // rows per sequence costs about 1 + k times the plain step however many
  // proposals stand.
  int max_batch = 0;
  // The pricing above; 0: not priced (proposals that cost nothing).
  double proposal_cost = 0.0;  // one proposed token, in plain target steps
  // One verification row beyond the first, likewise (the runner's
  // ModelRunner::VerificationRowCost() where the worker's flags build it).
  double row_cost = 0.2;
  double min_speedup = 1.1;  // predicted gain a priced verification must reach
  // One token a proposer must compute before it can propose for a sequence
  // (Proposer::CatchUpTokens: a draft's catch-up over a prompt or over the
  // steps of a cool-down), in plain target steps; 0: not priced. Priced, a
  // sequence proposes only while the tokens it has left (max_tokens less
  // those generated) could repay its catch-up at the priced speed-up.
  double catch_up_cost = 0.0;
  // Price verifications although the proposals cost nothing to make
  // (proposal_cost 0: n-grams): each row beyond the first still costs
  // row_cost, so k is capped and the sequence cools down as above.
  bool price_rows = false;
};

// The k in [1, max_k] that maximises the predicted speed-up of a priced
// verification at per-token acceptance `alpha` (see above), and that
// speed-up.
struct PricedK {
  int k = 1;
  double speedup = 0.0;
};
PricedK BestPricedK(double alpha, int max_k, double row_cost, double proposal_cost);

// What one step's verifications did.
struct SpecStepStats {
  int verifications = 0;              // sequences that verified proposals
  int proposed = 0;                   // tokens verified
  int accepted = 0;                   // of which stood
  std::vector<int> accepted_lengths;  // per verification: proposals that stood
};

class SpecDecoder {
 public:
  // `proposer` must not be null.
  SpecDecoder(SpecOptions options, std::unique_ptr<Proposer> proposer);

  // Proposes for Scheduler::DecodingSequences() and hands the proposals over.
  // A proposer failure is returned after leaving every sequence without one.
  absl::Status ProposeFor(Scheduler& scheduler);
  // Accounts a completed step's updates; forgets sequences that are gone.
  SpecStepStats Observe(std::span<const SequenceUpdate> updates);

  const Proposer& proposer() const { return *proposer_; }
  // k at most (SpecOptions::num_speculative_tokens).
  int num_speculative_tokens() const { return options_.num_speculative_tokens; }
  const SpecOptions& options() const { return options_; }
  // The k a sequence proposes next (0: cooling down); for tests.
  int NextK(SeqId id) const;

 private:
  struct SeqState {
    int k = 0;
    double acceptance = 1.0;
    int cooldown_left = 0;
    int next_cooldown = 0;
    // Exponential averages, per verification, of proposed tokens that stood
    // and of tokens decided (those plus the rejected one, if any): their
    // ratio is the per-token acceptance the pricing uses.
    double stood = 1.0;
    double decided = 1.0;
    bool verified = false;  // has verified proposals at least once
  };
  void CoolDown(SeqState& state) const;
  // Whether `seq`'s tokens left can repay `catch_up` tokens of the
  // proposer's own computing (SpecOptions::catch_up_cost).
  bool CatchUpPays(const SeqState& state, const Scheduler::Sequence& seq, int catch_up) const;
  SeqState& StateOf(SeqId id);

  const SpecOptions options_;
  const std::unique_ptr<Proposer> proposer_;
  std::unordered_map<SeqId, SeqState> states_;
  std::vector<ProposalRequest> requests_;  // scratch
  std::vector<Proposal> proposals_;        // scratch
};

}  // namespace pdserve::engine::spec
