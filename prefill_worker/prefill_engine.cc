#include "prefill_worker/prefill_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace pdserve::prefill {

bool PrefillTicket::Wait(absl::Duration timeout, absl::StatusOr<PrefillOutcome>* out) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return result_.has_value(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return false;
  *out = *result_;
  return true;
}

PrefillProgress PrefillTicket::Await(absl::Duration timeout, bool started_seen) {
  absl::MutexLock lock(&mu_);
  auto changed = [this, started_seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return result_.has_value() || (started_ && !started_seen);
  };
  mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  return {.started = started_, .result = result_};
}

void PrefillTicket::Start() {
  absl::MutexLock lock(&mu_);
  started_ = true;
}

void PrefillTicket::Complete(absl::StatusOr<PrefillOutcome> result) {
  absl::MutexLock lock(&mu_);
  if (!result_.has_value()) result_ = std::move(result);
}

namespace {

engine::SchedulerOptions SchedulerOptionsFor(const PrefillEngineOptions& o) {
  return {.role = engine::SchedulerRole::kPrefill,
          .plan = {.max_num_seqs = o.max_queued_requests,
                   .max_batch_tokens = o.max_batch_tokens,
                   .max_prefill_chunk_tokens = o.max_prefill_chunk_tokens},
          .enable_prefix_caching = o.enable_prefix_caching};
}

}  // namespace

PrefillEngine::PrefillEngine(PrefillEngineOptions options, engine::ModelRunner* runner,
                             PrefillMetrics* metrics)
    : options_(options),
      runner_(runner),
      metrics_(metrics),
      sends_(std::make_shared<SendTracker>()),
      core_({.scheduler = SchedulerOptionsFor(options), .step_target = options.step_target}, runner,
            this) {
  {
    absl::MutexLock lock(&sends_->mu);
    sends_->metrics = metrics;
    sends_->engine = this;
  }
  core_.Start();
}

PrefillEngine::~PrefillEngine() {
  core_.Stop();
  // The loop has ended: whatever is left never ran to the end, or never
  // got its session.
  const absl::Status why = absl::UnavailableError("prefill worker is shutting down");
  std::vector<Job> left;
  {
    auto access = core_.Read();
    for (auto& [id, job] : jobs_) left.push_back(std::move(job));
    jobs_.clear();
    for (auto& [id, d] : deferred_) left.push_back(std::move(d.job));
    deferred_.clear();
  }
  for (Job& job : left) {
    if (job.kv_session != nullptr) job.kv_session->Abort(why);
    job.ticket->Complete(why);
  }
  // Wait (bounded) for the receivers' acks of sends in flight; callbacks set
  // the count under the tracker's lock, so this wakes as soon as they are in.
  std::vector<std::unique_ptr<kvtransfer::SendSession>> sessions;
  {
    absl::MutexLock lock(&sends_->mu);
    auto all_done = [this]()
                        ABSL_SHARED_LOCKS_REQUIRED(sends_->mu) { return sends_->in_flight == 0; };
    sends_->mu.AwaitWithTimeout(absl::Condition(&all_done), options_.send_drain_timeout);
    sends_->metrics = nullptr;  // late callbacks must not touch the metrics or blocks
    sends_->engine = nullptr;
    for (auto& [key, session] : sends_->sessions) sessions.push_back(std::move(session));
    sends_->sessions.clear();
  }
  sessions.clear();  // outside the lock: destroying a session may run its callback
}

kvtransfer::TransferSpec PrefillEngine::SpecFor(int num_tokens) const {
  return kvtransfer::TransferSpecFor(*runner_, num_tokens);
}

