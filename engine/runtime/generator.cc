// GenerateLocally: prefill, sample token 0, then decode one token per step.
#include "engine/runtime/generator.h"

#include "absl/strings/str_cat.h"
#include "engine/kvcache/kv_cache_manager.h"

namespace pdserve::engine {

absl::StatusOr<GenerateResult> GenerateLocally(ModelRunner& runner, std::span<const int32_t> prompt,
                                               const SamplingParams& params) {
  const ModelConfig& config = runner.config();
  if (prompt.empty()) return absl::InvalidArgumentError("GenerateLocally: empty prompt");
  if (absl::Status s = ValidateSamplingParams(params, config.vocab_size); !s.ok()) return s;
  if (params.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 1, got ", params.max_tokens));
  }
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len + params.max_tokens > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt of ", prompt_len, " tokens + max_tokens ", params.max_tokens,
                     " exceed max_position_embeddings ", config.max_position_embeddings));
  }
  // The last generated token is never fed back, so its K/V needs no slot.
  const int kv_tokens = static_cast<int>(prompt_len) + params.max_tokens - 1;
  KvCacheManager blocks(runner.num_kv_blocks(), runner.kv_block_size());
  constexpr SeqId kSeq = 0;
  if (absl::Status s = blocks.Allocate(kSeq, kv_tokens); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GenerateLocally: KV cache too small: ", kv_tokens, " tokens need ",
                     blocks.BlocksForTokens(kv_tokens), " blocks of ", runner.kv_block_size(),
                     ", the runner has ", runner.num_kv_blocks()));
  }
  const std::span<const int32_t> table = blocks.BlockTable(kSeq);

  GenerateResult result;
  std::vector<int32_t> input(prompt.begin(), prompt.end());  // the step's new tokens
  int num_cached = 0;
  do {
    StepBatch batch;
    batch.seqs.push_back({.tokens = input,
                          .num_cached = num_cached,
                          .block_table = table,
                          .sampling = &params,
                          .history = {.prompt = prompt, .generated = result.tokens}});
    absl::StatusOr<StepOutput> out = runner.Step(std::move(batch));
    if (!out.ok()) return out.status();
    num_cached += static_cast<int>(input.size());
    SampledToken& t = out->sampled[0];
    const int32_t token = t.token;
    result.logprobs.push_back(std::move(t));
    result.tokens.push_back(token);
    const int generated = static_cast<int>(result.tokens.size());
    result.finish_reason =
        CheckFinish(config, params, token, generated, static_cast<int>(prompt_len) + generated);
    input.assign(1, token);
  } while (result.finish_reason == FinishReason::kNone);
  return result;
}

}  // namespace pdserve::engine
