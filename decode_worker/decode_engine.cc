#include "decode_worker/decode_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

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

DecodeEngine::DecodeEngine(DecodeEngineOptions options, engine::ModelRunner* runner,
                           kvtransfer::KvReceiver* receiver, DecodeMetrics* metrics,
                           std::unique_ptr<engine::spec::SpecDecoder> spec)
    : options_(options),
      runner_(runner),
      receiver_(receiver),
      metrics_(metrics),
      kv_endpoint_(receiver->endpoint()),
      weight_bytes_(static_cast<double>(runner->DecodeWeightBytes())),
      scheduler_({.role = engine::SchedulerRole::kDecode,
                  .plan = {.max_num_seqs = options.max_running,
                           .max_batch_tokens = std::max(options.max_running, 1) +
                                               std::max(options.recompute_chunk_tokens, 1),
                           .max_prefill_chunk_tokens = std::max(options.recompute_chunk_tokens, 1)},
                  .enable_prefix_caching = options.enable_prefix_caching,
                  .kv_headroom_tokens = options.kv_headroom_tokens},
                 runner->config(), runner->num_kv_blocks(), runner->kv_block_size()),
      spec_(std::move(spec)) {
  {
    absl::MutexLock lock(&mu_);
    UpdateGaugesLocked();
  }
  thread_ = std::thread([this] { Loop(); });
}

DecodeEngine::~DecodeEngine() {
  std::vector<kvtransfer::TransferId> awaiting;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [id, entry] : entries_) {
      if (entry.awaiting_kv) {
        entry.cancelled = true;
        awaiting.push_back(entry.stream->transfer_id());
      }
    }
  }
  thread_.join();
  for (kvtransfer::TransferId id : awaiting) receiver_->Cancel(id);
  absl::MutexLock lock(&mu_);
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
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("decode worker is shutting down");
    const engine::SeqId id = next_seq_++;
    absl::StatusOr<std::span<const int32_t>> blocks = scheduler_.AddRemote(
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
    absl::MutexLock lock(&mu_);
    DropLocked(stream->seq());
    return s;
  }
  return stream;
}

void DecodeEngine::DropLocked(engine::SeqId id) {
  scheduler_.Cancel(id);
  entries_.erase(id);
  UpdateGaugesLocked();
}

