// OpenBLAS's detected core against the CPU; see blas_core.h.
#include "engine/cpu/blas_core.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"

namespace pdserve::engine::cpu {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool OneOf(const std::string& core, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), core) != names.end();
}

}  // namespace

std::string SuggestedOpenBlasCore(std::string_view core, Isa isa) {
  const std::string c = Lower(core);
  const bool avx512 = OneOf(c, {"skylakex", "cooperlake", "sapphirerapids"});
  const bool avx2 = avx512 || OneOf(c, {"haswell", "zen", "excavator"});
  if (isa == Isa::kAvx512 && !avx512) return "SKYLAKEX";
  if (isa == Isa::kAvx2 && !avx2) return "HASWELL";
  return "";
}

std::string OpenBlasCore() {
  std::string core = openblas_get_corename();
  while (!core.empty() && std::isspace(static_cast<unsigned char>(core.back()))) core.pop_back();
  return core;
}

std::string OpenBlasCoreWarning() {
  const std::string core = OpenBlasCore();
  const std::string suggested = SuggestedOpenBlasCore(core, BestIsa());
  if (suggested.empty()) return "";
  return absl::StrCat(
      "OpenBLAS detected this CPU as '", core, "' and runs that core's kernels, but the CPU has ",
      IsaName(BestIsa()),
      ": the GEMMs left on OpenBLAS (int4 prefill, int8 products of 2-64 rows, fp32/bf16 "
      "prefill without AVX-512) run several times slower than they could. Start the process with "
      "OPENBLAS_CORETYPE=",
      suggested, " in its environment (OpenBLAS reads it only when it is loaded).");
}

}  // namespace pdserve::engine::cpu
