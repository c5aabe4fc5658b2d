#include "decode_worker/colocated_engine.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pdserve::colocated {

StepPlan PlanStep(const std::vector<int>& waiting_tokens, const std::vector<int>& waiting_blocks,
                  int free_blocks, int num_running, const ColocatedOptions& options) {
  StepPlan plan;
  int tokens = 0;
  for (size_t i = 0; i < waiting_tokens.size(); ++i) {
    if (num_running + plan.num_prefill >= options.max_running) break;
    if (plan.num_prefill > 0 && tokens + waiting_tokens[i] > options.max_prefill_tokens) break;
    if (waiting_blocks[i] > free_blocks) break;  // FCFS: nobody overtakes the head
    free_blocks -= waiting_blocks[i];
    tokens += waiting_tokens[i];
    ++plan.num_prefill;
  }
  if (plan.num_prefill > 0) {
    plan.kind = StepPlan::Kind::kPrefill;
  } else if (num_running > 0) {
    plan.kind = StepPlan::Kind::kDecode;
  }
  return plan;
}

ColocatedEngine::ColocatedEngine(ColocatedOptions options, engine::ModelRunner* runner,
                                 ColocatedMetrics* metrics)
    : options_(options),
      runner_(runner),
      metrics_(metrics),
      blocks_(runner->num_kv_blocks(), runner->kv_block_size()) {
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
  for (auto& [id, seq] : seqs_) {
    seq.stream->Push({.error = absl::UnavailableError("colocated server is shutting down")});
  }
}

int ColocatedEngine::ReserveTokens(const Sequence& seq) const {
  // The last generated token never enters the cache.
  return static_cast<int>(seq.prompt.size()) + seq.sampling.max_tokens - 1;
}

absl::StatusOr<std::shared_ptr<ColocatedStream>> ColocatedEngine::Submit(ColocatedRequest request) {
  const engine::ModelConfig& config = runner_->config();
  if (absl::Status s = engine::ValidateGenerationRequest(request.prompt, request.sampling, config);
      !s.ok()) {
    return s;
  }
  Sequence seq;
  seq.request_id = std::move(request.request_id);
  seq.sampling = std::move(request.sampling);
  seq.prompt = std::move(request.prompt);
  seq.submitted = absl::Now();
  const int reserve = ReserveTokens(seq);

  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("colocated server is shutting down");
  if (blocks_.BlocksForTokens(reserve) > blocks_.num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt + max_tokens (", reserve + 1, " tokens) exceed the whole KV cache"));
  }
  if (static_cast<int>(waiting_.size()) >= options_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("colocated server queue full (", options_.max_waiting, " prompts)"));
  }
  const engine::SeqId id = next_seq_++;
  auto stream = std::make_shared<ColocatedStream>(id);
  seq.stream = stream;
  seqs_.emplace(id, std::move(seq));
  waiting_.push_back(id);
  UpdateGaugesLocked();
  return stream;
}

void ColocatedEngine::Cancel(const ColocatedStream& stream) {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(stream.seq());
  if (it == seqs_.end()) return;
  it->second.cancelled = true;
  if (!it->second.in_step) FreeLocked(stream.seq());  // else: freed when the step ends
}

void ColocatedEngine::FreeLocked(engine::SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  if (it->second.state == State::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  } else {
    running_.erase(std::find(running_.begin(), running_.end(), id));
  }
  blocks_.Free(id);
  seqs_.erase(it);
  UpdateGaugesLocked();
}

void ColocatedEngine::UpdateGaugesLocked() {
  metrics_->waiting_sequences.Set(static_cast<double>(waiting_.size()));
  metrics_->running_sequences.Set(static_cast<double>(running_.size()));
  metrics_->kv_cache_usage.Set(blocks_.usage_ratio());
}

ColocatedLoad ColocatedEngine::load() const {
  absl::MutexLock lock(&mu_);
  return ColocatedLoad{.waiting = static_cast<int>(waiting_.size()),
                       .running = static_cast<int>(running_.size()),
                       .free_blocks = blocks_.num_free_blocks(),
                       .total_blocks = blocks_.num_blocks()};
}

