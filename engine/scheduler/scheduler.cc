// Scheduler: see scheduler.h.
#include "engine/scheduler/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/spec/rejection_sampler.h"

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

int Scheduler::FullReserveTokens(int prompt_len, int known_tokens,
                                 const SamplingParams& sampling) const {
  // The last generated token never enters the cache.
  if (options_.role == SchedulerRole::kPrefill) return known_tokens;
  return std::max(known_tokens, prompt_len + std::max(sampling.max_tokens, 1) - 1);
}

int Scheduler::AdmitReserveTokens(int prompt_len, int known_tokens,
                                  const SamplingParams& sampling) const {
  const int full = FullReserveTokens(prompt_len, known_tokens, sampling);
  if (options_.role == SchedulerRole::kPrefill || options_.kv_headroom_tokens < 0) return full;
  const int64_t lazy = int64_t{known_tokens} + options_.kv_headroom_tokens;
  return static_cast<int>(std::min<int64_t>(full, std::max<int64_t>(lazy, known_tokens)));
}

void Scheduler::EnsureHashes(Sequence& seq, int num_blocks) {
  const int block_size = kv_.block_size();
  const std::span<const int32_t> tokens(seq.tokens);
  while (static_cast<int>(seq.block_hashes.size()) < num_blocks) {
    const size_t at = seq.block_hashes.size() * block_size;
    const BlockHash parent = seq.block_hashes.empty() ? kNoParentHash : seq.block_hashes.back();
    seq.block_hashes.push_back(ChainBlockHash(parent, tokens.subspan(at, block_size)));
  }
}

std::span<const BlockHash> Scheduler::LookupHashes(Sequence& seq) {
  // Full blocks before the last known token: at least that token is
  // computed, so the step that ends the sequence's known tokens samples.
  const int blocks = (static_cast<int>(seq.tokens.size()) - 1) / kv_.block_size();
  EnsureHashes(seq, blocks);
  return std::span<const BlockHash>(seq.block_hashes).first(blocks);
}

void Scheduler::CommitComputed(Sequence& seq) {
  const int blocks = seq.num_computed / kv_.block_size();
  if (!options_.enable_prefix_caching || blocks <= seq.committed_blocks) return;
  EnsureHashes(seq, blocks);
  // Cannot fail: the sequence holds at least `blocks` blocks.
  (void)kv_.CommitBlockHashes(seq.id, std::span<const BlockHash>(seq.block_hashes).first(blocks));
  seq.committed_blocks = blocks;
}

absl::Status Scheduler::AddPrompt(SeqId id, std::vector<int32_t> prompt, SamplingParams sampling,
                                  std::span<const int32_t> generated) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (seqs_.contains(id)) return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " exists"));
  const int prompt_len = static_cast<int>(prompt.size());
  prompt.insert(prompt.end(), generated.begin(), generated.end());
  const int known = static_cast<int>(prompt.size());
  const int full = FullReserveTokens(prompt_len, known, sampling);
  if (kv_.BlocksForTokens(full) > kv_.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        full, " tokens of KV (", kv_.BlocksForTokens(full), " blocks) exceed the whole cache of ",
        kv_.num_blocks(), " blocks of ", kv_.block_size()));
  }
  Sequence& seq = seqs_[id];
  seq.id = id;
  seq.tokens = std::move(prompt);
  seq.prompt_len = prompt_len;
  seq.sampling = std::move(sampling);
  seq.reserve_tokens = AdmitReserveTokens(prompt_len, known, seq.sampling);
  if (options_.enable_prefix_caching) {
    seq.cached_when_added = kv_.NumCachedBlocks(LookupHashes(seq)) * kv_.block_size();
  }
  ++num_in_state_[static_cast<int>(State::kWaiting)];
  waiting_.push_back(id);
  return absl::OkStatus();
}

