#include "prefill_worker/prefill_engine.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pdserve::prefill {

bool PrefillTicket::Wait(absl::Duration timeout, absl::StatusOr<PrefillOutcome>* out) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return result_.has_value(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return false;
  *out = *result_;
  return true;
}

void PrefillTicket::Complete(absl::StatusOr<PrefillOutcome> result) {
  absl::MutexLock lock(&mu_);
  if (!result_.has_value()) result_ = std::move(result);
}

PrefillEngine::PrefillEngine(PrefillEngineOptions options, engine::ModelRunner* runner,
                             PrefillMetrics* metrics)
    : options_(options),
      runner_(runner),
      metrics_(metrics),
      blocks_(runner->num_kv_blocks(), runner->kv_block_size()) {
  thread_ = std::thread([this] { Loop(); });
}

PrefillEngine::~PrefillEngine() {
  std::deque<Job> dropped;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    dropped.swap(queue_);
  }
  thread_.join();
  for (Job& job : dropped) {
    job.request.kv_session->Abort(absl::UnavailableError("prefill worker is shutting down"));
    job.ticket->Complete(absl::UnavailableError("prefill worker is shutting down"));
  }
  // Wait for the receivers' acks (bounded by the transport's own timeouts).
  absl::MutexLock lock(&mu_);
  auto all_done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const Sending& s : sending_) {
      if (!s.done->load()) return false;
    }
    return true;
  };
  mu_.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(10));
  sending_.clear();
}

kvtransfer::TransferSpec PrefillEngine::SpecFor(int num_tokens) const {
  kvtransfer::TransferSpec spec;
  spec.model_fingerprint = runner_->fingerprint();
  spec.dtype = std::string(engine::KvDtypeName(runner_->kv_dtype()));
  spec.bytes_per_element = engine::KvDtypeBytes(runner_->kv_dtype());
  spec.num_layers = runner_->config().num_layers;
  spec.num_kv_heads = runner_->config().num_kv_heads;
  spec.head_dim = runner_->config().head_dim;
  spec.num_tokens = num_tokens;
  return spec;
}

absl::StatusOr<std::shared_ptr<PrefillTicket>> PrefillEngine::Submit(PrefillRequest request) {
  const engine::ModelConfig& config = runner_->config();
  const int n = static_cast<int>(request.prompt.size());
  if (n == 0) return absl::InvalidArgumentError("prompt_token_ids is empty");
  if (n >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", n,
                                                   " tokens leaves no room in the context of ",
                                                   config.max_position_embeddings));
  }
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_token_ids: token ", t, " outside [0, ", config.vocab_size, ")"));
    }
  }
  if (absl::Status s = engine::ValidateSamplingParams(request.sampling, config.vocab_size);
      !s.ok()) {
    return s;
  }
  if (request.kv_session == nullptr) return absl::InvalidArgumentError("no KV session");
  auto ticket = std::make_shared<PrefillTicket>();
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("prefill worker is shutting down");
  if (blocks_.BlocksForTokens(n) > blocks_.num_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prompt of ", n, " tokens exceeds this prefill worker's KV cache"));
  }
  if (static_cast<int>(queue_.size()) >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prefill queue full (", options_.max_queued_requests, " requests)"));
  }
  queued_tokens_ += n;
  queue_.push_back(Job{std::move(request), ticket, absl::Now()});
  UpdateGaugesLocked();
  return ticket;
}

void PrefillEngine::Cancel(const std::shared_ptr<PrefillTicket>& ticket) {
  std::optional<Job> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->ticket == ticket) {
        queued_tokens_ -= static_cast<int64_t>(it->request.prompt.size());
        dropped = std::move(*it);
        queue_.erase(it);
        UpdateGaugesLocked();
        break;
      }
    }
  }
  if (dropped) {
    dropped->request.kv_session->Abort(absl::CancelledError("prefill cancelled by the caller"));
    dropped->ticket->Complete(absl::CancelledError("prefill cancelled by the caller"));
  }
}

PrefillLoad PrefillEngine::load() const {
  absl::MutexLock lock(&mu_);
  return PrefillLoad{.queued_tokens = queued_tokens_ + running_tokens_,
                     .queued_requests = static_cast<int>(queue_.size()) + running_requests_};
}

void PrefillEngine::UpdateGaugesLocked() {
  metrics_->queue_depth.Set(static_cast<double>(queue_.size()));
  metrics_->queued_tokens.Set(static_cast<double>(queued_tokens_));
  metrics_->kv_cache_usage.Set(blocks_.usage_ratio());
}

void PrefillEngine::ReapSendsLocked() {
  std::erase_if(sending_, [](const Sending& s) { return s.done->load(); });
}

void PrefillEngine::Loop() {
  std::vector<Job> batch;
  while (true) {
    batch.clear();
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      ReapSendsLocked();
      if (stop_) return;
      // First come, first served, up to the token budget and the free blocks;
      // the head of the queue always runs.
      int tokens = 0;
      while (!queue_.empty()) {
        const int n = static_cast<int>(queue_.front().request.prompt.size());
        if (!batch.empty() && tokens + n > options_.max_batch_tokens) break;
        if (!blocks_.CanAllocate(n)) break;
        tokens += n;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      queued_tokens_ -= tokens;
      running_tokens_ = tokens;
      running_requests_ = static_cast<int>(batch.size());
      UpdateGaugesLocked();
    }
    if (!batch.empty()) RunBatch(batch);
  }
}

