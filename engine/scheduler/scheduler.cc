// Scheduler: see scheduler.h.
#include "engine/scheduler/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pdserve::engine {

std::string_view SchedulerRoleName(SchedulerRole role) {
  switch (role) {
    case SchedulerRole::kPrefill:
      return "prefill";
    case SchedulerRole::kDecode:
      return "decode";
    case SchedulerRole::kColocated:
      return "colocated";
  }
  return "unknown";
}

Scheduler::Scheduler(const SchedulerOptions& options, const ModelConfig& config, int num_blocks,
                     int block_size)
    : options_(options), config_(config), kv_(num_blocks, block_size) {}

void Scheduler::SetState(Sequence& seq, State state) {
  --num_in_state_[static_cast<int>(seq.state)];
  seq.state = state;
  ++num_in_state_[static_cast<int>(state)];
}

const Scheduler::Sequence* Scheduler::Find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

absl::Status Scheduler::AddPrompt(SeqId id, std::vector<int32_t> prompt, SamplingParams sampling) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (seqs_.contains(id)) return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " exists"));
  const int prompt_len = static_cast<int>(prompt.size());
  // The last generated token never enters the cache.
  const int reserve = options_.role == SchedulerRole::kPrefill
                          ? prompt_len
                          : prompt_len + std::max(sampling.max_tokens, 1) - 1;
  if (kv_.BlocksForTokens(reserve) > kv_.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        reserve, " tokens of KV (", kv_.BlocksForTokens(reserve),
        " blocks) exceed the whole cache of ", kv_.num_blocks(), " blocks of ", kv_.block_size()));
  }
  Sequence& seq = seqs_[id];
  seq.id = id;
  seq.tokens = std::move(prompt);
  seq.prompt_len = prompt_len;
  seq.reserve_tokens = reserve;
  seq.sampling = std::move(sampling);
  ++num_in_state_[static_cast<int>(State::kWaiting)];
  waiting_.push_back(id);
  return absl::OkStatus();
}

absl::StatusOr<std::span<const int32_t>> Scheduler::AddRemote(SeqId id, std::vector<int32_t> prompt,
                                                              SamplingParams sampling,
                                                              int reserve_tokens) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (seqs_.contains(id)) return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " exists"));
  if (num_holding() >= options_.plan.max_num_seqs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("holds its maximum of ", options_.plan.max_num_seqs, " sequences"));
  }
  reserve_tokens = std::max(reserve_tokens, static_cast<int>(prompt.size()));
  if (absl::Status s = kv_.Allocate(id, reserve_tokens); !s.ok()) return s;
  Sequence& seq = seqs_[id];
  seq.id = id;
  seq.prompt_len = static_cast<int>(prompt.size());
  seq.tokens = std::move(prompt);
  seq.reserve_tokens = reserve_tokens;
  seq.sampling = std::move(sampling);
  seq.state = State::kAwaitingKv;
  ++num_in_state_[static_cast<int>(State::kAwaitingKv)];
  const std::span<const int32_t> table = kv_.BlockTable(id);
  seq.block_table.assign(table.begin(), table.end());
  admitted_.push_back(id);
  return std::span<const int32_t>(seq.block_table);
}

absl::StatusOr<FinishReason> Scheduler::StartDecoding(SeqId id, int32_t first_token) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.state != State::kAwaitingKv) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is not awaiting its KV"));
  }
  Sequence& seq = it->second;
  seq.tokens.push_back(first_token);
  seq.num_computed = seq.prompt_len;
  const FinishReason finish =
      CheckFinish(config_, seq.sampling, first_token, 1, static_cast<int>(seq.tokens.size()));
  if (finish != FinishReason::kNone) {
    FreeSequence(id);
  } else {
    SetState(seq, State::kRunning);
  }
  return finish;
}

void Scheduler::Release(SeqId id) {
  auto it = seqs_.find(id);
  if (it != seqs_.end() && it->second.state == State::kHeld) FreeSequence(id);
}

bool Scheduler::Cancel(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  if (it->second.in_step) {
    it->second.cancelled = true;
    return false;
  }
  FreeSequence(id);
  return true;
}

void Scheduler::FreeSequence(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  --num_in_state_[static_cast<int>(it->second.state)];
  if (it->second.state == State::kWaiting) {
    std::erase(waiting_, id);
  } else {
    std::erase(admitted_, id);
  }
  kv_.Free(id);
  seqs_.erase(it);
}

