// Prometheus metrics of the colocated engine (its scheduler's view). The
// client-facing histograms (TTFT, ITL, E2E) are the front end's, from
// frontend/client_metrics.h, as on the router, so the same dashboard panels
// read both setups.
#pragma once

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::colocated {

struct ColocatedMetrics {
  explicit ColocatedMetrics(prometheus::Registry& registry);

  prometheus::Gauge& waiting_sequences;   // queued for prefill
  prometheus::Gauge& running_sequences;   // in the decode batch
  prometheus::Gauge& kv_cache_usage;      // pdserve_kv_cache_usage_ratio
  prometheus::Histogram& prefill_step_seconds;
  prometheus::Histogram& decode_step_seconds;
  prometheus::Histogram& scheduler_step_seconds;  // pdserve_scheduler_step_seconds
  prometheus::Counter& prefill_steps;
  prometheus::Counter& decode_steps;
  prometheus::Counter& prefix_cache_queries;  // tokens looked up at admission
  prometheus::Counter& prefix_cache_hits;     // tokens found cached
  prometheus::Counter& preemptions;           // sequences preempted for lack of KV blocks
};

}  // namespace pdserve::colocated
