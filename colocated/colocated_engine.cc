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
      core_(
          {.scheduler = SchedulerOptionsFor(options), .overlap_delivery = options.overlap_delivery},
          runner, this) {
  {
    auto access = core_.Read();
    UpdateGaugesLocked();
  }
  core_.Start();
}

ColocatedEngine::~ColocatedEngine() {
  core_.Stop();
  auto access = core_.Read();
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
  const bool logprobs = request.sampling.logprobs >= 0;
  auto access = core_.Change();
  engine::Scheduler& scheduler = access.scheduler();
  if (access.stopping()) return absl::UnavailableError("colocated server is shutting down");
  if (scheduler.num_waiting() >= options_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("colocated server queue full (", options_.max_waiting, " prompts)"));
  }
  const engine::SeqId id = next_seq_++;
  if (absl::Status s =
          scheduler.AddPrompt(id, std::move(request.prompt), std::move(request.sampling));
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt + max_tokens (", kv_tokens, " tokens) exceed the whole KV cache: ", s.message()));
  }
  auto stream = std::make_shared<ColocatedStream>(id);
  entries_.emplace(id, Entry{.stream = stream, .submitted = absl::Now(), .logprobs = logprobs});
  UpdateGaugesLocked();
  return stream;
}

void ColocatedEngine::Cancel(const ColocatedStream& stream) {
  auto access = core_.Change();
  if (!entries_.contains(stream.seq())) return;
  // Freed now, or by the engine thread when the step it is in ends.
  if (access.scheduler().Cancel(stream.seq())) {
    entries_.erase(stream.seq());
    UpdateGaugesLocked();
  }
}

void ColocatedEngine::UpdateGaugesLocked() {
  const engine::Scheduler& scheduler = core_.scheduler_locked();
  metrics_->waiting_sequences.Set(scheduler.num_waiting());
  metrics_->running_sequences.Set(scheduler.num_running());
  metrics_->kv_cache_usage.Set(scheduler.kv().usage_ratio());
}

ColocatedLoad ColocatedEngine::load() const {
  auto access = core_.Read();
  const engine::Scheduler& scheduler = access.scheduler();
  return ColocatedLoad{.waiting = scheduler.num_waiting(),
                       .running = scheduler.num_running(),
                       .free_blocks = scheduler.kv().num_free_blocks(),
                       .total_blocks = scheduler.kv().num_blocks()};
}

void ColocatedEngine::OnPlanned(const engine::ScheduledStep& step, double plan_seconds) {
  metrics_->scheduler_step_seconds.Observe(plan_seconds);
  metrics_->prefix_cache_queries.Increment(step.prefix_query_tokens);
  metrics_->prefix_cache_hits.Increment(step.prefix_hit_tokens);
  metrics_->preemptions.Increment(static_cast<double>(step.preempted.size()));
  for (const auto& [id, why] : step.failed) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    it->second.stream->Push({.error = why});
    entries_.erase(it);
  }
}

// One planned step: prompt work or decodes (the step-time histograms tell
// them apart), then the tokens it produced, pushed after the lock.
class ColocatedEngine::Step final : public engine::EngineStep {
 public:
  Step(ColocatedEngine* engine, bool prompt_work) : engine_(*engine), prompt_work_(prompt_work) {}

  void Apply(const std::vector<engine::SequenceUpdate>& updates,
             const absl::StatusOr<engine::StepOutput>& output,
             const engine::StepTiming& timing) override {
    seconds_ = timing.seconds();
    for (const engine::SequenceUpdate& u : updates) {
      auto it = engine_.entries_.find(u.id);
      if (it == engine_.entries_.end()) continue;
      Entry& entry = it->second;
      if (u.cancelled) {
        engine_.entries_.erase(it);
        continue;
      }
      if (!u.error.ok()) {
        out_.push_back(
            {entry.stream,
             {.error = absl::InternalError(absl::StrCat("step failed: ", u.error.message()))}});
        engine_.entries_.erase(it);
        continue;
      }
      if (!u.token.has_value()) continue;  // a chunk of a longer prompt
      ColocatedOutput out{.tokens = {u.token->token}};
      if (entry.logprobs) out.logprobs.push_back(*u.token);
      if (!entry.first_sent) {
        out.queue_seconds = entry.queue_seconds;
        entry.first_sent = true;
      }
      if (u.finish != engine::FinishReason::kNone) {
        out.finished = true;
        out.finish_reason = u.finish;
      }
      out_.push_back({entry.stream, std::move(out)});
      if (u.freed) engine_.entries_.erase(it);
    }
  }

  void Deliver() override {
    ColocatedMetrics& metrics = *engine_.metrics_;
    if (prompt_work_) {
      metrics.prefill_step_seconds.Observe(seconds_);
      metrics.prefill_steps.Increment();
    } else {
      metrics.decode_step_seconds.Observe(seconds_);
      metrics.decode_steps.Increment();
    }
    for (auto& [stream, out] : out_) stream->Push(std::move(out));
  }

 private:
  ColocatedEngine& engine_;
  const bool prompt_work_;
  double seconds_ = 0;
  std::vector<std::pair<std::shared_ptr<ColocatedStream>, ColocatedOutput>> out_;
};

std::unique_ptr<engine::EngineStep> ColocatedEngine::BeginStep(const engine::ScheduledStep& step,
                                                               absl::Time now) {
  for (size_t i = 0; i < step.ids.size(); ++i) {
    Entry& entry = entries_.at(step.ids[i]);
    if (step.admitted[i] && !entry.first_sent) {
      entry.queue_seconds = absl::ToDoubleSeconds(now - entry.submitted);
    }
  }
  return std::make_unique<Step>(this, step.prompt_work);
}

}  // namespace pdserve::colocated
