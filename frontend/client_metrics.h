// Prometheus metrics of a front end: the client-facing view (TTFT, ITL, E2E,
// how every request ended). The router and the colocated baseline register
// the same series, so the same dashboards and alerts read both.
#pragma once

#include <string>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::frontend {

// Every value the labels below take. The series of each are created at
// start-up with value 0, so that rate() sees the first increment and
// dashboards show a flat zero rather than nothing.
inline const std::vector<std::string> kFinishLabels = {"length",   "stop",  "context", "cancelled",
                                                       "deadline", "error", "rejected"};
inline const std::vector<std::string> kRejectReasons = {
    "invalid_argument", "capacity",           "overloaded",  "draining", "no_prefill_worker",
    "no_decode_worker", "resource_exhausted", "unavailable", "other"};

struct ClientMetrics {
  // Registers the series in `registry`, which must outlive this struct.
  explicit ClientMetrics(prometheus::Registry& registry);

  prometheus::Histogram& time_to_first_token;
  prometheus::Histogram& inter_token_latency;
  // Per request: its mean gap after the first token (TPOT), observed when
  // it ends with two tokens or more. A per-request SLO on decode speed
  // reads this one; a stall of a few gaps moves it less than the gaps' own
  // quantiles.
  prometheus::Histogram& time_per_output_token;
  prometheus::Histogram& e2e_latency;
  prometheus::Histogram& queue_time;
  prometheus::Family<prometheus::Counter>& requests;  // label finish_reason
  prometheus::Counter& prompt_tokens;
  // max_tokens of admitted requests: the most each may generate. Against
  // generation_tokens it gives the share of it requests use, and with that
  // the decode demand of what was just admitted (the planner's lead on a
  // shift towards longer answers).
  prometheus::Counter& requested_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Gauge& in_flight;
  prometheus::Family<prometheus::Counter>& rejected;  // label reason

  // finish_reason: length, stop, context, cancelled, deadline, error or
  // rejected. Each request is counted exactly once.
  void CountFinished(const std::string& finish_reason) {
    requests.Add({{"finish_reason", finish_reason}}).Increment();
  }
  // A refusal: pdserve_requests_rejected_total{reason} and
  // pdserve_requests_total{finish_reason="rejected"}, once each.
  void CountRejected(const std::string& reason) {
    rejected.Add({{"reason", reason}}).Increment();
    CountFinished("rejected");
  }
};

}  // namespace pdserve::frontend
