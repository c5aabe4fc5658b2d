// Prometheus metrics of a prefill worker, created on an injected registry.
#pragma once

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::prefill {

struct PrefillMetrics {
  explicit PrefillMetrics(prometheus::Registry& registry);

  prometheus::Gauge& queue_depth;         // requests waiting (not yet in a batch)
  prometheus::Gauge& queued_tokens;       // their prompt tokens
  prometheus::Histogram& batch_tokens;
  prometheus::Histogram& step_seconds;
  prometheus::Histogram& scheduler_step_seconds;  // pdserve_scheduler_step_seconds
  prometheus::Counter& requests;
  prometheus::Counter& prompt_tokens;
  prometheus::Gauge& achieved_flops;      // FLOP/s of the last batch
  prometheus::Gauge& mfu;                 // achieved / peak_flops
  prometheus::Gauge& peak_flops;          // the peak MFU is relative to; 0: unknown
  // Prompt queued at this worker to its first token sampled (queue + compute).
  prometheus::Histogram& time_to_first_token;
  // Prompt queued at this worker to its first step (the wait in this
  // pool's queue).
  prometheus::Histogram& queue_wait;
  prometheus::Gauge& kv_cache_usage;      // pdserve_kv_cache_usage_ratio
  prometheus::Histogram& kv_transfer_seconds;          // first layer queued -> receiver ack
  prometheus::Histogram& kv_transfer_exposed_seconds;  // compute end -> receiver ack
  prometheus::Counter& kv_transfer_bytes;
  // pdserve_kv_transfer_failures_total{reason}: every reason of
  // kvtransfer::kKvFailureReasons exists from start-up.
  prometheus::Family<prometheus::Counter>& kv_transfer_failures;
  void CountKvTransferFailure(const absl::Status& why);
  // Prefix caching, in tokens: looked up at admission, and found cached.
  prometheus::Counter& prefix_cache_queries;
  prometheus::Counter& prefix_cache_hits;
};

}  // namespace pdserve::prefill
