// Prometheus metrics of a decode worker. Created once per process on an
// injected registry; the engine updates them.
#pragma once

#include "common/spec_decode_metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::decode {

struct DecodeMetrics {
  explicit DecodeMetrics(prometheus::Registry& registry);

  prometheus::Gauge& running_sequences;     // in the decode batch
  prometheus::Gauge& waiting_kv_sequences;  // reserved, KV not yet complete
  prometheus::Gauge& kv_cache_usage;        // pdserve_kv_cache_usage_ratio
  prometheus::Histogram& step_seconds;
  prometheus::Histogram& scheduler_step_seconds;  // pdserve_scheduler_step_seconds
  prometheus::Histogram& batch_size;
  prometheus::Counter& generation_tokens;
  prometheus::Gauge& achieved_bytes_per_second;  // weights + KV read per step / step time
  prometheus::Gauge& bandwidth_utilization;      // achieved / peak_memory_bandwidth
  prometheus::Gauge& peak_memory_bandwidth;      // bytes/s the ratio is relative to; 0: unknown
  // Between consecutive tokens of one sequence at this worker; the first
  // gap runs from the sequence joining the batch.
  prometheus::Histogram& inter_token_latency;
  // Admission (KV reserved) to joining the batch: the wait for the prompt's
  // prefill and KV (the decode pool's queue, as a request sees it).
  prometheus::Histogram& kv_wait;
  prometheus::Counter& kv_received_bytes;
  prometheus::Counter& kv_receive_failures;
  prometheus::Counter& requests_admitted;
  prometheus::Counter& requests_rejected;
  // Sequences preempted for lack of KV blocks (recomputed later).
  prometheus::Counter& preemptions;
  SpecDecodeMetrics spec;  // speculative decoding (zero when off)
};

}  // namespace pdserve::decode
