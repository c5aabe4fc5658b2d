// The planner's /metrics: what a decision was based on, as the dashboards
// read it. The workload inputs follow the observation (NaN while a series
// is absent, never 0), and the decode pool's share of max_tokens used is the
// one the decision learnt.
#include "planner/planner_metrics.h"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace pdserve::planner {
namespace {

// The value of `series` on the page (nullopt: not there).
std::optional<double> Value(const std::string& page, const std::string& series) {
  const std::string prefix = series + " ";
  for (size_t at = page.find(prefix); at != std::string::npos; at = page.find(prefix, at + 1)) {
    if (at != 0 && page[at - 1] != '\n') continue;
    return std::strtod(page.c_str() + at + prefix.size(), nullptr);
  }
  return std::nullopt;
}

std::string Input(const std::string& name) {
  return "pdserve_planner_input{name=\"" + name + "\"}";
}

Observation Busy(absl::Time t) {
  Observation o{.time = t};
  o.ttft_s = 0.4;
  o.ttft_count = 50;
  o.itl_s = 0.02;
  o.itl_count = 500;
  o.request_rate = 2;
  o.prompt_tokens_per_s = 1000;  // 500 per request
  o.output_tokens_per_s = 100;   // 50 per request
  o.prefill_queued_tokens = 0;
  o.decode_sequences = 4;
  o.decode_kv_usage = 0.2;
  o.ready_workers = {1, 1};
  return o;
}

TEST(PlannerMetricsTest, InputsFollowTheObservationAndTheShareTheDecisionLearnt) {
  prometheus::Registry registry;
  PlannerMetrics metrics(registry);
  PlannerOptions options;
  Planner planner(options);
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);

  Observation o = Busy(t0);
  o.requested_tokens_per_s = 400;  // 200 max_tokens per request, a quarter used
  const Decision d = planner.Decide(o, {1, 1});
  EXPECT_DOUBLE_EQ(d.pools[Pool::kDecode].answer_share, 0.25);
  EXPECT_TRUE(std::isnan(d.pools[Pool::kPrefill].answer_share));
  metrics.Record(d, o, options);
  std::string page = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_EQ(Value(page, Input("request_rate")), 2) << page;
  EXPECT_EQ(Value(page, Input("mean_prompt_tokens")), 500);
  EXPECT_EQ(Value(page, Input("mean_output_tokens")), 50);
  EXPECT_EQ(Value(page, Input("mean_requested_tokens")), 200);
  EXPECT_EQ(Value(page, Input("decode_answer_share")), 0.25);
  EXPECT_EQ(Value(page, Input("decode_kv_usage")), 0.2);
  EXPECT_EQ(Value(page, "pdserve_planner_desired_replicas{pool=\"decode\"}"),
            d.pools[Pool::kDecode].desired);

  // A router that does not count max_tokens: both read NaN (absent), not 0.
  Planner other(options);
  const Observation plain = Busy(t0);
  const Decision pd = other.Decide(plain, {1, 1});
  metrics.Record(pd, plain, options);
  page = prometheus::TextSerializer().Serialize(registry.Collect());
  for (const char* name : {"mean_requested_tokens", "decode_answer_share"}) {
    const std::optional<double> v = Value(page, Input(name));
    ASSERT_TRUE(v.has_value()) << name << " in\n" << page;
    EXPECT_TRUE(std::isnan(*v)) << name << " = " << *v;
  }
  EXPECT_EQ(Value(page, Input("mean_output_tokens")), 50);
}

}  // namespace
}  // namespace pdserve::planner
