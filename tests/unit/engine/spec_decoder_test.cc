// SpecDecoder: each sequence's k follows its acceptance (grows after a full
// acceptance, falls to one past the accepted count), low acceptance stops
// its proposals for a cool-down that doubles when it happens again and
// resets once acceptance recovers; priced proposals (a draft's) are capped
// at the k whose predicted speed-up peaks and cool down when none pays, and
// a first catch-up must be repaid by the tokens left;
// proposals never run past max_tokens; a proposer that proposes too much is
// refused.
#include "engine/spec/spec_decoder.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::engine::spec {
namespace {

// Proposes `max_tokens` copies of token 1 and records the requests.
class FixedProposer final : public Proposer {
 public:
  std::string_view name() const override { return "fixed"; }
  absl::Status Propose(std::span<const ProposalRequest> requests,
                       std::vector<Proposal>& out) override {
    out.assign(requests.size(), Proposal{});
    for (size_t i = 0; i < requests.size(); ++i) {
      seen.push_back(requests[i].max_tokens);
      out[i].tokens.assign(requests[i].max_tokens + extra, 1);
    }
    return absl::OkStatus();
  }
  void Forget(SeqId id) override { forgotten.push_back(id); }
  int CatchUpTokens(SeqId, std::span<const int32_t>) const override { return catch_up; }
  std::vector<int> seen;
  std::vector<SeqId> forgotten;
  int extra = 0;
  int catch_up = 0;  // what CatchUpTokens says of every sequence
};

SequenceUpdate Verified(SeqId id, int proposed, int accepted) {
  return {.id = id, .num_proposed = proposed, .num_accepted = accepted};
}

TEST(SpecDecoderTest, KFollowsAcceptance) {
  SpecDecoder d({.num_speculative_tokens = 5}, std::make_unique<FixedProposer>());
  EXPECT_EQ(d.NextK(1), 5);
  std::vector<SequenceUpdate> u = {Verified(1, 5, 2)};
  SpecStepStats stats = d.Observe(u);
  EXPECT_EQ(stats.proposed, 5);
  EXPECT_EQ(stats.accepted, 2);
  EXPECT_EQ(stats.accepted_lengths, std::vector<int>{2});
  EXPECT_EQ(d.NextK(1), 3);
  u = {Verified(1, 3, 3)};
  d.Observe(u);
  EXPECT_EQ(d.NextK(1), 4);
}

TEST(SpecDecoderTest, FreedSequencesAreForgotten) {
  auto proposer = std::make_unique<FixedProposer>();
  FixedProposer* p = proposer.get();
  SpecDecoder d({}, std::move(proposer));
  std::vector<SequenceUpdate> u = {{.id = 3, .freed = true}};
  d.Observe(u);
  EXPECT_EQ(p->forgotten, std::vector<SeqId>{3});
}

// A scheduler with one sequence decoding (fabricated steps, no model).
class DecodingScheduler {
 public:
  explicit DecodingScheduler(int max_tokens,
                             std::shared_ptr<const TokenConstraint> constraint = nullptr)
      : scheduler_(Options(), Config(), 16, 4) {
    SamplingParams params;
    params.max_tokens = max_tokens;
    params.ignore_eos = constraint == nullptr;
    params.constraint = std::move(constraint);
    EXPECT_TRUE(scheduler_.AddPrompt(1, {3, 4, 5}, params).ok());
    ScheduledStep step = scheduler_.Schedule();
    StepOutput out;
    out.sampled.resize(1);
    out.sampled[0].token = 2;
    scheduler_.Complete(step, out);
  }
  Scheduler& scheduler() { return scheduler_; }