void DecodeEngine::Cancel(const DecodeStream& stream) {
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(stream.seq());
    if (it == entries_.end()) return;
    Entry& entry = it->second;
    if (!entry.awaiting_kv) {
      // Freed now, or by the engine thread when the step it is in ends.
      if (scheduler_.Cancel(stream.seq())) {
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
  absl::MutexLock lock(&mu_);
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
  absl::StatusOr<engine::FinishReason> finish = scheduler_.StartDecoding(id, token);
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
  metrics_->running_sequences.Set(scheduler_.num_running());
  metrics_->waiting_kv_sequences.Set(scheduler_.num_awaiting_kv());
  metrics_->kv_cache_usage.Set(scheduler_.kv().usage_ratio());
}

DecodeLoad DecodeEngine::load() const {
  absl::MutexLock lock(&mu_);
  DecodeLoad load{.running = scheduler_.num_running(),
                  .waiting_kv = scheduler_.num_awaiting_kv(),
                  .preempted = scheduler_.num_waiting(),
                  .free_blocks = scheduler_.num_available_blocks(),
                  .total_blocks = scheduler_.kv().num_blocks(),
                  .progress = steps_completed_,
                  .has_work = stepping_ && scheduler_.num_running() + scheduler_.num_waiting() > 0};
  constexpr int kUnhealthyAfter = 3;
  if (failed_steps_in_a_row_ >= kUnhealthyAfter) {
    load.unhealthy_reason =
        absl::StrCat("its last ", failed_steps_in_a_row_, " steps failed: ", last_step_error_);
  }
  return load;
}

void DecodeEngine::Loop() {
  const engine::ModelConfig& config = runner_->config();
  const double kv_bytes_per_token =
      static_cast<double>(config.KvBytesPerToken(engine::KvDtypeBytes(runner_->kv_dtype())));
  while (true) {
    engine::ScheduledStep step;
    double kv_tokens = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || scheduler_.num_running() > 0 || scheduler_.num_waiting() > 0;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      const absl::Time plan_start = absl::Now();
      if (spec_ != nullptr) {
        if (absl::Status s = spec_->ProposeFor(scheduler_); !s.ok()) {
          PDSERVE_LOG(WARNING) << "speculative proposals failed: " << s;
        }
      }
      step = scheduler_.Schedule();
      metrics_->scheduler_step_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - plan_start));
      metrics_->preemptions.Increment(static_cast<double>(step.preempted.size()));
      for (const auto& [id, why] : step.failed) {
        auto it = entries_.find(id);
        if (it == entries_.end()) continue;
        PDSERVE_LOG(WARNING) << "request " << it->second.request_id << ": " << why;
        it->second.stream->Push({.error = why});
        entries_.erase(it);
      }
      if (!step.failed.empty() || !step.preempted.empty()) UpdateGaugesLocked();
      stepping_ = !step.empty();
      if (step.empty()) {
        // Running sequences that cannot step now (cancelled, awaiting
        // blocks): wait for a change rather than spin.
        mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(5));
        continue;
      }
      for (const engine::StepSequence& s : step.batch.seqs) {
        kv_tokens += s.num_cached + static_cast<double>(s.tokens.size());
      }
    }

    const absl::Time start = absl::Now();
    const size_t batch_size = step.ids.size();
    const absl::StatusOr<engine::StepOutput> output = runner_->Step(step.batch);
    const absl::Time end = absl::Now();
    const double seconds = absl::ToDoubleSeconds(end - start);
    metrics_->step_seconds.Observe(seconds);
    metrics_->batch_size.Observe(static_cast<double>(batch_size));
    if (output.ok() && seconds > 0) {
      const double bytes_per_second = (weight_bytes_ + kv_tokens * kv_bytes_per_token) / seconds;
      metrics_->achieved_bytes_per_second.Set(bytes_per_second);
      if (options_.peak_memory_bandwidth > 0) {
        metrics_->bandwidth_utilization.Set(bytes_per_second / options_.peak_memory_bandwidth);
      }
    }
    if (!output.ok()) PDSERVE_LOG(ERROR) << "decode step failed: " << output.status();

    absl::MutexLock lock(&mu_);
    ++steps_completed_;
    if (output.ok()) {
      failed_steps_in_a_row_ = 0;
    } else {
      ++failed_steps_in_a_row_;
      last_step_error_ = std::string(output.status().message());
    }
    const std::vector<engine::SequenceUpdate> updates = scheduler_.Complete(step, output);
    if (spec_ != nullptr) {
      const engine::spec::SpecStepStats stats = spec_->Observe(updates);
      metrics_->spec.Record(stats.proposed, stats.accepted_lengths);
    }
    for (const engine::SequenceUpdate& u : updates) {
      auto it = entries_.find(u.id);
      if (it == entries_.end()) continue;
      Entry& entry = it->second;
      if (u.cancelled) {
        entries_.erase(it);
        continue;
      }
      if (!u.error.ok()) {
        entry.stream->Push({.error = absl::InternalError(
                                absl::StrCat("decode step failed: ", u.error.message()))});
        entries_.erase(it);
        continue;
      }
      if (!u.token.has_value()) continue;
      // A verification's tokens arrive together: each counts its share of the gap.
      const int num_tokens = 1 + static_cast<int>(u.more_tokens.size());
      metrics_->generation_tokens.Increment(num_tokens);
      for (int i = 0; i < num_tokens; ++i) {
        metrics_->inter_token_latency.Observe(absl::ToDoubleSeconds(end - entry.last_token_time) /
                                              num_tokens);
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
      entry.stream->Push(std::move(out));
      if (u.freed) entries_.erase(it);
    }
    UpdateGaugesLocked();
  }
}

}  // namespace pdserve::decode
