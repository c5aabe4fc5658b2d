// A scripted orchestration for front-end tests: each started generation
// plays a list of steps (event batches, an error, or silence), and records
// what the session did to it. Tests may also feed a running generation
// (FakeGeneration::Push) from their own thread. Waiting is event-driven, as
// the Generation contract asks: a Next with nothing to return sleeps until
// events are fed, Cancel, or its timeout, and counts every call, so tests
// can assert how often a session woke. With `push` set on the orchestrator
// the generations offer push mode (SetReadyCallback, Poll).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "frontend/orchestrator.h"

namespace pdserve::frontend::testing {

struct Step {
  std::vector<GenerationEvent> events;  // returned by one Next call
  absl::Status error;                   // non-OK: Next returns it (after `events`)
};

// What the session did to the generations of one orchestrator.
struct GenerationLog {
  std::atomic<int> started{0};
  std::atomic<int> cancelled{0};
  std::atomic<int> destroyed{0};
  std::atomic<int> next_calls{0};   // Generation::Next calls, all generations
  std::vector<GenerationJob> jobs;  // as started
};

class FakeGeneration final : public Generation {
 public:
  FakeGeneration(std::deque<Step> script, GenerationLog* log)
      : log_(log), script_(std::move(script)) {}
  // As the real generation's destructor waits for its calls' reactions, it
  // waits here for a ready callback that Push is running: the session may
  // go as soon as its generation is destroyed.
  ~FakeGeneration() override {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](int* notifying) { return *notifying == 0; }, &notifying_));
    }
    log_->destroyed.fetch_add(1);
  }

  // Thread mode: plays the next step, waiting up to `timeout` for one (a
  // generation that makes no progress) unless cancelled. Push mode: appends
  // nothing; returns at once while fed events are queued, else waits for
  // the end, an error or Cancel.
  absl::Status Next(absl::Duration timeout, std::vector<GenerationEvent>* out) override {
    log_->next_calls.fetch_add(1);
    absl::MutexLock lock(&mu_);
    if (ready_ && !queued_.empty()) return absl::OkStatus();  // for Poll
    ++waiting_;
    mu_.AwaitWithTimeout(absl::Condition(this, &FakeGeneration::NextReadyLocked), timeout);
    --waiting_;
    if (ready_) {
      if (!queued_.empty()) return absl::OkStatus();
      if (!error_.ok()) return error_;
      if (cancelled_) return absl::CancelledError("cancelled");
      return absl::OkStatus();
    }
    if (cancelled_) return absl::CancelledError("cancelled");
    if (script_.empty()) return absl::OkStatus();
    Step step = std::move(script_.front());
    script_.pop_front();
    for (GenerationEvent& e : step.events) out->push_back(std::move(e));
    return step.error;
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) log_->cancelled.fetch_add(1);
    cancelled_ = true;
  }
  Placement placement() const override { return {"prefill-0", "decode-0"}; }

  bool SetReadyCallback(std::function<void()> ready) override {
    if (!push_) return false;
    absl::MutexLock lock(&mu_);
    ready_ = std::move(ready);
    return true;
  }
  void Poll(std::vector<GenerationEvent>* out) override {
    absl::MutexLock lock(&mu_);
    while (!queued_.empty()) {
      out->push_back(std::move(queued_.front()));
      queued_.pop_front();
    }
  }

  // From the test's thread, while a session runs: in thread mode the step
  // is played by the next Next; in push mode its events are queued for Poll
  // and the ready callback is called on this thread.
  void Push(Step step) {
    std::function<void()> ready;
    {
      absl::MutexLock lock(&mu_);
      if (ready_ == nullptr) {
        script_.push_back(std::move(step));
        return;
      }
      for (GenerationEvent& e : step.events) {
        finished_ = finished_ || e.finished;
        queued_.push_back(std::move(e));
      }
      if (!step.error.ok()) error_ = step.error;
      ready = ready_;
      ++notifying_;
    }
    ready();
    absl::MutexLock lock(&mu_);
    --notifying_;
  }
  // Blocks until a Next is waiting (the session's thread is asleep in it).
  void AwaitWaiting() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* waiting) { return *waiting > 0; }, &waiting_));
  }
  void set_push(bool push) { push_ = push; }

 private:
  bool NextReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_) return true;
    if (ready_) return finished_ || !error_.ok();  // tokens are Pump's
    return !script_.empty();
  }

  GenerationLog* const log_;
  bool push_ = false;  // set before the session starts
  mutable absl::Mutex mu_;
  std::deque<Step> script_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  // Push mode.
  std::function<void()> ready_ ABSL_GUARDED_BY(mu_);
  std::deque<GenerationEvent> queued_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int notifying_ ABSL_GUARDED_BY(mu_) = 0;  // ready callbacks Push is running
};

class FakeOrchestrator final : public Orchestrator {
 public:
  // Every generation plays `script`; Start fails with `refusal` when set.
  std::deque<Step> script;
  absl::Status refusal;
  bool push = false;  // generations offer push mode
  GenerationLog log;
  // The generations started, in order (valid until their sessions end).
  std::vector<FakeGeneration*> generations;

  absl::StatusOr<std::unique_ptr<Generation>> Start(GenerationJob job) override {
    if (!refusal.ok()) return refusal;
    log.jobs.push_back(std::move(job));
    auto generation = std::make_unique<FakeGeneration>(script, &log);
    generation->set_push(push);
    generations.push_back(generation.get());
    log.started.fetch_add(1);  // after the above: a test on another thread waits for it
    return generation;
  }
};

// An event with `tokens` (and logprobs -k for the k-th when `with_logprobs`).
inline GenerationEvent Tokens(std::vector<int32_t> tokens, bool with_logprobs = false) {
  GenerationEvent e;
  e.tokens = std::move(tokens);
  if (with_logprobs) {
    for (size_t k = 0; k < e.tokens.size(); ++k) {
      e.logprobs.push_back({.token = e.tokens[k], .logprob = -static_cast<float>(k + 1)});
    }
  }
  return e;
}

inline GenerationEvent Finished(engine::FinishReason reason) {
  GenerationEvent e;
  e.finished = true;
  e.finish_reason = reason;
  return e;
}

// Token ids of `text` under the byte tokenizer.
inline std::vector<int32_t> Bytes(const std::string& text) {
  std::vector<int32_t> out;
  for (unsigned char c : text) out.push_back(c);
  return out;
}

}  // namespace pdserve::frontend::testing
