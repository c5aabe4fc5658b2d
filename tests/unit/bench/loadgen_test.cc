// Workload planning and run statistics of pdserve_loadgen, without a server.
#include <cmath>

#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "gtest/gtest.h"

namespace pdserve::loadgen {
namespace {

TEST(LengthDistributionTest, ParsesAndSamplesWithinBounds) {
  std::mt19937_64 rng(3);
  auto fixed = LengthDistribution::Parse("fixed:17");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->Sample(rng), 17);
  EXPECT_EQ(fixed->ToString(), "fixed:17");

  auto uniform = LengthDistribution::Parse("uniform:4:9");
  ASSERT_TRUE(uniform.ok());
  std::vector<int> seen(10, 0);
  for (int i = 0; i < 2000; ++i) {
    const int v = uniform->Sample(rng);
    ASSERT_GE(v, 4);
    ASSERT_LE(v, 9);
    ++seen[v];
  }
  for (int v = 4; v <= 9; ++v) EXPECT_GT(seen[v], 200) << v;

  auto normal = LengthDistribution::Parse("normal:100:40:60:120");
  ASSERT_TRUE(normal.ok());
  double sum = 0;
  bool hit_lo = false, hit_hi = false;
  for (int i = 0; i < 4000; ++i) {
    const int v = normal->Sample(rng);
    ASSERT_GE(v, 60);
    ASSERT_LE(v, 120);
    hit_lo |= v == 60;
    hit_hi |= v == 120;
    sum += v;
  }
  EXPECT_TRUE(hit_lo && hit_hi);  // clamped, not redrawn
  EXPECT_NEAR(sum / 4000, 97, 4);

  auto default_clamp = LengthDistribution::Parse("normal:10:5");
  ASSERT_TRUE(default_clamp.ok());
  EXPECT_EQ(default_clamp->lo, 1);
  EXPECT_EQ(default_clamp->max(), 30);

  // A long tail: most values well below the mean's multiples, clamped.
  auto exponential = LengthDistribution::Parse("exponential:40:4:512");
  ASSERT_TRUE(exponential.ok()) << exponential.status();
  EXPECT_EQ(exponential->ToString(), "exponential:40:4:512");
  int below_mean = 0;
  sum = 0;
  for (int i = 0; i < 4000; ++i) {
    const int v = exponential->Sample(rng);
    ASSERT_GE(v, 4);
    ASSERT_LE(v, 512);
    below_mean += v < 40;
    sum += v;
  }
  EXPECT_NEAR(below_mean / 4000.0, 1 - std::exp(-1.0), 0.04);  // P(X < mean) = 0.63
  EXPECT_NEAR(sum / 4000, 40, 3);
  EXPECT_EQ(LengthDistribution::Parse("exponential:8")->max(), 80);
}

TEST(LengthDistributionTest, RejectsBadSpecs) {
  for (const char* spec :
       {"", "fixed", "fixed:0", "fixed:x", "uniform:5", "uniform:9:4", "normal:10", "normal:0:1",
        "normal:10:-1", "normal:10:1:5", "normal:10:1:0:5", "zipf:3", "exponential",
        "exponential:0", "exponential:5:3", "exponential:5:9:2"}) {
    EXPECT_FALSE(LengthDistribution::Parse(spec).ok()) << spec;
  }
}

WorkloadOptions Options(Arrival arrival) {
  WorkloadOptions o;
  o.arrival = arrival;
  o.rate = 20;
  o.duration_s = 50;
  o.prompt_len = *LengthDistribution::Parse("uniform:3:40");
  o.output_len = *LengthDistribution::Parse("fixed:7");
  o.vocab_size = 300;
  o.seed = 42;
  return o;
}

TEST(PlanWorkloadTest, FixedRateIsEvenlySpaced) {
  auto plan = PlanWorkload(Options(Arrival::kFixed));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 1000u);
  for (size_t i = 0; i < plan->size(); ++i) {
    EXPECT_NEAR((*plan)[i].send_at_s, i * 0.05, 1e-9);
    EXPECT_EQ((*plan)[i].index, static_cast<int>(i));
    EXPECT_EQ((*plan)[i].output_len, 7);
    ASSERT_GE((*plan)[i].prompt.size(), 3u);
    ASSERT_LE((*plan)[i].prompt.size(), 40u);
    for (int32_t t : (*plan)[i].prompt) {
      ASSERT_GE(t, 1);
      ASSERT_LT(t, 300);
    }
  }
}

