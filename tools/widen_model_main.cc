// pdserve_widen_model: writes a checkpoint k times wider that computes what
// the source computes (tools/widen_model.h), e.g. the trained demo model as
// a target whose decode steps stream weights from memory:
//   pdserve_widen_model --in_dir=tools/demo_model --out_dir=/tmp/demo_wide4 --factor=4
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "common/base/cli.h"
#include "tools/widen_model.h"

ABSL_FLAG(std::string, in_dir, "", "Checkpoint to widen (config.json + safetensors)");
ABSL_FLAG(std::string, out_dir, "", "Directory to write the widened checkpoint into");
ABSL_FLAG(int, factor, 4, "Width multiple k >= 2 (a power of two keeps bf16 weights exact)");
ABSL_FLAG(std::string, dtype, "", "Output dtype f32, bf16 or f16 (empty: the source's)");

int main(int argc, char** argv) {
  pdserve::ParseFlags(argc, argv,
                      "Writes a checkpoint k times wider that gives the source's logits", __FILE__);
  const std::string in_dir = absl::GetFlag(FLAGS_in_dir);
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  if (in_dir.empty() || out_dir.empty()) {
    std::cerr << "pdserve_widen_model: --in_dir and --out_dir are required\n";
    return 2;
  }
  const absl::Status s = pdserve::engine::WidenCheckpoint(
      in_dir, out_dir,
      {.factor = absl::GetFlag(FLAGS_factor), .dtype = absl::GetFlag(FLAGS_dtype)});
  if (!s.ok()) {
    std::cerr << "pdserve_widen_model: " << s << "\n";
    return 1;
  }
  std::cout << "wrote " << out_dir << "\n";
  return 0;
}
