// Prometheus metrics of the router (the client-facing view: TTFT, ITL, E2E).
#pragma once

#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::router {

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

  void CountFinished(const std::string& finish_reason) {
    requests.Add({{"finish_reason", finish_reason}}).Increment();
  }
  void CountRejected(const std::string& reason) { rejected.Add({{"reason", reason}}).Increment(); }
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
