// The router's orchestration (frontend/orchestrator.h) over the internal
// worker services: reserve KV on a decode worker (trying the next one on a
// refusal), dispatch the prompt to a prefill worker that sends the KV to that
// reservation and returns the first token, then relay the decode worker's
// token stream. Workers are picked by the routing policy from the registry's
// live workers, and the registry counts what was sent to each.
//
// Worker calls use gRPC's callback API: no thread waits on a worker; events
// are queued for the session, which reads them with Generation::Next. The
// decode worker may stream tokens before the prefill worker's reply arrives;
// they are held back until the first token is out. Cancelling a generation
// cancels both calls, which frees the request's KV on both workers.
//
// Fault handling is meant to live here, behind the same interface: a failure
// before the first token can re-run placement on other workers; after it,
// the generation knows the prompt, the job's seed and every token it has
// relayed, so it can re-prefill prompt + generated tokens on another pair
// and keep feeding the same event queue. The session and the adapters do not
// change.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "frontend/orchestrator.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace pdserve::router {

class DisaggregatedOrchestrator final : public frontend::Orchestrator {
 public:
  // `registry`, `policy` and `metrics` must outlive the orchestrator and
  // every generation it started.
  DisaggregatedOrchestrator(WorkerRegistry* registry, const RoutingPolicy* policy,
                            RouterMetrics* metrics);

  // Refusals: UNAVAILABLE with reason no_decode_worker or no_prefill_worker
  // when a pool is empty; the decode workers' own status (RESOURCE_EXHAUSTED
  // when every one is full) when each refused; INVALID_ARGUMENT when a worker
  // refused the input.
  absl::StatusOr<std::unique_ptr<frontend::Generation>> Start(frontend::GenerationJob job) override;

  internal::v1::PrefillWorker::Stub& PrefillStub(const std::string& address);
  internal::v1::DecodeWorker::Stub& DecodeStub(const std::string& address);
  WorkerRegistry& registry() { return *registry_; }
  const RoutingPolicy* policy() const { return policy_; }
  RouterMetrics& metrics() { return *metrics_; }

 private:
  WorkerRegistry* const registry_;
  const RoutingPolicy* const policy_;
  RouterMetrics* const metrics_;

  absl::Mutex stubs_mu_;
  // Never erased: calls in flight refer to them.
  std::map<std::string, std::unique_ptr<internal::v1::PrefillWorker::Stub>> prefill_stubs_
      ABSL_GUARDED_BY(stubs_mu_);
  std::map<std::string, std::unique_ptr<internal::v1::DecodeWorker::Stub>> decode_stubs_
      ABSL_GUARDED_BY(stubs_mu_);
};

}  // namespace pdserve::router