void ColocatedEngine::Loop() {
  std::vector<engine::SeqId> step;
  while (true) {
    StepPlan plan;
    step.clear();
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || !waiting_.empty() || !running_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      if (stop_) return;
      std::vector<int> waiting_tokens, waiting_blocks;
      for (engine::SeqId id : waiting_) {
        const Sequence& seq = seqs_.at(id);
        waiting_tokens.push_back(static_cast<int>(seq.prompt.size()));
        waiting_blocks.push_back(blocks_.BlocksForTokens(ReserveTokens(seq)));
      }
      plan = PlanStep(waiting_tokens, waiting_blocks, blocks_.num_free_blocks(),
                      static_cast<int>(running_.size()), options_);
      switch (plan.kind) {
        case StepPlan::Kind::kIdle:
          continue;
        case StepPlan::Kind::kPrefill:
          for (int i = 0; i < plan.num_prefill; ++i) {
            const engine::SeqId id = waiting_.front();
            waiting_.pop_front();
            Sequence& seq = seqs_.at(id);
            // PlanStep counted these blocks as free.
            PDSERVE_CHECK(blocks_.Allocate(id, ReserveTokens(seq)).ok());
            const auto table = blocks_.BlockTable(id);
            seq.block_table.assign(table.begin(), table.end());
            seq.state = State::kRunning;  // a running sequence from here on, even mid-prefill
            running_.push_back(id);
            seq.in_step = true;
            step.push_back(id);
          }
          break;
        case StepPlan::Kind::kDecode:
          for (engine::SeqId id : running_) {
            Sequence& seq = seqs_.at(id);
            seq.in_step = true;
            step.push_back(id);
          }
          break;
      }
      UpdateGaugesLocked();
    }
    if (plan.kind == StepPlan::Kind::kPrefill) {
      RunPrefill(step);
    } else {
      RunDecode(step);
    }
  }
}

void ColocatedEngine::RunPrefill(const std::vector<engine::SeqId>& ids) {
  engine::StepBatch step;
  std::vector<double> queue_seconds;
  const absl::Time start = absl::Now();
  {
    // Prompts and block tables of in-step sequences are not touched by other
    // threads (Cancel defers to the end of the step), so the spans stay valid.
    absl::MutexLock lock(&mu_);
    for (engine::SeqId id : ids) {
      const Sequence& seq = seqs_.at(id);
      step.seqs.push_back({.tokens = seq.prompt,
                           .num_cached = 0,
                           .block_table = seq.block_table,
                           .sampling = &seq.sampling,
                           .history = {.prompt = seq.prompt, .generated = {}}});
      queue_seconds.push_back(absl::ToDoubleSeconds(start - seq.submitted));
    }
  }
  absl::StatusOr<engine::StepOutput> output = runner_->Step(std::move(step));
  const absl::Status status = output.status();
  metrics_->prefill_step_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  metrics_->prefill_steps.Increment();

  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    Sequence& seq = seqs_.at(ids[i]);
    if (!SettleLocked(ids[i], seq, status, "prefill")) continue;
    // The runner samples with the same pipeline as the prefill worker.
    const engine::SampledToken& first = output->sampled[i];
    seq.position = static_cast<int>(seq.prompt.size());
    ApplyTokenLocked(ids[i], seq, first.token, queue_seconds[i]);
  }
}

bool ColocatedEngine::SettleLocked(engine::SeqId id, Sequence& seq, const absl::Status& step,
                                   const char* what) {
  seq.in_step = false;
  if (seq.cancelled) {
    FreeLocked(id);
    return false;
  }
  if (!step.ok()) {
    PDSERVE_LOG(ERROR) << what << " step failed: " << step;
    seq.stream->Push(
        {.error = absl::InternalError(absl::StrCat(what, " step failed: ", step.message()))});
    FreeLocked(id);
    return false;
  }
  return true;
}

void ColocatedEngine::RunDecode(const std::vector<engine::SeqId>& ids) {
  engine::StepBatch batch;
  {
    // Nodes of seqs_ do not move, and an in-step sequence is only changed
    // (its history appended, or erased) by this thread after the step.
    absl::MutexLock lock(&mu_);
    for (engine::SeqId id : ids) {
      const Sequence& seq = seqs_.at(id);
      batch.seqs.push_back({.tokens = {&seq.last_token, 1},
                            .num_cached = seq.position,
                            .block_table = seq.block_table,
                            .sampling = &seq.sampling,
                            .history = {.prompt = seq.prompt, .generated = seq.generated}});
    }
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<engine::StepOutput> output = runner_->Step(std::move(batch));
  const absl::Status status = output.status();
  std::vector<int32_t> sampled(ids.size(), 0);
  if (status.ok()) {
    for (size_t i = 0; i < ids.size(); ++i) sampled[i] = output->sampled[i].token;
  }
  metrics_->decode_step_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  metrics_->decode_steps.Increment();

  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    Sequence& seq = seqs_.at(ids[i]);
    if (!SettleLocked(ids[i], seq, status, "decode")) continue;
    ++seq.position;
    ApplyTokenLocked(ids[i], seq, sampled[i], 0);
  }
}

void ColocatedEngine::ApplyTokenLocked(engine::SeqId id, Sequence& seq, int32_t token,
                                       double queue_seconds) {
  seq.generated.push_back(token);
  seq.last_token = token;
  const int generated = static_cast<int>(seq.generated.size());
  const engine::FinishReason reason =
      engine::CheckFinish(runner_->config(), seq.sampling, token, generated,
                          static_cast<int>(seq.prompt.size()) + generated);
  ColocatedOutput out{.tokens = {token}, .queue_seconds = queue_seconds};
  if (reason != engine::FinishReason::kNone) {
    out.finished = true;
    out.finish_reason = reason;
    seq.stream->Push(std::move(out));
    FreeLocked(id);
  } else {
    seq.stream->Push(std::move(out));
  }
}

}  // namespace pdserve::colocated
