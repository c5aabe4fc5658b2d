// Speculative decoding as a worker configures it from its flags
// (--speculative, --num_speculative_tokens, --draft_model_dir): a
// SpecDecoder with the chosen proposer, checked against the target model.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/runtime/model_runner.h"
#include "engine/spec/ngram_proposer.h"
#include "engine/spec/spec_decoder.h"

namespace pdserve::engine::spec {

// The k a method proposes at most when the configuration leaves it at 0: 6
// for n-grams (a proposal costs nothing and on copied text most of it
// stands), 4 for a draft (each proposed token costs a draft step).
// docs/decisions/speculative.md, "Proposal length per method".
inline constexpr int kDefaultNgramTokens = 6;
inline constexpr int kDefaultDraftTokens = 4;
int DefaultSpeculativeTokens(SpecMethod method);

// The most decoding sequences a step may have and still propose, when the
// configuration leaves it at -1: 2 for n-grams, 1 for a draft. On the CPU
// backend a step of three or more sequences' verification rows is
// compute-bound, and at two the draft's own steps and catch-ups cost more
// than its proposals gain (docs/performance.md, "Speculative decoding").
inline constexpr int kDefaultNgramMaxBatch = 2;
inline constexpr int kDefaultDraftMaxBatch = 1;
int DefaultSpeculativeMaxBatch(SpecMethod method);

// A draft step's cost in target steps, estimated from the two models' sizes
// (forward FLOPs of one token, LM head included): counted, not timed, so
// decisions priced with it are the same in every run.
double EstimateDraftCost(const ModelConfig& draft, const ModelConfig& target);
// A token of the draft's catch-up (computed with the others of its
// sequence in one step) against one of its decode steps: the demo draft's
// catch-up over a 110-token prompt cost 36 us a token on the Zen 3 guest,
// its decode step 97-107 us (docs/performance.md, "Draft steps on the
// caller's thread"). SpecOptions::catch_up_cost is this times the draft's
// cost.
inline constexpr double kDraftCatchUpFraction = 1.0 / 3;

struct SpecConfig {
  SpecMethod method = SpecMethod::kOff;
  int num_speculative_tokens = 0;  // k, in [1, 16]; 0: DefaultSpeculativeTokens(method)
  bool adaptive = true;            // SpecOptions::adaptive
  int max_batch = -1;              // SpecOptions::max_batch; -1: DefaultSpeculativeMaxBatch
  // kDraft: SpecOptions::proposal_cost; 0: EstimateDraftCost.
  double draft_cost = 0.0;
  // SpecOptions::row_cost; 0: the target runner's VerificationRowCost().
  double row_cost = 0.0;
  NgramOptions ngram;
  // kDraft: a smaller model of the target's vocabulary, run on the target's
  // backend with its own KV cache of draft_kv_blocks blocks.
  std::string draft_model_dir;
  std::string backend = "cpu";
  int num_threads = 0;
  int draft_kv_blocks = 0;  // 0: as many blocks as the target's cache has
};

// Null for kOff. INVALID_ARGUMENT for a k outside [0, 16] or n-gram range, a missing
// draft_model_dir, or a draft whose vocabulary or special tokens differ from
// the target's.
absl::StatusOr<std::unique_ptr<SpecDecoder>> CreateSpecDecoder(const SpecConfig& config,
                                                               const ModelRunner& target);

}  // namespace pdserve::engine::spec