TEST(PlanWorkloadTest, PoissonHasTheRateAndExponentialGaps) {
  auto plan = PlanWorkload(Options(Arrival::kPoisson));
  ASSERT_TRUE(plan.ok());
  // 1000 expected arrivals in 50 s at 20/s: within 4 standard deviations.
  EXPECT_NEAR(static_cast<double>(plan->size()), 1000, 4 * std::sqrt(1000.0));
  int short_gaps = 0;
  for (size_t i = 1; i < plan->size(); ++i) {
    const double gap = (*plan)[i].send_at_s - (*plan)[i - 1].send_at_s;
    ASSERT_GE(gap, 0);
    if (gap < 0.05) ++short_gaps;  // P(gap < mean) = 1 - 1/e = 0.63
  }
  EXPECT_NEAR(static_cast<double>(short_gaps) / (plan->size() - 1), 0.632, 0.05);
  EXPECT_LT(plan->back().send_at_s, 50);
}

TEST(PlanWorkloadTest, SameSeedSamePlanAndStreamsAreIndependent) {
  auto a = PlanWorkload(Options(Arrival::kPoisson));
  auto b = PlanWorkload(Options(Arrival::kPoisson));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].send_at_s, (*b)[i].send_at_s);
    EXPECT_EQ((*a)[i].prompt, (*b)[i].prompt);
  }
  // Other output lengths: same arrival times.
  WorkloadOptions o = Options(Arrival::kPoisson);
  o.output_len = *LengthDistribution::Parse("uniform:1:99");
  auto c = PlanWorkload(o);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), a->size());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_EQ((*a)[i].send_at_s, (*c)[i].send_at_s);
  o = Options(Arrival::kPoisson);
  o.seed = 43;
  auto d = PlanWorkload(o);
  ASSERT_TRUE(d.ok());
  EXPECT_NE((*d)[0].send_at_s, (*a)[0].send_at_s);
}

TEST(PlanWorkloadTest, BurstAndCaps) {
  WorkloadOptions o = Options(Arrival::kBurst);
  EXPECT_FALSE(PlanWorkload(o).ok());  // needs max_requests
  o.max_requests = 12;
  auto plan = PlanWorkload(o);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 12u);
  for (const PlannedRequest& r : *plan) EXPECT_EQ(r.send_at_s, 0);
  o = Options(Arrival::kFixed);
  o.max_requests = 5;
  EXPECT_EQ(PlanWorkload(o)->size(), 5u);
  o.rate = 0;
  EXPECT_FALSE(PlanWorkload(o).ok());
}

TEST(PlanWorkloadTest, SharedPrefixesStartEveryPrompt) {
  WorkloadOptions o = Options(Arrival::kFixed);
  o.shared_prefix_len = 25;
  o.num_shared_prefixes = 3;
  auto plan = PlanWorkload(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::vector<int32_t>> prefixes(3);
  std::vector<int> picked(3, 0);
  for (const PlannedRequest& r : *plan) {
    ASSERT_GE(r.prefix_index, 0);
    ASSERT_LT(r.prefix_index, 3);
    ASSERT_GE(r.prompt.size(), 25u + 3u);
    const std::vector<int32_t> prefix(r.prompt.begin(), r.prompt.begin() + 25);
    if (prefixes[r.prefix_index].empty()) prefixes[r.prefix_index] = prefix;
    EXPECT_EQ(prefix, prefixes[r.prefix_index]);
    ++picked[r.prefix_index];
  }
  EXPECT_NE(prefixes[0], prefixes[1]);
  for (int n : picked) EXPECT_GT(n, 250);
  // The questions are the planned prompts of a run without prefixes.
  auto plain = PlanWorkload(Options(Arrival::kFixed));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(std::vector<int32_t>((*plan)[5].prompt.begin() + 25, (*plan)[5].prompt.end()),
            (*plain)[5].prompt);
  o.num_shared_prefixes = 0;
  EXPECT_FALSE(PlanWorkload(o).ok());
}

TEST(StatsTest, PercentileInterpolates) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_EQ(Percentile({7}, 0.99), 7);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 0.9), 10);
  EXPECT_DOUBLE_EQ(Percentile({0, 10}, 0.99), 9.9);
}