absl::StatusOr<std::shared_ptr<PrefillTicket>> PrefillEngine::Submit(PrefillRequest request) {
  const engine::ModelConfig& config = runner_->config();
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt_token_ids is empty");
  const int n = static_cast<int>(request.prompt.size() + request.generated.size());
  if (n >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", n,
                                                   " tokens leaves no room in the context of ",
                                                   config.max_position_embeddings));
  }
  for (const auto* tokens : {&request.prompt, &request.generated}) {
    for (int32_t t : *tokens) {
      if (t < 0 || t >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(tokens == &request.prompt ? "prompt_token_ids" : "generated_token_ids",
                         ": token ", t, " outside [0, ", config.vocab_size, ")"));
      }
    }
  }
  if (!request.generated.empty() &&
      static_cast<int>(request.generated.size()) >= request.sampling.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("generated_token_ids: ", request.generated.size(),
                     " tokens leave none of max_tokens ", request.sampling.max_tokens));
  }
  if (absl::Status s = engine::ValidateSamplingParams(request.sampling, config.vocab_size);
      !s.ok()) {
    return s;
  }
  auto access = core_.Change();
  engine::Scheduler& scheduler = access.scheduler();
  if (access.stopping()) return absl::UnavailableError("prefill worker is shutting down");
  if (static_cast<int>(jobs_.size()) >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prefill queue full (", options_.max_queued_requests, " requests)"));
  }
  auto ticket = std::make_shared<PrefillTicket>(static_cast<int>(jobs_.size()),
                                                scheduler.pending_prompt_tokens());
  const engine::SeqId id = next_seq_++;
  if (absl::Status s =
          scheduler.AddPrompt(id, std::move(request.prompt), request.sampling, request.generated);
      !s.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt of ", n, " tokens exceeds this prefill worker's KV cache: ", s.message()));
  }
  jobs_.emplace(id, Job{.request_id = std::move(request.request_id),
                        .kv_session = std::move(request.kv_session),
                        .ticket = ticket,
                        .prompt_len = n,
                        .enqueued = absl::Now()});
  UpdateGaugesLocked();
  return ticket;
}

void PrefillEngine::AttachKvSession(
    const std::shared_ptr<PrefillTicket>& ticket,
    absl::StatusOr<std::unique_ptr<kvtransfer::SendSession>> session) {
  std::optional<Deferred> computed;
  {
    auto access = core_.Change();
    engine::Scheduler& scheduler = access.scheduler();
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      Job& job = it->second;
      if (job.ticket != ticket) continue;
      // Read by the engine thread when it plans the prompt's last step.
      if (session.ok()) {
        job.kv_session = *std::move(session);
        return;
      }
      // Nowhere to send its KV: it stops now, or when its step ends.
      job.kv_open_error = session.status();
      metrics_->CountKvTransferFailure(session.status());
      if (!scheduler.Cancel(it->first)) return;
      jobs_.erase(it);
      UpdateGaugesLocked();
      ticket->Complete(session.status());
      return;
    }
    for (auto it = deferred_.begin(); it != deferred_.end(); ++it) {
      if (it->second.job.ticket != ticket) continue;
      computed = std::move(it->second);
      deferred_.erase(it);
      break;
    }
    if (computed.has_value() && !session.ok()) {
      scheduler.Release(computed->id);
      UpdateGaugesLocked();
    }
  }
  if (!computed.has_value()) {  // cancelled or ended meanwhile
    if (session.ok()) (*session)->Abort(absl::CancelledError("prefill request ended"));
    return;
  }
  if (!session.ok()) {
    metrics_->CountKvTransferFailure(session.status());
    computed->job.ticket->Complete(session.status());
    return;
  }
  computed->job.kv_session = *std::move(session);
  SendAllAndFinish(*std::move(computed));
}

void PrefillEngine::Cancel(const std::shared_ptr<PrefillTicket>& ticket) {
  std::unique_ptr<kvtransfer::SendSession> session;
  bool found = false;
  {
    auto access = core_.Change();
    engine::Scheduler& scheduler = access.scheduler();
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (it->second.ticket != ticket) continue;
      // In a step: the engine thread ends it when the step completes.
      if (!scheduler.Cancel(it->first)) return;
      session = std::move(it->second.kv_session);
      jobs_.erase(it);
      found = true;
      break;
    }
    for (auto it = deferred_.begin(); !found && it != deferred_.end(); ++it) {
      if (it->second.job.ticket != ticket) continue;
      scheduler.Release(it->first);
      deferred_.erase(it);
      found = true;
      break;
    }
    if (found) UpdateGaugesLocked();
  }
  if (!found) return;
  const absl::Status why = absl::CancelledError("prefill cancelled by the caller");
  if (session != nullptr) session->Abort(why);
  ticket->Complete(why);
}

PrefillLoad PrefillEngine::load() const {
  auto access = core_.Read();
  const engine::Scheduler& scheduler = access.scheduler();
  const engine::EngineProgress progress = core_.ProgressLocked();
  PrefillLoad load{.queued_tokens = scheduler.pending_prompt_tokens(),
                   .queued_requests = static_cast<int>(jobs_.size()),
                   .progress = progress.steps_completed + layers_computed_.load(),
                   .has_work = progress.has_work,
                   .tokens_per_second = progress.tokens_per_second,
                   .unhealthy_reason = progress.unhealthy_reason};
  if (options_.enable_prefix_caching) load.cached_block_hashes = scheduler.kv().CachedHashDigest();
  return load;
}