void PrefillEngine::RunBatch(std::vector<Job>& batch) {
  const engine::ModelConfig& config = runner_->config();
  const absl::Time start = absl::Now();
  std::vector<engine::SeqId> seqs;
  std::vector<std::vector<int32_t>> tables;
  int total_tokens = 0;
  double flops = 0;
  {
    absl::MutexLock lock(&mu_);
    for (Job& job : batch) {
      const engine::SeqId seq = next_seq_++;
      const int n = static_cast<int>(job.request.prompt.size());
      // CanAllocate was checked for the batch as a whole under the same lock.
      PDSERVE_CHECK(blocks_.Allocate(seq, n).ok());
      auto table = blocks_.BlockTable(seq);
      seqs.push_back(seq);
      tables.emplace_back(table.begin(), table.end());
      total_tokens += n;
      flops += config.PrefillFlops(n);
    }
    UpdateGaugesLocked();
  }

  engine::StepBatch step;
  for (size_t i = 0; i < batch.size(); ++i) {
    const PrefillRequest& r = batch[i].request;
    step.seqs.push_back({.tokens = r.prompt,
                         .num_cached = 0,
                         .block_table = tables[i],
                         .sampling = &r.sampling,
                         .history = {.prompt = r.prompt, .generated = {}}});
  }
  std::vector<absl::Status> send_status(batch.size());
  std::vector<size_t> sent_bytes(batch.size(), 0);
  std::optional<absl::Time> first_layer_sent;
  // After each layer: copy its KV out and queue it, while the runner
  // computes the next layer.
  auto send_layer = [&](int layer) {
    if (!first_layer_sent) first_layer_sent = absl::Now();
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!send_status[i].ok()) continue;
      const int n = static_cast<int>(batch[i].request.prompt.size());
      std::vector<std::byte> payload(runner_->LayerKvBytes(n));
      send_status[i] = runner_->ReadLayerKv(layer, tables[i], n, payload);
      if (!send_status[i].ok()) continue;
      sent_bytes[i] += payload.size();
      send_status[i] = batch[i].request.kv_session->SendLayer(layer, std::move(payload));
    }
  };
  absl::StatusOr<engine::StepOutput> output = [&]() -> absl::StatusOr<engine::StepOutput> {
    absl::StatusOr<std::unique_ptr<engine::StepHandle>> handle = runner_->Enqueue(std::move(step));
    if (!handle.ok()) return handle.status();
    for (int layer = 0; layer < config.num_layers; ++layer) {
      if (!(*handle)->WaitLayer(layer).ok()) break;  // Wait() reports the error
      send_layer(layer);
    }
    return (*handle)->Wait();
  }();
  const absl::Status status = output.status();
  const absl::Time compute_end = absl::Now();
  const double seconds = absl::ToDoubleSeconds(compute_end - start);
  metrics_->step_seconds.Observe(seconds);
  metrics_->batch_tokens.Observe(total_tokens);
  if (status.ok() && seconds > 0) {
    metrics_->achieved_flops.Set(flops / seconds);
    if (options_.peak_flops > 0) metrics_->mfu.Set(flops / seconds / options_.peak_flops);
  }

  const absl::Time transfer_start = first_layer_sent.value_or(compute_end);
  for (size_t i = 0; i < batch.size(); ++i) {
    Job& job = batch[i];
    metrics_->requests.Increment();
    metrics_->prompt_tokens.Increment(static_cast<double>(job.request.prompt.size()));
    if (!status.ok()) {
      job.request.kv_session->Abort(status);
      job.ticket->Complete(absl::InternalError(absl::StrCat("prefill failed: ", status.message())));
      continue;
    }
    if (!send_status[i].ok()) {
      metrics_->kv_transfer_failures.Increment();
      job.request.kv_session->Abort(send_status[i]);
      job.ticket->Complete(absl::UnavailableError(
          absl::StrCat("KV transfer to the decode worker failed: ", send_status[i].message())));
      continue;
    }
    engine::SampledToken first = std::move(output->sampled[i]);
    auto done = std::make_shared<std::atomic<bool>>(false);
    PrefillMetrics* metrics = metrics_;
    const size_t bytes = sent_bytes[i];
    const std::string request_id = job.request.request_id;
    job.request.kv_session->Finish(first.token, [metrics, done, bytes, transfer_start, compute_end,
                                                 request_id](absl::Status s) {
      const absl::Time now = absl::Now();
      if (s.ok()) {
        metrics->kv_transfer_seconds.Observe(absl::ToDoubleSeconds(now - transfer_start));
        metrics->kv_transfer_exposed_seconds.Observe(absl::ToDoubleSeconds(now - compute_end));
        metrics->kv_transfer_bytes.Increment(static_cast<double>(bytes));
      } else {
        metrics->kv_transfer_failures.Increment();
        PDSERVE_LOG(WARNING) << "request " << request_id << ": KV transfer failed: " << s;
      }
      done->store(true);
    });
    metrics_->time_to_first_token.Observe(absl::ToDoubleSeconds(absl::Now() - job.enqueued));
    job.ticket->Complete(
        PrefillOutcome{.first_token = std::move(first),
                       .queue_seconds = absl::ToDoubleSeconds(start - job.enqueued),
                       .compute_seconds = seconds});
    absl::MutexLock lock(&mu_);
    sending_.push_back(Sending{std::move(job.request.kv_session), std::move(done)});
  }

  absl::MutexLock lock(&mu_);
  for (engine::SeqId seq : seqs) blocks_.Free(seq);
  running_tokens_ = 0;
  running_requests_ = 0;
  UpdateGaugesLocked();
}

}  // namespace pdserve::prefill
