// The scheduling counters every process that schedules exports from
// start-up at 0 (rate() needs a sample before the first increment):
// prefix caching on prefill workers and the colocated baseline, preemptions
// on decode workers and the colocated baseline.
#include <string>

#include "colocated/colocated_metrics.h"
#include "decode_worker/decode_metrics.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_metrics.h"
#include "prometheus/text_serializer.h"

namespace pdserve {
namespace {

std::string Exposition(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

constexpr const char* kQueries = "\npdserve_prefix_cache_queries_total 0\n";
constexpr const char* kHits = "\npdserve_prefix_cache_hits_total 0\n";
constexpr const char* kPreemptions = "\npdserve_preemptions_total 0\n";

TEST(SchedulerMetricsTest, PrefillWorkersExportPrefixCacheCountersAtZero) {
  prometheus::Registry registry;
  prefill::PrefillMetrics metrics(registry);
  const std::string text = Exposition(registry);
  EXPECT_NE(text.find(kQueries), std::string::npos) << text;
  EXPECT_NE(text.find(kHits), std::string::npos);
  EXPECT_EQ(text.find("pdserve_preemptions_total"), std::string::npos);
}

TEST(SchedulerMetricsTest, DecodeWorkersExportPreemptionsAtZero) {
  prometheus::Registry registry;
  decode::DecodeMetrics metrics(registry);
  const std::string text = Exposition(registry);
  EXPECT_NE(text.find(kPreemptions), std::string::npos) << text;
  EXPECT_EQ(text.find("pdserve_prefix_cache"), std::string::npos);
}

TEST(SchedulerMetricsTest, TheColocatedBaselineExportsAllThreeAtZero) {
  prometheus::Registry registry;
  colocated::ColocatedMetrics metrics(registry);
  const std::string text = Exposition(registry);
  for (const char* want : {kQueries, kHits, kPreemptions}) {
    EXPECT_NE(text.find(want), std::string::npos) << want;
  }
  metrics.preemptions.Increment(2);
  EXPECT_NE(Exposition(registry).find("\npdserve_preemptions_total 2\n"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