void PrefillEngine::UpdateGaugesLocked() {
  const engine::Scheduler& scheduler = core_.scheduler_locked();
  metrics_->queue_depth.Set(scheduler.num_waiting());
  metrics_->queued_tokens.Set(static_cast<double>(scheduler.pending_prompt_tokens()));
  metrics_->kv_cache_usage.Set(scheduler.kv().usage_ratio());
}

void PrefillEngine::OnPlanned(const engine::ScheduledStep& step, double plan_seconds) {
  metrics_->scheduler_step_seconds.Observe(plan_seconds);
  metrics_->prefix_cache_queries.Increment(step.prefix_query_tokens);
  metrics_->prefix_cache_hits.Increment(step.prefix_hit_tokens);
  for (const auto& [id, why] : step.failed) {  // freed by the scheduler
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    if (it->second.kv_session != nullptr) it->second.kv_session->Abort(why);
    it->second.ticket->Complete(why);
    jobs_.erase(it);
  }
}

// One planned prefill step: the prompts' jobs and sessions as attached when
// it was planned, what was sent of each, and the outcomes to hand out.
class PrefillEngine::Step final : public engine::EngineStep {
 public:
  Step(PrefillEngine* engine, const engine::ScheduledStep& step, absl::Time planned)
      : engine_(*engine),
        num_tokens_(step.num_tokens),
        planned_(planned),
        send_status_(step.ids.size()),
        sent_bytes_(step.ids.size(), 0) {
    const engine::ModelConfig& config = engine_.runner_->config();
    for (size_t i = 0; i < step.ids.size(); ++i) {
      Job& job = engine_.jobs_.at(step.ids[i]);
      if (!job.started_set) {
        job.started = planned;
        job.started_set = true;
        engine_.metrics_->queue_wait.Observe(absl::ToDoubleSeconds(planned - job.enqueued));
        job.ticket->Start();  // its caller opens the KV session now
      }
      jobs_.push_back(&job);
      sessions_.push_back(job.kv_session.get());
      const engine::StepSequence& s = step.batch.seqs[i];
      flops_ += config.PrefillFlops(s.num_cached + static_cast<int>(s.tokens.size())) -
                config.PrefillFlops(s.num_cached);
    }
  }

  // Queues layer i of every prompt this step finishes (all its tokens,
  // earlier chunks included) on its session as soon as it is computed, while
  // the runner computes layer i+1. Sessions that order their reads after the
  // layer's device event get it at once; the others once the host has seen
  // the layer complete.
  absl::StatusOr<engine::StepOutput> Run(const engine::ScheduledStep& step,
                                         engine::StepHandle& handle) override {
    bool host_wait = false;
    for (size_t i = 0; i < step.ids.size(); ++i) {
      if (step.batch.seqs[i].sampling != nullptr && sessions_[i] != nullptr &&
          !sessions_[i]->OrdersOnDeviceEvents()) {
        host_wait = true;
      }
    }
    const size_t layer_bytes = engine_.runner_->LayerKvBytes(1);
    for (int layer = 0; layer < engine_.runner_->config().num_layers; ++layer) {
      void* event = handle.LayerDeviceEvent(layer);
      if (host_wait || event == nullptr) {
        if (!handle.WaitLayer(layer).ok()) break;  // Wait() reports the error
        engine_.layers_computed_.fetch_add(1);
      }
      if (layer == 0) first_layer_sent_ = absl::Now();
      for (size_t i = 0; i < step.ids.size(); ++i) {
        const engine::StepSequence& seq = step.batch.seqs[i];
        if (seq.sampling == nullptr || sessions_[i] == nullptr || !send_status_[i].ok()) continue;
        const int n = jobs_[i]->prompt_len;
        send_status_[i] = sessions_[i]->SendLayer(
            {.layer = layer,
             .token_begin = 0,
             .num_tokens = n,
             .block_table = seq.block_table,
             .ready_event = sessions_[i]->OrdersOnDeviceEvents() ? event : nullptr});
        if (send_status_[i].ok()) sent_bytes_[i] += layer_bytes * n;
      }
    }
    return handle.Wait();
  }

