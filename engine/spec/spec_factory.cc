// Speculative decoding from a worker's flags: see spec_factory.h.
#include "engine/spec/spec_factory.h"

#include "absl/strings/str_cat.h"
#include "engine/runner_factory.h"
#include "engine/spec/draft_proposer.h"

namespace pdserve::engine::spec {

int DefaultSpeculativeTokens(SpecMethod method) {
  switch (method) {
    case SpecMethod::kOff:
      return 0;
    case SpecMethod::kNgram:
      return kDefaultNgramTokens;
    case SpecMethod::kDraft:
      return kDefaultDraftTokens;
  }
  return 0;
}

int DefaultSpeculativeMaxBatch(SpecMethod method) {
  return method == SpecMethod::kDraft ? kDefaultDraftMaxBatch : kDefaultNgramMaxBatch;
}

double EstimateDraftCost(const ModelConfig& draft, const ModelConfig& target) {
  return draft.PrefillFlops(1) / target.PrefillFlops(1);
}

absl::StatusOr<std::unique_ptr<SpecDecoder>> CreateSpecDecoder(const SpecConfig& config,
                                                               const ModelRunner& target) {
  if (config.method == SpecMethod::kOff) return nullptr;
  if (config.num_speculative_tokens < 0 || config.num_speculative_tokens > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_speculative_tokens must be in [1, 16] (0: the method's default), got ",
                     config.num_speculative_tokens));
  }
  const int k = config.num_speculative_tokens > 0 ? config.num_speculative_tokens
                                                  : DefaultSpeculativeTokens(config.method);
  if (config.max_batch < -1 || config.draft_cost < 0 || config.row_cost < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speculative max batch (", config.max_batch, "), draft cost (", config.draft_cost,
        ") and row cost (", config.row_cost, ") must not be negative (max batch -1: the default)"));
  }
  SpecOptions options{.num_speculative_tokens = k,
                      .adaptive = config.adaptive,
                      .max_batch = config.max_batch >= 0 ? config.max_batch
                                                         : DefaultSpeculativeMaxBatch(config.method),
                      .row_cost = config.row_cost > 0 ? config.row_cost
                                                      : target.VerificationRowCost()};
  switch (config.method) {
    case SpecMethod::kOff:
      return nullptr;
    case SpecMethod::kNgram:
      if (config.ngram.min_n < 1 || config.ngram.max_n < config.ngram.min_n) {
        return absl::InvalidArgumentError(absl::StrCat("n-gram range [", config.ngram.min_n, ", ",
                                                       config.ngram.max_n, "] is empty"));
      }
      // Free to propose, not to verify: a row costs row_cost of a step.
      options.price_rows = true;
      return std::make_unique<SpecDecoder>(options, std::make_unique<NgramProposer>(config.ngram));
    case SpecMethod::kDraft: {
      if (config.draft_model_dir.empty()) {
        return absl::InvalidArgumentError("--speculative=draft needs --draft_model_dir");
      }
      absl::StatusOr<std::unique_ptr<ModelRunner>> draft =
          CreateModelRunner({.model_dir = config.draft_model_dir,
                             .backend = config.backend,
                             .kv_block_size = target.kv_block_size(),
                             .num_kv_blocks = config.draft_kv_blocks > 0 ? config.draft_kv_blocks
                                                                         : target.num_kv_blocks(),
                             .num_threads = config.num_threads});
      if (!draft.ok()) {
        return absl::Status(draft.status().code(),
                            absl::StrCat("draft model: ", draft.status().message()));
      }
      options.proposal_cost = config.draft_cost > 0
                                  ? config.draft_cost
                                  : EstimateDraftCost((*draft)->config(), target.config());
      options.catch_up_cost = options.proposal_cost * kDraftCatchUpFraction;
      absl::StatusOr<std::unique_ptr<DraftProposer>> proposer =
          DraftProposer::Create(*std::move(draft), target.config());
      if (!proposer.ok()) return proposer.status();
      return std::make_unique<SpecDecoder>(options, *std::move(proposer));
    }
  }
  return absl::InvalidArgumentError("unknown speculative method");
}

}  // namespace pdserve::engine::spec
