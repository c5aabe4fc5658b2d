#include "colocated/colocated_metrics.h"

#include "common/metrics_server.h"
#include "common/scheduler_metrics.h"

namespace pdserve::colocated {

ColocatedMetrics::ColocatedMetrics(prometheus::Registry& r)
    : waiting_sequences(
          MakeGauge(r, "pdserve_colocated_waiting_sequences", "Prompts waiting for prefill")),
      running_sequences(
          MakeGauge(r, "pdserve_colocated_running_sequences", "Sequences in the decode batch")),
      kv_cache_usage(
          MakeGauge(r, "pdserve_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use")),
      prefill_step_seconds(MakeHistogram(r, "pdserve_colocated_prefill_step_seconds",
                                         "Wall time of one prefill step", LatencyBuckets())),
      decode_step_seconds(MakeHistogram(r, "pdserve_colocated_decode_step_seconds",
                                        "Wall time of one decode step", TokenLatencyBuckets())),
      scheduler_step_seconds(MakeSchedulerStepHistogram(r)),
      prefill_steps(MakeCounter(r, "pdserve_colocated_prefill_steps_total", "Prefill steps run")),
      decode_steps(MakeCounter(r, "pdserve_colocated_decode_steps_total", "Decode steps run")),
      prefix_cache_queries(MakePrefixCacheQueriesCounter(r)),
      prefix_cache_hits(MakePrefixCacheHitsCounter(r)),
      preemptions(MakePreemptionsCounter(r)) {}

}  // namespace pdserve::colocated