  void Apply(const std::vector<engine::SequenceUpdate>& updates,
             const absl::StatusOr<engine::StepOutput>& output,
             const engine::StepTiming& timing) override {
    engine::Scheduler& scheduler = engine_.core_.scheduler_locked();
    ok_ = output.ok();
    compute_end_ = timing.completed;
    seconds_ = absl::ToDoubleSeconds(timing.completed - planned_);
    for (size_t i = 0; i < updates.size(); ++i) {
      const engine::SequenceUpdate& u = updates[i];
      auto it = engine_.jobs_.find(u.id);
      if (it == engine_.jobs_.end()) continue;
      if (u.cancelled) {
        absl::Status why = it->second.kv_open_error.ok()
                               ? absl::CancelledError("prefill cancelled by the caller")
                               : it->second.kv_open_error;
        done_.push_back({.job = std::move(it->second), .error = std::move(why)});
      } else if (!u.error.ok()) {
        done_.push_back(
            {.job = std::move(it->second),
             .error = absl::InternalError(absl::StrCat("prefill failed: ", u.error.message()))});
      } else if (u.token.has_value() && sessions_[i] == nullptr) {
        // Computed before its session was attached: the KV goes now if it
        // arrived during the step, else when it does.
        Job& job = it->second;
        if (!job.kv_open_error.ok()) {  // counted when it was attached
          scheduler.Release(u.id);
          absl::Status error = job.kv_open_error;
          done_.push_back({.job = std::move(job), .error = std::move(error)});
        } else {
          // Held by the scheduler until released (the step's own spans
          // are gone once it completed).
          const engine::Scheduler::Sequence* held = scheduler.Find(u.id);
          Deferred d{.id = u.id,
                     .job = std::move(job),
                     .first = *u.token,
                     .block_table = held->block_table,
                     .compute_end = compute_end_,
                     .compute_seconds = seconds_};
          if (d.job.kv_session != nullptr) {
            late_.push_back(std::move(d));
          } else {
            engine_.deferred_.emplace(u.id, std::move(d));
          }
        }
      } else if (u.token.has_value()) {
        // The transport reads the blocks until the send is done (FinishJob
        // releases them then); a send that already failed reads nothing
        // more once aborted below, before the next step can reuse them.
        if (!send_status_[i].ok()) scheduler.Release(u.id);
        done_.push_back({.id = u.id,
                         .job = std::move(it->second),
                         .first = *u.token,
                         .error = send_status_[i],
                         .sent_bytes = sent_bytes_[i]});
      } else {
        continue;  // a chunk of a longer prompt: more steps to come
      }
      engine_.jobs_.erase(it);
    }
  }

  void Deliver() override {
    PrefillMetrics& metrics = *engine_.metrics_;
    metrics.step_seconds.Observe(seconds_);
    metrics.batch_tokens.Observe(num_tokens_);
    if (ok_ && seconds_ > 0) {
      metrics.achieved_flops.Set(flops_ / seconds_);
      if (engine_.options_.peak_flops > 0) {
        metrics.mfu.Set(flops_ / seconds_ / engine_.options_.peak_flops);
      }
    }
    const absl::Time transfer_start = std::min(first_layer_sent_, compute_end_);
    for (Deferred& d : late_) engine_.SendAllAndFinish(std::move(d));
    for (Done& d : done_) {
      metrics.requests.Increment();
      metrics.prompt_tokens.Increment(d.job.prompt_len);
      if (!d.first.has_value()) {
        if (d.job.kv_session != nullptr) d.job.kv_session->Abort(d.error);
        d.job.ticket->Complete(d.error);
      } else if (!d.error.ok()) {
        metrics.CountKvTransferFailure(d.error);
        d.job.kv_session->Abort(d.error);
        d.job.ticket->Complete(absl::UnavailableError(
            absl::StrCat("KV transfer to the decode worker failed: ", d.error.message())));
      } else {
        engine_.FinishJob(d.id, d.job, *std::move(d.first), d.sent_bytes, transfer_start,
                          compute_end_, seconds_);
      }
    }
  }

 private:
  // An outcome handed out after the lock is released.
  struct Done {
    engine::SeqId id = 0;
    Job job;
    std::optional<engine::SampledToken> first;
    absl::Status error;
    size_t sent_bytes = 0;
  };

