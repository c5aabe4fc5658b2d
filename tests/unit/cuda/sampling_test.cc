// The device sampler against the CPU sampler (engine/runtime/sampler.h) on the same
// logits: greedy, temperature with top-k / top-p / min-p (the exact token
// for every (seed, step)), penalties and min_tokens masks (bit-exact
// logits), and log-probabilities. Logits include ties, NaN, -inf and +inf.
#include "engine/cuda/sampling.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "engine/cuda/sampling_inputs.h"
#include "engine/runtime/sampler.h"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::cuda {
namespace {

using testing::DeviceBuffer;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kVocab = 1000;

using SamplingTest = testing::GpuStreamTest;

// Normal logits with a few exact ties, NaN and -inf sprinkled in.
std::vector<float> Logits(uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> x(kVocab);
  for (float& v : x) v = normal(rng);
  for (int i = 0; i < 20; ++i) x[rng() % kVocab] = x[rng() % kVocab];  // ties
  x[rng() % kVocab] = kNaN;
  x[rng() % kVocab] = -kInf;
  return x;
}

std::vector<int32_t> RunSample(const std::vector<float>& logits,
                               const std::vector<DeviceSamplingParams>& params,
                               cudaStream_t stream) {
  const int rows = static_cast<int>(params.size());
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<DeviceSamplingParams> d_params(params);
  DeviceBuffer<int32_t> tokens(rows);
  EXPECT_EQ(SampleTokens(d_logits.get(), rows, kVocab, d_params.get(), tokens.get(), stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return tokens.Download();
}

TEST_F(SamplingTest, GreedyMatchesCpu) {
  std::vector<float> logits;
  std::vector<std::vector<float>> rows = {Logits(1, 2.0f), Logits(2, 0.5f)};
  rows.push_back(std::vector<float>(kVocab, 1.5f));   // all tied: id 0
  rows.push_back(std::vector<float>(kVocab, -kInf));  // nothing beats -inf: 0
  rows.push_back(std::vector<float>(kVocab, kNaN));   // all NaN: 0
  std::vector<float> tie = Logits(3, 1.0f);
  tie[700] = tie[300] = 50.0f;  // lowest id on ties
  rows.push_back(tie);
  std::vector<float> inf = Logits(4, 1.0f);
  inf[900] = kInf;
  rows.push_back(inf);
  for (const auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> tokens(rows.size());
  ASSERT_EQ(
      SampleGreedy(d_logits.get(), static_cast<int>(rows.size()), kVocab, tokens.get(), stream_),
      cudaSuccess);
  Sync();
  const std::vector<int32_t> got = tokens.Download();
  engine::SamplingParams greedy;
  for (size_t r = 0; r < rows.size(); ++r)
    EXPECT_EQ(got[r], engine::SampleToken(rows[r], greedy, 0)) << r;
  EXPECT_EQ(got[5], 300);
  EXPECT_EQ(got[6], 900);
}

struct Case {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
};

TEST_F(SamplingTest, TemperatureTopKTopPMinPMatchCpuTokenForToken) {
  const std::vector<Case> cases = {
      {1.0f, 0, 1.0f, 0.0f},  {0.7f, 0, 1.0f, 0.0f},  {1.3f, 1, 1.0f, 0.0f},
      {1.0f, 5, 1.0f, 0.0f},  {1.0f, 50, 1.0f, 0.0f}, {2.0f, 300, 1.0f, 0.0f},
      {1.0f, 0, 0.9f, 0.0f},  {1.5f, 0, 0.5f, 0.0f},  {1.0f, 0, 1e-6f, 0.0f},
      {1.0f, 40, 0.8f, 0.0f}, {1.0f, 0, 1.0f, 0.05f}, {3.0f, 200, 0.95f, 0.01f},
      {0.0f, 10, 0.5f, 0.0f},  // greedy wins
  };
  constexpr int kSteps = 3;
  std::vector<float> logits;
  std::vector<DeviceSamplingParams> params;
  std::vector<int32_t> want;
  uint32_t seed = 10;
  for (const Case& c : cases) {
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float> row = Logits(++seed, step == 2 ? 0.3f : 2.5f);
      engine::SamplingParams p;
      p.temperature = c.temperature;
      p.top_k = c.top_k;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.seed = 1000 + seed;
      logits.insert(logits.end(), row.begin(), row.end());
      params.push_back(ToDeviceParams(p, step));
      want.push_back(engine::SampleToken(row, p, step));
    }
  }
  const std::vector<int32_t> got = RunSample(logits, params, stream_);
  for (size_t r = 0; r < want.size(); ++r) {
    const Case& c = cases[r / kSteps];
    EXPECT_EQ(got[r], want[r]) << "T=" << c.temperature << " top_k=" << c.top_k
                               << " top_p=" << c.top_p << " min_p=" << c.min_p << " step "
                               << r % kSteps;
  }
}

TEST_F(SamplingTest, InfiniteLogitsShareTheMassAndNothingValidGivesZero) {
  std::vector<float> a(kVocab, 1.0f);
  a[10] = a[500] = a[999] = kInf;
  std::vector<float> b(kVocab, -kInf);
  b[7] = kNaN;
  std::vector<float> logits = a;
  logits.insert(logits.end(), b.begin(), b.end());
  std::vector<DeviceSamplingParams> params;
  std::vector<int32_t> want;
  for (int step = 0; step < 12; ++step) {
    engine::SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = step % 3 == 0 ? 0.5f : 1.0f;
    p.top_k = step % 4 == 1 ? 2 : 0;
    p.seed = 99;
    std::vector<DeviceSamplingParams> two = {ToDeviceParams(p, step), ToDeviceParams(p, step)};
    const std::vector<int32_t> got = RunSample(logits, two, stream_);
    EXPECT_EQ(got[0], engine::SampleToken(a, p, step)) << step;
    EXPECT_EQ(got[1], 0);
  }
}

TEST_F(SamplingTest, PenaltiesAndMinTokensMatchCpuBitForBit) {
  std::mt19937 rng(7);
  const std::vector<int> eos = {2, 999};
  PenaltyInputs inputs;
  std::vector<float> logits, want;
  std::vector<std::vector<int32_t>> prompts, outputs;
  const std::vector<engine::SamplingParams> rows = [] {
    std::vector<engine::SamplingParams> v(4);
    v[0].repetition_penalty = 1.3f;
    v[1].presence_penalty = 0.5f;
    v[1].frequency_penalty = -0.25f;
    v[2].repetition_penalty = 0.8f;
    v[2].frequency_penalty = 1.5f;
    v[2].min_tokens = 100;
    v[2].stop_token_ids = {5, 6};
    v[3].min_tokens = 100;
    v[3].ignore_eos = true;
    v[3].stop_token_ids = {7};
    return v;
  }();
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<int32_t> prompt(30), output(25);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 60);
    for (int32_t& t : output) t = static_cast<int32_t>(rng() % 60);
    prompts.push_back(prompt);
    outputs.push_back(output);
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<float> row = Logits(static_cast<uint32_t>(50 + r), 3.0f);
    logits.insert(logits.end(), row.begin(), row.end());
    const engine::TokenHistory history{prompts[r], outputs[r]};
    EXPECT_TRUE(NeedsLogitsProcessors(rows[r], history));
    engine::ApplyLogitsProcessors(row, rows[r], history, eos);
    want.insert(want.end(), row.begin(), row.end());
    inputs.AddRow(rows[r], history, eos, kVocab);
  }
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<DevicePenalty> d_params(inputs.params);
  DeviceBuffer<int32_t> d_offsets(inputs.offsets), d_tokens(inputs.tokens), d_counts(inputs.counts),
      d_mask_offsets(inputs.mask_offsets), d_masks(inputs.mask_tokens);
  PenaltyArgs args;
  args.params = d_params.get();
  args.offsets = d_offsets.get();
  args.tokens = d_tokens.get();
  args.counts = d_counts.get();
  args.mask_offsets = d_mask_offsets.get();
  args.mask_tokens = d_masks.get();
  ASSERT_EQ(ApplyPenalties(d_logits.get(), static_cast<int>(rows.size()), kVocab, args, stream_),
            cudaSuccess);
  Sync();
  const std::vector<float> got = d_logits.Download();
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << i;
    } else {
      ASSERT_EQ(got[i], want[i]) << "row " << i / kVocab << " id " << i % kVocab;
    }
  }
}

