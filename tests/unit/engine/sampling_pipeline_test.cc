// Logits processors (penalties, min_tokens), min-p and log-probabilities.
#include <cmath>

#include "engine/runtime/sampler.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

TEST(LogitsProcessorsTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  std::vector<float> logits = {2.0f, -2.0f, 2.0f, 1.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {0, 1}, generated = {0};
  ApplyLogitsProcessors(logits, p, {prompt, generated}, {});
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 2.0f, 1.0f}));
}

TEST(LogitsProcessorsTest, PresenceAndFrequencyPenaltiesCountOutputOnly) {
  std::vector<float> logits = {0.0f, 0.0f, 0.0f};
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const std::vector<int32_t> prompt = {2, 2, 2}, generated = {0, 1, 1, 1};
  ApplyLogitsProcessors(logits, p, {prompt, generated}, {});
  EXPECT_FLOAT_EQ(logits[0], -0.75f);
  EXPECT_FLOAT_EQ(logits[1], -1.25f);
  EXPECT_FLOAT_EQ(logits[2], 0.0f);  // prompt tokens are not output
}

TEST(LogitsProcessorsTest, MinTokensMasksEosAndStopIdsUntilReached) {
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {1};
  const std::vector<int> eos = {3};
  std::vector<float> logits = {0, 5, 0, 9};
  const std::vector<int32_t> one = {0};
  ApplyLogitsProcessors(logits, p, {{}, one}, eos);
  EXPECT_TRUE(std::isinf(logits[1]) && logits[1] < 0);
  EXPECT_TRUE(std::isinf(logits[3]) && logits[3] < 0);
  std::vector<float> scratch;
  std::vector<float> raw = {0, 5, 0, 9};
  EXPECT_EQ(Sample(raw, p, {{}, one}, eos, scratch).token, 0);  // greedy, EOS masked
  const std::vector<int32_t> two = {0, 0};
  EXPECT_EQ(Sample(raw, p, {{}, two}, eos, scratch).token, 3);  // reached: EOS allowed
  p.ignore_eos = true;
  logits = {0, 5, 0, 9};
  ApplyLogitsProcessors(logits, p, {{}, one}, eos);
  EXPECT_EQ(logits[3], 9);  // ignore_eos leaves EOS alone; stop ids still masked
  EXPECT_TRUE(std::isinf(logits[1]));
}

TEST(MinPTest, DropsUnlikelyTokens) {
  // p ~ [0.66, 0.24, 0.09, 0.003]; min_p 0.2 keeps p >= 0.13: ids 0 and 1.
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, -2.5f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.2f;
  std::vector<int> seen(4, 0);
  for (int step = 0; step < 3000; ++step) ++seen[SampleToken(logits, p, step)];
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen[2], 0);
  EXPECT_EQ(seen[3], 0);
  p.min_p = 1.0f;  // only the most likely
  for (int step = 0; step < 100; ++step) EXPECT_EQ(SampleToken(logits, p, step), 0);
}

TEST(LogprobsTest, RawLogSoftmaxAndTopAlternatives) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  SamplingParams p;
  p.logprobs = 3;
  p.repetition_penalty = 5.0f;  // changes the draw, not the reported logprobs
  std::vector<float> scratch;
  const std::vector<int32_t> prompt = {1};
  SampledToken t = Sample(logits, p, {prompt, {}}, {}, scratch);
  EXPECT_EQ(t.token, 3);  // id 1 was penalised to 0.6
  double z = 0;
  for (float x : logits) z += std::exp(x);
  EXPECT_NEAR(t.logprob, 3.0 - std::log(z), 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].token, 1);  // ties: lower id first
  EXPECT_EQ(t.top[1].token, 3);
  EXPECT_EQ(t.top[2].token, 2);
  EXPECT_NEAR(t.top[2].logprob, 2.0 - std::log(z), 1e-6);
  p.logprobs = -1;
  EXPECT_TRUE(Sample(logits, p, {prompt, {}}, {}, scratch).top.empty());
}

TEST(ValidationTest, NewFieldsAreRangeChecked) {
  struct Case {
    SamplingParams params;
    std::string field;
  };
  std::vector<Case> cases;
  SamplingParams base;
  base.max_tokens = 4;
  {
    auto p = base;
    p.min_p = 1.5f;
    cases.push_back({p, "min_p"});
  }
  {
    auto p = base;
    p.repetition_penalty = 0.0f;
    cases.push_back({p, "repetition_penalty"});
  }
  {
    auto p = base;
    p.presence_penalty = 3.0f;
    cases.push_back({p, "presence_penalty"});
  }
  {
    auto p = base;
    p.frequency_penalty = -3.0f;
    cases.push_back({p, "frequency_penalty"});
  }
  {
    auto p = base;
    p.min_tokens = 5;
    cases.push_back({p, "min_tokens"});
  }
  {
    auto p = base;
    p.logprobs = 21;
    cases.push_back({p, "logprobs"});
  }
  for (const Case& c : cases) {
    absl::Status s = ValidateSamplingParams(c.params, 100);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), absl::string_view::npos) << s;
  }
  EXPECT_TRUE(ValidateSamplingParams(base, 100).ok());
}

}  // namespace
}  // namespace pdserve::engine
