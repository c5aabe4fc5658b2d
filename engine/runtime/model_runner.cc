#include "engine/runtime/model_runner.h"

namespace pdserve::engine {

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kBF16: return "bf16";
    case KvDtype::kF16: return "f16";
  }
  return "unknown";
}

int KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return 4;
    case KvDtype::kBF16: return 2;
    case KvDtype::kF16: return 2;
  }
  return 0;
}

}  // namespace pdserve::engine