TEST_F(SamplingTest, LogprobsMatchCpu) {
  constexpr int kTop = 5;
  std::vector<float> logits;
  std::vector<std::vector<float>> rows = {Logits(60, 2.0f), Logits(61, 8.0f)};
  rows[1][123] = rows[1][456] = 40.0f;  // a tie at the top
  for (const auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());
  const std::vector<int32_t> tokens = {17, 456};
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> d_tokens(tokens), top_ids(rows.size() * kTop);
  DeviceBuffer<float> token_lp(rows.size()), top_lp(rows.size() * kTop);
  ASSERT_EQ(ComputeLogprobs(d_logits.get(), static_cast<int>(rows.size()), kVocab, d_tokens.get(),
                            kTop, token_lp.get(), top_ids.get(), top_lp.get(), stream_),
            cudaSuccess);
  Sync();
  const std::vector<float> got_lp = token_lp.Download(), got_top_lp = top_lp.Download();
  const std::vector<int32_t> got_ids = top_ids.Download();
  for (size_t r = 0; r < rows.size(); ++r) {
    // The CPU's top alternatives of a greedy request over the same row.
    engine::SamplingParams p;
    p.logprobs = kTop;
    std::vector<float> scratch;
    const engine::SampledToken cpu = engine::Sample(rows[r], p, {}, {}, scratch);
    ASSERT_EQ(cpu.top.size(), static_cast<size_t>(kTop));
    for (int n = 0; n < kTop; ++n) {
      EXPECT_EQ(got_ids[r * kTop + n], cpu.top[n].token) << r << "," << n;
      EXPECT_NEAR(got_top_lp[r * kTop + n], cpu.top[n].logprob, 1e-5) << r << "," << n;
    }
    // The sampled token's logprob: the CPU's log-softmax at tokens[r].
    double max = -kInf, sum = 0;
    for (float v : rows[r]) {
      if (!std::isnan(v)) max = std::max<double>(max, v);
    }
    for (float v : rows[r]) {
      if (!std::isnan(v)) sum += std::exp(static_cast<double>(v) - max);
    }
    EXPECT_NEAR(got_lp[r], static_cast<double>(rows[r][tokens[r]]) - (max + std::log(sum)), 1e-5);
  }
  EXPECT_EQ(got_ids[kTop], 123);  // lowest id first on the tie
  EXPECT_EQ(got_ids[kTop + 1], 456);
}

}  // namespace
}  // namespace pdserve::cuda