  PrefillEngine& engine_;
  const int num_tokens_;
  const absl::Time planned_;
  std::vector<Job*> jobs_;                          // per sequence, in batch order
  std::vector<kvtransfer::SendSession*> sessions_;  // as attached when planned
  std::vector<absl::Status> send_status_;
  std::vector<size_t> sent_bytes_;
  double flops_ = 0;
  absl::Time first_layer_sent_ = absl::InfiniteFuture();
  bool ok_ = false;
  absl::Time compute_end_;
  double seconds_ = 0;
  std::vector<Done> done_;
  std::vector<Deferred> late_;  // computed, session attached during the step
};

std::unique_ptr<engine::EngineStep> PrefillEngine::BeginStep(const engine::ScheduledStep& step,
                                                             absl::Time now) {
  return std::make_unique<Step>(this, step, now);
}

void PrefillEngine::SendAllAndFinish(Deferred d) {
  const int n = d.job.prompt_len;
  absl::Status sent;
  for (int layer = 0; layer < runner_->config().num_layers && sent.ok(); ++layer) {
    sent = d.job.kv_session->SendLayer(
        {.layer = layer, .token_begin = 0, .num_tokens = n, .block_table = d.block_table});
  }
  metrics_->requests.Increment();
  metrics_->prompt_tokens.Increment(n);
  if (!sent.ok()) {
    d.job.kv_session->Abort(sent);
    ReleaseSource(d.id);
    metrics_->CountKvTransferFailure(sent);
    d.job.ticket->Complete(absl::UnavailableError(
        absl::StrCat("KV transfer to the decode worker failed: ", sent.message())));
    return;
  }
  const size_t bytes = runner_->LayerKvBytes(n) * runner_->config().num_layers;
  FinishJob(d.id, d.job, std::move(d.first), bytes, d.compute_end, d.compute_end,
            d.compute_seconds);
}

void PrefillEngine::ReleaseSource(engine::SeqId id) {
  // A change: a prompt waiting for these blocks starts at once.
  auto access = core_.Change();
  access.scheduler().Release(id);
  UpdateGaugesLocked();
}

void PrefillEngine::FinishJob(engine::SeqId id, Job& job, engine::SampledToken first,
                              size_t sent_bytes, absl::Time transfer_start, absl::Time compute_end,
                              double compute_seconds) {
  const int32_t first_token = first.token;
  metrics_->time_to_first_token.Observe(absl::ToDoubleSeconds(absl::Now() - job.enqueued));
  job.ticket->Complete(
      PrefillOutcome{.first_token = std::move(first),
                     .queue_seconds = absl::ToDoubleSeconds(job.started - job.enqueued),
                     .compute_seconds = compute_seconds});
  std::shared_ptr<SendTracker> tracker = sends_;
  kvtransfer::SendSession* session = job.kv_session.get();
  std::vector<std::unique_ptr<kvtransfer::SendSession>> reaped;
  uint64_t key;
  {
    absl::MutexLock lock(&tracker->mu);
    // Sessions whose send completed since the last time are destroyed below.
    for (uint64_t k : tracker->done_keys) {
      auto it = tracker->sessions.find(k);
      reaped.push_back(std::move(it->second));
      tracker->sessions.erase(it);
    }
    tracker->done_keys.clear();
    key = tracker->next_key++;
    tracker->sessions.emplace(key, std::move(job.kv_session));
    ++tracker->in_flight;
  }
  reaped.clear();
  // `done` may run inline (a session that already failed) or on a transport
  // thread; the transport reads the blocks no more by then, so it releases
  // them, and marks the session for reaping.
  session->Finish(first_token, [tracker, id, key, sent_bytes, transfer_start, compute_end,
                                request_id = job.request_id](absl::Status s) {
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&tracker->mu);
    --tracker->in_flight;
    tracker->done_keys.push_back(key);
    if (tracker->engine == nullptr) return;  // the engine is gone
    tracker->engine->ReleaseSource(id);
    PrefillMetrics* metrics = tracker->metrics;
    if (s.ok()) {
      metrics->kv_transfer_seconds.Observe(absl::ToDoubleSeconds(now - transfer_start));
      metrics->kv_transfer_exposed_seconds.Observe(absl::ToDoubleSeconds(now - compute_end));
      metrics->kv_transfer_bytes.Increment(static_cast<double>(sent_bytes));
    } else {
      metrics->CountKvTransferFailure(s);
      PDSERVE_LOG(WARNING) << "request " << request_id << ": KV transfer failed: " << s;
    }
  });
}

}  // namespace pdserve::prefill
