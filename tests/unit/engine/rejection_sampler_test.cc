// VerifyProposals: greedy acceptance, the bonus token, deterministic
// proposals giving exactly the plain draws, and sampled proposals keeping
// the target distribution exactly (chi-square over many seeds, with the
// acceptance rate of Leviathan et al.: sum over tokens of min(p, q)).
#include "engine/spec/rejection_sampler.h"

#include <cmath>
#include <vector>

#include "engine/runtime/sampling_draw.h"
#include "gtest/gtest.h"

namespace pdserve::engine::spec {
namespace {

constexpr int kVocab = 6;

std::vector<float> Rows(std::initializer_list<std::vector<float>> rows) {
  std::vector<float> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

VerifyResult Verify(std::span<const float> logits, std::span<const int32_t> proposals,
                    const SamplingParams& params, std::span<const int32_t> generated = {},
                    std::span<const float> probs = {}) {
  static const std::vector<int32_t> prompt = {1, 2, 3};
  static const std::vector<int> eos = {5};
  VerifyScratch scratch;
  return VerifyProposals({.logits = logits,
                          .proposals = proposals,
                          .proposal_probs = probs,
                          .sampling = &params,
                          .history = {.prompt = prompt, .generated = generated},
                          .eos_ids = eos},
                         scratch);
}

TEST(RejectionSamplerTest, GreedyKeepsProposalsUpToTheFirstMismatch) {
  const std::vector<float> logits = Rows({{0, 3, 1, 0, 0, 0},    // argmax 1
                                          {0, 0, 0, 4, 1, 0},    // argmax 3
                                          {2, 0, 0, 0, 1, 0}});  // argmax 0
  SamplingParams greedy;
  const std::vector<int32_t> right_then_wrong = {1, 4};
  VerifyResult r = Verify(logits, right_then_wrong, greedy);
  EXPECT_EQ(r.num_accepted, 1);
  ASSERT_EQ(r.tokens.size(), 2u);
  EXPECT_EQ(r.tokens[0].token, 1);
  EXPECT_EQ(r.tokens[1].token, 3);

  const std::vector<int32_t> all_right = {1, 3};
  r = Verify(logits, all_right, greedy);
  EXPECT_EQ(r.num_accepted, 2);
  ASSERT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.tokens[2].token, 0);  // the bonus token

  const std::vector<int32_t> wrong = {2, 3};
  r = Verify(logits, wrong, greedy);
  EXPECT_EQ(r.num_accepted, 0);
  ASSERT_EQ(r.tokens.size(), 1u);
  EXPECT_EQ(r.tokens[0].token, 1);
}

// Penalties and min_tokens see the proposals before each position.
TEST(RejectionSamplerTest, ProcessorsSeeEarlierProposals) {
  const std::vector<float> logits = Rows({{0, 3, 1, 0, 0, 0},        // argmax 1
                                          {0, 2.9f, 2.8f, 0, 0, 0},  // 1, but 2 once 1 is penalised
                                          {0, 0, 0, 0, 0, 9}});      // EOS, masked by min_tokens
  SamplingParams params;
  params.presence_penalty = 0.5f;
  params.min_tokens = 3;
  const std::vector<int32_t> proposals = {1, 2};
  const VerifyResult r = Verify(logits, proposals, params);
  EXPECT_EQ(r.num_accepted, 2);
  ASSERT_EQ(r.tokens.size(), 3u);
  EXPECT_NE(r.tokens[2].token, 5);  // generated 2 < min_tokens 3: EOS masked
}

// One-hot proposals with temperature: every output token is the plain draw
// of its step (Sample with the request's seed), accepted or not.
TEST(RejectionSamplerTest, DeterministicProposalsGiveThePlainDraws) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.9f;
  params.logprobs = 1;
  const std::vector<int32_t> generated = {4, 4};
  int accepted = 0, rejected = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    params.seed = seed;
    std::vector<float> logits(3 * kVocab);
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = static_cast<float>(UniformForStep(seed + 77, static_cast<int>(i)) * 3);
    }
    const std::vector<int32_t> proposals = {static_cast<int32_t>(seed % kVocab),
                                            static_cast<int32_t>((seed / kVocab) % kVocab)};
    const VerifyResult r = Verify(logits, proposals, params, generated);
    std::vector<int32_t> history = generated;
    std::vector<float> scratch;
    for (size_t j = 0; j < r.tokens.size(); ++j) {
      const SampledToken plain = Sample(std::span<const float>(logits).subspan(j * kVocab, kVocab),
                                        params, {.generated = history}, {}, scratch);
      EXPECT_EQ(r.tokens[j].token, plain.token) << seed << " " << j;
      EXPECT_FLOAT_EQ(r.tokens[j].logprob, plain.logprob);
      history.push_back(plain.token);
    }
    accepted += r.num_accepted;
    rejected += r.tokens.size() <= proposals.size();
  }
  EXPECT_GT(accepted, 20);
  EXPECT_GT(rejected, 20);
}

// Sampled proposals: x ~ q, verified against p. Over many seeds the first
// output token follows p (chi-square, 5 degrees of freedom, fixed seeds: the
// test is deterministic) and the acceptance rate is sum min(p, q).
TEST(RejectionSamplerTest, SampledProposalsKeepTheTargetDistribution) {
  const std::vector<float> target_logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f};
  const std::vector<double> q = {0.05, 0.4, 0.25, 0.1, 0.15, 0.05};
  SamplingParams params;
  params.temperature = 1.0f;
  double z = 0;
  std::vector<double> p(kVocab);
  for (int i = 0; i < kVocab; ++i) z += p[i] = std::exp(static_cast<double>(target_logits[i]));
  double overlap = 0;
  for (int i = 0; i < kVocab; ++i) {
    p[i] /= z;
    overlap += std::min(p[i], q[i]);
  }
  std::vector<float> logits = target_logits;
  logits.insert(logits.end(), target_logits.begin(), target_logits.end());  // bonus row
  const std::vector<float> probs(q.begin(), q.end());
  constexpr int kDraws = 60000;
  std::vector<int> counts(kVocab, 0);
  int accepted = 0;
  for (int s = 0; s < kDraws; ++s) {
    params.seed = static_cast<uint64_t>(s);
    // The proposal drawn from q on the draft's own stream.
    const double u = UniformForStep(params.seed ^ kDraftStreamSalt, 0);
    int32_t x = kVocab - 1;
    double cum = 0;
    for (int i = 0; i < kVocab; ++i) {
      cum += q[i];
      if (u < cum) {
        x = i;
        break;
      }
    }
    const std::vector<int32_t> proposals = {x};
    const VerifyResult r = Verify(logits, proposals, params, {}, probs);
    ++counts[r.tokens[0].token];
    accepted += r.num_accepted;
  }
  double chi2 = 0;
  for (int i = 0; i < kVocab; ++i) {
    const double expected = p[i] * kDraws;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  EXPECT_LT(chi2, 20.5) << "chi-square (5 dof, p = 0.001 at 20.5)";
  const double rate = static_cast<double>(accepted) / kDraws;
  EXPECT_NEAR(rate, overlap, 0.01);
}

}  // namespace
}  // namespace pdserve::engine::spec
