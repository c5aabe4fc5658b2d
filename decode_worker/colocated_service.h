// pdserve.v1.Generation served by one colocated process: the router's input
// checks (router/request_validation.h), then the colocated engine, streamed
// back with incremental detokenization and the router's client-facing
// metrics and timings, so clients and bench/loadgen see the same API as
// with the disaggregated cluster. Stop strings and logprobs are refused
// (UNIMPLEMENTED): the baseline serves the token path only.
#pragma once

#include <atomic>
#include <string>

#include "decode_worker/colocated_engine.h"
#include "engine/model/config.h"
#include "text/tokenizer.h"
#include "pdserve/v1/generation.grpc.pb.h"
#include "router/prompt_source.h"
#include "router/router_metrics.h"

namespace pdserve::colocated {

class ColocatedService final : public v1::Generation::Service {
 public:
  // Every pointer must outlive the service. `worker_id` names this process in
  // the final message's timings (prefill_worker and decode_worker).
  ColocatedService(ColocatedEngine* engine, const router::PromptSource* prompt_source,
                   router::RouterMetrics* metrics, std::string worker_id);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;

  // While draining, new calls get UNAVAILABLE; streams in flight finish.
  void SetDraining(bool draining) { draining_.store(draining); }
  int in_flight() const { return in_flight_.load(); }

 private:
  grpc::Status Serve(grpc::ServerContext* context, const v1::GenerateRequest& request,
                     grpc::ServerWriter<v1::GenerateResponse>* writer, absl::Time arrival,
                     std::string* finish_label);

  ColocatedEngine* const engine_;
  const router::PromptSource* const prompt_source_;
  router::RouterMetrics* const metrics_;
  const std::string worker_id_;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> seed_counter_;
};

}  // namespace pdserve::colocated
