// The n choices (OpenAI's `n` > 1) of one request, each a RequestSession of
// its own (its own seed, admission slot, worker calls and metrics), run
// side by side and merged into one stream of outputs tagged with the
// choice's index.
//
// Prefill once: choice 0 starts first, and the others start only once its
// first output arrived. By then its prompt is computed on a prefill worker,
// whose KV cache holds the prompt's full blocks under their content hashes
// (in use or evictable), and the router counts them among what that worker
// caches; the prefix-aware routing sends the followers there, and each
// computes only the tokens after the last full block before the prompt's
// last token (pdserve_prefix_cache_hits_total grows by the rest). Waiting
// for one prefill costs the followers that prefill's time, which they
// would spend computing the prompt themselves.
//
// Each choice runs on a thread of its own that owns its session (a
// session is used from one thread); outputs queue for the caller. Stop ends
// every choice still running as if its client went away.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "frontend/request.h"
#include "frontend/request_session.h"

namespace pdserve::frontend {

// The requests of n choices of `base`: request ids `<id>-<i>`, and where
// `base` has a seed s, choice i the seed s + i (else each draws its own).
std::vector<Request> ChoiceRequests(const Request& base, const std::string& id, int n);

class ChoiceFanout {
 public:
  // What choice `index` produced next: a delta (the last one `finished`),
  // or the error that ended it.
  struct Output {
    int index = 0;
    absl::StatusOr<Delta> delta;
  };

  // Starts choice 0 (`requests[0]`), waits for its first delta (asking
  // `gone` every `poll`), then starts the others. Errors: choice 0's
  // refusal or failure before its first delta, or CANCELLED when `gone`
  // said so (choice 0 is then ended as cancelled). The followers' own
  // refusals come as their outputs. `sessions` must outlive the fan-out.
  static absl::StatusOr<std::unique_ptr<ChoiceFanout>> Start(SessionManager& sessions,
                                                             std::vector<Request> requests,
                                                             const CallInfo& call,
                                                             const std::function<bool()>& gone,
                                                             absl::Duration poll);

  // Stops what still runs and joins the choices' threads.
  ~ChoiceFanout();

  // The next output, waiting up to `timeout`; nullopt when none came. After
  // a choice's finished delta or error it gives nothing more for it.
  std::optional<Output> Next(absl::Duration timeout);

  // Ends every choice still running (cancelled: the client left, or another
  // choice failed). Idempotent; returns at once, the threads end within `poll`.
  void Stop() { stop_.store(true); }

  int size() const { return static_cast<int>(requests_.size()); }

 private:
  ChoiceFanout(SessionManager& sessions, std::vector<Request> requests, const CallInfo& call,
               absl::Duration poll);
  // Choice `index`'s thread: starts its session unless given one, then
  // relays its deltas to the end.
  void Run(int index, std::unique_ptr<RequestSession> session);
  void Push(int index, absl::StatusOr<Delta> delta);

  SessionManager& sessions_;
  const std::vector<Request> requests_;
  const CallInfo call_;
  const absl::Duration poll_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::deque<Output> outputs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;  // last: they use the above
};

}  // namespace pdserve::frontend
