// Prometheus metrics of the router (the client-facing view: TTFT, ITL, E2E).
#pragma once

#include <string>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::router {

// Every value the labels below take. The series of each are created at
// start-up with value 0, so that rate() sees the first increment and
// dashboards show a flat zero rather than nothing.
inline const std::vector<std::string> kFinishLabels = {"length",   "stop",  "context", "cancelled",
                                                       "deadline", "error", "rejected"};
inline const std::vector<std::string> kRejectReasons = {
    "invalid_argument", "capacity",           "draining",    "no_prefill_worker",
    "no_decode_worker", "resource_exhausted", "unavailable", "other"};
inline const std::vector<std::string> kPools = {"prefill", "decode"};

struct RouterMetrics {
  explicit RouterMetrics(prometheus::Registry& registry);

  prometheus::Histogram& time_to_first_token;
  prometheus::Histogram& inter_token_latency;
  prometheus::Histogram& e2e_latency;
  prometheus::Histogram& queue_time;
  prometheus::Family<prometheus::Counter>& requests;  // label finish_reason
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Gauge& in_flight;
  prometheus::Family<prometheus::Counter>& rejected;  // label reason
  prometheus::Family<prometheus::Gauge>& pool_size;   // label pool
  // Worker calls that failed after the request was placed on the worker
  // (prefill call error, decode stream cut), label pool.
  prometheus::Family<prometheus::Counter>& worker_failures;
  // The request was offered to another worker of the pool after one refused
  // or failed, label pool.
  prometheus::Family<prometheus::Counter>& retries;

  void CountFinished(const std::string& finish_reason) {
    requests.Add({{"finish_reason", finish_reason}}).Increment();
  }
  void CountRejected(const std::string& reason) { rejected.Add({{"reason", reason}}).Increment(); }
  void CountWorkerFailure(const std::string& pool) {
    worker_failures.Add({{"pool", pool}}).Increment();
  }
  void CountRetry(const std::string& pool) { retries.Add({{"pool", pool}}).Increment(); }
  // Counts a Generate call once it has ended: as `finish_label` when the call
  // set one (a finish reason, or "rejected"), else by how it failed.
  void CountEnded(const std::string& finish_label, bool failed, bool cancelled,
                  bool deadline_exceeded) {
    if (!finish_label.empty()) {
      CountFinished(finish_label);
    } else if (failed) {
      CountFinished(cancelled ? "cancelled" : deadline_exceeded ? "deadline" : "error");
    }
  }
};

}  // namespace pdserve::router
