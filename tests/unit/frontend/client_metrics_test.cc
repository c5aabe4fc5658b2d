// The front end's labelled counters exist from start-up, at 0, for every
// label value it uses: rate() then sees the first increment, and panels show
// a flat zero instead of nothing.
#include "frontend/client_metrics.h"

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace pdserve::frontend {
namespace {

TEST(ClientMetricsTest, EveryLabelValueStartsAtZero) {
  prometheus::Registry registry;
  ClientMetrics metrics(registry);
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  auto expect_zero = [&](const std::string& series) {
    EXPECT_NE(text.find(series + " 0\n"), std::string::npos) << series << " in\n" << text;
  };
  for (const std::string& label : kFinishLabels) {
    expect_zero("pdserve_requests_total{finish_reason=\"" + label + "\"}");
  }
  for (const std::string& reason : kRejectReasons) {
    expect_zero("pdserve_requests_rejected_total{reason=\"" + reason + "\"}");
  }
  // Counting adds to the existing series instead of creating a second one;
  // a refusal counts in both families.
  metrics.CountRejected("capacity");
  const std::string after = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(after.find("pdserve_requests_rejected_total{reason=\"capacity\"} 1\n"),
            std::string::npos);
  EXPECT_NE(after.find("pdserve_requests_total{finish_reason=\"rejected\"} 1\n"),
            std::string::npos);
}

}  // namespace
}  // namespace pdserve::frontend
