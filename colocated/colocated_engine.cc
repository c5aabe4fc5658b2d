#include "colocated/colocated_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace pdserve::colocated {
namespace {

engine::SchedulerOptions SchedulerOptionsFor(const ColocatedOptions& o) {
  return {.role = engine::SchedulerRole::kColocated,
          .plan = {.max_num_seqs = o.max_running,
                   .max_batch_tokens = o.max_prefill_tokens,
                   .max_prefill_chunk_tokens = o.max_prefill_chunk_tokens,
                   .separate_prefill_steps = o.max_prefill_chunk_tokens == 0},
          .enable_prefix_caching = o.enable_prefix_caching,
          .kv_headroom_tokens = o.kv_headroom_tokens};
}

}  // namespace

ColocatedEngine::ColocatedEngine(ColocatedOptions options, engine::ModelRunner* runner,
                                 ColocatedMetrics* metrics)
    : options_(options),
      runner_(runner),
      metrics_(metrics),
      scheduler_(SchedulerOptionsFor(options), runner->config(), runner->num_kv_blocks(),
                 runner->kv_block_size()) {
  {
    absl::MutexLock lock(&mu_);
    UpdateGaugesLocked();
  }
  thread_ = std::thread([this] { Loop(); });
}

ColocatedEngine::~ColocatedEngine() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : entries_) {
    entry.stream->Push({.error = absl::UnavailableError("colocated server is shutting down")});
  }
}

absl::StatusOr<std::shared_ptr<ColocatedStream>> ColocatedEngine::Submit(ColocatedRequest request) {
  const engine::ModelConfig& config = runner_->config();
  if (absl::Status s = engine::ValidateGenerationRequest(request.prompt, request.sampling, config);
      !s.ok()) {
    return s;
  }
  const int kv_tokens = static_cast<int>(request.prompt.size()) + request.sampling.max_tokens;
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("colocated server is shutting down");
  if (scheduler_.num_waiting() >= options_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("colocated server queue full (", options_.max_waiting, " prompts)"));
  }
  const engine::SeqId id = next_seq_++;
  if (absl::Status s =
          scheduler_.AddPrompt(id, std::move(request.prompt), std::move(request.sampling));
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt + max_tokens (", kv_tokens, " tokens) exceed the whole KV cache: ", s.message()));
  }
  auto stream = std::make_shared<ColocatedStream>(id);
  entries_.emplace(id, Entry{.stream = stream, .submitted = absl::Now()});
  wake_ = true;
  UpdateGaugesLocked();
  return stream;
}

void ColocatedEngine::Cancel(const ColocatedStream& stream) {
  absl::MutexLock lock(&mu_);
  if (!entries_.contains(stream.seq())) return;
  // Freed now, or by the engine thread when the step it is in ends.
  if (scheduler_.Cancel(stream.seq())) {
    entries_.erase(stream.seq());
    UpdateGaugesLocked();
  }
}

void ColocatedEngine::UpdateGaugesLocked() {
  metrics_->waiting_sequences.Set(scheduler_.num_waiting());
  metrics_->running_sequences.Set(scheduler_.num_running());
  metrics_->kv_cache_usage.Set(scheduler_.kv().usage_ratio());
}

ColocatedLoad ColocatedEngine::load() const {
  absl::MutexLock lock(&mu_);
  return ColocatedLoad{.waiting = scheduler_.num_waiting(),
                       .running = scheduler_.num_running(),
                       .free_blocks = scheduler_.kv().num_free_blocks(),
                       .total_blocks = scheduler_.kv().num_blocks()};
}

void ColocatedEngine::Loop() {
  while (true) {
    engine::ScheduledStep step;
    bool prompt_work = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      if (stop_) return;
      wake_ = false;
      const absl::Time plan_start = absl::Now();
      step = scheduler_.Schedule();
      const absl::Time now = absl::Now();
      metrics_->scheduler_step_seconds.Observe(absl::ToDoubleSeconds(now - plan_start));
      metrics_->prefix_cache_queries.Increment(step.prefix_query_tokens);
      metrics_->prefix_cache_hits.Increment(step.prefix_hit_tokens);
      metrics_->preemptions.Increment(static_cast<double>(step.preempted.size()));
      for (const auto& [id, why] : step.failed) {
        auto it = entries_.find(id);
        if (it == entries_.end()) continue;
        it->second.stream->Push({.error = why});
        entries_.erase(it);
      }
      if (!step.preempted.empty()) wake_ = true;  // readmission may be possible at once
      if (step.empty()) {
        UpdateGaugesLocked();
        continue;
      }
      wake_ = true;  // plan again right after this step
      for (size_t i = 0; i < step.ids.size(); ++i) {
        Entry& entry = entries_.at(step.ids[i]);
        if (step.admitted[i] && !entry.first_sent) {
          entry.queue_seconds = absl::ToDoubleSeconds(now - entry.submitted);
        }
      }
      prompt_work = step.prompt_work;
      UpdateGaugesLocked();
    }

    const absl::Time start = absl::Now();
    const absl::StatusOr<engine::StepOutput> output = runner_->Step(step.batch);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (prompt_work) {
      metrics_->prefill_step_seconds.Observe(seconds);
      metrics_->prefill_steps.Increment();
    } else {
      metrics_->decode_step_seconds.Observe(seconds);
      metrics_->decode_steps.Increment();
    }
    if (!output.ok()) PDSERVE_LOG(ERROR) << "step failed: " << output.status();

    absl::MutexLock lock(&mu_);
    for (const engine::SequenceUpdate& u : scheduler_.Complete(step, output)) {
      auto it = entries_.find(u.id);
      if (it == entries_.end()) continue;
      Entry& entry = it->second;
      if (u.cancelled) {
        entries_.erase(it);
        continue;
      }
      if (!u.error.ok()) {
        entry.stream->Push(
            {.error = absl::InternalError(absl::StrCat("step failed: ", u.error.message()))});
        entries_.erase(it);
        continue;
      }
      if (!u.token.has_value()) continue;  // a chunk of a longer prompt
      ColocatedOutput out{.tokens = {u.token->token}};
      if (!entry.first_sent) {
        out.queue_seconds = entry.queue_seconds;
        entry.first_sent = true;
      }
      if (u.finish != engine::FinishReason::kNone) {
        out.finished = true;
        out.finish_reason = u.finish;
      }
      entry.stream->Push(std::move(out));
      if (u.freed) entries_.erase(it);
    }
    UpdateGaugesLocked();
  }
}

}  // namespace pdserve::colocated
