// pdserve_export_llama2c: converts a Hugging Face Llama model directory to
// llama2.c's run.c checkpoint (and a tokenizer.bin it can load), for the
// side-by-side benchmark bench/llama2c_side_by_side.sh. Weights are written
// in fp32 whatever the checkpoint dtype; see tools/llama2c_export.h.
//   pdserve_export_llama2c --model_dir=DIR --out=model.bin
//       [--tokenizer_out=tokenizer.bin]
#include <cmath>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/model/config.h"
#include "tools/llama2c_export.h"
#include "engine/model/weights.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory");
ABSL_FLAG(std::string, out, "", "llama2.c checkpoint to write");
ABSL_FLAG(std::string, tokenizer_out, "", "Also write a llama2.c tokenizer.bin here");

namespace pdserve::engine {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "pdserve_export_llama2c: " << status << "\n";
  return 1;
}

int Main() {
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir), out = absl::GetFlag(FLAGS_out);
  if (model_dir.empty() || out.empty()) {
    return Fail(absl::InvalidArgumentError("--model_dir and --out are required"));
  }
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(model_dir);
  if (!config.ok()) return Fail(config.status());
  if (absl::Status s = CheckLlama2cCompatible(*config); !s.ok()) return Fail(s);
  if (std::abs(config->rms_norm_eps - 1e-5f) > 1e-9f) {
    std::cerr << "warning: run.c uses rms_norm_eps 1e-5, the model " << config->rms_norm_eps
              << "\n";
  }
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(*config, model_dir);
  if (!weights.ok()) return Fail(weights.status());
  if (absl::Status s = WriteLlama2cCheckpoint(*config, *weights, out); !s.ok()) return Fail(s);
  if (const std::string tok = absl::GetFlag(FLAGS_tokenizer_out); !tok.empty()) {
    if (absl::Status s = WriteLlama2cTokenizer(config->vocab_size, tok); !s.ok()) return Fail(s);
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::engine::Main();
}
