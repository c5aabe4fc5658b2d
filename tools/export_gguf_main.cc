// pdserve_export_gguf: converts a Hugging Face Llama model directory to a
// GGUF file llama.cpp loads (fp32 tensors, a vocabulary whose token i is
// "<i>"), for the side-by-side benchmark bench/llamacpp_side_by_side.sh;
// see tools/gguf_export.h.
//   pdserve_export_gguf --model_dir=DIR --out=model.gguf
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"
#include "tools/gguf_export.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory");
ABSL_FLAG(std::string, out, "", "GGUF file to write");

namespace pdserve::engine {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "pdserve_export_gguf: " << status << "\n";
  return 1;
}

int Main() {
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir), out = absl::GetFlag(FLAGS_out);
  if (model_dir.empty() || out.empty()) {
    return Fail(absl::InvalidArgumentError("--model_dir and --out are required"));
  }
  absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(model_dir);
  if (!config.ok()) return Fail(config.status());
  if (absl::Status s = CheckGgufCompatible(*config); !s.ok()) return Fail(s);
  absl::StatusOr<ModelWeights> weights = LoadModelWeights(*config, model_dir);
  if (!weights.ok()) return Fail(weights.status());
  if (absl::Status s = WriteGguf(*config, *weights, out); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace
}  // namespace pdserve::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::engine::Main();
}