 private:
  static SchedulerOptions Options() {
    return {.role = SchedulerRole::kColocated, .kv_headroom_tokens = 2};
  }
  static const ModelConfig& Config() {
    static const ModelConfig c = [] {
      ModelConfig c;
      c.vocab_size = 8;
      c.max_position_embeddings = 64;
      return c;
    }();
    return c;
  }
  Scheduler scheduler_;
};

TEST(SpecDecoderTest, ProposalsStopAtMaxTokens) {
  DecodingScheduler s(/*max_tokens=*/3);  // one generated: a verification may yield 2 more
  auto proposer = std::make_unique<FixedProposer>();
  FixedProposer* p = proposer.get();
  SpecDecoder d({.num_speculative_tokens = 4}, std::move(proposer));
  ASSERT_TRUE(d.ProposeFor(s.scheduler()).ok());
  EXPECT_EQ(p->seen, std::vector<int>{1});
  EXPECT_EQ(s.scheduler().Find(1)->proposal.size(), 1u);
}

// Allows every token (the test needs a constraint, not its mask).
class AnyToken final : public TokenConstraint {
 public:
  void FillMask(std::span<const int32_t>, int, std::span<const int>,
                std::span<uint32_t> mask) const override {
    for (uint32_t& w : mask) w = ~0u;
  }
};

// The verifier draws rows without a grammar's mask: a sequence under a
// structured-output constraint is never proposed for.
TEST(SpecDecoderTest, ConstrainedSequencesAreNotSpeculated) {
  DecodingScheduler s(/*max_tokens=*/40, std::make_shared<AnyToken>());
  auto proposer = std::make_unique<FixedProposer>();
  FixedProposer* p = proposer.get();
  SpecDecoder d({.num_speculative_tokens = 4}, std::move(proposer));
  ASSERT_TRUE(d.ProposeFor(s.scheduler()).ok());
  EXPECT_TRUE(p->seen.empty());
  EXPECT_TRUE(s.scheduler().Find(1)->proposal.empty());
}

// min_acceptance 0.25, smoothing 0.3: from 1.0, four verifications that keep
// nothing bring the average to 0.24.
TEST(SpecDecoderTest, LowAcceptanceCoolsDownLongerEachTime) {
  DecodingScheduler s(/*max_tokens=*/40);
  auto proposer = std::make_unique<FixedProposer>();
  FixedProposer* p = proposer.get();
  SpecDecoder d({.num_speculative_tokens = 4, .min_cooldown_steps = 2, .max_cooldown_steps = 8},
                std::move(proposer));
  auto observe = [&](int proposed, int accepted) {
    std::vector<SequenceUpdate> u = {Verified(1, proposed, accepted)};
    d.Observe(u);
  };
  // Steps (ProposeFor calls) until sequence 1 proposes again.
  auto steps_until_proposal = [&] {
    for (int n = 1; n <= 20; ++n) {
      const size_t before = p->seen.size();
      EXPECT_TRUE(d.ProposeFor(s.scheduler()).ok());
      if (p->seen.size() > before) return n;
    }
    return -1;
  };
  for (int i = 0; i < 3; ++i) observe(4, 0);
  EXPECT_EQ(d.NextK(1), 1);
  observe(1, 0);
  EXPECT_EQ(d.NextK(1), 0);
  EXPECT_EQ(steps_until_proposal(), 3);  // 2 steps cooling down, then a probe
  EXPECT_EQ(p->seen.back(), 1);
  observe(1, 0);  // the probe fails: twice as long
  EXPECT_EQ(steps_until_proposal(), 5);
  observe(1, 1);  // recovering: 0.475
  observe(2, 2);  // 0.63: the next cool-down is short again
  EXPECT_EQ(d.NextK(1), 3);
  for (int i = 0; i < 6 && d.NextK(1) > 0; ++i) observe(3, 0);
  EXPECT_EQ(d.NextK(1), 0);
  EXPECT_EQ(steps_until_proposal(), 3);
}

// E(k) = (1 - a^(k+1)) / (1 - a) tokens for 1 + (row + proposal) * k steps.
TEST(SpecDecoderTest, PricedKMaximisesThePredictedSpeedup) {
  // Every proposal stands: k = max; 1 + 4 = 5 tokens for 1 + 0.5 * 4 = 3 steps.
  PricedK all = BestPricedK(1.0, 4, 0.2, 0.3);
  EXPECT_EQ(all.k, 4);
  EXPECT_DOUBLE_EQ(all.speedup, 5.0 / 3.0);
  // None stands: one token for more than one step at any k.
  EXPECT_LT(BestPricedK(0.0, 4, 0.2, 0.3).speedup, 1.0);
  // Half stands: k = 1 gives 1.5 / 1.5; k = 2 gives 1.75 / 2.
  PricedK half = BestPricedK(0.5, 4, 0.2, 0.3);
  EXPECT_EQ(half.k, 1);
  EXPECT_DOUBLE_EQ(half.speedup, 1.0);
  // Free proposals and rows: the longest k always pays.
  EXPECT_EQ(BestPricedK(0.5, 6, 0.0, 0.0).k, 6);
  // Between: 0.8 at 0.2 + 0.3 peaks at k = 2 (2.44 / 2 = 1.22 against 1.2 at 1, 1.18 at 3).
  EXPECT_EQ(BestPricedK(0.8, 4, 0.2, 0.3).k, 2);
}

// Sequence 1 verifies once with every proposal standing (the longest k
// then pays, checked), then six times with its proposals in turn rejected
// at their first token and all standing (about one token in two decided
// stands). Returns its k after that (0: cooling down).
int HalfStanding(SpecDecoder& d) {
  std::vector<SequenceUpdate> u = {Verified(1, 4, 4)};
  d.Observe(u);
  EXPECT_EQ(d.NextK(1), 4);
  for (int i = 0; i < 6; ++i) {
    const int k = d.NextK(1);
    if (k == 0) continue;
    u = {Verified(1, k, i % 2 == 0 ? 0 : k)};
    d.Observe(u);
  }
  return d.NextK(1);
}

// A priced proposer: k is capped where the predicted speed-up peaks, and a
// sequence whose proposals no longer pay cools down although its acceptance
// stays above min_acceptance; an unpriced one (proposal_cost 0) keeps
// proposing at the same acceptance.
TEST(SpecDecoderTest, PricedProposalsCoolDownWhenTheyDoNotPay) {
  auto make = [](double proposal_cost) {
    return std::make_unique<SpecDecoder>(SpecOptions{.num_speculative_tokens = 4,
                                                     .min_acceptance = 0.05,
                                                     .min_cooldown_steps = 4,
                                                     .max_cooldown_steps = 40,
                                                     .proposal_cost = proposal_cost},
                                         std::make_unique<FixedProposer>());
  };
  std::unique_ptr<SpecDecoder> priced = make(0.3);
  std::unique_ptr<SpecDecoder> free = make(0.0);
  EXPECT_EQ(HalfStanding(*priced), 0);  // cooling down
  EXPECT_GT(HalfStanding(*free), 0);

  // The cool-down runs its 4 steps; a probe that is priced out again stops
  // the sequence for the longest cool-down at once (each probe costs a draft
  // its catch-up over the skipped steps).
  DecodingScheduler s(/*max_tokens=*/60);
  auto cooling_steps = [&] {
    int n = 0;
    while (priced->NextK(1) == 0 && n < 1000) {
      EXPECT_TRUE(priced->ProposeFor(s.scheduler()).ok());
      ++n;
    }
    return n;
  };
  EXPECT_EQ(cooling_steps(), 4);
  EXPECT_EQ(priced->NextK(1), 1);  // the probe
  std::vector<SequenceUpdate> probe = {Verified(1, 1, 0)};
  priced->Observe(probe);
  EXPECT_EQ(cooling_steps(), 40);  // max_cooldown_steps
}

// A priced first catch-up: a sequence that never verified proposes only if
// its tokens left repay the proposer's catch-up at the priced speed-up;
// once it has verified, catch-ups are not priced; unpriced, it proposes.
TEST(SpecDecoderTest, FirstCatchUpMustBeRepaidByTheTokensLeft) {
  // Every proposal stands (alpha 1): k = 4 gives 5 tokens for 1 + 0.5 * 4 = 3
  // steps, so each token left saves 1 - 3/5 = 0.4 steps; a catch-up of 30
  // tokens at 0.1 costs 3 steps: 8 tokens left repay it, 7 do not.
  const SpecOptions priced{
      .num_speculative_tokens = 4, .proposal_cost = 0.3, .row_cost = 0.2, .catch_up_cost = 0.1};
  auto proposals = [&](const SpecOptions& options, int max_tokens, bool verified_first) {
    auto proposer = std::make_unique<FixedProposer>();
    FixedProposer* p = proposer.get();
    p->catch_up = 30;
    SpecDecoder d(options, std::move(proposer));
    if (verified_first) {
      std::vector<SequenceUpdate> u = {Verified(1, 4, 4)};
      d.Observe(u);
    }
    DecodingScheduler s(max_tokens);  // one token generated: max_tokens - 1 left
    EXPECT_TRUE(d.ProposeFor(s.scheduler()).ok());
    return p->seen.size();
  };
  EXPECT_EQ(proposals(priced, /*max_tokens=*/9, false), 1u);  // 8 left
  EXPECT_EQ(proposals(priced, /*max_tokens=*/8, false), 0u);  // 7 left
  EXPECT_EQ(proposals(priced, /*max_tokens=*/8, true), 1u);   // verified before
  SpecOptions unpriced = priced;
  unpriced.catch_up_cost = 0;
  EXPECT_EQ(proposals(unpriced, /*max_tokens=*/8, false), 1u);
}

// Free proposals (n-grams) with their verification rows priced: at about
// one token in two standing, a row at 0.6 of a step does not pay and the
// sequence cools down; unpriced, it keeps proposing; with every proposal
// standing, the priced one keeps the longest k.
TEST(SpecDecoderTest, PricedRowsCoolDownFreeProposalsThatDoNotPay) {
  auto make = [](bool price_rows) {
    return std::make_unique<SpecDecoder>(SpecOptions{.num_speculative_tokens = 4,
                                                     .min_acceptance = 0.05,
                                                     .row_cost = 0.6,
                                                     .price_rows = price_rows},
                                         std::make_unique<FixedProposer>());
  };
  EXPECT_EQ(HalfStanding(*make(true)), 0);  // cooling down
  EXPECT_GT(HalfStanding(*make(false)), 0);
}

TEST(SpecDecoderTest, LargeBatchesProposeNothing) {
  DecodingScheduler s(/*max_tokens=*/20);  // one decoding sequence
  auto proposer = std::make_unique<FixedProposer>();
  FixedProposer* p = proposer.get();
  SpecDecoder limited({.num_speculative_tokens = 2, .max_batch = 1}, std::move(proposer));
  ASSERT_TRUE(limited.ProposeFor(s.scheduler()).ok());
  EXPECT_EQ(p->seen.size(), 1u);  // 1 <= max_batch
  auto none = std::make_unique<FixedProposer>();
  FixedProposer* q = none.get();
  SpecDecoder zero({.num_speculative_tokens = 2, .max_batch = 1}, std::move(none));
  DecodingScheduler two(/*max_tokens=*/20);
  SamplingParams params;
  params.max_tokens = 20;
  ASSERT_TRUE(two.scheduler().AddPrompt(2, {1, 2}, params).ok());
  ScheduledStep step = two.scheduler().Schedule();
  StepOutput out;
  out.sampled.resize(step.ids.size());
  for (SampledToken& t : out.sampled) t.token = 3;
  two.scheduler().Complete(step, out);
  ASSERT_EQ(two.scheduler().DecodingSequences().size(), 2u);
  ASSERT_TRUE(zero.ProposeFor(two.scheduler()).ok());
  EXPECT_TRUE(q->seen.empty());  // 2 > max_batch
}

TEST(SpecDecoderTest, TooManyProposedTokensAreRefused) {
  DecodingScheduler s(/*max_tokens=*/20);
  auto proposer = std::make_unique<FixedProposer>();
  proposer->extra = 1;
  SpecDecoder d({.num_speculative_tokens = 2}, std::move(proposer));
  EXPECT_EQ(d.ProposeFor(s.scheduler()).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(s.scheduler().Find(1)->proposal.empty());
}

TEST(SpecDecoderTest, ParsesMethods) {
  EXPECT_EQ(*ParseSpecMethod("ngram"), SpecMethod::kNgram);
  EXPECT_EQ(*ParseSpecMethod("draft"), SpecMethod::kDraft);
  EXPECT_EQ(*ParseSpecMethod("off"), SpecMethod::kOff);
  EXPECT_EQ(ParseSpecMethod("eagle").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::engine::spec
