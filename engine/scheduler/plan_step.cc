// PlanStep: see plan_step.h for the rules.
#include "engine/scheduler/plan_step.h"

#include <algorithm>
#include <cstdint>

namespace pdserve::engine {
namespace {

enum class Work { kAll, kPromptOnly, kDecodeOnly };

// More than the newest token to compute, or still inside its prompt: a
// prompt, a prompt chunk, or the recomputation of a preempted sequence.
bool IsPromptWork(const PlanSeq& s) {
  return s.num_computed < s.prompt_len || s.num_tokens - s.num_computed > 1;
}

class Planner {
 public:
  Planner(const PlanInput& input, const PlanOptions& options)
      : in_(input),
        o_(options),
        free_(input.free_blocks),
        budget_(options.max_batch_tokens),
        holding_(input.num_holding),
        gone_(input.running.size(), false) {}

  StepPlan Plan(Work work) {
    if (work != Work::kPromptOnly) PlanDecodes();
    if (work != Work::kDecodeOnly) PlanPrompts();
    return std::move(plan_);
  }

 private:
  // Rules 1 and 2.
  void PlanDecodes() {
    const std::vector<PlanSeq>& running = in_.running;
    const auto decodes = [&](size_t i) {
      const PlanSeq& s = running[i];
      return !gone_[i] && s.ready && s.num_tokens > s.num_computed && !IsPromptWork(s);
    };
    const auto growth = [&](const PlanSeq& s) {
      return std::max(0, BlocksFor(s.num_computed + 1) - s.num_blocks);
    };
    // Decodes not yet planned and the blocks they grow by: proposals take
    // only budget and blocks none of them needs.
    int decodes_left = 0, growth_left = 0;
    for (size_t i = 0; i < running.size(); ++i) {
      if (!decodes(i)) continue;
      ++decodes_left;
      growth_left += growth(running[i]);
    }
    for (size_t i = 0; i < running.size(); ++i) {
      const PlanSeq& s = running[i];
      if (!decodes(i)) continue;
      --decodes_left;
      growth_left -= growth(s);
      if (budget_ <= 0) break;
      const int blocks = BlocksFor(s.num_computed + 1);
      if (in_.total_blocks > 0 && blocks > in_.total_blocks) {
        plan_.too_large.push_back(s.id);
        gone_[i] = true;
        continue;
      }
      const int need = std::max(0, blocks - s.num_blocks);
      for (size_t v = running.size(); need > free_ && v-- > i + 1;) {
        if (gone_[v] || !running[v].preemptable) continue;
        gone_[v] = true;
        free_ += running[v].free_on_preempt;
        --holding_;
        plan_.preempted.push_back(running[v].id);
      }
      if (need > free_) continue;  // waits for blocks: only sequences it cannot preempt hold them
      // Proposals ride along where the budget and the free blocks allow.
      int n = 1;
      for (int extra = std::min(s.num_proposed, budget_ - 1 - decodes_left); extra > 0; --extra) {
        const int more = std::max(0, BlocksFor(s.num_computed + 1 + extra) - s.num_blocks);
        if (more <= free_ - growth_left &&
            (in_.total_blocks <= 0 || BlocksFor(s.num_computed + 1 + extra) <= in_.total_blocks)) {
          n = 1 + extra;
          break;
        }
      }
      Add(s, n, std::max(0, BlocksFor(s.num_computed + n) - s.num_blocks), /*admit=*/false);
    }
  }

