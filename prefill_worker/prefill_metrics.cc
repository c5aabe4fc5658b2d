#include "prefill_worker/prefill_metrics.h"

#include <string>

#include "common/metrics_server.h"
#include "common/scheduler_metrics.h"
#include "kvtransfer/transport.h"

namespace pdserve::prefill {

PrefillMetrics::PrefillMetrics(prometheus::Registry& r)
    : queue_depth(
          MakeGauge(r, "pdserve_prefill_queue_depth", "Prefill requests waiting for a batch")),
      queued_tokens(
          MakeGauge(r, "pdserve_prefill_queued_tokens", "Prompt tokens waiting for a batch")),
      batch_tokens(MakeHistogram(r, "pdserve_prefill_batch_tokens",
                                 "Prompt tokens per prefill batch",
                                 {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384})),
      step_seconds(MakeHistogram(r, "pdserve_prefill_step_seconds",
                                 "Wall time of one prefill batch", LatencyBuckets())),
      scheduler_step_seconds(MakeSchedulerStepHistogram(r)),
      requests(MakeCounter(r, "pdserve_prefill_requests_total", "Prompts prefilled")),
      prompt_tokens(
          MakeCounter(r, "pdserve_prefill_prompt_tokens_total", "Prompt tokens prefilled")),
      achieved_flops(MakeGauge(r, "pdserve_prefill_achieved_flops_per_second",
                               "Model FLOPs of the last batch / its wall time")),
      mfu(MakeGauge(r, "pdserve_prefill_mfu_ratio",
                    "Achieved FLOP/s over pdserve_prefill_peak_flops_per_second")),
      peak_flops(MakeGauge(r, "pdserve_prefill_peak_flops_per_second",
                           "Peak FLOP/s of the device: measured at start-up, or --peak_flops")),
      time_to_first_token(MakeHistogram(
          r, "pdserve_prefill_time_to_first_token_seconds",
          "Prompt queued at this worker to its first token sampled (queue and prefill)",
          TimeToFirstTokenBuckets())),
      queue_wait(MakeHistogram(r, "pdserve_prefill_queue_wait_seconds",
                               "Prompt queued at this worker to its first step (the wait in the "
                               "prefill pool's queue)",
                               TimeToFirstTokenBuckets())),
      kv_cache_usage(
          MakeGauge(r, "pdserve_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use")),
      kv_transfer_seconds(MakeHistogram(r, "pdserve_kv_transfer_seconds",
                                        "KV transfer time, first layer queued to receiver ack",
                                        LatencyBuckets())),
      kv_transfer_exposed_seconds(MakeHistogram(
          r, "pdserve_kv_transfer_exposed_seconds",
          "KV transfer time left after prefill compute ended (not hidden behind compute)",
          LatencyBuckets())),
      kv_transfer_bytes(MakeCounter(r, "pdserve_kv_transfer_bytes_total", "KV bytes sent")),
      kv_transfer_failures(prometheus::BuildCounter()
                               .Name("pdserve_kv_transfer_failures_total")
                               .Help("KV transfers that failed, by reason")
                               .Register(r)),
      prefix_cache_queries(MakePrefixCacheQueriesCounter(r)),
      prefix_cache_hits(MakePrefixCacheHitsCounter(r)) {
  for (std::string_view reason : kvtransfer::kKvFailureReasons) {
    kv_transfer_failures.Add({{"reason", std::string(reason)}});
  }
}

void PrefillMetrics::CountKvTransferFailure(const absl::Status& why) {
  kv_transfer_failures.Add({{"reason", std::string(kvtransfer::KvFailureReason(why))}}).Increment();
}

}  // namespace pdserve::prefill
