// Reading Prometheus's text exposition format (what every /metrics here
// serves) and Prometheus's histogram_quantile over cumulative buckets.
// Pure: no I/O. Used by the load generator's histogram check and by the
// planner when it scrapes the pods itself.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve {

// One sample line: name{labels} value (a timestamp, if any, is dropped).
struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Every sample of `exposition`; comment and malformed lines are skipped.
std::vector<MetricSample> ParseExposition(std::string_view exposition);

// Cumulative bucket counts of a histogram: upper bound (le; +Inf included)
// -> count.
using HistogramBuckets = std::map<double, double>;

// The `name`_bucket series of `samples`, summed over their other labels.
HistogramBuckets HistogramOf(const std::vector<MetricSample>& samples, std::string_view name);
// Sum of the samples named exactly `name` whose labels include `match`;
// `found` (when given) says whether any sample matched.
double SumOf(const std::vector<MetricSample>& samples, std::string_view name,
             const std::map<std::string, std::string>& match = {}, bool* found = nullptr);

// after - before, bucket by bucket (a bucket missing before counts 0).
HistogramBuckets SubtractBuckets(const HistogramBuckets& after, const HistogramBuckets& before);
// Prometheus's histogram_quantile (promql bucketQuantile) over cumulative
// buckets: NaN without a +Inf bucket or without observations.
double HistogramQuantile(double q, const HistogramBuckets& buckets);

}  // namespace pdserve
