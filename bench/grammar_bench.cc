// Structured output's cost, printed (never asserted):
//  1. per vocabulary (--tokenizer_dirs: each a model directory with a
//     tokenizer.json, e.g. a 32k and a 128k one): compiling a schema, each
//     node's token mask computed once, and the mask of one token in a
//     constrained generation (cold: masks computed on first use; warm:
//     every mask already computed, the steady state of a service);
//  2. on the demo model (random weights, CPU runner, batch 1): time per
//     generated token with and without the schema's mask, alternated rounds.
//   pdserve_grammar_bench [--tokenizer_dirs=DIR,DIR] [--tokens=2000] [--rounds=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "engine/model/config.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/grammar/grammar_constraint.h"
#include "engine/runtime/grammar/grammar_spec.h"
#include "engine/runtime/grammar/tokenizer_vocabulary.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer_loader.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

ABSL_FLAG(std::string, tokenizer_dirs, "",
          "Comma-separated model directories whose tokenizer.json gives a vocabulary");
ABSL_FLAG(int, tokens, 2000, "Constrained tokens generated per vocabulary (random draws)");
ABSL_FLAG(int, rounds, 5, "Alternated rounds of the demo-model comparison");
ABSL_FLAG(int, max_tokens, 128, "Tokens per generation on the demo model");
ABSL_FLAG(std::string, work_dir, "/tmp/pdserve_grammar_bench", "Where the demo model is written");

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double Since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// A schema of the kind clients send: nested objects, an array, an enum,
// strings, numbers, a boolean, optional properties.
const char* kSchema = R"({"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "email": {"type": "string"}, "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    "role": {"enum": ["admin", "user", "guest"]}, "active": {"type": "boolean"},
    "address": {"type": "object", "properties": {"street": {"type": "string"},
      "city": {"type": "string"}, "zip": {"type": "string"}},
      "required": ["street", "city"]}},
  "required": ["name", "age", "tags", "role", "address"]})";

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Random constrained generations of `total` tokens, restarting at the end of
// each output; the time of every FillMask.
std::vector<double> MaskTimes(engine::grammar::GrammarCompiler& compiler, const std::string& spec,
                              int total) {
  const int vocab = compiler.vocab().size();
  std::vector<uint32_t> mask(engine::TokenMaskWords(vocab));
  std::vector<double> times;
  std::mt19937 rng(1);
  const std::span<const int> eos = compiler.vocab().eos_ids();
  while (static_cast<int>(times.size()) < total) {
    auto constraint = compiler.Compile(spec);
    if (!constraint.ok()) {
      std::fprintf(stderr, "%s\n", constraint.status().ToString().c_str());
      std::exit(1);
    }
    std::vector<int32_t> generated;
    const int max_tokens = 256;
    for (int step = 0; step < max_tokens && static_cast<int>(times.size()) < total; ++step) {
      const auto t = Clock::now();
      (*constraint)->FillMask(generated, max_tokens - step, eos, mask);
      times.push_back(Since(t));
      std::vector<int32_t> allowed;
      for (int id = 0; id < vocab; ++id) {
        if (engine::TokenAllowed(mask, id)) allowed.push_back(id);
      }
      const int32_t tok = allowed[rng() % allowed.size()];
      if (std::find(eos.begin(), eos.end(), tok) != eos.end()) break;
      generated.push_back(tok);
    }
  }
  return times;
}

