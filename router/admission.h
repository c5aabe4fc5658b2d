// The router's admission: whether the pools can take one more request now,
// and a bounded queue for those that must wait. Pure bookkeeping with time
// as an input (no threads, no clocks); the orchestration
// (router/disaggregated_orchestrator.h) owns one queue and asks it.
//
// Capacity is read from the workers' reports and this router's own
// accounting since (router/worker_registry.h): a request fits when some
// decode worker can reserve its KV (free blocks, sequence slots) and some
// prefill worker whose KV it accepts has a short enough queue (prompt
// tokens under `prefill_queue_batches` of its steps, and with
// `prefill_queue_seconds` under that many seconds of its work). Requests that do not
// fit wait here, in order of priority (lower first), first come first
// served within one, until they fit, their deadline passes or they waited
// `max_wait`; when the queue is full, a request is refused at once (the
// estimated wait is its retry hint). Nothing is accepted
// and later failed for lack of room: a worker that refuses for lack of room
// puts the request back at the head of the queue.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <utility>

#include "absl/time/time.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace pdserve::router {

struct AdmissionOptions {
  // Requests waiting at the router at most; beyond, refused at once.
  int max_queued = 1024;
  // Longest wait at the router; beyond, refused (RESOURCE_EXHAUSTED).
  absl::Duration max_wait = absl::Seconds(120);
  // A prefill worker is sent prompts while the tokens queued there stay
  // under this many of its steps (its reported max_batch_tokens; 4096 when
  // it reports none). A worker with nothing queued takes any one prompt.
  int prefill_queue_batches = 4;
  // And, where > 0, while they take no more than this many seconds at the
  // rate the worker reports (LoadReport::tokens_per_second; a worker that
  // reports none is bounded by the steps alone). The rest wait here, so a
  // worker that joins the pool takes the backlog at once instead of the
  // new arrivals only (late binding: what an autoscaler's new worker needs).
  double prefill_queue_seconds = 0;
};

// What a request needs.
struct AdmissionQuery {
  int prompt_tokens = 0;  // prompt + tokens already generated
  int max_tokens = 0;     // still to generate
};

// Whether a request fits the pools now. Empty pools, or pools with no
// prefill and decode worker whose KV matches, fit (placing then fails at
// once with its own error, which is clearer than a wait).
bool HasCapacity(std::span<const WorkerView> prefill, std::span<const WorkerView> decode,
                 const AdmissionQuery& query, const AdmissionOptions& options);

// Whether some decode worker's whole KV cache (as reported) could ever hold
// `query`'s reservation; true while no worker has reported its size. A
// request that fits none is refused at once: waiting would not help.
bool CouldEverFit(std::span<const WorkerView> decode, const AdmissionQuery& query);

// How long prompt tokens queued at the router (`router_tokens`) and on the
// prefill workers take to compute, at the rate the workers report; nullopt
// when no worker has reported a rate yet.
std::optional<absl::Duration> EstimateQueueWait(std::span<const WorkerView> prefill,
                                                int64_t router_tokens);

class AdmissionQueue {
 public:
  using Ticket = uint64_t;
  struct Waiting {
    Ticket ticket = 0;
    int priority = 0;
    absl::Time enqueued;
    absl::Time deadline = absl::InfiniteFuture();  // the request's own
    int64_t tokens = 0;
  };
  enum class Why { kDeadline, kMaxWait };

  explicit AdmissionQueue(AdmissionOptions options) : options_(options) {}

  // Queues a request; false when the queue is full. `front`: ahead of
  // everything of its priority (a request a worker refused for lack of
  // room, which had waited its turn already).
  bool Push(const Waiting& w, bool front = false);
  // The request to admit next; nullptr when none waits.
  const Waiting* Head() const;
  // Takes `ticket` out (admitted, cancelled); false if it was not queued.
  bool Remove(Ticket ticket);
  // Takes out the requests whose deadline or max_wait passed at `now`.
  std::vector<std::pair<Ticket, Why>> Expire(absl::Time now);

  int size() const { return static_cast<int>(order_.size()); }
  int64_t tokens() const { return tokens_; }
  const AdmissionOptions& options() const { return options_; }

 private:
  // (priority, sequence): lower first. A request pushed to the front gets
  // a sequence below every earlier one.
  using Key = std::tuple<int, int64_t>;
  const AdmissionOptions options_;
  std::map<Key, Waiting> order_;
  std::map<Ticket, Key> keys_;
  int64_t next_back_ = 0;
  int64_t next_front_ = -1;
  int64_t tokens_ = 0;
};

}  // namespace pdserve::router
