// EngineCore: see engine_core.h.
#include "engine/core/engine_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace pdserve::engine {

struct EngineCore::Planned {
  ScheduledStep step;
  std::unique_ptr<EngineStep> work;
  StepTiming timing;
};

EngineCore::Access::Access(EngineCore& core, bool wake) : core_(core), wake_(wake) {
  core_.mu_.Lock();
}

EngineCore::Access::~Access() {
  if (wake_) core_.wake_ = true;
  core_.mu_.Unlock();
}

EngineCore::EngineCore(EngineCoreOptions options, ModelRunner* runner, EnginePolicy* policy)
    : options_(std::move(options)),
      runner_(runner),
      policy_(policy),
      scheduler_(options_.scheduler, runner->config(), runner->num_kv_blocks(),
                 runner->kv_block_size()) {}

EngineCore::~EngineCore() { Stop(); }

void EngineCore::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void EngineCore::RequestStop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
}

void EngineCore::Stop() {
  RequestStop();
  if (thread_.joinable()) thread_.join();
}

EngineProgress EngineCore::progress() const {
  absl::MutexLock lock(&mu_);
  return ProgressLocked();
}

EngineProgress EngineCore::ProgressLocked() const {
  EngineProgress p{.steps_completed = steps_completed_,
                   .has_work = stepping_ && scheduler_.num_running() + scheduler_.num_waiting() > 0,
                   .tokens_per_second = tokens_per_second_};
  if (failed_steps_in_a_row_ >= options_.unhealthy_after_failed_steps) {
    p.unhealthy_reason =
        absl::StrCat("its last ", failed_steps_in_a_row_, " steps failed: ", last_step_error_);
  }
  return p;
}

WakeStats EngineCore::wake_stats() const {
  absl::MutexLock lock(&mu_);
  WakeStats stats = wake_stats_;
  stats.idle = waiting_ && !wake_ && !stop_;
  return stats;
}

DeliveryStats EngineCore::delivery_stats() const {
  absl::MutexLock lock(&mu_);
  return delivery_stats_;
}

std::unique_ptr<EngineCore::Planned> EngineCore::PlanLocked() {
  wake_ = false;
  policy_->BeforePlan();
  auto planned = std::make_unique<Planned>();
  const absl::Time plan_start = absl::Now();
  if (options_.step_target > absl::ZeroDuration() && tokens_per_second_ > 0) {
    const PlanOptions& plan = options_.scheduler.plan;
    const int floor =
        plan.max_prefill_chunk_tokens > 0 ? plan.max_prefill_chunk_tokens : plan.max_batch_tokens;
    const double timed = std::min<double>(
        tokens_per_second_ * absl::ToDoubleSeconds(options_.step_target), plan.max_batch_tokens);
    scheduler_.set_step_token_limit(
        std::min(plan.max_batch_tokens, std::max(floor, static_cast<int>(timed))));
  }
  planned->step = scheduler_.Schedule();
  const absl::Time now = absl::Now();
  ++wake_stats_.plans;
  planned->timing.plan_seconds = absl::ToDoubleSeconds(now - plan_start);
  planned->timing.planned = now;
  policy_->OnPlanned(planned->step, planned->timing.plan_seconds);
  // Preempted sequences may be readmitted at once.
  if (!planned->step.preempted.empty()) wake_ = true;
  stepping_ = !planned->step.empty();
  if (planned->step.empty()) {
    policy_->UpdateGauges();
    return nullptr;
  }
  wake_ = true;  // plan again right after this step
  planned->work = policy_->BeginStep(planned->step, now);
  policy_->UpdateGauges();
  return planned;
}

void EngineCore::Loop() {
  // A step applied whose results are not handed out yet.
  std::unique_ptr<EngineStep> undelivered;
  // `overlapped`: the next step is enqueued and computes meanwhile.
  auto deliver = [this, &undelivered](bool overlapped) {
    if (undelivered == nullptr) return;
    const absl::Time start = absl::Now();
    undelivered->Deliver();
    undelivered.reset();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    absl::MutexLock lock(&mu_);
    ++delivery_stats_.deliveries;
    delivery_stats_.seconds += seconds;
    if (overlapped) {
      ++delivery_stats_.overlapped;
      delivery_stats_.overlapped_seconds += seconds;
    }
  };
  while (true) {
    if (undelivered != nullptr) {
      bool idle;
      {
        absl::MutexLock lock(&mu_);
        idle = !wake_ && !stop_;
      }
      if (idle) deliver(false);  // before waiting for a change
    }
    std::unique_ptr<Planned> planned;
    {
      absl::MutexLock lock(&mu_);
      bool polled = false;
      if (!wake_ && !stop_) {
        auto changed = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return wake_ || stop_; };
        waiting_ = true;
        const bool woken = mu_.AwaitWithTimeout(absl::Condition(&changed), options_.idle_poll);
        waiting_ = false;
        if (woken) {
          ++wake_stats_.event_wakeups;
        } else {
          ++wake_stats_.poll_wakeups;
          polled = true;
        }
      }
      if (stop_) break;
      planned = PlanLocked();
      if (planned == nullptr) continue;
      if (polled) ++wake_stats_.poll_found_work;
      ++wake_stats_.steps;
    }

    ScheduledStep& step = planned->step;
    absl::StatusOr<StepOutput> output;
    {
      planned->timing.enqueued = absl::Now();
      absl::StatusOr<std::unique_ptr<StepHandle>> handle = runner_->Enqueue(step.batch);
      deliver(handle.ok());  // step n-1's results go out while step n computes
      output = handle.ok() ? planned->work->Run(step, **handle) : handle.status();
      planned->timing.completed = absl::Now();
    }  // the handle is dropped: the runner no longer reads the step's spans
    if (!output.ok()) PDSERVE_LOG(ERROR) << "engine step failed: " << output.status();

    {
      absl::MutexLock lock(&mu_);
      ++steps_completed_;
      if (output.ok()) {
        failed_steps_in_a_row_ = 0;
        const double seconds = planned->timing.seconds();
        if (seconds > 0) {
          const double rate = step.num_tokens / seconds;
          tokens_per_second_ =
              tokens_per_second_ == 0 ? rate : 0.8 * tokens_per_second_ + 0.2 * rate;
        }
      } else {
        ++failed_steps_in_a_row_;
        last_step_error_ = std::string(output.status().message());
      }
      const std::vector<SequenceUpdate> updates = scheduler_.Complete(step, output);
      planned->work->Apply(updates, output, planned->timing);
      policy_->UpdateGauges();
    }
    undelivered = std::move(planned->work);
    if (!options_.overlap_delivery) deliver(false);
  }
  deliver(false);
}

}  // namespace pdserve::engine
