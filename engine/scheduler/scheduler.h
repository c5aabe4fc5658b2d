// The continuous-batching core every role runs on: sequence state, the KV
// cache manager, and one step at a time planned by PlanStep
// (engine/scheduler/plan_step.h). Roles are policies of the same core:
//
//   kPrefill    prompts are queued, computed (whole or in chunks), and the
//               first token sampled; the sequence then holds its blocks
//               until the KV transfer has read them (Release).
//   kDecode     a sequence is admitted with blocks reserved for its prompt
//               plus a headroom while its prompt's KV arrives from a prefill
//               worker (AddRemote); with the KV and the first token in
//               (StartDecoding) it decodes one token per step, taking blocks
//               as it grows.
//   kColocated  prompts are queued, prefilled and decoded in one process,
//               with the same lazy growth.
//
// Lazy growth and preemption (kDecode, kColocated, with kv_headroom_tokens
// >= 0): admission reserves the known tokens plus the headroom; when a
// running sequence needs a block that is not free, the newest running
// sequences are preempted: their blocks are freed and they go back to the
// head of the waiting queue with num_computed = 0, their known tokens
// (prompt + generated) intact. Readmitted, they are recomputed as a prompt
// step (in chunks, sharing steps with decodes) whose last token samples the
// next one, so with seeded sampling the stream goes on exactly as it would
// have. The oldest running sequence is never preempted for a newer one, and
// a request that could never fit the whole cache is refused when added, so
// preemption cannot loop; a sequence that outgrows the whole cache anyway
// fails (ScheduledStep::failed).
//
// Prefix caching (enable_prefix_caching): the full blocks of every sequence
// are hashed (chained, engine/kvcache) once computed; a sequence is
// admitted with AllocateCached over its known tokens' block hashes and starts
// computing after its cached prefix (at least its last token is always
// computed, so the step samples); blocks of finished, released or preempted
// sequences stay cached as evictable until reused.
//
// Usage, on one engine thread under the engine's lock: Schedule() plans the
// next step, takes its blocks and returns the StepBatch; the engine runs it
// on the ModelRunner without the lock; Complete() applies the result and
// returns one update per sequence of the step. Other threads add, cancel and
// release sequences under the same lock. A sequence in a step is never freed
// under the runner: Cancel marks it and Complete frees it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/model/config.h"
#include "engine/runtime/finish.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sampler.h"
#include "engine/scheduler/plan_step.h"

