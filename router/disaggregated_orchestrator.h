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
// cancels both calls, which frees the request's KV on both workers. In push
// mode (Generation::SetReadyCallback) the decode stream's reaction calls the
// session back on the gRPC thread that received the tokens; Next then wakes
// only for the first token, the end, a failed attempt, the admission queue's
// grant and cancellation, so a relayed token does not wake the session's
// thread.
//
// Faults are handled here, behind the same interface (the session and the
// adapters do not see them). A generation is run by attempts: one decode
// reservation plus one prefill. When an attempt fails (a worker call ends
// with an error we did not ask for, a stream ends without finishing, or a
// worker serving it is judged out of service), the generation starts
// another attempt on other workers, up to `max_attempts` in all and within
// the request's deadline. Before the first token this is a retry
// (pdserve_retries_total{pool}); after it, a migration
// (pdserve_migrations_total{reason}): the new attempt prefills the prompt
// plus every token already relayed, and the new decode worker continues
// from there. Sampling draws depend only on (seed, position), and the
// relayed tokens count toward max_tokens and the penalties on the workers,
// so the client's stream goes on without a gap or a repeat, with the tokens
// an uninterrupted run gives. Tokens of a failed attempt that were not yet
// relayed are dropped (the next attempt computes them again).
//
// Liveness comes from the workers, never from a request: a worker is out of
// service when its heartbeats stop, a call finds its connection broken, it
// reports itself unhealthy, or it has work and its step count stops moving
// (WorkerRegistry::Judge). A watch thread judges the workers of every
// generation each `watch_interval`. A long queue or a request's own short
// deadline never takes a worker out of service: a deadline ends that
// request only, and a worker that has not answered one request within
// `stall_timeout` (no reservation, no acceptance of the prompt) is given up
// for that request alone.
//
// Admission (router/admission.h): a request the pools cannot take now
// waits in the router's queue (priority, then arrival) until they can, or
// is refused at once with RESOURCE_EXHAUSTED and a retry hint; a worker's
// refusal for lack of room puts the request back at the head of the queue.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "frontend/orchestrator.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "router/admission.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace pdserve::router {

struct OrchestratorOptions {
  // Attempts a generation may use in all (the first placement, retries and
  // migrations); at least 1.
  int max_attempts = 3;
  // A decode worker that does not answer a reservation, or a prefill worker
  // that does not accept a prompt, for this long is given up for that
  // request (another worker is tried); the worker is not blamed. Zero:
  // never (the request's deadline still holds).
  absl::Duration stall_timeout = absl::ZeroDuration();
  // The served model (EOS ids, context length), outliving the orchestrator.
  // A failure after a relayed token that ended the run (engine::CheckFinish:
  // EOS, a stop token id, max_tokens, the context) finishes the stream with
  // that reason instead of moving the request: only the finish was lost.
  // Null: only a max_tokens stop is recognised.
  const engine::ModelConfig* model = nullptr;
  // How often the workers serving generations are judged and the admission
  // queue is looked at again (it is also looked at whenever work ends).
  absl::Duration watch_interval = absl::Milliseconds(200);
  AdmissionOptions admission;
  // The retry hint of an UNAVAILABLE for an empty pool: workers register
  // within a heartbeat interval of a router (re)start.
  absl::Duration empty_pool_retry_after = absl::Seconds(1);
};

class DisaggregatedGeneration;

class DisaggregatedOrchestrator final : public frontend::Orchestrator {
 public:
  // `registry`, `policy` and `metrics` must outlive the orchestrator and
  // every generation it started. Starts the watch thread.
  DisaggregatedOrchestrator(WorkerRegistry* registry, const RoutingPolicy* policy,
                            RouterMetrics* metrics, OrchestratorOptions options = {});
  // Joins the watch thread; every generation must be gone.
  ~DisaggregatedOrchestrator() override;

  // Places the job at once when the pools can take it, else queues it (the
  // generation is placed from Next once its turn comes). Refusals:
  // RESOURCE_EXHAUSTED "overloaded" with a retry hint when the queue is
  // full or the wait ahead would outlast the request's deadline;
  // UNAVAILABLE with reason no_decode_worker or no_prefill_worker (and a
  // retry hint) when a pool is empty; INVALID_ARGUMENT when a worker
  // refused the input.
  absl::StatusOr<std::unique_ptr<frontend::Generation>> Start(frontend::GenerationJob job) override;

