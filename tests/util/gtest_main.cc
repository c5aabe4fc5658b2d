// The main of every test binary (tests/CMakeLists.txt, pdserve_test). As
// GoogleTest's own, plus one exit code: when no test failed and every test
// that ran skipped itself (no GPU, a missing tool), it exits with
// kAllSkipped, which ctest reports as "Skipped" (SKIP_RETURN_CODE). A
// failure anywhere, a failed SetUpTestSuite included, still exits 1 and
// fails, even when the tests after it skipped.
#include "gtest/gtest.h"

namespace {
constexpr int kAllSkipped = 77;
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (result == 0 && unit.successful_test_count() == 0 && unit.skipped_test_count() > 0 &&
      !unit.ad_hoc_test_result().Failed()) {
    return kAllSkipped;
  }
  return result;
}
