#include "decode_worker/decode_engine.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pdserve::decode {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

kvtransfer::TransferSpec BaseSpec(const engine::ModelRunner& runner) {
  kvtransfer::TransferSpec spec;
  spec.model_fingerprint = runner.fingerprint();
  spec.dtype = std::string(engine::KvDtypeName(runner.kv_dtype()));
  spec.bytes_per_element = engine::KvDtypeBytes(runner.kv_dtype());
  spec.num_layers = runner.config().num_layers;
  spec.num_kv_heads = runner.config().num_kv_heads;
  spec.head_dim = runner.config().head_dim;
  return spec;
}

}  // namespace

// Receives one request's KV straight into its reserved blocks.
class DecodeEngine::Sink final : public kvtransfer::ReceiveSink {
 public:
  Sink(DecodeEngine* engine, engine::SeqId seq, std::vector<int32_t> block_table, int num_tokens)
      : engine_(engine), seq_(seq), block_table_(std::move(block_table)), num_tokens_(num_tokens) {}

  absl::Status OnLayer(int layer, std::span<const std::byte> payload) override {
    engine_->metrics_->kv_received_bytes.Increment(static_cast<double>(payload.size()));
    return engine_->runner_->WriteLayerKv(layer, block_table_, num_tokens_, payload);
  }
  void OnComplete(absl::StatusOr<int32_t> first_token) override {
    engine_->OnKvComplete(seq_, std::move(first_token));
  }

 private:
  DecodeEngine* const engine_;
  const engine::SeqId seq_;
  const std::vector<int32_t> block_table_;
  const int num_tokens_;
};

DecodeEngine::DecodeEngine(DecodeEngineOptions options, engine::ModelRunner* runner,
                           kvtransfer::KvReceiver* receiver, DecodeMetrics* metrics)
    : options_(options),
      runner_(runner),
      receiver_(receiver),
      metrics_(metrics),
      kv_endpoint_(receiver->endpoint()),
      base_spec_(BaseSpec(*runner)),
      weight_bytes_(static_cast<double>(runner->DecodeWeightBytes())),
      blocks_(runner->num_kv_blocks(), runner->kv_block_size()),
      transfer_salt_(std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32)) {
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
    for (auto& [id, seq] : seqs_) {
      if (seq.state == State::kAwaitingKv) {
        seq.cancelled = true;
        awaiting.push_back(seq.transfer_id);
      }
    }
  }
  thread_.join();
  for (kvtransfer::TransferId id : awaiting) receiver_->Cancel(id);
  absl::MutexLock lock(&mu_);
  for (auto& [id, seq] : seqs_) {
    seq.stream->Push({.error = absl::UnavailableError("decode worker is shutting down")});
  }
}

absl::StatusOr<std::shared_ptr<DecodeStream>> DecodeEngine::Admit(DecodeRequest request) {
  const engine::ModelConfig& config = runner_->config();
  if (absl::Status s = engine::ValidateGenerationRequest(request.prompt, request.sampling, config);
      !s.ok()) {
    return s;
  }
  const int prompt_len = static_cast<int>(request.prompt.size());

  // The last generated token never enters the cache.
  const int reserve_tokens = prompt_len + request.sampling.max_tokens - 1;
  std::shared_ptr<DecodeStream> stream;
  std::vector<int32_t> table;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("decode worker is shutting down");
    if (static_cast<int>(seqs_.size()) >= options_.max_running) {
      metrics_->requests_rejected.Increment();
      return absl::ResourceExhaustedError(
          absl::StrCat("decode worker holds its maximum of ", options_.max_running, " sequences"));
    }
    const engine::SeqId id = next_seq_++;
    if (absl::Status s = blocks_.Allocate(id, reserve_tokens); !s.ok()) {
      metrics_->requests_rejected.Increment();
      return absl::ResourceExhaustedError(
          absl::StrCat("decode worker KV cache full: ", s.message()));
    }
    const auto span = blocks_.BlockTable(id);
    table.assign(span.begin(), span.end());
    const kvtransfer::TransferId transfer_id = SplitMix64(transfer_salt_ + id);
    stream = std::make_shared<DecodeStream>(id, transfer_id);
    Sequence seq;
    seq.request_id = std::move(request.request_id);
    seq.sampling = std::move(request.sampling);
    seq.prompt = std::move(request.prompt);
    seq.block_table = table;
    seq.prompt_len = prompt_len;
    seq.transfer_id = transfer_id;
    seq.stream = stream;
    seqs_.emplace(id, std::move(seq));
    metrics_->requests_admitted.Increment();
    UpdateGaugesLocked();
  }

  kvtransfer::TransferSpec spec = base_spec_;
  spec.num_tokens = prompt_len;
  auto sink = std::make_shared<Sink>(this, stream->seq(), std::move(table), prompt_len);
  if (absl::Status s = receiver_->Expect(stream->transfer_id(), spec, sink, options_.kv_timeout);
      !s.ok()) {
    absl::MutexLock lock(&mu_);
    FreeLocked(stream->seq());
    return s;
  }
  return stream;
}

