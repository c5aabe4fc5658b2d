// The start-up peak measurements of the CPU backend (engine/cpu/roofline.h):
// positive finite rates, passes ended by the budget. The rates themselves are
// not judged (machines differ); the workers' logs and gauges show them.
#include "engine/cpu/roofline.h"

#include <cmath>

#include "absl/time/clock.h"
#include "engine/device_peaks.h"
#include "engine/runner_factory.h"
#include "gtest/gtest.h"

namespace pdserve::engine::cpu {
namespace {

// The budget each measurement gets. How long a call takes is not asserted
// (a busy machine stretches any pass); that the budget ends the passes is:
// a zero budget measures exactly one pass (below), and a budget far longer
// than a pass measures several.
constexpr absl::Duration kBudget = absl::Milliseconds(200);
constexpr absl::Duration kLongBudget = absl::Seconds(2);

void ExpectSane(const RooflineMeasurement& m, absl::Duration wall) {
  EXPECT_TRUE(std::isfinite(m.per_second));
  EXPECT_GT(m.per_second, 0);
  EXPECT_GE(m.passes, 1);
  EXPECT_EQ(m.threads, 2);
  EXPECT_LE(m.elapsed, wall);
}

TEST(RooflineTest, TriadBandwidthIsPositiveAndFinite) {
  const absl::Time start = absl::Now();
  const RooflineMeasurement m = MeasureTriadBandwidth(/*threads=*/2, kBudget);
  ExpectSane(m, absl::Now() - start);
  // Any memory system of this century moves more than 100 MB/s.
  EXPECT_GT(m.per_second, 1e8);
}

TEST(RooflineTest, SgemmFlopsArePositiveFiniteAndMeasuredOverSeveralPasses) {
  const absl::Time start = absl::Now();
  const RooflineMeasurement m = MeasureSgemmFlops(/*threads=*/2, kLongBudget);
  ExpectSane(m, absl::Now() - start);
  EXPECT_GT(m.passes, 1) << "a 512^3 sgemm takes milliseconds, the budget seconds";
  EXPECT_GT(m.per_second, 1e8);
}

TEST(RooflineTest, ATinyBudgetStillMeasuresOnePass) {
  const RooflineMeasurement m = MeasureSgemmFlops(/*threads=*/1, absl::ZeroDuration());
  EXPECT_EQ(m.passes, 1);
  EXPECT_GT(m.per_second, 0);
}

TEST(DevicePeaksTest, FlagOverridesMeasurementAndOtherBackendsSayUnknown) {
  const ResolvedPeak flag = ResolvePeak(PeakKind::kFlops, 5e12, "peak_flops", {});
  EXPECT_EQ(flag.value, 5e12);
  EXPECT_NE(flag.source.find("--peak_flops"), std::string::npos) << flag.source;

  const ResolvedPeak measured = ResolvePeak(PeakKind::kMemoryBandwidth, 0, "peak_memory_bandwidth",
                                            {.backend = "cpu", .threads = 1});
  EXPECT_GT(measured.value, 0);
  EXPECT_NE(measured.source.find("measured"), std::string::npos) << measured.source;

  // A backend this binary lacks (here always "tpu"; "cuda" unless built in:
  // tests/unit/cuda covers its peaks).
  for (const std::string backend : {"tpu", "cuda"}) {
    if (FindBackend(backend) != nullptr) continue;
    const ResolvedPeak none =
        ResolvePeak(PeakKind::kFlops, 0, "peak_flops", {.backend = backend, .threads = 1});
    EXPECT_EQ(none.value, 0);
    EXPECT_NE(none.source.find("--peak_flops"), std::string::npos) << none.source;
    EXPECT_EQ(MeasurePeak(PeakKind::kFlops, {.backend = backend}).status().code(),
              absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace pdserve::engine::cpu
