// Reads the Observation from Prometheus's HTTP API (instant queries on
// /api/v1/query), from the series the router and the workers export, with
// jobs named router, prefill and decode as in deploy/prometheus and the
// ServiceMonitors. `selector` (e.g. namespace="pdserve") narrows every
// query to one deployment. A query that returns no series leaves its field
// empty (the planner freezes); a NaN quantile (no observations in the
// window) is a value.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "planner/http_client.h"
#include "planner/metrics_source.h"

namespace pdserve::planner {

struct PrometheusSourceOptions {
  std::string url;       // e.g. http://prometheus-operated.monitoring.svc:9090
  std::string selector;  // extra label matchers, comma separated; "" for none
  absl::Duration window = absl::Seconds(60);
  // The router's rates also over this shorter range (Observation::recent_*);
  // zero: not queried.
  absl::Duration rate_window = absl::ZeroDuration();
  double quantile = 0.9;
  // As ScrapeSourceOptions::decode_latency_metric.
  std::string decode_latency_metric = kItlMetric;
  HttpOptions http;
};

// The PromQL the source sends, by field (tests and docs show them).
struct PrometheusQueries {
  std::string ttft, ttft_count, itl, itl_count, request_rate, prompt_tokens, output_tokens,
      queued_tokens, prefill_busy_rate, decode_sequences, kv_usage, pool_workers, requested_tokens;
  // Over rate_window; empty when it is zero.
  std::string recent_request_rate, recent_prompt_tokens, recent_output_tokens,
      recent_requested_tokens;
};
PrometheusQueries MakeQueries(const PrometheusSourceOptions& options);

// Sends one instant query, returns the raw JSON body.
using QueryFn = std::function<absl::StatusOr<std::string>(const std::string& promql)>;

class PrometheusSource final : public MetricsSource {
 public:
  explicit PrometheusSource(PrometheusSourceOptions options);
  // For tests: answers come from `query`.
  PrometheusSource(PrometheusSourceOptions options, QueryFn query);
  Observation Read(absl::Time now) override;
  std::string Describe() const override { return "Prometheus at " + options_.url; }

 private:
  PrometheusSourceOptions options_;
  PrometheusQueries queries_;
  QueryFn query_;
};

}  // namespace pdserve::planner