void DecodeEngine::Cancel(const DecodeStream& stream) {
  kvtransfer::TransferId awaiting = 0;
  bool is_awaiting = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = seqs_.find(stream.seq());
    if (it == seqs_.end()) return;
    Sequence& seq = it->second;
    seq.cancelled = true;
    if (seq.state == State::kAwaitingKv) {
      is_awaiting = true;
      awaiting = seq.transfer_id;
    } else if (!seq.in_step) {
      FreeLocked(stream.seq());
    }  // else: freed by the engine thread when the step ends
  }
  // Outside mu_: the receiver calls OnKvComplete(CANCELLED), which frees.
  if (is_awaiting) receiver_->Cancel(awaiting);
}

void DecodeEngine::OnKvComplete(engine::SeqId id, absl::StatusOr<int32_t> first_token) {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  Sequence& seq = it->second;
  if (seq.cancelled || !first_token.ok()) {
    if (!first_token.ok()) {
      metrics_->kv_receive_failures.Increment();
      if (!seq.cancelled) {
        PDSERVE_LOG(WARNING) << "request " << seq.request_id
                             << ": KV transfer failed: " << first_token.status();
        seq.stream->Push({.error = absl::Status(first_token.status().code(),
                                                absl::StrCat("KV transfer failed: ",
                                                             first_token.status().message()))});
      }
    }
    FreeLocked(id);
    return;
  }
  const int32_t token = *first_token;
  if (token < 0 || token >= runner_->config().vocab_size) {
    seq.stream->Push(
        {.error = absl::InternalError(absl::StrCat("first token ", token, " out of range"))});
    FreeLocked(id);
    return;
  }
  seq.last_token = token;
  seq.position = seq.prompt_len;
  seq.generated.push_back(token);
  const engine::FinishReason reason =
      engine::CheckFinish(runner_->config(), seq.sampling, token, 1, seq.prompt_len + 1);
  if (reason != engine::FinishReason::kNone) {
    seq.stream->Push({.finished = true, .finish_reason = reason, .completion_tokens = 1});
    FreeLocked(id);
    return;
  }
  seq.state = State::kRunning;
  seq.last_token_time = absl::Now();
  ++num_running_;
  UpdateGaugesLocked();
}

void DecodeEngine::FreeLocked(engine::SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  if (it->second.state == State::kRunning) --num_running_;
  blocks_.Free(id);
  seqs_.erase(it);
  UpdateGaugesLocked();
}

void DecodeEngine::UpdateGaugesLocked() {
  metrics_->running_sequences.Set(num_running_);
  metrics_->waiting_kv_sequences.Set(static_cast<double>(seqs_.size()) - num_running_);
  metrics_->kv_cache_usage.Set(blocks_.usage_ratio());
}