absl::StatusOr<std::span<const int32_t>> Scheduler::AddRemote(SeqId id, std::vector<int32_t> prompt,
                                                              SamplingParams sampling,
                                                              std::span<const int32_t> generated) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (seqs_.contains(id)) return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " exists"));
  const int prompt_len = static_cast<int>(prompt.size());
  prompt.insert(prompt.end(), generated.begin(), generated.end());
  const int known = static_cast<int>(prompt.size());
  const int full = FullReserveTokens(prompt_len, known, sampling);
  if (kv_.BlocksForTokens(full) > kv_.num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot hold the request: ", full, " tokens of KV (", kv_.BlocksForTokens(full),
        " blocks) exceed its whole cache of ", kv_.num_blocks(), " blocks of ", kv_.block_size()));
  }
  // Preempted sequences waiting for readmission keep their slots.
  if (num_holding() + num_waiting() >= options_.plan.max_num_seqs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("holds its maximum of ", options_.plan.max_num_seqs, " sequences"));
  }
  const int reserve = AdmitReserveTokens(prompt_len, known, sampling);
  if (kv_.BlocksForTokens(reserve) > num_available_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: ", kv_.BlocksForTokens(reserve), " blocks needed for ",
                     reserve, " tokens, ", num_available_blocks(), " of ", kv_.num_blocks(),
                     " available (", num_waiting(), " preempted sequences waiting)"));
  }
  if (absl::Status s = kv_.Allocate(id, reserve); !s.ok()) return s;
  Sequence& seq = seqs_[id];
  seq.id = id;
  seq.prompt_len = prompt_len;
  seq.tokens = std::move(prompt);
  seq.reserve_tokens = reserve;
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
  seq.num_computed = static_cast<int>(seq.tokens.size());
  seq.tokens.push_back(first_token);
  const FinishReason finish = CheckFinish(config_, seq.sampling, first_token, seq.num_generated(),
                                          static_cast<int>(seq.tokens.size()));
  if (finish != FinishReason::kNone) {
    FreeSequence(id);
  } else {
    CommitComputed(seq);
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

void Scheduler::Preempt(SeqId id) {
  Sequence& seq = seqs_.at(id);
  kv_.Free(id);  // computed full blocks stay cached (evictable) with prefix caching
  seq.block_table.clear();
  seq.proposal.clear();
  seq.proposal_probs.clear();
  seq.num_computed = 0;
  seq.committed_blocks = 0;
  seq.reserve_tokens =
      AdmitReserveTokens(seq.prompt_len, static_cast<int>(seq.tokens.size()), seq.sampling);
  ++seq.num_preemptions;
  std::erase(admitted_, id);
  SetState(seq, State::kWaiting);
}

PlanSeq Scheduler::RunningPlanSeq(const Sequence& seq) const {
  const bool preemptable = seq.state == State::kRunning && !seq.in_step && !seq.cancelled &&
                           options_.role != SchedulerRole::kPrefill;
  int free_on_preempt = 0;
  if (preemptable) {
    for (int32_t block : seq.block_table) free_on_preempt += kv_.RefCount(block) == 1;
  }
  return PlanSeq{.id = seq.id,
                 .prompt_len = seq.prompt_len,
                 .num_tokens = static_cast<int>(seq.tokens.size()),
                 .num_computed = seq.num_computed,
                 .num_blocks = static_cast<int>(seq.block_table.size()),
                 .ready = seq.state == State::kRunning && !seq.in_step && !seq.cancelled,
                 .preemptable = preemptable,
                 .free_on_preempt = free_on_preempt,
                 .num_proposed = static_cast<int>(seq.proposal.size())};
}

bool Scheduler::IsDecoding(const Sequence& seq) const {
  return seq.state == State::kRunning && !seq.in_step && !seq.cancelled &&
         seq.num_computed >= seq.prompt_len &&
         seq.num_computed + 1 == static_cast<int>(seq.tokens.size());
}

std::vector<SeqId> Scheduler::DecodingSequences() const {
  std::vector<SeqId> ids;
  for (SeqId id : admitted_) {
    if (IsDecoding(seqs_.at(id))) ids.push_back(id);
  }
  return ids;
}

absl::Status Scheduler::SetProposal(SeqId id, std::vector<int32_t> tokens,
                                    std::vector<float> probs) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || !IsDecoding(it->second)) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " is not decoding"));
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("proposed token ", t, " out of range"));
    }
  }
  if (!probs.empty() && probs.size() != tokens.size() * static_cast<size_t>(config_.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat("proposal distributions of ", probs.size(),
                                                   " values for ", tokens.size(), " tokens"));
  }
  it->second.proposal = std::move(tokens);
  it->second.proposal_probs = std::move(probs);
  return absl::OkStatus();
}

PlanSeq Scheduler::WaitingPlanSeq(Sequence& seq) {
  PlanSeq p{.id = seq.id,
            .prompt_len = seq.prompt_len,
            .num_tokens = static_cast<int>(seq.tokens.size()),
            .reserve_tokens = seq.reserve_tokens,
            .admit_blocks = kv_.BlocksForTokens(seq.reserve_tokens)};
  if (options_.enable_prefix_caching) {
    const std::span<const BlockHash> lookup = LookupHashes(seq);
    p.num_computed = kv_.NumCachedBlocks(lookup) * kv_.block_size();
    p.admit_blocks = kv_.FreeBlocksNeeded(lookup, seq.reserve_tokens);
  }
  return p;
}