  // Rules 3 to 6.
  void PlanPrompts() {
    struct Candidate {
      const PlanSeq* seq;
      int cap;     // tokens it could take at most
      int blocks;  // taken from the pool if planned
      bool admit;
    };
    std::vector<Candidate> candidates;
    const bool chunked = o_.max_prefill_chunk_tokens > 0;
    auto cap_of = [&](const PlanSeq& s) {
      const int remaining = s.num_tokens - s.num_computed;
      return chunked ? std::min(remaining, o_.max_prefill_chunk_tokens) : remaining;
    };
    // Blocks are taken tentatively while listing, so that admissions see
    // what running prompts need, and given back before planning.
    int free = free_;
    int holding = holding_;
    for (size_t i = 0; i < in_.running.size(); ++i) {
      const PlanSeq& s = in_.running[i];
      if (gone_[i] || !s.ready || s.num_tokens <= s.num_computed || !IsPromptWork(s)) continue;
      const int cap = cap_of(s);
      const int need = std::max(0, BlocksFor(s.num_computed + cap) - s.num_blocks);
      if (need > free) continue;
      free -= need;
      candidates.push_back({&s, cap, need, false});
    }
    if (plan_.preempted.empty()) {
      for (const PlanSeq& s : in_.waiting) {
        if (holding >= o_.max_num_seqs || s.admit_blocks > free) break;
        if (chunked && static_cast<int>(candidates.size()) >= budget_) break;  // >= 1 token each
        free -= s.admit_blocks;
        ++holding;
        candidates.push_back({&s, cap_of(s), s.admit_blocks, true});
      }
    }

    std::vector<int> tokens(candidates.size(), 0);
    if (chunked) {
      std::vector<int> caps;
      for (const Candidate& c : candidates) caps.push_back(c.cap);
      tokens = ShareBudget(caps, budget_);
    } else {
      // Whole prompts while they fit; one over the budget only alone.
      int left = budget_;
      for (size_t k = 0; k < candidates.size(); ++k) {
        const int n = candidates[k].cap;
        if (n <= left || (plan_.seqs.empty() && k == 0)) {
          tokens[k] = n;
          left -= n;
        }
      }
    }
    for (size_t k = 0; k < candidates.size(); ++k) {
      const Candidate& c = candidates[k];
      if (tokens[k] == 0) {
        if (c.admit) break;  // first come first served: the rest of the queue waits too
        continue;
      }
      if (c.admit) ++holding_;
      const int blocks =
          c.admit ? c.blocks
                  : std::max(0, BlocksFor(c.seq->num_computed + tokens[k]) - c.seq->num_blocks);
      Add(*c.seq, tokens[k], blocks, c.admit);
    }
  }

  int BlocksFor(int tokens) const {
    return tokens <= 0 ? 0 : (tokens + in_.block_size - 1) / in_.block_size;
  }
  void Add(const PlanSeq& s, int n, int blocks, bool admit) {
    free_ -= blocks;
    budget_ -= n;
    plan_.seqs.push_back({.id = s.id,
                          .num_new_tokens = n,
                          .new_blocks = blocks,
                          .admit = admit,
                          .samples = s.num_computed + n >= s.num_tokens});
    plan_.num_tokens += n;
    plan_.new_blocks += blocks;
  }

  const PlanInput& in_;
  const PlanOptions& o_;
  int free_;
  int budget_;
  int holding_;
  std::vector<bool> gone_;  // running[i] preempted or too large in this plan
  StepPlan plan_;
};

}  // namespace

std::vector<int> ShareBudget(const std::vector<int>& caps, int budget) {
  std::vector<int> out(caps.size(), 0);
  if (caps.empty() || budget <= 0) return out;
  // The water level: the largest L with sum(min(cap, L)) <= budget.
  std::vector<int> sorted = caps;
  std::sort(sorted.begin(), sorted.end());
  int64_t left = budget;
  int64_t level = budget;
  for (size_t j = 0; j < sorted.size(); ++j) {
    const int64_t share = left / static_cast<int64_t>(sorted.size() - j);
    if (sorted[j] > share) {
      level = share;
      break;
    }
    left -= sorted[j];
  }
  int64_t given = 0;
  for (size_t i = 0; i < caps.size(); ++i) {
    out[i] = static_cast<int>(std::min<int64_t>(std::max(caps[i], 0), level));
    given += out[i];
  }
  // What the level rounded away, one token each to the earliest.
  for (size_t i = 0; i < caps.size() && given < budget; ++i) {
    if (out[i] < caps[i]) {
      ++out[i];
      ++given;
    }
  }
  return out;
}

StepPlan PlanStep(const PlanInput& input, const PlanOptions& options) {
  if (!options.separate_prefill_steps) return Planner(input, options).Plan(Work::kAll);
  StepPlan prompts = Planner(input, options).Plan(Work::kPromptOnly);
  if (!prompts.empty()) return prompts;
  return Planner(input, options).Plan(Work::kDecodeOnly);
}

}  // namespace pdserve::engine
