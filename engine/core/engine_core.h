// EngineCore: the step loop every engine role runs, written once.
//
//   admit -> plan -> enqueue -> (hand out the previous step) -> run -> apply
//
// The core owns the Scheduler (engine/scheduler/scheduler.h) and the lock
// that guards it, and runs one engine thread. A role (prefill worker, decode
// worker, colocated baseline) differs only by a small EnginePolicy: what it
// gives the scheduler before a plan (the decode role's speculative
// proposals), what a planned step carries besides its batch (KV sessions, stream timings),
// how a step runs once enqueued (the prefill role queues each layer's KV on
// its transfer while the next layer computes), how results are applied under
// the lock, and how they are handed out (tickets, streams, KV sends) without
// it.
//
// Wake-ups. The loop plans when something may have changed what can run:
// after every step, and after every change made through Change() — a request
// arrival, a cancel, blocks freed after a KV send, a transfer done. An idle
// loop waits for such a change; `idle_poll` is only a safety net, and
// WakeStats counts how each wait ended (tests assert that the events, not the
// poll, started the work). A role must therefore make every change to the
// scheduler through Change() (or from a policy method, on the loop itself).
//
// Overlap. The runner is asynchronous (Enqueue returns at once; the CPU
// runner computes on its own thread, the CUDA runner on its streams). With
// `overlap_delivery`, the results of step n are applied under the lock (the
// scheduler needs them to plan), step n+1 is planned and enqueued, and only
// then are step n's results handed out (streams, tickets, KV first tokens,
// metrics) while step n+1 computes. Step n+1 cannot be planned before step n
// completes: its decode tokens are step n's samples, and the runner takes
// tokens from the host. delivery_stats() says how long the hand-outs took
// and how much of that ran beside a step (bench/overlap_bench.cc).
//
// Threads and locks: the engine thread runs the loop and every EnginePolicy /
// EngineStep method. Other threads (gRPC handlers, transport callbacks) read
// and change the scheduler and the role's own tables through Read() and
// Change(), under the core's lock (mu()); the role's tables are guarded by
// that same lock. A sequence in a step is never freed under the runner
// (Scheduler::Cancel defers it to the step's end).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/runtime/model_runner.h"
#include "engine/scheduler/scheduler.h"

namespace pdserve::engine {

struct EngineCoreOptions {
  SchedulerOptions scheduler;
  // Hand step n's results out while step n+1 computes (see above); false:
  // before planning step n+1.
  bool overlap_delivery = true;
  // An idle loop plans again after this long even when nothing woke it (a
  // safety net: every change that can unblock work wakes it at once).
  absl::Duration idle_poll = absl::Milliseconds(100);
  // Failed steps in a row after which the core reports itself unhealthy.
  int unhealthy_after_failed_steps = 3;
  // Steps last about this long: a step's new tokens are capped at the
  // measured rate times this (never below one prefill chunk, never above the
  // plan's max_batch_tokens), so a cancelled or newly arrived prompt waits at
  // most about this for the step in progress. Zero: no cap.
  absl::Duration step_target = absl::ZeroDuration();
};

// What the router's liveness judgement reads (heartbeats).
struct EngineProgress {
  uint64_t steps_completed = 0;  // since start, failed ones included
  // The last plan had a step to run and sequences wait or run: work the
  // engine can step now (not prompts waiting for blocks KV sends still hold).
  bool has_work = false;
  double tokens_per_second = 0;  // new tokens per second, moving average over busy steps
  std::string unhealthy_reason;  // why the engine cannot serve; empty: it can
};

// How the loop's idle waits ended.
struct WakeStats {
  uint64_t plans = 0;            // Schedule() calls
  uint64_t steps = 0;            // steps enqueued
  uint64_t event_wakeups = 0;    // idle waits ended by a change (Change(), Stop())
  uint64_t poll_wakeups = 0;     // idle waits ended by idle_poll
  uint64_t poll_found_work = 0;  // of these, plans that found a step nothing had announced
  // The loop waits for a change now and none is pending: what it planned
  // last reflects every change made so far.
  bool idle = false;
};

// Time the loop spent handing results out (EngineStep::Deliver and the
// step's release): the host work overlap_delivery hides behind the next
// step.
struct DeliveryStats {
  uint64_t deliveries = 0;        // steps handed out
  uint64_t overlapped = 0;        // of these, while the next step computed
  double seconds = 0;             // in all of them
  double overlapped_seconds = 0;  // in the overlapped ones
};

// Times of one step, for the role's metrics.
struct StepTiming {
  double plan_seconds = 0;  // Schedule()
  absl::Time planned;       // the plan was made (the step's prompts start)
  absl::Time enqueued;      // the runner took it
  absl::Time completed;     // its result was in
  double seconds() const { return absl::ToDoubleSeconds(completed - enqueued); }
};

// One planned step's role-specific state, made by EnginePolicy::BeginStep.
class EngineStep {
 public:
  virtual ~EngineStep() = default;
  // Without the lock, right after the step was enqueued: drives it to its
  // result. The default waits for it.
  virtual absl::StatusOr<StepOutput> Run(const ScheduledStep& step, StepHandle& handle) {
    return handle.Wait();
  }
  // Under the lock, after Scheduler::Complete: `updates` are in batch order
  // (one per sequence of the step).
  virtual void Apply(const std::vector<SequenceUpdate>& updates,
                     const absl::StatusOr<StepOutput>& output, const StepTiming& timing) = 0;
  // Without the lock: hands out what Apply collected. With overlap_delivery
  // this runs while the next step computes.
  virtual void Deliver() {}
};

// The role's part of the loop. Every method runs on the engine thread, under
// the core's lock.
class EnginePolicy {
 public:
  virtual ~EnginePolicy() = default;
  // Right before every plan: what the role gives the scheduler for it (the
  // decode role's speculative proposals, Scheduler::SetProposal). Not
  // counted in the plan's seconds.
  virtual void BeforePlan() {}
  // After every plan, empty or not: sequences the plan preempted (queued
  // again) or failed (already freed), prefix-cache counters.
  virtual void OnPlanned(const ScheduledStep& step, double plan_seconds) = 0;
  // For a non-empty plan: the step's own state. `now`: when it was planned.
  virtual std::unique_ptr<EngineStep> BeginStep(const ScheduledStep& step, absl::Time now) = 0;
  // After every plan and every applied step: the role's gauges.
  virtual void UpdateGauges() {}
};

class EngineCore {
 public:
  // `runner` and `policy` must outlive the core; the loop starts with Start().
  EngineCore(EngineCoreOptions options, ModelRunner* runner, EnginePolicy* policy);
  ~EngineCore();  // Stop()

