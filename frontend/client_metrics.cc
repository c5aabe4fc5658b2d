#include "frontend/client_metrics.h"

#include "common/metrics_server.h"

namespace pdserve::frontend {

ClientMetrics::ClientMetrics(prometheus::Registry& r)
    : time_to_first_token(MakeHistogram(r, "pdserve_time_to_first_token_seconds",
                                        "Request arrival to first token sent",
                                        TimeToFirstTokenBuckets())),
      inter_token_latency(MakeHistogram(r, "pdserve_inter_token_latency_seconds",
                                        "Time between consecutive streamed tokens",
                                        InterTokenLatencyBuckets())),
      time_per_output_token(MakeHistogram(
          r, "pdserve_time_per_output_token_seconds",
          "Per request: mean time between its streamed tokens after the first (TPOT), "
          "observed when it ends with two tokens or more",
          InterTokenLatencyBuckets())),
      e2e_latency(MakeHistogram(r, "pdserve_e2e_request_latency_seconds",
                                "Request arrival to last message", LatencyBuckets())),
      queue_time(MakeHistogram(r, "pdserve_request_queue_time_seconds",
                               "Arrival to prefill start (router and prefill queue)",
                               LatencyBuckets())),
      requests(
          prometheus::BuildCounter()
              .Name("pdserve_requests_total")
              .Help("Every request once, by how it ended: length, stop, context, cancelled, "
                    "deadline, error, or rejected (see pdserve_requests_rejected_total for why)")
              .Register(r)),
      prompt_tokens(prometheus::BuildCounter()
                        .Name("pdserve_prompt_tokens_total")
                        .Help("Prompt tokens of admitted requests")
                        .Register(r)
                        .Add({})),
      requested_tokens(
          prometheus::BuildCounter()
              .Name("pdserve_requested_max_tokens_total")
              .Help("max_tokens of admitted requests: the most tokens they may generate")
              .Register(r)
              .Add({})),
      generation_tokens(prometheus::BuildCounter()
                            .Name("pdserve_generation_tokens_total")
                            .Help("Tokens streamed to clients")
                            .Register(r)
                            .Add({})),
      in_flight(prometheus::BuildGauge()
                    .Name("pdserve_requests_in_flight")
                    .Help("Requests being served")
                    .Register(r)
                    .Add({})),
      rejected(prometheus::BuildCounter()
                   .Name("pdserve_requests_rejected_total")
                   .Help("Requests refused before generation, by reason")
                   .Register(r)) {
  for (const std::string& label : kFinishLabels) requests.Add({{"finish_reason", label}});
  for (const std::string& reason : kRejectReasons) rejected.Add({{"reason", reason}});
}

}  // namespace pdserve::frontend
