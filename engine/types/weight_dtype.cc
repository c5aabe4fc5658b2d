// WeightDtype names; see weight_dtype.h.
#include "engine/types/weight_dtype.h"

#include "absl/strings/str_cat.h"

namespace pdserve::engine {

std::string_view WeightDtypeName(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kAuto:
      return "auto";
    case WeightDtype::kF32:
      return "f32";
    case WeightDtype::kBf16:
      return "bf16";
    case WeightDtype::kInt8:
      return "int8";
    case WeightDtype::kW8A8:
      return "w8a8";
    case WeightDtype::kInt4:
      return "int4";
  }
  return "unknown";
}

absl::StatusOr<WeightDtype> ParseWeightDtype(std::string_view name) {
  for (WeightDtype d : {WeightDtype::kAuto, WeightDtype::kF32, WeightDtype::kBf16,
                        WeightDtype::kInt8, WeightDtype::kW8A8, WeightDtype::kInt4}) {
    if (name == WeightDtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("weight dtype \"", absl::string_view(name.data(), name.size()),
                   "\" is not one of auto, f32, bf16, int8, w8a8, int4"));
}

bool AbslParseFlag(absl::string_view text, WeightDtype* dtype, std::string* error) {
  absl::StatusOr<WeightDtype> parsed = ParseWeightDtype(std::string_view(text.data(), text.size()));
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  *dtype = *parsed;
  return true;
}

std::string AbslUnparseFlag(WeightDtype dtype) { return std::string(WeightDtypeName(dtype)); }

}  // namespace pdserve::engine
