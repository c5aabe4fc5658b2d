// Drives a Scheduler over a ModelRunner to completion, with or without a
// SpecDecoder, for speculative-decoding tests: every request's generated
// tokens (with log-probabilities), and what speculation proposed and kept.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "engine/runtime/model_runner.h"
#include "engine/scheduler/scheduler.h"
#include "engine/spec/spec_decoder.h"
#include "gtest/gtest.h"

namespace pdserve::engine::testing_spec {

struct RunRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
};

struct RunResult {
  std::map<SeqId, std::vector<int32_t>> tokens;  // by request index + 1
  std::map<SeqId, std::vector<SampledToken>> sampled;
  std::map<SeqId, FinishReason> finish;
  int proposed = 0;
  int accepted = 0;
  int steps = 0;
  int preemptions = 0;
  int free_blocks_after = -1;  // KV blocks free once all finished (prefix cache: evictable count)
};

// Runs `requests` (ids 1..n) in a kColocated scheduler over `runner`'s
// whole cache; `spec` may be null (no speculation).
inline RunResult RunToCompletion(ModelRunner& runner, const std::vector<RunRequest>& requests,
                                 spec::SpecDecoder* spec, bool prefix_caching = false,
                                 int kv_headroom_tokens = 4, int max_num_seqs = 16) {
  Scheduler scheduler({.role = SchedulerRole::kColocated,
                       .plan = {.max_num_seqs = max_num_seqs, .max_batch_tokens = 512},
                       .enable_prefix_caching = prefix_caching,
                       .kv_headroom_tokens = kv_headroom_tokens},
                      runner.config(), runner.num_kv_blocks(), runner.kv_block_size());
  RunResult out;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(scheduler.AddPrompt(i + 1, requests[i].prompt, requests[i].sampling).ok());
  }
  size_t done = 0;
  for (int guard = 0; done < requests.size() && guard < 100000; ++guard) {
    if (spec != nullptr) {
      const absl::Status s = spec->ProposeFor(scheduler);
      EXPECT_TRUE(s.ok()) << s;
    }
    ScheduledStep step = scheduler.Schedule();
    out.preemptions += static_cast<int>(step.preempted.size());
    EXPECT_TRUE(step.failed.empty());
    if (step.empty()) {
      ADD_FAILURE() << "nothing to run with " << requests.size() - done << " requests left";
      break;
    }
    ++out.steps;
    const absl::StatusOr<StepOutput> output = runner.Step(step.batch);
    EXPECT_TRUE(output.ok()) << output.status();
    const std::vector<SequenceUpdate> updates = scheduler.Complete(step, output);
    for (const SequenceUpdate& u : updates) {
      EXPECT_TRUE(u.error.ok()) << u.error;
      if (!u.token.has_value()) continue;
      out.tokens[u.id].push_back(u.token->token);
      out.sampled[u.id].push_back(*u.token);
      for (const SampledToken& t : u.more_tokens) {
        out.tokens[u.id].push_back(t.token);
        out.sampled[u.id].push_back(t);
      }
      if (u.finish != FinishReason::kNone) {
        out.finish[u.id] = u.finish;
        ++done;
      }
    }
    if (spec != nullptr) {
      const spec::SpecStepStats stats = spec->Observe(updates);
      out.proposed += stats.proposed;
      out.accepted += stats.accepted;
    }
  }
  out.free_blocks_after = scheduler.kv().num_free_blocks();
  EXPECT_EQ(scheduler.kv().num_sequences(), 0u);
  return out;
}

}  // namespace pdserve::engine::testing_spec