DecodeLoad DecodeEngine::load() const {
  absl::MutexLock lock(&mu_);
  return DecodeLoad{.running = num_running_,
                    .waiting_kv = static_cast<int>(seqs_.size()) - num_running_,
                    .free_blocks = blocks_.num_free_blocks(),
                    .total_blocks = blocks_.num_blocks()};
}

void DecodeEngine::Loop() {
  const engine::ModelConfig& config = runner_->config();
  const double kv_bytes_per_token =
      static_cast<double>(config.KvBytesPerToken(engine::KvDtypeBytes(runner_->kv_dtype())));
  std::vector<engine::SeqId> ids;
  std::vector<Sequence*> batch_seqs;
  engine::StepBatch batch;
  while (true) {
    ids.clear();
    batch_seqs.clear();
    batch.seqs.clear();
    double kv_tokens = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || num_running_ > 0; };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      // Pointers into seqs_ stay valid: nodes are not moved, and a sequence
      // in the step is only erased by this thread.
      for (auto& [id, seq] : seqs_) {
        if (seq.state != State::kRunning || seq.cancelled) continue;
        seq.in_step = true;
        ids.push_back(id);
        batch_seqs.push_back(&seq);
        // Histories are only appended to by this thread, after the step.
        batch.seqs.push_back({.tokens = {&seq.last_token, 1},
                              .num_cached = seq.position,
                              .block_table = seq.block_table,
                              .sampling = &seq.sampling,
                              .history = {.prompt = seq.prompt, .generated = seq.generated}});
        kv_tokens += seq.position + 1;
      }
    }
    if (batch.seqs.empty()) continue;

    const absl::Time start = absl::Now();
    const size_t batch_size = batch.seqs.size();
    absl::StatusOr<engine::StepOutput> output = runner_->Step(batch);
    const absl::Status status = output.status();
    std::vector<engine::SampledToken> sampled =
        status.ok() ? std::move(output->sampled) : std::vector<engine::SampledToken>(batch_size);
    const absl::Time end = absl::Now();
    const double seconds = absl::ToDoubleSeconds(end - start);
    metrics_->step_seconds.Observe(seconds);
    metrics_->batch_size.Observe(static_cast<double>(batch_size));
    if (seconds > 0) {
      const double bytes_per_second = (weight_bytes_ + kv_tokens * kv_bytes_per_token) / seconds;
      metrics_->achieved_bytes_per_second.Set(bytes_per_second);
      if (options_.peak_memory_bandwidth > 0) {
        metrics_->bandwidth_utilization.Set(bytes_per_second / options_.peak_memory_bandwidth);
      }
    }

    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < ids.size(); ++i) {
      Sequence& seq = *batch_seqs[i];
      seq.in_step = false;
      if (seq.cancelled) {
        FreeLocked(ids[i]);
        continue;
      }
      if (!status.ok()) {
        PDSERVE_LOG(ERROR) << "decode step failed: " << status;
        seq.stream->Push(
            {.error = absl::InternalError(absl::StrCat("decode step failed: ", status.message()))});
        FreeLocked(ids[i]);
        continue;
      }
      const int32_t token = sampled[i].token;
      seq.generated.push_back(token);
      ++seq.position;
      seq.last_token = token;
      metrics_->generation_tokens.Increment();
      metrics_->inter_token_latency.Observe(absl::ToDoubleSeconds(end - seq.last_token_time));
      seq.last_token_time = end;
      const int num_generated = static_cast<int>(seq.generated.size());
      const engine::FinishReason reason = engine::CheckFinish(
          config, seq.sampling, token, num_generated, seq.prompt_len + num_generated);
      DecodeOutput out{.tokens = {std::move(sampled[i])}};
      if (reason != engine::FinishReason::kNone) {
        out.finished = true;
        out.finish_reason = reason;
        out.completion_tokens = num_generated;
        seq.stream->Push(std::move(out));
        FreeLocked(ids[i]);
      } else {
        seq.stream->Push(std::move(out));
      }
    }
  }
}

}  // namespace pdserve::decode
