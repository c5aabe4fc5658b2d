// A scripted orchestration for front-end tests: each started generation
// plays a list of steps (event batches, an error, or silence), and records
// what the session did to it. No threads, no servers.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

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
  std::vector<GenerationJob> jobs;  // as started
};

class FakeGeneration final : public Generation {
 public:
  FakeGeneration(std::deque<Step> script, GenerationLog* log)
      : script_(std::move(script)), log_(log) {}
  ~FakeGeneration() override { log_->destroyed.fetch_add(1); }

  // Plays the next step; when the script is over, waits out `timeout` (a
  // generation that makes no progress) unless cancelled.
  absl::Status Next(absl::Duration timeout, std::vector<GenerationEvent>* out) override {
    if (cancelled_) return absl::CancelledError("cancelled");
    if (script_.empty()) {
      absl::SleepFor(std::min(timeout, absl::Milliseconds(5)));
      return absl::OkStatus();
    }
    Step step = std::move(script_.front());
    script_.pop_front();
    for (GenerationEvent& e : step.events) out->push_back(std::move(e));
    return step.error;
  }
  void Cancel() override {
    if (!cancelled_) log_->cancelled.fetch_add(1);
    cancelled_ = true;
  }
  Placement placement() const override { return {"prefill-0", "decode-0"}; }

 private:
  std::deque<Step> script_;
  GenerationLog* const log_;
  bool cancelled_ = false;
};

class FakeOrchestrator final : public Orchestrator {
 public:
  // Every generation plays `script`; Start fails with `refusal` when set.
  std::deque<Step> script;
  absl::Status refusal;
  GenerationLog log;

  absl::StatusOr<std::unique_ptr<Generation>> Start(GenerationJob job) override {
    if (!refusal.ok()) return refusal;
    log.started.fetch_add(1);
    log.jobs.push_back(std::move(job));
    return std::make_unique<FakeGeneration>(script, &log);
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
