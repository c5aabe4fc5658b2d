// Where the planner's Observation comes from: Prometheus's HTTP API
// (prometheus_source.h) or the processes' own /metrics, scraped by the
// planner (scrape_source.h). Both reduce the same series the same way.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "planner/observation.h"

namespace pdserve::planner {

// The series an Observation is made of, exported by the router
// (frontend/client_metrics.cc, router/router_metrics.cc) and the workers
// (prefill_worker/prefill_metrics.cc, decode_worker/decode_metrics.cc).
inline constexpr char kTtftMetric[] = "pdserve_time_to_first_token_seconds";
inline constexpr char kItlMetric[] = "pdserve_inter_token_latency_seconds";
// Per request, its mean gap (TPOT): the decode latency with --decode_latency=tpot.
inline constexpr char kTpotMetric[] = "pdserve_time_per_output_token_seconds";
inline constexpr char kRequestsMetric[] = "pdserve_requests_total";
inline constexpr char kPromptTokensMetric[] = "pdserve_prompt_tokens_total";
inline constexpr char kGenerationTokensMetric[] = "pdserve_generation_tokens_total";
inline constexpr char kRequestedTokensMetric[] = "pdserve_requested_max_tokens_total";
inline constexpr char kPoolWorkersMetric[] = "pdserve_pool_workers";
inline constexpr char kQueuedTokensMetric[] = "pdserve_prefill_queued_tokens";
inline constexpr char kPrefillBatchTokensMetric[] = "pdserve_prefill_batch_tokens";
inline constexpr char kPrefillStepSecondsMetric[] = "pdserve_prefill_step_seconds";
inline constexpr char kRunningSequencesMetric[] = "pdserve_decode_running_sequences";
inline constexpr char kWaitingKvSequencesMetric[] = "pdserve_decode_waiting_kv_sequences";
inline constexpr char kKvUsageMetric[] = "pdserve_kv_cache_usage_ratio";

class MetricsSource {
 public:
  virtual ~MetricsSource() = default;
  // The metrics as of `now` over the trailing window. Never fails as a
  // whole: what cannot be read is left empty (see observation.h).
  virtual Observation Read(absl::Time now) = 0;
  virtual std::string Describe() const = 0;
};

}  // namespace pdserve::planner