namespace pdserve::engine {

enum class SchedulerRole { kPrefill, kDecode, kColocated };
std::string_view SchedulerRoleName(SchedulerRole role);

struct SchedulerOptions {
  SchedulerRole role = SchedulerRole::kColocated;
  PlanOptions plan;
  // Share cached prefixes at admission and keep computed blocks cached.
  bool enable_prefix_caching = false;
  // kDecode, kColocated: tokens reserved at admission beyond the known ones
  // (lazy growth). Never more than prompt + max_tokens - 1 in all; negative:
  // whole requests are reserved at admission.
  int kv_headroom_tokens = -1;
};

// What happened to one sequence of a completed step.
struct SequenceUpdate {
  SeqId id = 0;
  // A sampled token (the first one for a prompt), when the step sampled.
  std::optional<SampledToken> token;
  // Speculative decoding: the tokens after `token` the step produced (its
  // standing proposals and the token drawn after them), and how many
  // proposals it verified and kept. A finish stops the list at its token.
  std::vector<SampledToken> more_tokens;
  int num_proposed = 0;
  int num_accepted = 0;
  // kNone while the sequence goes on.
  FinishReason finish = FinishReason::kNone;
  // Non-OK: the step failed for this sequence; it has been freed.
  absl::Status error;
  // The sequence was cancelled during the step and has been freed.
  bool cancelled = false;
  // The sequence is gone (finished, failed or cancelled): its blocks are free.
  bool freed = false;
};

// One planned step: the batch for the runner and what it covers.
struct ScheduledStep {
  std::vector<SeqId> ids;           // batch order
  std::vector<bool> admitted;       // came from the waiting queue in this step
  std::vector<int> num_new_tokens;  // per sequence
  std::vector<int> num_proposed;    // per sequence: proposals verified (0: a plain step)
  StepBatch batch;                  // spans into the scheduler's sequences
  int num_tokens = 0;               // new tokens of the step
  bool prompt_work = false;         // some sequence computes more than its newest token
  // Preempted before this step (blocks freed, queued again); not in `ids`.
  std::vector<SeqId> preempted;
  // Sequences that can never fit the cache: failed with this status and
  // freed; not in `ids`.
  std::vector<std::pair<SeqId, absl::Status>> failed;
  // Prefix caching: tokens of the sequences admitted in this step, and how
  // many of them were found cached.
  int prefix_query_tokens = 0;
  int prefix_hit_tokens = 0;
  bool empty() const { return ids.empty(); }
};

class Scheduler {
 public:
  enum class State { kWaiting, kAwaitingKv, kRunning, kHeld };
  struct Sequence {
    SeqId id = 0;
    std::vector<int32_t> tokens;  // prompt, then generated tokens
    int prompt_len = 0;
    int num_computed = 0;    // tokens whose K/V is in the cache
    int reserve_tokens = 0;  // tokens reserved at its last admission
    SamplingParams sampling;
    State state = State::kWaiting;
    bool in_step = false;
    bool cancelled = false;
    std::vector<int32_t> block_table;  // copy of the cache manager's
    int num_preemptions = 0;
    // Prefix caching: chained hashes of the first full blocks of `tokens`
    // (extended as needed), how many of this admission's blocks carry their
    // hash, and the cached prompt tokens seen when it was added.
    std::vector<BlockHash> block_hashes;
    int committed_blocks = 0;
    int cached_when_added = 0;
    // Speculative decoding: tokens proposed to follow `tokens` (and the
    // distributions they were drawn from, [proposal.size(), vocab], or empty
    // for deterministic ones), verified by its next decode; and that step's
    // tokens (the newest, then the proposals), which the batch points into.
    std::vector<int32_t> proposal;
    std::vector<float> proposal_probs;
    std::vector<int32_t> step_tokens;

    int num_generated() const { return static_cast<int>(tokens.size()) - prompt_len; }
  };

  // `config` must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, const ModelConfig& config, int num_blocks,
            int block_size);

  // kPrefill, kColocated: queues a prompt. INVALID_ARGUMENT when the whole
  // request (kPrefill: its known tokens) needs more blocks than the whole
  // cache (it could never run), ALREADY_EXISTS for a known id.
  // `generated`: tokens the request already generated elsewhere (a
  // continuation after a worker failed): they are computed with the prompt,
  // the step samples token number generated.size(), and they count toward
  // max_tokens, min_tokens and the penalties, exactly as after a preemption.
  absl::Status AddPrompt(SeqId id, std::vector<int32_t> prompt, SamplingParams sampling,
                         std::span<const int32_t> generated = {});
  // kDecode: admits a sequence whose KV (prompt, then `generated` as for
  // AddPrompt) will be written from outside into the returned blocks (they
  // cover those tokens, plus the headroom). RESOURCE_EXHAUSTED when the
  // whole request could never fit the cache, or when blocks (those free
  // beyond what preempted sequences wait for) or max_num_seqs run out.
  absl::StatusOr<std::span<const int32_t>> AddRemote(SeqId id, std::vector<int32_t> prompt,
                                                     SamplingParams sampling,
                                                     std::span<const int32_t> generated = {});
  // kDecode: the KV of the known tokens and the next token arrived. Returns
  // that token's finish reason; when not kNone the sequence is freed.
  absl::StatusOr<FinishReason> StartDecoding(SeqId id, int32_t first_token);
  // kPrefill: frees a held sequence once its KV has been read.
  void Release(SeqId id);
  // Frees the sequence now, or after the step it is in (then Complete
  // reports it cancelled). True when it was freed now; false when deferred
  // or unknown.
  bool Cancel(SeqId id);

