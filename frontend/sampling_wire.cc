#include "frontend/sampling_wire.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pdserve {

engine::SamplingParams SamplingFromProto(const internal::v1::WorkerSampling& s) {
  engine::SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p();
  p.seed = s.seed();
  p.max_tokens = s.max_tokens();
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  p.min_p = s.min_p();
  p.repetition_penalty = s.repetition_penalty();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.min_tokens = s.min_tokens();
  p.logprobs = s.logprobs();
  p.grammar_spec = s.grammar();
  return p;
}

absl::StatusOr<engine::SamplingParams> SamplingForWorker(
    const internal::v1::WorkerSampling& sampling, std::span<const int32_t> generated,
    engine::grammar::GrammarCompiler* grammars) {
  engine::SamplingParams p = SamplingFromProto(sampling);
  if (p.grammar_spec.empty()) return p;
  if (grammars == nullptr) {
    return absl::FailedPreconditionError(
        "structured output: this worker has no tokenizer to build token masks from");
  }
  absl::StatusOr<std::shared_ptr<const engine::TokenConstraint>> c =
      grammars->Compile(p.grammar_spec);
  if (!c.ok()) return c.status();
  p.constraint = *std::move(c);
  std::vector<uint32_t> mask(engine::TokenMaskWords(grammars->vocab().size()));
  p.constraint->FillMask(generated,
                         std::max<int>(p.max_tokens - static_cast<int>(generated.size()), 1),
                         grammars->vocab().eos_ids(), mask);
  return p;
}

internal::v1::WorkerSampling SamplingToProto(const engine::SamplingParams& p) {
  internal::v1::WorkerSampling s;
  s.set_temperature(p.temperature);
  s.set_top_k(p.top_k);
  s.set_top_p(p.top_p);
  s.set_seed(p.seed);
  s.set_max_tokens(p.max_tokens);
  for (int32_t t : p.stop_token_ids) s.add_stop_token_ids(t);
  s.set_ignore_eos(p.ignore_eos);
  s.set_min_p(p.min_p);
  s.set_repetition_penalty(p.repetition_penalty);
  s.set_presence_penalty(p.presence_penalty);
  s.set_frequency_penalty(p.frequency_penalty);
  s.set_min_tokens(p.min_tokens);
  s.set_logprobs(p.logprobs);
  s.set_grammar(p.grammar_spec);
  return s;
}

internal::v1::SampledLogprobs LogprobsToProto(const engine::SampledToken& token) {
  internal::v1::SampledLogprobs out;
  out.set_logprob(token.logprob);
  for (const engine::TopLogprob& t : token.top) {
    out.add_top_ids(t.token);
    out.add_top_logprobs(t.logprob);
  }
  return out;
}

engine::SampledToken LogprobsFromProto(int32_t token,
                                       const internal::v1::SampledLogprobs& logprobs) {
  engine::SampledToken out;
  out.token = token;
  out.logprob = logprobs.logprob();
  const int n = std::min(logprobs.top_ids_size(), logprobs.top_logprobs_size());
  out.top.reserve(n);
  for (int k = 0; k < n; ++k) out.top.push_back({logprobs.top_ids(k), logprobs.top_logprobs(k)});
  return out;
}

// engine::FinishReason travels as its integer value (the decode worker's
// finished event) and becomes pdserve.v1.FinishReason at the front end: the
// two enums must keep the same numbering.
static_assert(static_cast<int>(engine::FinishReason::kNone) == v1::FINISH_REASON_UNSPECIFIED);
static_assert(static_cast<int>(engine::FinishReason::kLength) == v1::FINISH_REASON_LENGTH);
static_assert(static_cast<int>(engine::FinishReason::kStop) == v1::FINISH_REASON_STOP);
static_assert(static_cast<int>(engine::FinishReason::kContext) == v1::FINISH_REASON_CONTEXT);
static_assert(v1::FinishReason_MAX == v1::FINISH_REASON_CONTEXT,
              "a new pdserve.v1.FinishReason needs its engine::FinishReason");

absl::Status CheckJobLists(int prompt_token_ids, int generated_token_ids,
                           const internal::v1::WorkerSampling& sampling, int context) {
  if (int64_t{prompt_token_ids} + generated_token_ids > context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_token_ids + generated_token_ids: ", prompt_token_ids, " + ",
                     generated_token_ids, " tokens exceed the model context of ", context));
  }
  if (sampling.stop_token_ids_size() > engine::kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop_token_ids must hold at most ",
                                                   engine::kMaxStopTokenIds, " ids, got ",
                                                   sampling.stop_token_ids_size()));
  }
  return absl::OkStatus();
}

v1::FinishReason FinishReasonToProto(engine::FinishReason reason) {
  return static_cast<v1::FinishReason>(static_cast<int>(reason));
}

}  // namespace pdserve