int64_t Scheduler::pending_prompt_tokens() const {
  int64_t n = 0;
  for (const auto& [id, seq] : seqs_) {
    if (seq.state == State::kWaiting) {
      n += std::max(0, seq.prompt_len - std::max(seq.num_computed, seq.cached_when_added));
    } else if (seq.state == State::kRunning) {
      n += std::max(0, seq.prompt_len - seq.num_computed);
    }
  }
  return n;
}

int Scheduler::num_available_blocks() const {
  int64_t waiting = 0;
  for (SeqId id : waiting_) waiting += kv_.BlocksForTokens(seqs_.at(id).reserve_tokens);
  return static_cast<int>(std::max<int64_t>(0, kv_.num_free_blocks() - waiting));
}

ScheduledStep Scheduler::Schedule() {
  PlanInput input;
  input.block_size = kv_.block_size();
  input.free_blocks = kv_.num_free_blocks();
  input.total_blocks = kv_.num_blocks();
  input.num_holding = num_holding();
  for (SeqId id : admitted_) input.running.push_back(RunningPlanSeq(seqs_.at(id)));
  // Waiting sequences past what the free blocks could admit are left out:
  // the planner admits first come first served and would stop before them.
  int64_t admit_blocks = 0;
  for (SeqId id : waiting_) {
    if (static_cast<int>(input.waiting.size()) + input.num_holding >= options_.plan.max_num_seqs) {
      break;
    }
    input.waiting.push_back(WaitingPlanSeq(seqs_.at(id)));
    admit_blocks += input.waiting.back().admit_blocks;
    if (admit_blocks > input.free_blocks) break;
  }
  PlanOptions plan_options = options_.plan;
  if (step_token_limit_ > 0) {
    plan_options.max_batch_tokens = std::min(plan_options.max_batch_tokens, step_token_limit_);
  }
  const StepPlan plan = PlanStep(input, plan_options);

  ScheduledStep step;
  for (SeqId id : plan.too_large) {
    const Sequence& seq = seqs_.at(id);
    const int tokens = seq.num_computed + 1;
    step.failed.emplace_back(
        id, absl::ResourceExhaustedError(absl::StrCat(
                "sequence of ", tokens, " tokens needs ", kv_.BlocksForTokens(tokens),
                " blocks of KV: more than the whole cache of ", kv_.num_blocks(), " blocks")));
    FreeSequence(id);
  }
  // Newest first in the plan; back at the head of the queue oldest first.
  for (SeqId id : plan.preempted) {
    Preempt(id);
    waiting_.insert(waiting_.begin(), id);
  }
  step.preempted = plan.preempted;

  // Admissions take their cached prefixes first: a fresh block taken for
  // anyone may evict an evictable cached block another admission counts on.
  std::unordered_map<SeqId, bool> admitted_ok;
  for (const PlannedSeq& p : plan.seqs) {
    if (!p.admit) continue;
    Sequence& seq = seqs_.at(p.id);
    std::span<const BlockHash> cached;
    if (options_.enable_prefix_caching) {
      const std::span<const BlockHash> lookup = LookupHashes(seq);
      cached = lookup.first(kv_.NumCachedBlocks(lookup));
    }
    const int cached_tokens = static_cast<int>(cached.size()) * kv_.block_size();
    admitted_ok[p.id] = kv_.AllocateCached(p.id, cached, cached_tokens).ok();
    seq.num_computed = cached_tokens;
    seq.committed_blocks = static_cast<int>(cached.size());
  }
  for (const PlannedSeq& p : plan.seqs) {
    Sequence& seq = seqs_.at(p.id);
    // PlanStep subtracted every block it planned from one free count, so
    // these cannot fail; if they ever do, the sequence just waits.
    if (p.admit) {
      if (!admitted_ok[p.id] || !kv_.Reserve(p.id, seq.reserve_tokens).ok()) {
        kv_.Free(p.id);
        seq.num_computed = 0;
        seq.committed_blocks = 0;
        continue;
      }
      std::erase(waiting_, p.id);
      admitted_.push_back(p.id);
      SetState(seq, State::kRunning);
      if (options_.enable_prefix_caching) {
        step.prefix_query_tokens += static_cast<int>(seq.tokens.size());
        step.prefix_hit_tokens += seq.num_computed;
      }
    } else if (p.new_blocks > 0) {
      if (!kv_.Reserve(p.id, seq.num_computed + p.num_new_tokens).ok()) continue;
    }
    if (p.admit || p.new_blocks > 0) {
      const std::span<const int32_t> table = kv_.BlockTable(p.id);
      seq.block_table.assign(table.begin(), table.end());
    }
    const int num_tokens = static_cast<int>(seq.tokens.size());
    seq.in_step = true;
    if (!p.admit && p.num_new_tokens > 1 && !seq.proposal.empty() &&
        seq.num_computed + 1 == num_tokens) {
      // A decode that verifies proposals: the newest token, then them.
      const int proposed = p.num_new_tokens - 1;
      seq.step_tokens.assign(1, seq.tokens.back());
      seq.step_tokens.insert(seq.step_tokens.end(), seq.proposal.begin(),
                             seq.proposal.begin() + proposed);
      step.ids.push_back(p.id);
      step.admitted.push_back(false);
      step.num_new_tokens.push_back(p.num_new_tokens);
      step.num_proposed.push_back(proposed);
      step.batch.seqs.push_back({.tokens = seq.step_tokens,
                                 .num_cached = seq.num_computed,
                                 .block_table = seq.block_table,
                                 .num_verify_rows = p.num_new_tokens});
      step.num_tokens += p.num_new_tokens;
      continue;
    }
    seq.proposal.clear();
    seq.proposal_probs.clear();
    const int n = std::min(p.num_new_tokens, num_tokens - seq.num_computed);
    const std::span<const int32_t> all(seq.tokens);
    StepSequence s{.tokens = all.subspan(seq.num_computed, n),
                   .num_cached = seq.num_computed,
                   .block_table = seq.block_table};
    if (seq.num_computed + n == num_tokens) {
      s.sampling = &seq.sampling;
      s.history = {.prompt = all.first(seq.prompt_len), .generated = all.subspan(seq.prompt_len)};
    }
    step.prompt_work |= n > 1 || seq.num_computed < seq.prompt_len;
    step.ids.push_back(p.id);
    step.admitted.push_back(p.admit);
    step.num_new_tokens.push_back(n);
    step.num_proposed.push_back(0);
    step.batch.seqs.push_back(s);
    step.num_tokens += n;
  }
  return step;
}

