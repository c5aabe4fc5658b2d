// pdserve_dump_logits: runs a Hugging Face model directory on the CPU runner
// and prints, as one JSON object on stdout, what the torch reference check
// (tests/reference/check_against_torch.py) compares:
//   prefill_logits  [vocab]       logits of the prompt's last token, one Prefill
//   greedy_tokens   [max_tokens]  greedy continuation via GenerateLocally
//                                 (temperature 0, EOS ignored)
//   sequence        prompt + greedy_tokens[:-1]
//   step_logits     [len(sequence)][vocab]  logits after each token of
//                   `sequence`: Prefill of its first token, then one Decode
//                   per token (the decode path, paged KV cache included)
//   pdserve_dump_logits --model_dir=DIR --tokens=1,2,3 [--max_tokens=32]
//       [--weight_dtype=auto|f32|bf16|int8|w8a8|int4]
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/cli.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "engine/types/weight_dtype.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory");
ABSL_FLAG(std::string, tokens, "", "Comma-separated prompt token ids");
ABSL_FLAG(int, max_tokens, 32, "Greedy tokens to generate (>= 1)");
ABSL_FLAG(int, threads, 0, "CPU threads; 0: all cores");
ABSL_FLAG(pdserve::engine::WeightDtype, weight_dtype, pdserve::engine::WeightDtype::kAuto,
          "How weight matrices are kept in memory: auto, f32, bf16, int8, w8a8 or int4");

namespace pdserve::engine {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "pdserve_dump_logits: " << status << "\n";
  return 1;
}

int Main() {
  std::vector<int32_t> prompt;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',', absl::SkipEmpty())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--tokens: bad id \"", part, "\"")));
    }
    prompt.push_back(id);
  }
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (prompt.empty() || max_tokens < 1) {
    return Fail(absl::InvalidArgumentError("--tokens must be non-empty and --max_tokens >= 1"));
  }
  RunnerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model_dir);
  options.kv_block_size = 16;
  options.num_kv_blocks = static_cast<int>((prompt.size() + max_tokens) / 16 + 2);
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.weight_dtype = absl::GetFlag(FLAGS_weight_dtype);
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = CreateModelRunner(options);
  if (!runner.ok()) return Fail(runner.status());
  ModelRunner& r = **runner;
  std::vector<int32_t> table(static_cast<size_t>(options.num_kv_blocks));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);

  nlohmann::json out;
  out["architecture"] = r.config().architecture;
  out["vocab_size"] = r.config().vocab_size;
  out["prompt"] = prompt;

  std::vector<float> logits;
  const PrefillSequence whole{prompt, table};
  if (absl::Status s = PrefillForLogits(r, {&whole, 1}, nullptr, logits); !s.ok()) return Fail(s);
  out["prefill_logits"] = logits;

  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  absl::StatusOr<GenerateResult> generated = GenerateLocally(r, prompt, params);
  if (!generated.ok()) return Fail(generated.status());
  out["greedy_tokens"] = generated->tokens;

  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), generated->tokens.begin(), generated->tokens.end() - 1);
  out["sequence"] = sequence;
  nlohmann::json steps = nlohmann::json::array();
  const PrefillSequence first{std::span<const int32_t>(sequence).first(1), table};
  if (absl::Status s = PrefillForLogits(r, {&first, 1}, nullptr, logits); !s.ok()) return Fail(s);
  steps.push_back(logits);
  for (size_t i = 1; i < sequence.size(); ++i) {
    const DecodeSequence d{sequence[i], static_cast<int32_t>(i), table};
    if (absl::Status s = DecodeForLogits(r, {&d, 1}, logits); !s.ok()) return Fail(s);
    steps.push_back(logits);
  }
  out["step_logits"] = std::move(steps);
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace pdserve::engine

int main(int argc, char** argv) {
  pdserve::ParseFlags(
      argc, argv, "Prints prefill and decode logits and a greedy continuation of a model as JSON",
      __FILE__);
  return pdserve::engine::Main();
}
