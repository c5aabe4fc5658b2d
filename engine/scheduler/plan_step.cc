// PlanStep: see plan_step.h for the rules.
#include "engine/scheduler/plan_step.h"

#include <algorithm>

namespace pdserve::engine {
namespace {

enum class Work { kAll, kPromptOnly, kDecodeOnly };

class Planner {
 public:
  Planner(const PlanInput& input, const PlanOptions& options)
      : in_(input),
        o_(options),
        free_(input.free_blocks),
        budget_(options.max_batch_tokens),
        holding_(input.num_holding) {}

  StepPlan Plan(Work work) {
    for (const PlanSeq& s : in_.running) {
      if (!s.ready || s.num_tokens <= s.num_computed) continue;
      const bool prompt_work = s.num_computed < s.prompt_len;
      if ((work == Work::kPromptOnly && !prompt_work) ||
          (work == Work::kDecodeOnly && prompt_work)) {
        continue;
      }
      const int n = Take(s.num_tokens - s.num_computed);
      if (n == 0) {
        if (budget_ <= 0) break;
        continue;  // a whole prompt over the budget waits for a step of its own
      }
      const int need = std::max(0, BlocksFor(s.num_computed + n) - s.num_blocks);
      if (need > free_) continue;  // cannot grow now; sequences that finish free blocks
      Add(s, n, need, /*admit=*/false);
    }
    if (work == Work::kDecodeOnly) return std::move(plan_);
    for (const PlanSeq& s : in_.waiting) {
      if (holding_ >= o_.max_num_seqs || s.admit_blocks > free_) break;
      const int n = Take(s.num_tokens - s.num_computed);
      if (n == 0) break;
      ++holding_;
      Add(s, n, s.admit_blocks, /*admit=*/true);
    }
    return std::move(plan_);
  }

 private:
  int BlocksFor(int tokens) const {
    return tokens <= 0 ? 0 : (tokens + in_.block_size - 1) / in_.block_size;
  }
  // New tokens a sequence with `remaining` uncomputed tokens gets; 0: none.
  int Take(int remaining) const {
    if (o_.max_prefill_chunk_tokens > 0) {
      return std::max(0, std::min({remaining, o_.max_prefill_chunk_tokens, budget_}));
    }
    if (remaining <= budget_) return remaining;
    return plan_.seqs.empty() ? remaining : 0;  // over the budget: alone, or not at all
  }
  void Add(const PlanSeq& s, int n, int blocks, bool admit) {
    free_ -= blocks;
    budget_ -= n;
    plan_.seqs.push_back({.id = s.id,
                          .num_new_tokens = n,
                          .new_blocks = blocks,
                          .admit = admit,
                          .samples = s.num_computed + n == s.num_tokens});
    plan_.num_tokens += n;
    plan_.new_blocks += blocks;
  }

  const PlanInput& in_;
  const PlanOptions& o_;
  int free_;
  int budget_;
  int holding_;
  StepPlan plan_;
};

}  // namespace

StepPlan PlanStep(const PlanInput& input, const PlanOptions& options) {
  if (!options.separate_prefill_steps) return Planner(input, options).Plan(Work::kAll);
  StepPlan prompts = Planner(input, options).Plan(Work::kPromptOnly);
  if (!prompts.empty()) return prompts;
  return Planner(input, options).Plan(Work::kDecodeOnly);
}

}  // namespace pdserve::engine
