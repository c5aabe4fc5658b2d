// WeightSource: see weight_source.h.
#include "engine/model/weight_source.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/model/weights.h"

namespace pdserve::engine {
namespace {

uint16_t LoadU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

float TensorView::At(int64_t i) const {
  switch (dtype) {
    case StDtype::kBF16:
      return Bf16ToFloat(LoadU16(bytes.data() + 2 * i));
    case StDtype::kF16:
      return HalfToFloat(LoadU16(bytes.data() + 2 * i));
    default: {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, sizeof(v));
      return v;
    }
  }
}

void TensorView::ToF32(std::span<float> out, int64_t begin) const {
  const int64_t n = static_cast<int64_t>(out.size());
  if (dtype == StDtype::kF32) {
    if (n > 0) std::memcpy(out.data(), bytes.data() + 4 * begin, static_cast<size_t>(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = At(begin + i);
}

void TensorView::ToBf16(std::span<uint16_t> out, int64_t begin) const {
  const int64_t n = static_cast<int64_t>(out.size());
  if (dtype == StDtype::kBF16) {
    if (n > 0) std::memcpy(out.data(), bytes.data() + 2 * begin, static_cast<size_t>(n) * 2);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(At(begin + i));
}

uint64_t MixFingerprint(uint64_t fingerprint, std::string_view tag) {
  uint64_t h = fingerprint ^ 0x9e3779b97f4a7c15ull;
  for (char c : tag) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

absl::StatusOr<std::unique_ptr<WeightSource>> WeightSource::Open(const ModelConfig& config,
                                                                 const std::string& model_dir) {
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> checkpoint =
      SafetensorsCheckpoint::Open(model_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  return FromCheckpoint(config, *std::move(checkpoint));
}

absl::StatusOr<std::unique_ptr<WeightSource>> WeightSource::FromCheckpoint(
    const ModelConfig& config, std::unique_ptr<SafetensorsCheckpoint> checkpoint) {
  std::unique_ptr<WeightSource> source(new WeightSource(config));
  for (WeightSpec& spec : ModelWeightSpecs(config)) {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* info = checkpoint->Find(spec.name, &file);
    if (info == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(checkpoint->path(), ": missing tensor \"", spec.name, "\""));
    }
    if (info->shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": tensor \"", spec.name,
                                                     "\" has shape ", ShapeString(info->shape),
                                                     ", expected ", ShapeString(spec.shape)));
    }
    if (info->dtype != StDtype::kF32 && info->dtype != StDtype::kF16 &&
        info->dtype != StDtype::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(
          file->path(), ": tensor \"", spec.name, "\": dtype ",
          std::string(StDtypeName(info->dtype)), " cannot be loaded (need F32, F16 or BF16)"));
    }
    source->index_.emplace(spec.name, source->tensors_.size());
    source->tensors_.push_back(TensorView{.name = std::move(spec.name),
                                          .dtype = info->dtype,
                                          .shape = info->shape,
                                          .num_elements = info->num_elements,
                                          .bytes = file->RawBytes(*info)});
  }
  source->checkpoint_ = std::move(checkpoint);
  std::vector<FingerprintTensor> sample;
  for (const TensorView& t : source->tensors_) {
    sample.push_back({&t.name, &t.shape, t.num_elements, [&t](int64_t j) { return t.At(j); }});
  }
  source->fingerprint_ = ComputeFingerprint(config, sample);
  // The same hash over each tensor's edges only: its first and last 64
  // values as a 128-value tensor of the real name and shape.
  constexpr int64_t kEdge = 64;
  std::vector<FingerprintTensor> edges;
  for (const TensorView& t : source->tensors_) {
    const int64_t n = t.num_elements;
    const int64_t m = std::min<int64_t>(n, 2 * kEdge);
    edges.push_back(
        {&t.name, &t.shape, m, [&t, n, m](int64_t j) { return t.At(j < m / 2 ? j : n - m + j); }});
  }
  source->checkpoint_fingerprint_ = ComputeFingerprint(config, edges);
  return source;
}

absl::StatusOr<uint64_t> CheckpointFingerprint(const ModelConfig& config,
                                               const std::string& model_dir) {
  absl::StatusOr<std::unique_ptr<WeightSource>> source = WeightSource::Open(config, model_dir);
  if (!source.ok()) return source.status();
  return (*source)->checkpoint_fingerprint();
}

const TensorView* WeightSource::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorView* WeightSource::Layer(int layer, std::string_view suffix) const {
  return Find(absl::StrCat("model.layers.", layer, ".", std::string(suffix)));
}

}  // namespace pdserve::engine