std::vector<SequenceUpdate> Scheduler::Complete(ScheduledStep& step,
                                                const absl::StatusOr<StepOutput>& result) {
  std::vector<SequenceUpdate> updates;
  updates.reserve(step.ids.size());
  size_t verify_row = 0;  // next row of result->verify_logits
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
    } else if (step.num_proposed[i] > 0) {
      const size_t rows = static_cast<size_t>(step.num_proposed[i]) + 1;
      if (result->verify_logits.size() < (verify_row + rows) * config_.vocab_size) {
        FreeSequence(id);
        u.error = absl::InternalError("the runner returned no verification logits");
        u.freed = true;
      } else {
        CompleteVerification(seq, step.num_proposed[i], *result, verify_row, u);
      }
      verify_row += rows;
    } else {
      seq.num_computed += step.num_new_tokens[i];
      CommitComputed(seq);
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

void Scheduler::CompleteVerification(Sequence& seq, int num_proposed, const StepOutput& result,
                                     size_t row, SequenceUpdate& u) {
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  const std::span<const int32_t> all(seq.tokens);
  thread_local spec::VerifyScratch scratch;
  const std::span<const float> probs(seq.proposal_probs);
  const spec::VerifyResult verified = spec::VerifyProposals(
      {.logits = std::span<const float>(result.verify_logits)
                     .subspan(row * vocab, (static_cast<size_t>(num_proposed) + 1) * vocab),
       .proposals = std::span<const int32_t>(seq.proposal).first(num_proposed),
       .proposal_probs = probs.empty() ? probs : probs.first(num_proposed * vocab),
       .sampling = &seq.sampling,
       .history = {.prompt = all.first(seq.prompt_len), .generated = all.subspan(seq.prompt_len)},
       .eos_ids = config_.eos_token_ids},
      scratch);
  seq.proposal.clear();
  seq.proposal_probs.clear();
  u.num_proposed = num_proposed;
  u.num_accepted = verified.num_accepted;
  // The newest token and the standing proposals are computed; the KV of the
  // rejected ones is not, and the blocks taken only for them go back.
  seq.num_computed += 1 + verified.num_accepted;
  for (const SampledToken& token : verified.tokens) {
    seq.tokens.push_back(token.token);
    if (!u.token.has_value()) {
      u.token = token;
    } else {
      u.more_tokens.push_back(token);
    }
    u.finish = CheckFinish(config_, seq.sampling, token.token, seq.num_generated(),
                           static_cast<int>(seq.tokens.size()));
    if (u.finish != FinishReason::kNone) break;
  }
  if (u.finish != FinishReason::kNone) {
    FreeSequence(seq.id);
    u.freed = true;
    return;
  }
  (void)kv_.Truncate(seq.id, std::max(static_cast<int>(seq.tokens.size()), seq.reserve_tokens));
  const std::span<const int32_t> table = kv_.BlockTable(seq.id);
  seq.block_table.assign(table.begin(), table.end());
  CommitComputed(seq);
}

}  // namespace pdserve::engine
