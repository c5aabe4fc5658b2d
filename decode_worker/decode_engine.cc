#include "decode_worker/decode_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace pdserve::decode {

// Follows one request's KV as the transport writes it into the reserved
// blocks; its completion frees them on failure or starts the sequence.
class DecodeEngine::Sink final : public kvtransfer::ReceiveSink {
 public:
  Sink(DecodeEngine* engine, engine::SeqId seq) : engine_(engine), seq_(seq) {}

  absl::Status OnLayer(int layer, int token_begin, int num_tokens) override {
    engine_->metrics_->kv_received_bytes.Increment(
        static_cast<double>(engine_->runner_->LayerKvBytes(num_tokens)));
    return absl::OkStatus();
  }
  void OnComplete(absl::StatusOr<int32_t> first_token) override {
    engine_->OnKvComplete(seq_, std::move(first_token));
  }

 private:
  DecodeEngine* const engine_;
  const engine::SeqId seq_;
};

namespace {

engine::SchedulerOptions SchedulerOptionsFor(const DecodeEngineOptions& o) {
  return {.role = engine::SchedulerRole::kDecode,
          .plan = {.max_num_seqs = o.max_running,
                   .max_batch_tokens =
                       std::max(o.max_running, 1) + std::max(o.recompute_chunk_tokens, 1),
                   .max_prefill_chunk_tokens = std::max(o.recompute_chunk_tokens, 1)},
          .enable_prefix_caching = o.enable_prefix_caching,
          .kv_headroom_tokens = o.kv_headroom_tokens};
}

}  // namespace

DecodeEngine::DecodeEngine(DecodeEngineOptions options, engine::ModelRunner* runner,
                           kvtransfer::KvReceiver* receiver, DecodeMetrics* metrics,
                           std::unique_ptr<engine::spec::SpecDecoder> spec)
    : options_(options),
      runner_(runner),
      receiver_(receiver),
      metrics_(metrics),
      kv_endpoint_(receiver->endpoint()),
      weight_bytes_(static_cast<double>(runner->DecodeWeightBytes())),
      spec_(std::move(spec)),
      core_({.scheduler = SchedulerOptionsFor(options)}, runner, this) {
  {
    auto access = core_.Read();
    UpdateGaugesLocked();
  }
  core_.Start();
}

DecodeEngine::~DecodeEngine() {
  core_.RequestStop();  // Admit refuses from here on
  std::vector<kvtransfer::TransferId> awaiting;
  {
    auto access = core_.Read();
    for (auto& [id, entry] : entries_) {
      if (entry.awaiting_kv) {
        entry.cancelled = true;
        awaiting.push_back(entry.stream->transfer_id());
      }
    }
  }
  core_.Stop();
  for (kvtransfer::TransferId id : awaiting) receiver_->Cancel(id);
  auto access = core_.Read();
  for (auto& [id, entry] : entries_) {
    entry.stream->Push({.error = absl::UnavailableError("decode worker is shutting down")});
  }
}

absl::StatusOr<std::shared_ptr<DecodeStream>> DecodeEngine::Admit(DecodeRequest request) {
  const engine::ModelConfig& config = runner_->config();
  if (absl::Status s = engine::ValidateGenerationRequest(request.prompt, request.sampling, config);
      !s.ok()) {
    return s;
  }
  if (!request.generated.empty()) {
    if (static_cast<int>(request.generated.size()) >= request.sampling.max_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("generated_token_ids: ", request.generated.size(),
                       " tokens leave none of max_tokens ", request.sampling.max_tokens));
    }
    for (int32_t t : request.generated) {
      if (t < 0 || t >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("generated_token_ids: token ", t,
                                                       " outside [0, ", config.vocab_size, ")"));
      }
    }
  }
  // Tokens whose KV the transfer brings.
  const int known = static_cast<int>(request.prompt.size() + request.generated.size());
  const int num_generated = static_cast<int>(request.generated.size());
  std::shared_ptr<DecodeStream> stream;
  std::vector<int32_t> table;
  {
    auto access = core_.Change();
    if (access.stopping()) return absl::UnavailableError("decode worker is shutting down");
    const engine::SeqId id = next_seq_++;
    absl::StatusOr<std::span<const int32_t>> blocks = access.scheduler().AddRemote(
        id, std::move(request.prompt), std::move(request.sampling), request.generated);
    if (!blocks.ok()) {
      metrics_->requests_rejected.Increment();
      return absl::ResourceExhaustedError(
          absl::StrCat("decode worker ", blocks.status().message()));
    }
    table.assign(blocks->begin(), blocks->end());
    stream = std::make_shared<DecodeStream>(id, transfer_ids_.Id(id));
    entries_.emplace(id, Entry{.request_id = std::move(request.request_id),
                               .stream = stream,
                               .num_generated = num_generated,
                               .admitted = absl::Now()});
    metrics_->requests_admitted.Increment();
    UpdateGaugesLocked();
  }

  auto sink = std::make_shared<Sink>(this, stream->seq());
  const absl::Time now = absl::Now();
  const absl::Duration kv_wait = request.kv_deadline == absl::InfiniteFuture()
                                     ? options_.kv_timeout
                                     : std::max(request.kv_deadline - now, absl::Milliseconds(1));
  if (absl::Status s =
          receiver_->Expect(stream->transfer_id(), kvtransfer::TransferSpecFor(*runner_, known),
                            std::move(table), sink, kv_wait);
      !s.ok()) {
    auto access = core_.Change();
    DropLocked(stream->seq());
    return s;
  }
  return stream;
}

