// The router's labelled counters exist from start-up, at 0, for every label
// value the router uses: rate() then sees the first increment, and panels
// show a flat zero instead of nothing. (The client-facing series are the
// front end's: tests/unit/frontend/client_metrics_test.cc.)
#include "router/router_metrics.h"

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace pdserve::router {
namespace {

TEST(RouterMetricsTest, EveryLabelValueStartsAtZero) {
  prometheus::Registry registry;
  RouterMetrics metrics(registry);
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  auto expect_zero = [&](const std::string& series) {
    EXPECT_NE(text.find(series + " 0\n"), std::string::npos) << series << " in\n" << text;
  };
  for (const std::string& pool : kPools) {
    expect_zero("pdserve_worker_failures_total{pool=\"" + pool + "\"}");
    expect_zero("pdserve_retries_total{pool=\"" + pool + "\"}");
  }
  // Counting adds to the existing series instead of creating a second one.
  metrics.CountRetry("decode");
  const std::string after = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(after.find("pdserve_retries_total{pool=\"decode\"} 1\n"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::router
