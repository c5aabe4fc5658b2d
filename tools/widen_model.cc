// WidenCheckpoint: see widen_model.h.
#include "tools/widen_model.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/model/config.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"

namespace pdserve::engine {
namespace {

bool IsCheckpointFile(const std::string& name) {
  return name == "config.json" || name == "model.safetensors.index.json" ||
         name.ends_with(".safetensors");
}

// Repeats `from` (shape old_shape) into new_shape: element (i, j) of the
// result is element (i mod rows, j mod cols) of the source, times `scale`.
std::vector<float> Repeat(const std::vector<float>& from, const std::vector<int64_t>& old_shape,
                          const std::vector<int64_t>& new_shape, float scale) {
  const int64_t old_rows = old_shape.size() == 2 ? old_shape[0] : 1;
  const int64_t old_cols = old_shape.back();
  const int64_t rows = new_shape.size() == 2 ? new_shape[0] : 1;
  const int64_t cols = new_shape.back();
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    const float* src = from.data() + (i % old_rows) * old_cols;
    float* dst = out.data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) dst[j] = src[j % old_cols] * scale;
  }
  return out;
}

}  // namespace

absl::Status WidenCheckpoint(const std::string& in_dir, const std::string& out_dir,
                             const WidenOptions& options) {
  const int k = options.factor;
  if (k < 2 || k > 64) {
    return absl::InvalidArgumentError(absl::StrCat("factor must be in [2, 64], got ", k));
  }
  std::error_code ec;
  if (std::filesystem::equivalent(in_dir, out_dir, ec)) {
    return absl::InvalidArgumentError("out_dir must differ from in_dir");
  }
  // config.json alone: generation_config.json is copied as it is.
  absl::StatusOr<ModelConfig> parsed = ModelConfig::FromFile(in_dir + "/config.json");
  if (!parsed.ok()) return parsed.status();
  const ModelConfig config = *std::move(parsed);

  std::string dtype = options.dtype;
  if (dtype.empty()) {
    dtype = config.torch_dtype == "bfloat16"  ? "bf16"
            : config.torch_dtype == "float16" ? "f16"
                                              : "f32";
  }
  StDtype st_dtype;
  ModelConfig wide = config;
  if (dtype == "f32") {
    st_dtype = StDtype::kF32;
    wide.torch_dtype = "float32";
  } else if (dtype == "bf16") {
    st_dtype = StDtype::kBF16;
    wide.torch_dtype = "bfloat16";
  } else if (dtype == "f16") {
    st_dtype = StDtype::kF16;
    wide.torch_dtype = "float16";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype must be f32, bf16 or f16, got \"", dtype, "\""));
  }
  wide.hidden_size = config.hidden_size * k;
  wide.intermediate_size = config.intermediate_size * k;
  wide.num_heads = config.num_heads * k;
  wide.num_kv_heads = config.num_kv_heads * k;
  wide.head_dim = config.head_dim;
  // Validated as a reader of config.json will validate it.
  parsed = ModelConfig::FromJson(wide.ToJson());
  if (!parsed.ok()) return parsed.status();
  wide = *std::move(parsed);

  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> checkpoint =
      SafetensorsCheckpoint::Open(in_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  const std::vector<WeightSpec> old_specs = ModelWeightSpecs(config);
  const std::vector<WeightSpec> new_specs = ModelWeightSpecs(wide);
  if (old_specs.size() != new_specs.size()) {
    return absl::InternalError("widening changed the list of tensors");
  }
  const float inv_k = 1.0f / static_cast<float>(k);
  std::vector<std::vector<float>> data;
  data.reserve(new_specs.size());
  for (size_t t = 0; t < old_specs.size(); ++t) {
    const WeightSpec& from = old_specs[t];
    const WeightSpec& to = new_specs[t];
    if (from.name != to.name || from.shape.size() != to.shape.size() || from.shape.empty() ||
        from.shape.size() > 2) {
      return absl::InternalError(absl::StrCat("cannot widen tensor ", from.name));
    }
    absl::StatusOr<std::vector<float>> values = (*checkpoint)->ReadF32(from.name, from.shape);
    if (!values.ok()) return values.status();
    // A matrix whose input (last dimension) was repeated sums k copies of each
    // product: divided by k. The embedding's last dimension is its output,
    // and the LM head's input is the final norm's output, which is divided
    // by k instead (it is also the tied embedding's).
    float scale = 1.0f;
    const bool input_repeated = from.shape.size() == 2 && to.shape[1] != from.shape[1];
    if (input_repeated && from.name != "model.embed_tokens.weight" &&
        from.name != "lm_head.weight") {
      scale = inv_k;
    }
    if (from.name == "model.norm.weight") scale = inv_k;
    data.push_back(Repeat(*values, from.shape, to.shape, scale));
  }

  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
    if (IsCheckpointFile(entry.path().filename().string())) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  for (const auto& entry : std::filesystem::directory_iterator(in_dir, ec)) {
    const std::string name = entry.path().filename().string();
    // The source's README describes the source, not this checkpoint.
    if (!entry.is_regular_file() || IsCheckpointFile(name) || name == "README.md") continue;
    std::filesystem::copy_file(entry.path(), out_dir + "/" + name,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", name, ": ", ec.message()));
  }
  {
    std::ofstream out(out_dir + "/config.json", std::ios::binary | std::ios::trunc);
    out << wide.ToJson() << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", out_dir, "/config.json"));
  }
  std::vector<TensorToWrite> tensors;
  tensors.reserve(new_specs.size());
  for (size_t t = 0; t < new_specs.size(); ++t) {
    tensors.push_back({new_specs[t].name, new_specs[t].shape, data[t]});
  }
  return WriteSafetensors(out_dir + "/model.safetensors", tensors, st_dtype);
}

}  // namespace pdserve::engine