  // Speculative decoding: the running sequences whose next step is a decode
  // (past the prompt, only the newest token uncomputed, not in a step), in
  // admission order.
  std::vector<SeqId> DecodingSequences() const;
  // Gives a decoding sequence tokens proposed to follow it (and, when they
  // were drawn from a distribution, that distribution: [tokens.size(),
  // vocab]). Its next decode verifies as many of them as the budget and the
  // free blocks allow (engine/spec/rejection_sampler.h) and Complete returns
  // the tokens that stand plus the one after them; the KV of the rejected
  // ones is rolled back. FAILED_PRECONDITION when the sequence is not
  // decoding; INVALID_ARGUMENT for out-of-range tokens or a bad size.
  absl::Status SetProposal(SeqId id, std::vector<int32_t> tokens, std::vector<float> probs = {});

  // Caps the new tokens of the steps planned from now on below the options'
  // max_batch_tokens (a step bounded in time on a slow device); 0 lifts it.
  void set_step_token_limit(int tokens) { step_token_limit_ = tokens; }
  // Plans the next step and takes its blocks. Empty when nothing can run.
  ScheduledStep Schedule();
  // Applies a finished step (its result, or the error that failed it).
  std::vector<SequenceUpdate> Complete(ScheduledStep& step,
                                       const absl::StatusOr<StepOutput>& result);

  const Sequence* Find(SeqId id) const;
  const KvCacheManager& kv() const { return kv_; }
  const ModelConfig& config() const { return config_; }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return num_in_state_[static_cast<int>(State::kRunning)]; }
  int num_awaiting_kv() const { return num_in_state_[static_cast<int>(State::kAwaitingKv)]; }
  int num_held() const { return num_in_state_[static_cast<int>(State::kHeld)]; }
  // Sequences holding blocks (running, awaiting KV, held).
  int num_holding() const { return static_cast<int>(admitted_.size()); }
  // Uncomputed prompt tokens of waiting and running sequences (a waiting
  // prompt's cached prefix, as found when it was added, not counted).
  int64_t pending_prompt_tokens() const;
  // Free blocks beyond those the waiting sequences need to be admitted:
  // what a new admission can take without delaying them.
  int num_available_blocks() const;
  // Tokens reserved at admission for a sequence that knows `known_tokens`
  // of a request with this prompt length and sampling.
  int AdmitReserveTokens(int prompt_len, int known_tokens, const SamplingParams& sampling) const;

 private:
  void SetState(Sequence& seq, State state);
  void FreeSequence(SeqId id);
  // Frees a running sequence's blocks and queues it for recomputation.
  void Preempt(SeqId id);
  PlanSeq RunningPlanSeq(const Sequence& seq) const;
  PlanSeq WaitingPlanSeq(Sequence& seq);
  // Tokens the whole request needs in the cache (kPrefill: the known ones).
  int FullReserveTokens(int prompt_len, int known_tokens, const SamplingParams& sampling) const;
  // Prefix caching: the hashes admission looks up (full blocks before the
  // last known token), and committing the hashes of computed full blocks.
  std::span<const BlockHash> LookupHashes(Sequence& seq);
  void EnsureHashes(Sequence& seq, int num_blocks);
  void CommitComputed(Sequence& seq);
  bool IsDecoding(const Sequence& seq) const;
  // Complete's part for a sequence that verified `num_proposed` proposals
  // with the rows of result.verify_logits from `row` on.
  void CompleteVerification(Sequence& seq, int num_proposed, const StepOutput& result, size_t row,
                            SequenceUpdate& u);

  const SchedulerOptions options_;
  int step_token_limit_ = 0;
  const ModelConfig& config_;
  KvCacheManager kv_;
  // Node-based: pointers and spans into a Sequence stay valid until it is
  // erased, which never happens while it is in a step.
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<SeqId> waiting_;   // arrival order
  std::vector<SeqId> admitted_;  // admission order: running, awaiting KV, held
  int num_in_state_[4] = {0, 0, 0, 0};
};

}  // namespace pdserve::engine
