// The planner's own metrics (prefix pdserve_planner_), served on its
// /metrics. One series per pool (label pool="prefill"|"decode"); the reason
// of the latest decision is the `reason` label of pdserve_planner_decision
// (1 on the current reason, 0 on every other: a bounded set).
#pragma once

#include "planner/decision.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace pdserve::planner {

struct PlannerMetrics {
  explicit PlannerMetrics(prometheus::Registry& r);

  // Exports one decision (and what it was based on).
  void Record(const Decision& decision, const Observation& observation,
              const PlannerOptions& options);
  // A scaling the actuator carried out, or failed to.
  void CountScaling(Pool pool, bool up);
  void CountActuationFailure(Pool pool);
  void CountInterval(bool ok);

  prometheus::Family<prometheus::Gauge>& desired_replicas;
  prometheus::Family<prometheus::Gauge>& current_replicas;
  prometheus::Family<prometheus::Gauge>& ready_workers;
  prometheus::Family<prometheus::Gauge>& decision;
  prometheus::Family<prometheus::Gauge>& observed_latency;
  prometheus::Family<prometheus::Gauge>& predicted_latency;
  prometheus::Family<prometheus::Gauge>& slo;
  prometheus::Family<prometheus::Gauge>& load;
  prometheus::Family<prometheus::Gauge>& forecast_load;
  prometheus::Family<prometheus::Gauge>& capacity_per_worker;
  prometheus::Family<prometheus::Counter>& scalings;
  prometheus::Family<prometheus::Counter>& actuation_failures;
  prometheus::Family<prometheus::Counter>& intervals;
  prometheus::Gauge& dry_run;
  // The workload as read (NaN when absent): requests/s, mean prompt,
  // output and requested (max_tokens) tokens per request, the share of
  // max_tokens answers use (as the decision learnt it), queued prompt
  // tokens, prefill speed while busy, decode sequences held and the decode
  // pool's mean KV usage.
  prometheus::Family<prometheus::Gauge>& input;
};

}  // namespace pdserve::planner