  // A worker's channel and stub; a call holds them until it ends. Making
  // one for a new address first drops those of addresses no live worker
  // has that no call holds: workers that come and go (pods restarted on new
  // addresses) do not leave channels behind.
  template <typename Service>
  struct WorkerChannel {
    std::shared_ptr<grpc::Channel> channel;
    std::shared_ptr<typename Service::Stub> stub;
  };
  WorkerChannel<internal::v1::PrefillWorker> PrefillStub(const std::string& address);
  WorkerChannel<internal::v1::DecodeWorker> DecodeStub(const std::string& address);
  // Worker addresses with a stub held now (prefill and decode).
  int channel_count();
  // Requests waiting in the admission queue.
  int queued();
  WorkerRegistry& registry() { return *registry_; }
  const RoutingPolicy* policy() const { return policy_; }
  RouterMetrics& metrics() { return *metrics_; }
  const OrchestratorOptions& options() const { return options_; }

 private:
  friend class DisaggregatedGeneration;

  // Drops the stubs of addresses no live worker has and no call holds.
  void PruneStubsLocked(const std::set<std::string>& live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stubs_mu_);
  // Addresses of the live workers of both pools.
  std::set<std::string> LiveAddresses();

  template <typename Service>
  using StubMap = std::map<std::string, WorkerChannel<Service>>;
  // The stub of `address` in `stubs` (one of the maps below), made (after
  // pruning) when there is none.
  template <typename Service>
  WorkerChannel<Service> CachedStub(StubMap<Service>& stubs, const std::string& address);

  // Admission, for generations. Queues `generation` (front: it had its
  // turn and a worker refused it for lack of room); false when full.
  bool Enqueue(DisaggregatedGeneration* generation, bool front);
  // A granted generation placed itself (or gave up its grant): the next
  // may be granted. `requeued`: a worker refused it for lack of room after
  // all, so the reports overstate the room: the next grant waits for the
  // next watch round.
  void GrantUsed(DisaggregatedGeneration* generation, bool requeued);
  // Grants the head of the queue its turn when the pools can take it.
  void Pump();
  // Asks the watch thread to Pump soon (from gRPC reactions, which must not
  // take the admission lock under a generation's).
  void RequestPump();
  // Whether the pools can take `query` now.
  bool HasCapacityNow(const AdmissionQuery& query);
  // A refusal for lack of room, with the estimated wait as the retry hint.
  absl::Status Overloaded(absl::string_view why);
  // A generation is gone: out of the watch list and the queue.
  void Forget(DisaggregatedGeneration* generation);
  // Every `watch_interval`: judge the workers of every generation, expire
  // queued requests, pump the queue, update the gauges.
  void Watch();

  const OrchestratorOptions options_;
  WorkerRegistry* const registry_;
  const RoutingPolicy* const policy_;
  RouterMetrics* const metrics_;
  const absl::Time created_ = absl::Now();

  absl::Mutex stubs_mu_;
  StubMap<internal::v1::PrefillWorker> prefill_stubs_ ABSL_GUARDED_BY(stubs_mu_);
  StubMap<internal::v1::DecodeWorker> decode_stubs_ ABSL_GUARDED_BY(stubs_mu_);

  // Lock order: gens_mu_, then admission_mu_, then a generation's own, then
  // the registry's.
  absl::Mutex gens_mu_;
  std::set<DisaggregatedGeneration*> generations_ ABSL_GUARDED_BY(gens_mu_);
  absl::Mutex admission_mu_ ABSL_ACQUIRED_AFTER(gens_mu_);
  AdmissionQueue queue_ ABSL_GUARDED_BY(admission_mu_);
  std::unordered_map<AdmissionQueue::Ticket, DisaggregatedGeneration*> queued_
      ABSL_GUARDED_BY(admission_mu_);
  // The generation granted its turn and not yet placed (one at a time, so
  // that each grant sees the load of the one before).
  DisaggregatedGeneration* granted_ ABSL_GUARDED_BY(admission_mu_) = nullptr;
  std::atomic<uint64_t> next_ticket_{1};

  absl::Mutex watch_mu_;
  bool stop_ ABSL_GUARDED_BY(watch_mu_) = false;
  bool pump_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watch_thread_;  // last: runs Watch() over everything above
};

}  // namespace pdserve::router
