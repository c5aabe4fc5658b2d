// PlanStep: the pure decision of what the next step computes, shared by every
// role (prefill worker, decode worker, colocated baseline). No threads, no
// clocks, no I/O: a table of sequences in, a plan out.
//
// Request state is vLLM v1's: a sequence knows `num_tokens` tokens (prompt,
// then generated ones; the newest is not yet computed) and has
// `num_computed` of them in the KV cache. A prompt, a prompt chunk, a prompt
// after a cached prefix, the recomputation of a preempted sequence and a
// decode step are the same thing with different token counts: the planner
// gives each chosen sequence `num_new_tokens` of its uncomputed tokens.
//
// Rules, in order:
// 1. Decode work first: every ready running sequence past its prompt gets its
//    next token, oldest admission first, plus as many of its proposed tokens
//    (speculative decoding) as the budget and the free blocks allow.
// 2. A running sequence whose next token needs a block that is not free
//    preempts the newest preemptable running sequences (not yet planned in
//    this step) until it fits; if none is left it waits for blocks. A
//    sequence that needs more blocks than the whole cache can never fit and
//    is listed in `too_large` (the caller fails it: nothing else is freed
//    for it, so preemption never loops). After a preemption nothing new is
//    admitted in that step: the blocks were freed for growth.
// 3. Then prompt work: running sequences in the middle of their prompt, in
//    admission order, then waiting ones, first come first served (nobody
//    overtakes the head). A waiting sequence is admitted only when its whole
//    reservation fits in the free blocks left.
// 4. Every block (admission or growth) comes out of one free-block count that
//    the planner subtracts from as it goes, so the plan always fits the
//    cache: a burst of prompts that together exceed it is queued, never
//    over-committed.
// 5. A step holds at most max_batch_tokens new tokens. Without chunking a
//    prompt runs whole: one that exceeds what is left of the budget runs
//    alone when it is the first work of the step, else waits. With chunking
//    (max_prefill_chunk_tokens > 0) the budget left after decode work is
//    shared max-min fairly among the prompt sequences (each gets up to the
//    chunk size and what it has left; a short prompt takes what it needs and
//    the rest goes to the longer ones), so a long prompt never starves a
//    short one behind it.
// 6. At most max_num_seqs sequences hold blocks.
// 7. With separate_prefill_steps (the colocated vLLM-v0 policy) a step is
//    either prompt work (admissions and unfinished prompts) or decode work,
//    prompt work first whenever there is any that fits.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kvcache/kv_cache_manager.h"

namespace pdserve::engine {

struct PlanOptions {
  int max_num_seqs = 256;            // sequences holding blocks
  int max_batch_tokens = 4096;       // new tokens per step (see rule 5)
  int max_prefill_chunk_tokens = 0;  // 0: prompts run whole
  bool separate_prefill_steps = false;
};

// A sequence as the planner sees it.
struct PlanSeq {
  SeqId id = 0;
  int prompt_len = 0;
  int num_tokens = 0;  // known tokens; > num_computed when it has work
  // Tokens whose K/V is in the cache; for a waiting sequence, the tokens of
  // its cached prefix (its computation starts there once admitted).
  int num_computed = 0;
  int num_blocks = 0;  // blocks it holds (running sequences)
  // Waiting sequences: tokens to reserve blocks for at admission, and the
  // blocks that takes from the free pool (fewer with a cached prefix).
  int reserve_tokens = 0;
  int admit_blocks = 0;
  // Running sequences: false while it cannot compute (awaiting its KV,
  // holding blocks for a transfer, or in a step already).
  bool ready = true;
  // Running sequences: may be preempted (running, not in a step, not
  // awaiting KV), and how many blocks that would return to the free pool
  // (blocks it shares with others stay in use).
  bool preemptable = false;
  int free_on_preempt = 0;
  // Running sequences: proposed tokens (speculative decoding) its decode
  // verifies when the budget and free blocks allow; they never preempt
  // anyone. num_new_tokens is then 1 + the proposals taken.
  int num_proposed = 0;
};

struct PlanInput {
  std::vector<PlanSeq> running;  // admission order
  std::vector<PlanSeq> waiting;  // arrival order
  int free_blocks = 0;
  int total_blocks = 0;  // the whole cache (rule 2's "can never fit"); 0: not checked
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
  // Running sequences to preempt before the step (newest first): free their
  // blocks and queue them again at the head of the waiting queue.
  std::vector<SeqId> preempted;
  // Running sequences that need more blocks than the whole cache (rule 2).
  std::vector<SeqId> too_large;
  bool empty() const { return seqs.empty(); }
};

StepPlan PlanStep(const PlanInput& input, const PlanOptions& options);

// Splits `budget` max-min fairly over sequences wanting up to caps[i] each:
// a sequence wanting less than an even share gets what it wants, the others
// share the rest evenly; remainders go to the earliest. Sum <= budget.
std::vector<int> ShareBudget(const std::vector<int>& caps, int budget);

}  // namespace pdserve::engine
