// PlanStep: the pure decision of what the next step computes, shared by every
// role (prefill worker, decode worker, colocated baseline). No threads, no
// clocks, no I/O: a table of sequences in, a plan out.
//
// Request state is vLLM v1's: a sequence knows `num_tokens` tokens (prompt,
// then generated ones; the newest is not yet computed) and has
// `num_computed` of them in the KV cache. A prompt, a prompt chunk, a prompt
// after a cached prefix and a decode step are the same thing with different
// token counts: the planner gives each chosen sequence `num_new_tokens` of its
// uncomputed tokens.
//
// Rules, in order:
// 1. Running sequences (admitted, holding blocks) first, in admission order;
//    then waiting ones, first come first served (nobody overtakes the head).
// 2. Every chosen sequence's blocks come out of one free-block count that the
//    planner subtracts from as it goes, so the plan always fits the cache: a
//    burst of prompts that together exceed it is queued, never over-committed.
//    A waiting sequence is admitted only when its whole reservation fits.
// 3. A step holds at most max_batch_tokens new tokens. Without chunking, a
//    prompt that exceeds the budget runs alone when it is the first work of
//    the step; with chunking (max_prefill_chunk_tokens > 0) prompts are cut
//    to the chunk size and to what is left of the budget.
// 4. At most max_num_seqs sequences hold blocks.
// 5. With separate_prefill_steps (the colocated vLLM-v0 policy) a step is
//    either prompt work (admissions and unfinished prompts) or decode work,
//    prompt work first whenever there is any that fits.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kvcache/kv_cache_manager.h"

namespace pdserve::engine {

struct PlanOptions {
  int max_num_seqs = 256;            // sequences holding blocks
  int max_batch_tokens = 4096;       // new tokens per step (see rule 3)
  int max_prefill_chunk_tokens = 0;  // 0: prompts run whole
  bool separate_prefill_steps = false;
};

// A sequence as the planner sees it.
struct PlanSeq {
  SeqId id = 0;
  int prompt_len = 0;
  int num_tokens = 0;    // known tokens; > num_computed when it has work
  int num_computed = 0;  // tokens whose K/V is in the cache
  int num_blocks = 0;    // blocks it holds (running sequences)
  // Waiting sequences: tokens to reserve blocks for at admission, and the
  // blocks that takes from the free pool (fewer with a cached prefix).
  int reserve_tokens = 0;
  int admit_blocks = 0;
  // Running sequences: false while it cannot compute (awaiting its KV,
  // holding blocks for a transfer, or in a step already).
  bool ready = true;
};

struct PlanInput {
  std::vector<PlanSeq> running;  // admission order
  std::vector<PlanSeq> waiting;  // arrival order
  int free_blocks = 0;
  int block_size = 1;
  int num_holding = 0;  // sequences holding blocks now (running.size() plus any not listed)
};

struct PlannedSeq {
  SeqId id = 0;
  int num_new_tokens = 0;
  int new_blocks = 0;    // blocks to take from the pool (admission or growth)
  bool admit = false;    // from the waiting queue
  bool samples = false;  // the new tokens reach the end of its known tokens
};

struct StepPlan {
  std::vector<PlannedSeq> seqs;
  int num_tokens = 0;
  int new_blocks = 0;
  bool empty() const { return seqs.empty(); }
};

StepPlan PlanStep(const PlanInput& input, const PlanOptions& options);

}  // namespace pdserve::engine