PlanSeq Scheduler::ToPlanSeq(const Sequence& seq) const {
  return PlanSeq{.id = seq.id,
                 .prompt_len = seq.prompt_len,
                 .num_tokens = static_cast<int>(seq.tokens.size()),
                 .num_computed = seq.num_computed,
                 .num_blocks = static_cast<int>(seq.block_table.size()),
                 .reserve_tokens = seq.reserve_tokens,
                 .admit_blocks = kv_.BlocksForTokens(seq.reserve_tokens),
                 .ready = seq.state == State::kRunning && !seq.in_step && !seq.cancelled};
}

int64_t Scheduler::pending_prompt_tokens() const {
  int64_t n = 0;
  for (const auto& [id, seq] : seqs_) {
    if (seq.state == State::kWaiting || seq.state == State::kRunning) {
      n += std::max(0, seq.prompt_len - seq.num_computed);
    }
  }
  return n;
}

ScheduledStep Scheduler::Schedule() {
  PlanInput input;
  input.block_size = kv_.block_size();
  input.free_blocks = kv_.num_free_blocks();
  input.num_holding = num_holding();
  for (SeqId id : admitted_) input.running.push_back(ToPlanSeq(seqs_.at(id)));
  for (SeqId id : waiting_) input.waiting.push_back(ToPlanSeq(seqs_.at(id)));
  const StepPlan plan = PlanStep(input, options_.plan);

  ScheduledStep step;
  for (const PlannedSeq& p : plan.seqs) {
    Sequence& seq = seqs_.at(p.id);
    // PlanStep subtracted every block it planned from one free count, so
    // these cannot fail; if they ever do, the sequence just waits.
    if (p.admit) {
      if (!kv_.Allocate(p.id, seq.reserve_tokens).ok()) continue;
      std::erase(waiting_, p.id);
      admitted_.push_back(p.id);
      SetState(seq, State::kRunning);
    } else if (p.new_blocks > 0) {
      if (!kv_.Reserve(p.id, seq.num_computed + p.num_new_tokens).ok()) continue;
    }
    if (p.admit || p.new_blocks > 0) {
      const std::span<const int32_t> table = kv_.BlockTable(p.id);
      seq.block_table.assign(table.begin(), table.end());
    }
    seq.in_step = true;
    const std::span<const int32_t> all(seq.tokens);
    StepSequence s{.tokens = all.subspan(seq.num_computed, p.num_new_tokens),
                   .num_cached = seq.num_computed,
                   .block_table = seq.block_table};
    if (p.samples) {
      s.sampling = &seq.sampling;
      s.history = {.prompt = all.first(seq.prompt_len), .generated = all.subspan(seq.prompt_len)};
    }
    step.ids.push_back(p.id);
    step.admitted.push_back(p.admit);
    step.num_new_tokens.push_back(p.num_new_tokens);
    step.batch.seqs.push_back(s);
    step.num_tokens += p.num_new_tokens;
  }
  return step;
}

std::vector<SequenceUpdate> Scheduler::Complete(ScheduledStep& step,
                                                const absl::StatusOr<StepOutput>& result) {
  std::vector<SequenceUpdate> updates;
  updates.reserve(step.ids.size());
  for (size_t i = 0; i < step.ids.size(); ++i) {
    const SeqId id = step.ids[i];
    Sequence& seq = seqs_.at(id);
    seq.in_step = false;
    SequenceUpdate u{.id = id};
    if (seq.cancelled) {
      FreeSequence(id);
      u.cancelled = u.freed = true;
    } else if (!result.ok()) {
      FreeSequence(id);
      u.error = result.status();
      u.freed = true;
    } else {
      seq.num_computed += step.num_new_tokens[i];
      if (step.batch.seqs[i].sampling != nullptr) {
        const SampledToken& token = result->sampled[i];
        u.token = token;
        seq.tokens.push_back(token.token);
        if (options_.role == SchedulerRole::kPrefill) {
          SetState(seq, State::kHeld);  // its KV goes to a decode worker next
        } else {
          u.finish = CheckFinish(config_, seq.sampling, token.token, seq.num_generated(),
                                 static_cast<int>(seq.tokens.size()));
          if (u.finish != FinishReason::kNone) {
            FreeSequence(id);
            u.freed = true;
          }
        }
      }
    }
    updates.push_back(std::move(u));
  }
  step = ScheduledStep{};  // its spans may dangle from here on
  return updates;
}

}  // namespace pdserve::engine