void DecodeEngine::DropLocked(engine::SeqId id) {
  core_.scheduler_locked().Cancel(id);
  entries_.erase(id);
  UpdateGaugesLocked();
}

void DecodeEngine::Cancel(const DecodeStream& stream) {
  {
    auto access = core_.Change();
    auto it = entries_.find(stream.seq());
    if (it == entries_.end()) return;
    Entry& entry = it->second;
    if (!entry.awaiting_kv) {
      // Freed now, or by the engine thread when the step it is in ends.
      if (access.scheduler().Cancel(stream.seq())) {
        entries_.erase(it);
        UpdateGaugesLocked();
      } else {
        entry.cancelled = true;
      }
      return;
    }
    entry.cancelled = true;
  }
  // Outside mu_: the receiver calls OnKvComplete(CANCELLED), which frees.
  receiver_->Cancel(stream.transfer_id());
}

void DecodeEngine::OnKvComplete(engine::SeqId id, absl::StatusOr<int32_t> first_token) {
  // A change: the sequence joins the next step (or its blocks are free).
  auto access = core_.Change();
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  if (entry.cancelled || !first_token.ok()) {
    if (!first_token.ok()) {
      metrics_->kv_receive_failures.Increment();
      if (!entry.cancelled) {
        PDSERVE_LOG(WARNING) << "request " << entry.request_id
                             << ": KV transfer failed: " << first_token.status();
        entry.stream->Push({.error = absl::Status(first_token.status().code(),
                                                  absl::StrCat("KV transfer failed: ",
                                                               first_token.status().message()))});
      }
    }
    DropLocked(id);
    return;
  }
  const int32_t token = *first_token;
  if (token < 0 || token >= runner_->config().vocab_size) {
    entry.stream->Push(
        {.error = absl::InternalError(absl::StrCat("first token ", token, " out of range"))});
    DropLocked(id);
    return;
  }
  entry.awaiting_kv = false;
  ++entry.num_generated;
  metrics_->kv_wait.Observe(absl::ToDoubleSeconds(absl::Now() - entry.admitted));
  absl::StatusOr<engine::FinishReason> finish = access.scheduler().StartDecoding(id, token);
  if (!finish.ok()) {
    entry.stream->Push({.error = absl::InternalError(finish.status().message())});
    DropLocked(id);
    return;
  }
  if (*finish != engine::FinishReason::kNone) {
    entry.stream->Push(
        {.finished = true, .finish_reason = *finish, .completion_tokens = entry.num_generated});
    entries_.erase(it);  // the scheduler freed it
  } else {
    entry.last_token_time = absl::Now();
  }
  UpdateGaugesLocked();
}

void DecodeEngine::UpdateGaugesLocked() {
  const engine::Scheduler& scheduler = core_.scheduler_locked();
  metrics_->running_sequences.Set(scheduler.num_running());
  metrics_->waiting_kv_sequences.Set(scheduler.num_awaiting_kv());
  metrics_->kv_cache_usage.Set(scheduler.kv().usage_ratio());
}

DecodeLoad DecodeEngine::load() const {
  auto access = core_.Read();
  const engine::Scheduler& scheduler = access.scheduler();
  const engine::EngineProgress progress = core_.ProgressLocked();
  return DecodeLoad{.running = scheduler.num_running(),
                    .waiting_kv = scheduler.num_awaiting_kv(),
                    .preempted = scheduler.num_waiting(),
                    .free_blocks = scheduler.num_available_blocks(),
                    .total_blocks = scheduler.kv().num_blocks(),
                    .progress = progress.steps_completed,
                    .has_work = progress.has_work,
                    .unhealthy_reason = progress.unhealthy_reason};
}

void DecodeEngine::BeforePlan() {
  if (spec_ == nullptr) return;
  if (absl::Status s = spec_->ProposeFor(core_.scheduler_locked()); !s.ok()) {
    PDSERVE_LOG(WARNING) << "speculative proposals failed: " << s;
  }
}

