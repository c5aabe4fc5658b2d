// The client-facing Generate call: validate and tokenize, admit, reserve KV on
// a decode worker, prefill on a prefill worker (first token), then proxy the
// decode worker's token stream to the client with incremental detokenization.
// Client cancellation and deadlines propagate to both workers' calls.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/model/config.h"
#include "text/tokenizer.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "pdserve/v1/generation.grpc.pb.h"
#include "router/request_validation.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace pdserve::router {

struct GenerationOptions {
  int max_in_flight = 1024;  // beyond: RESOURCE_EXHAUSTED
};

class GenerationService final : public v1::Generation::Service {
 public:
  // Every pointer must outlive the service.
  GenerationService(GenerationOptions options, const PromptSource* prompt_source,
                    WorkerRegistry* registry, const RoutingPolicy* policy, RouterMetrics* metrics);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;

  int in_flight() const { return in_flight_.load(); }
  // While draining (after SIGTERM), new Generate calls get UNAVAILABLE
  // "router is draining"; streams in flight finish.
  void SetDraining(bool draining) { draining_.store(draining); }

 private:
  internal::v1::PrefillWorker::Stub& PrefillStub(const std::string& address);
  internal::v1::DecodeWorker::Stub& DecodeStub(const std::string& address);
  grpc::Status Serve(grpc::ServerContext* context, const v1::GenerateRequest& request,
                     grpc::ServerWriter<v1::GenerateResponse>* writer, absl::Time arrival,
                     std::string* finish_label);

  const GenerationOptions options_;
  const PromptSource* const prompt_source_;
  WorkerRegistry* const registry_;
  const RoutingPolicy* const policy_;
  RouterMetrics* const metrics_;
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> seed_counter_;

  absl::Mutex stubs_mu_;
  std::map<std::string, std::unique_ptr<internal::v1::PrefillWorker::Stub>> prefill_stubs_
      ABSL_GUARDED_BY(stubs_mu_);
  std::map<std::string, std::unique_ptr<internal::v1::DecodeWorker::Stub>> decode_stubs_
      ABSL_GUARDED_BY(stubs_mu_);
};

}  // namespace pdserve::router
