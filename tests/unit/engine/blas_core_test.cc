// The OpenBLAS core check of blas_core.h: which detected cores get a
// suggestion on which CPUs, and the warning of this process (registered
// twice in CMake: as the environment leaves OpenBLAS, and with
// OPENBLAS_CORETYPE=PRESCOTT forcing the SSE3 core the misdetection picks).
#include "engine/cpu/blas_core.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::engine::cpu {
namespace {

using ::testing::HasSubstr;

TEST(BlasCoreTest, SuggestsTheWidestCoreTheCpuRuns) {
  // The misdetection seen on family 6 model 207 Xeons.
  EXPECT_EQ(SuggestedOpenBlasCore("Prescott", Isa::kAvx512), "SKYLAKEX");
  EXPECT_EQ(SuggestedOpenBlasCore("Prescott", Isa::kAvx2), "HASWELL");
  EXPECT_EQ(SuggestedOpenBlasCore("Prescott", Isa::kPortable), "");
  // AVX2 kernels on an AVX-512 CPU: 45 against 65 GFLOP/s measured.
  EXPECT_EQ(SuggestedOpenBlasCore("Haswell", Isa::kAvx512), "SKYLAKEX");
  EXPECT_EQ(SuggestedOpenBlasCore("Zen", Isa::kAvx512), "SKYLAKEX");
  EXPECT_EQ(SuggestedOpenBlasCore("Sandybridge", Isa::kAvx2), "HASWELL");
  EXPECT_EQ(SuggestedOpenBlasCore("Nehalem", Isa::kAvx2), "HASWELL");
  for (const char* core : {"SkylakeX", "SKYLAKEX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(SuggestedOpenBlasCore(core, Isa::kAvx512), "") << core;
    EXPECT_EQ(SuggestedOpenBlasCore(core, Isa::kAvx2), "") << core;
  }
  for (const char* core : {"Haswell", "haswell", "Zen", "Excavator"}) {
    EXPECT_EQ(SuggestedOpenBlasCore(core, Isa::kAvx2), "") << core;
  }
}

TEST(BlasCoreTest, WarningOfThisProcessNamesTheVariable) {
  const std::string core = OpenBlasCore();
  ASSERT_FALSE(core.empty());
  ASSERT_NE(core.back(), ' ');
  const std::string suggested = SuggestedOpenBlasCore(core, BestIsa());
  const std::string warning = OpenBlasCoreWarning();
  if (suggested.empty()) {
    EXPECT_EQ(warning, "") << core << " on " << IsaName(BestIsa());
  } else {
    EXPECT_THAT(warning, HasSubstr("'" + core + "'"));
    EXPECT_THAT(warning, HasSubstr("OPENBLAS_CORETYPE=" + suggested));
    EXPECT_THAT(warning, HasSubstr(IsaName(BestIsa())));
  }
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced != nullptr && std::string(forced) == "PRESCOTT") {
    // OpenBLAS honoured the variable (a DYNAMIC_ARCH build), and on any CPU
    // with AVX2 the check flags the SSE3 core.
    EXPECT_EQ(core, "Prescott");
    if (BestIsa() != Isa::kPortable) EXPECT_THAT(warning, HasSubstr("OPENBLAS_CORETYPE="));
  }
}

}  // namespace
}  // namespace pdserve::engine::cpu
