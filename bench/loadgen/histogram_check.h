// Checks the server's latency histograms against what the load generator
// measured itself: Prometheus estimates a quantile from bucket counts
// (histogram_quantile: linear interpolation inside the bucket that holds
// it), so the buckets decide how far a dashboard's p99 can be from the
// clients' p99. The load generator scrapes the server's /metrics before and
// after its run and compares the quantiles of the difference with the
// percentiles of the same requests, warm-up included. Pure but for Scrape.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/prometheus_text.h"
#include "nlohmann/json.hpp"

namespace pdserve::loadgen {

// Cumulative bucket counts of histogram `name` in a text exposition, summed
// over its label sets: upper bound (le, +Inf included) -> count.
using Buckets = HistogramBuckets;
Buckets ParseHistogram(const std::string& exposition, const std::string& name);
// after - before, bucket by bucket (a bucket missing before counts 0).
inline Buckets Subtract(const Buckets& after, const Buckets& before) {
  return SubtractBuckets(after, before);
}
using ::pdserve::HistogramQuantile;

// GET http://host:port/metrics.
absl::StatusOr<std::string> Scrape(const std::string& host_port);

struct QuantileCheck {
  double q = 0;
  double client = 0;  // the load generator's percentile (numpy's linear)
  // The same values under Prometheus's rank rule: the ceil(q n)-th smallest,
  // what histogram_quantile tends to as buckets narrow. With few values the
  // two rules differ at the tail (the p99 of 45 values: numpy interpolates
  // between the two largest, the rank rule takes the largest), whatever
  // the buckets.
  double client_rank_rule = 0;
  double histogram = 0;  // histogram_quantile over the run's buckets
  double relative_difference() const { return client > 0 ? histogram / client - 1 : 0; }
  double bucket_error() const {
    return client_rank_rule > 0 ? histogram / client_rank_rule - 1 : 0;
  }
};
struct HistogramCheck {
  std::string metric;
  double observations = 0;               // in the histogram, over the run
  std::vector<QuantileCheck> quantiles;  // p50, p90, p99
};
// `client_values`: the values the load generator measured (all of them).
HistogramCheck CheckHistogram(const std::string& metric, const Buckets& run_buckets,
                              const std::vector<double>& client_values);

nlohmann::json ToJson(const std::vector<HistogramCheck>& checks);
std::string ToTable(const std::vector<HistogramCheck>& checks);
std::string HistogramMarkdownHeader();
// One row: label, then per metric "client / histogram (difference)" per
// quantile, then each metric's p99 bucket error (against the rank rule).
std::string HistogramMarkdownRow(const std::vector<HistogramCheck>& checks,
                                 const std::string& label);

}  // namespace pdserve::loadgen
