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
// Faults are handled here, behind the same interface (the session and the
// adapters do not see them). A generation is run by attempts: one decode
// reservation plus one prefill. When an attempt fails (a worker call ends
// with an error we did not ask for, a stream ends without finishing, or
// nothing arrives for `stall_timeout`), the generation starts another
// attempt on other workers, up to `max_attempts` in all and within the
// request's deadline. Before the first token this is a retry
// (pdserve_retries_total{pool}); after it, a migration
// (pdserve_migrations_total{reason}): the new attempt prefills the prompt
// plus every token already relayed, and the new decode worker continues
// from there. Sampling draws depend only on (seed, position), and the
// relayed tokens count toward max_tokens and the penalties on the workers,
// so the client's stream goes on without a gap or a repeat, with the tokens
// an uninterrupted run gives. Tokens of a failed attempt that were not yet
// relayed are dropped (the next attempt computes them again).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "frontend/orchestrator.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace pdserve::router {

struct OrchestratorOptions {
  // Attempts a generation may use in all (the first placement, retries and
  // migrations); at least 1.
  int max_attempts = 3;
  // A decode worker that does not answer a reservation, a prefill that
  // does not answer, or a decode stream that relays no token for this long
  // is treated as failed. Zero: never (the request's deadline still holds).
  absl::Duration stall_timeout = absl::ZeroDuration();
  // The served model (EOS ids, context length), outliving the orchestrator.
  // A failure after a relayed token that ended the run (engine::CheckFinish:
  // EOS, a stop token id, max_tokens, the context) finishes the stream with
  // that reason instead of moving the request: only the finish was lost.
  // Null: only a max_tokens stop is recognised.
  const engine::ModelConfig* model = nullptr;
};

class DisaggregatedOrchestrator final : public frontend::Orchestrator {
 public:
  // `registry`, `policy` and `metrics` must outlive the orchestrator and
  // every generation it started.
  DisaggregatedOrchestrator(WorkerRegistry* registry, const RoutingPolicy* policy,
                            RouterMetrics* metrics, OrchestratorOptions options = {});

  // Refusals: UNAVAILABLE with reason no_decode_worker or no_prefill_worker
  // when a pool is empty; the decode workers' own status (RESOURCE_EXHAUSTED
  // when every one is full) when each refused; INVALID_ARGUMENT when a worker
  // refused the input.
  absl::StatusOr<std::unique_ptr<frontend::Generation>> Start(frontend::GenerationJob job) override;

  // The stub (and channel) of a worker address; a call holds it until it
  // ends. Making one for a new address first drops those of addresses no
  // live worker has that no call holds: workers that come and go (pods
  // restarted on new addresses) do not leave channels behind.
  std::shared_ptr<internal::v1::PrefillWorker::Stub> PrefillStub(const std::string& address);
  std::shared_ptr<internal::v1::DecodeWorker::Stub> DecodeStub(const std::string& address);
  // Worker addresses with a stub held now (prefill and decode).
  int channel_count();
  WorkerRegistry& registry() { return *registry_; }
  const RoutingPolicy* policy() const { return policy_; }
  RouterMetrics& metrics() { return *metrics_; }
  const OrchestratorOptions& options() const { return options_; }

 private:
  const OrchestratorOptions options_;
  WorkerRegistry* const registry_;
  const RoutingPolicy* const policy_;
  RouterMetrics* const metrics_;

  // Drops the stubs of addresses no live worker has and no call holds.
  void PruneStubsLocked(const std::set<std::string>& live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stubs_mu_);
  // Addresses of the live workers of both pools.
  std::set<std::string> LiveAddresses();

  template <typename Service>
  using StubMap = std::map<std::string, std::shared_ptr<typename Service::Stub>>;
  // The stub of `address` in `stubs` (one of the maps below), made (after
  // pruning) when there is none.
  template <typename Service>
  std::shared_ptr<typename Service::Stub> CachedStub(StubMap<Service>& stubs,
                                                     const std::string& address);

  absl::Mutex stubs_mu_;
  StubMap<internal::v1::PrefillWorker> prefill_stubs_ ABSL_GUARDED_BY(stubs_mu_);
  StubMap<internal::v1::DecodeWorker> decode_stubs_ ABSL_GUARDED_BY(stubs_mu_);
};

}  // namespace pdserve::router