RequestRecord Ok(int index, double send, double ttft, std::vector<double> gaps, bool warmup = false) {
  RequestRecord r;
  r.index = index;
  r.warmup = warmup;
  r.send_s = send;
  r.prompt_tokens = 10;
  r.ttft_s = ttft;
  r.token_gaps_s = std::move(gaps);
  r.output_tokens = 1 + static_cast<int>(r.token_gaps_s.size());
  double e2e = ttft;
  for (double g : r.token_gaps_s) e2e += g;
  r.e2e_s = e2e;
  return r;
}

TEST(StatsTest, GoodputNeedsBothSlosOnTheRequestMeanItl) {
  std::vector<RequestRecord> records = {
      Ok(0, 0.0, 5.0, {1, 1}, /*warmup=*/true),  // excluded
      Ok(1, 1.0, 0.5, {0.05, 0.05, 0.05}),        // good
      Ok(2, 2.0, 1.5, {0.05, 0.05}),              // TTFT misses
      Ok(3, 3.0, 0.2, {0.3, 0.0, 0.0}),           // mean ITL 0.1: meets (one 300 ms gap)
      Ok(4, 4.0, 0.2, {0.25, 0.0}),               // mean ITL 0.125: misses
      Ok(5, 5.0, 0.9, {}),                        // one token: TPOT 0, good
  };
  RequestRecord failed;
  failed.index = 6;
  failed.send_s = 6.0;
  failed.e2e_s = 0.01;
  failed.status_code = 14;
  records.push_back(failed);
  RequestRecord exhausted = failed;
  exhausted.index = 7;
  exhausted.status_code = 8;
  records.push_back(exhausted);

  const Summary s = Summarize(records, Slo{.ttft_s = 1.0, .itl_s = 0.1});
  EXPECT_EQ(s.sent, 8);
  EXPECT_EQ(s.measured, 7);
  EXPECT_EQ(s.succeeded, 5);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.failures.at("UNAVAILABLE"), 1);
  EXPECT_EQ(s.failures.at("RESOURCE_EXHAUSTED"), 1);
  EXPECT_EQ(s.good, 3);
  // Window: first measured send (1.0) to the last end (the failures, at 6.01).
  EXPECT_NEAR(s.window_s, 5.01, 1e-9);
  EXPECT_NEAR(s.goodput, 3 / 5.01, 1e-9);
  EXPECT_NEAR(s.goodput_ratio, 3.0 / 7, 1e-9);
  EXPECT_NEAR(s.request_throughput, 5 / 5.01, 1e-9);
  // Output tokens of succeeded requests: 4 + 3 + 4 + 3 + 1.
  EXPECT_NEAR(s.output_token_throughput, 15 / 5.01, 1e-9);
  EXPECT_EQ(s.ttft.count, 5);
  EXPECT_DOUBLE_EQ(s.ttft.p50, 0.5);
  EXPECT_DOUBLE_EQ(s.ttft.max, 1.5);
  EXPECT_EQ(s.itl.count, 10);  // pooled gaps
  EXPECT_EQ(s.tpot.count, 4);  // requests with >= 2 tokens
  EXPECT_EQ(s.e2e.count, 5);

  const nlohmann::json j = ToJson(s);
  EXPECT_EQ(j["goodput"]["good_requests"], 3);
  EXPECT_EQ(j["requests"]["failures_by_code"]["UNAVAILABLE"], 1);
  EXPECT_NE(ToTable(s, "t").find("goodput"), std::string::npos);
  const std::string row = MarkdownRow(s, "setup A");
  EXPECT_EQ(row.rfind("| setup A | 5 / 7 |", 0), 0u) << row;
  EXPECT_NE(row.find("| 0.60 (43%) |"), std::string::npos) << row;
  EXPECT_NE(MarkdownHeader().find("goodput"), std::string::npos);
}

TEST(StatsTest, StatusCodeNames) {
  EXPECT_EQ(StatusCodeName(0), "OK");
  EXPECT_EQ(StatusCodeName(4), "DEADLINE_EXCEEDED");
  EXPECT_EQ(StatusCodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(StatusCodeName(99), "CODE_99");
}

}  // namespace
}  // namespace pdserve::loadgen