void DecodeEngine::OnPlanned(const engine::ScheduledStep& step, double plan_seconds) {
  metrics_->scheduler_step_seconds.Observe(plan_seconds);
  metrics_->preemptions.Increment(static_cast<double>(step.preempted.size()));
  for (const auto& [id, why] : step.failed) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    PDSERVE_LOG(WARNING) << "request " << it->second.request_id << ": " << why;
    it->second.stream->Push({.error = why});
    entries_.erase(it);
  }
}

// One planned decode step: the KV it reads (for the bandwidth gauge), then
// the tokens it produced, pushed to their streams after the lock.
class DecodeEngine::Step final : public engine::EngineStep {
 public:
  Step(DecodeEngine* engine, const engine::ScheduledStep& step)
      : engine_(*engine), batch_size_(step.ids.size()) {
    for (const engine::StepSequence& s : step.batch.seqs) {
      kv_tokens_ += s.num_cached + static_cast<double>(s.tokens.size());
    }
  }

  void Apply(const std::vector<engine::SequenceUpdate>& updates,
             const absl::StatusOr<engine::StepOutput>& output,
             const engine::StepTiming& timing) override {
    ok_ = output.ok();
    seconds_ = timing.seconds();
    const absl::Time end = timing.completed;
    if (engine_.spec_ != nullptr) spec_stats_ = engine_.spec_->Observe(updates);
    for (const engine::SequenceUpdate& u : updates) {
      auto it = engine_.entries_.find(u.id);
      if (it == engine_.entries_.end()) continue;
      Entry& entry = it->second;
      if (u.cancelled) {
        engine_.entries_.erase(it);
        continue;
      }
      if (!u.error.ok()) {
        out_.push_back({entry.stream,
                        {.error = absl::InternalError(
                             absl::StrCat("decode step failed: ", u.error.message()))}});
        engine_.entries_.erase(it);
        continue;
      }
      if (!u.token.has_value()) continue;
      // A verification's tokens arrive together: each counts its share of the gap.
      const int num_tokens = 1 + static_cast<int>(u.more_tokens.size());
      tokens_ += num_tokens;
      for (int i = 0; i < num_tokens; ++i) {
        itl_.push_back(absl::ToDoubleSeconds(end - entry.last_token_time) / num_tokens);
      }
      entry.last_token_time = end;
      entry.num_generated += num_tokens;
      DecodeOutput out{.tokens = {*u.token}};
      out.tokens.insert(out.tokens.end(), u.more_tokens.begin(), u.more_tokens.end());
      if (u.finish != engine::FinishReason::kNone) {
        out.finished = true;
        out.finish_reason = u.finish;
        out.completion_tokens = entry.num_generated;
      }
      out_.push_back({entry.stream, std::move(out)});
      if (u.freed) engine_.entries_.erase(it);
    }
  }

  void Deliver() override {
    DecodeMetrics& metrics = *engine_.metrics_;
    metrics.step_seconds.Observe(seconds_);
    metrics.batch_size.Observe(static_cast<double>(batch_size_));
    if (ok_ && seconds_ > 0) {
      const engine::ModelConfig& config = engine_.runner_->config();
      const double kv_bytes_per_token = static_cast<double>(
          config.KvBytesPerToken(engine::KvDtypeBytes(engine_.runner_->kv_dtype())));
      const double bytes_per_second =
          (engine_.weight_bytes_ + kv_tokens_ * kv_bytes_per_token) / seconds_;
      metrics.achieved_bytes_per_second.Set(bytes_per_second);
      if (engine_.options_.peak_memory_bandwidth > 0) {
        metrics.bandwidth_utilization.Set(bytes_per_second /
                                          engine_.options_.peak_memory_bandwidth);
      }
    }
    metrics.generation_tokens.Increment(static_cast<double>(tokens_));
    if (engine_.spec_ != nullptr) {
      metrics.spec.Record(spec_stats_.proposed, spec_stats_.accepted_lengths);
    }
    for (double itl : itl_) metrics.inter_token_latency.Observe(itl);
    for (auto& [stream, out] : out_) stream->Push(std::move(out));
  }

 private:
  DecodeEngine& engine_;
  const size_t batch_size_;
  double kv_tokens_ = 0;
  bool ok_ = false;
  double seconds_ = 0;
  int tokens_ = 0;
  std::vector<double> itl_;
  engine::spec::SpecStepStats spec_stats_;  // speculative decoding: what the step verified
  std::vector<std::pair<std::shared_ptr<DecodeStream>, DecodeOutput>> out_;
};

std::unique_ptr<engine::EngineStep> DecodeEngine::BeginStep(const engine::ScheduledStep& step,
                                                            absl::Time now) {
  return std::make_unique<Step>(this, step);
}

}  // namespace pdserve::decode