  // Starts the engine thread (call once the policy is fully constructed).
  void Start();
  // From now on Access::stopping() is true (a role refuses new work) and the
  // loop ends after the step in flight; returns at once.
  void RequestStop();
  // RequestStop(), then waits for the loop to end (the step in flight
  // applied and handed out) and joins the thread. Idempotent. Sequences
  // still in the scheduler stay there for the role to fail.
  void Stop();

  // Scoped access to the scheduler under the core's lock. A Change wakes the
  // loop when it ends: every change that can unblock work (an arrival, a
  // cancel, blocks freed, a transfer done) goes through one.
  class Access {
   public:
    Access(const Access&) = delete;
    Access& operator=(const Access&) = delete;
    ~Access() ABSL_UNLOCK_FUNCTION();
    Scheduler& scheduler() { return core_.scheduler_; }
    // True once Stop() began: no new work should be accepted.
    bool stopping() const { return core_.stop_; }

   private:
    friend class EngineCore;
    Access(EngineCore& core, bool wake) ABSL_EXCLUSIVE_LOCK_FUNCTION(core.mu_);
    EngineCore& core_;
    const bool wake_;
  };
  Access Change() { return Access(*this, true); }
  Access Read() const { return Access(const_cast<EngineCore&>(*this), false); }
  // The scheduler, for EnginePolicy and EngineStep methods (which run under
  // the lock).
  Scheduler& scheduler_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return scheduler_; }
  // The lock of Access, for the role's annotations and its read-only paths.
  absl::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }

  EngineProgress progress() const;
  // progress() for a caller that holds the lock (an Access).
  EngineProgress ProgressLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WakeStats wake_stats() const;
  DeliveryStats delivery_stats() const;
  ModelRunner& runner() const { return *runner_; }

 private:
  void Loop();
  // Plans under the lock; null when there is nothing to run.
  struct Planned;
  std::unique_ptr<Planned> PlanLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineCoreOptions options_;
  ModelRunner* const runner_;
  EnginePolicy* const policy_;

  mutable absl::Mutex mu_;
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = true;  // plan again before waiting
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stepping_ ABSL_GUARDED_BY(mu_) = false;  // the last plan had a step
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;   // in the idle wait
  uint64_t steps_completed_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_steps_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_step_error_ ABSL_GUARDED_BY(mu_);
  WakeStats wake_stats_ ABSL_GUARDED_BY(mu_);
  DeliveryStats delivery_stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: runs Loop() over everything above
};

}  // namespace pdserve::engine
