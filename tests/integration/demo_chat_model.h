// Test helpers for the OpenAI API tests: a random-weight demo model that
// chats (demo tokenizer and template, generation config with both end ids),
// and the official `openai` npm client's scripts (tests/openai_client).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/config.h"
#include "nlohmann/json.hpp"
#include "tests/integration/http_client.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::testing {

inline absl::Status WriteDemoChatModel(const std::string& model_dir, int max_positions,
                                       uint64_t seed) {
  engine::ModelConfig config = engine::DefaultDemoConfig();
  config.max_position_embeddings = max_positions;
  engine::RandomModelOptions options{
      .seed = seed,
      .write_generation_config = true,
      .generation_eos_token_ids = {engine::kDemoEndOfTextId, engine::kDemoEotId}};
  if (absl::Status s = engine::WriteRandomModel(config, options, model_dir); !s.ok()) return s;
  return engine::WriteDemoTokenizer(config.vocab_size, model_dir);
}

// Runs `script` of `client_dir` (tests/openai_client, installed into
// `client_work`) with `config` written to `config_path`; its stdout is also
// kept next to the config (".out.json"). Exit code 77: node or npm missing.
inline CommandResult RunOpenAiClientScript(const std::string& client_dir,
                                           const std::string& client_work,
                                           const nlohmann::json& config,
                                           const std::string& config_path,
                                           const std::string& script) {
  std::ofstream(config_path) << config.dump();
  CommandResult run = RunCommand(absl::StrCat(client_dir, "/run_client.sh '", client_dir, "' '",
                                              client_work, "' '", config_path, "' ", script));
  std::ofstream(config_path + ".out.json") << run.output;
  return run;
}

}  // namespace pdserve::testing
