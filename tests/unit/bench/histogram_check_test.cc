// The load generator's histogram check: exposition parsing and Prometheus's
// histogram_quantile, on cases whose answers Prometheus itself gives (the
// first two are the p99s that promtool reports in
// deploy/prometheus/pdserve.rules.test.yml).
#include "bench/loadgen/histogram_check.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace pdserve::loadgen {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(HistogramQuantileTest, InterpolatesInsideTheBucketAsPrometheusDoes) {
  // Every observation in (2, 5]: p99 = 2 + 3 * 0.99.
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.99, {{1, 0}, {2, 0}, {5, 10}, {kInf, 10}}), 4.97);
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.99, {{0.2, 0}, {0.5, 100}, {kInf, 100}}), 0.497);
  // The first bucket starts at 0.
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.5, {{1, 4}, {2, 4}, {kInf, 4}}), 0.5);
  // A rank in the +Inf bucket reads as the largest finite bound.
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.9, {{1, 5}, {2, 8}, {kInf, 10}}), 2);
  // Exactly on a bucket's cumulative count: that bucket's upper bound.
  EXPECT_DOUBLE_EQ(HistogramQuantile(0.5, {{1, 5}, {2, 10}, {kInf, 10}}), 1);
}

TEST(HistogramQuantileTest, NoInfBucketOrNoObservationsIsNaN) {
  EXPECT_TRUE(std::isnan(HistogramQuantile(0.5, {{1, 1}, {2, 2}})));
  EXPECT_TRUE(std::isnan(HistogramQuantile(0.5, {{1, 0}, {kInf, 0}})));
  EXPECT_TRUE(std::isinf(HistogramQuantile(1.5, {{1, 1}, {kInf, 1}})));
}

TEST(ParseHistogramTest, SumsLabelSetsAndSubtractsRuns) {
  const std::string before = R"(# TYPE pdserve_x_seconds histogram
pdserve_x_seconds_bucket{le="0.1"} 1
pdserve_x_seconds_bucket{le="+Inf"} 2
pdserve_x_seconds_count 2
pdserve_other_bucket{le="0.1"} 7
)";
  const std::string after = R"(pdserve_x_seconds_bucket{pool="a",le="0.1"} 3
pdserve_x_seconds_bucket{pool="a",le="+Inf"} 5
pdserve_x_seconds_bucket{pool="b",le="0.1"} 1
pdserve_x_seconds_bucket{pool="b",le="+Inf"} 1
)";
  const Buckets b = ParseHistogram(before, "pdserve_x_seconds");
  EXPECT_EQ(b, (Buckets{{0.1, 1}, {kInf, 2}}));
  const Buckets run = Subtract(ParseHistogram(after, "pdserve_x_seconds"), b);
  EXPECT_EQ(run, (Buckets{{0.1, 3}, {kInf, 4}}));
}

TEST(CheckHistogramTest, ComparesWithTheClientsPercentiles) {
  // Ten client values 0.1 .. 1.0 against buckets holding them exactly.
  std::vector<double> values;
  Buckets buckets;
  for (int i = 1; i <= 10; ++i) {
    values.push_back(0.1 * i);
    buckets[0.1 * i] = i;
  }
  buckets[kInf] = 10;
  const HistogramCheck c = CheckHistogram("m", buckets, values);
  EXPECT_EQ(c.observations, 10);
  ASSERT_EQ(c.quantiles.size(), 3u);
  EXPECT_DOUBLE_EQ(c.quantiles[0].client, 0.55);    // numpy: between the 5th and 6th
  EXPECT_DOUBLE_EQ(c.quantiles[0].histogram, 0.5);  // Prometheus: rank 5 in (0.4, 0.5]
  EXPECT_NEAR(c.quantiles[0].relative_difference(), 0.5 / 0.55 - 1, 1e-12);
  // Rank rule: the 5th smallest (ceil(0.5 * 10)); p99: the 10th.
  EXPECT_DOUBLE_EQ(c.quantiles[0].client_rank_rule, 0.5);
  EXPECT_DOUBLE_EQ(c.quantiles[2].client_rank_rule, 1.0);
  EXPECT_NEAR(c.quantiles[0].bucket_error(), 0, 1e-12);
  EXPECT_NE(HistogramMarkdownRow({c}, "run").find("| run | 550.0 / 500.0 (-9%)"), std::string::npos)
      << HistogramMarkdownRow({c}, "run");
}

}  // namespace
}  // namespace pdserve::loadgen