void VocabularyFigures(const std::string& dir, const std::string& spec, int tokens) {
  auto tokenizer = text::LoadTokenizer(dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s: %s\n", dir.c_str(), tokenizer.status().ToString().c_str());
    return;
  }
  engine::ModelConfig config;
  config.vocab_size = (*tokenizer)->vocab_size();
  config.eos_token_ids = {config.vocab_size - 1};
  auto t = Clock::now();
  auto vocab = engine::grammar::VocabularyOf(**tokenizer, config);
  const double vocab_us = Since(t);

  engine::grammar::GrammarCompiler cold_compiler(vocab);
  t = Clock::now();
  auto compiled = cold_compiler.CompileGrammar(spec);
  const double compile_us = Since(t);
  if (!compiled.ok()) {
    std::fprintf(stderr, "%s\n", compiled.status().ToString().c_str());
    return;
  }
  // Cold: masks computed as the walk reaches their nodes.
  const std::vector<double> cold = MaskTimes(cold_compiler, spec, tokens);
  // Warm: a fresh compiler with every mask computed first.
  engine::grammar::GrammarCompiler warm_compiler(vocab);
  auto warm_compiled = warm_compiler.CompileGrammar(spec);
  t = Clock::now();
  (*warm_compiled)->ComputeAllMasks();
  const double all_masks_us = Since(t);
  const std::vector<double> warm = MaskTimes(warm_compiler, spec, tokens);
  double warm_sum = 0;
  for (double x : warm) warm_sum += x;
  std::printf(
      "vocabulary %s: %d tokens, vocabulary sort %.1f ms, grammar compile %.2f ms, "
      "all %d node masks %.1f ms\n"
      "  mask per token, warm: mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us (%zu tokens)\n"
      "  mask per token, cold: p50 %.1f us, p99 %.1f us, max %.1f us (first-use masks)\n",
      dir.c_str(), vocab->size(), vocab_us / 1000, compile_us / 1000,
      (*warm_compiled)->grammar().num_nodes(), all_masks_us / 1000, warm_sum / warm.size(),
      Percentile(warm, 0.5), Percentile(warm, 0.99), Percentile(warm, 1.0), warm.size(),
      Percentile(cold, 0.5), Percentile(cold, 0.99), Percentile(cold, 1.0));
}

void DemoModelFigures(const std::string& spec, int rounds, int max_tokens,
                      const std::string& work_dir) {
  const std::string dir = work_dir + "/demo";
  std::filesystem::create_directories(dir);
  engine::ModelConfig config = engine::DefaultDemoConfig();
  config.max_position_embeddings = 1024;
  if (!engine::WriteRandomModel(config, 7, "f32", dir).ok() ||
      !engine::WriteDemoTokenizer(config.vocab_size, dir).ok()) {
    std::fprintf(stderr, "cannot write the demo model to %s\n", dir.c_str());
    return;
  }
  auto runner =
      engine::CreateModelRunner({.model_dir = dir, .num_kv_blocks = 256, .num_threads = 1});
  auto compiler = engine::grammar::CreateGrammarCompiler(dir, (*runner)->config());
  if (!runner.ok() || !compiler.ok()) {
    std::fprintf(stderr, "cannot load the demo model\n");
    return;
  }
  (*(*compiler)->CompileGrammar(spec))->ComputeAllMasks();  // a service's steady state
  const std::vector<int32_t> prompt = {engine::kDemoBosId, 'H', 'i'};
  double plain_us = 0, masked_us = 0;
  int plain_tokens = 0, masked_tokens = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int masked = 0; masked < 2; ++masked) {
      engine::SamplingParams p;
      p.max_tokens = max_tokens;
      p.temperature = 1.0f;
      p.seed = 100 + round;
      if (masked) {
        p.grammar_spec = spec;
        p.constraint = *(*compiler)->Compile(spec);
      }
      const auto t = Clock::now();
      auto result = engine::GenerateLocally(**runner, prompt, p);
      const double us = Since(t);
      if (!result.ok()) {
        std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
        return;
      }
      (masked ? masked_us : plain_us) += us;
      (masked ? masked_tokens : plain_tokens) += static_cast<int>(result->tokens.size());
    }
  }
  const double plain = plain_us / plain_tokens, with_mask = masked_us / masked_tokens;
  std::printf(
      "demo model (vocab %d, CPU runner, 1 thread, batch 1, %d alternated rounds): "
      "%.1f us/token unconstrained (%d tokens), %.1f us/token with the schema's mask (%d tokens): "
      "%+.1f%%\n",
      config.vocab_size, rounds, plain, plain_tokens, with_mask, masked_tokens,
      100.0 * (with_mask - plain) / plain);
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string spec = pdserve::engine::grammar::JsonSchemaSpec(
                               nlohmann::ordered_json::parse(pdserve::kSchema), false)
                               .dump();
  for (const std::string& dir : std::vector<std::string>(
           absl::StrSplit(absl::GetFlag(FLAGS_tokenizer_dirs), ',', absl::SkipEmpty()))) {
    pdserve::VocabularyFigures(dir, spec, absl::GetFlag(FLAGS_tokens));
  }
  pdserve::DemoModelFigures(spec, absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_max_tokens),
                            absl::GetFlag(FLAGS_work_dir));
  return 0;
}
