#include "engine/device_peaks.h"

#include <omp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/cpu/roofline.h"
#include "engine/runner_factory.h"

namespace pdserve::engine {

absl::StatusOr<double> MeasurePeak(PeakKind kind, const PeakOptions& options) {
  if (options.backend != "cpu") {
    const BackendHooks* hooks = FindBackend(options.backend);
    if (hooks == nullptr || hooks->measure_peak == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("the ", options.backend, " backend is not built into this binary"));
    }
    return hooks->measure_peak(kind, options);
  }
  const cpu::RooflineMeasurement m =
      kind == PeakKind::kFlops ? cpu::MeasureSgemmFlops(options.threads, options.budget)
                               : cpu::MeasureTriadBandwidth(options.threads, options.budget);
  if (!(m.per_second > 0)) return absl::InternalError("the measurement timed nothing");
  return m.per_second;
}

ResolvedPeak ResolvePeak(PeakKind kind, double flag_value, const std::string& flag_name,
                         const PeakOptions& options) {
  const char* unit = kind == PeakKind::kFlops ? "FLOP/s" : "bytes/s";
  if (flag_value > 0)
    return {flag_value, absl::StrFormat("%g %s from --%s", flag_value, unit, flag_name)};
  const absl::Time start = absl::Now();
  absl::StatusOr<double> measured = MeasurePeak(kind, options);
  if (!measured.ok()) {
    return {0, absl::StrCat("unknown (", measured.status().message(), "; set --", flag_name, ")")};
  }
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(absl::Now() - start));
  if (options.backend != "cpu") {
    return {*measured,
            absl::StrFormat(
                "%.4g %s from the %s device in %d ms (%s)", *measured, unit, options.backend, ms,
                kind == PeakKind::kFlops ? "bf16 GEMM measured" : "2 x memory clock x bus width")};
  }
  return {*measured, absl::StrFormat("%.4g %s measured in %d ms (%s, %d threads)", *measured, unit,
                                     ms, kind == PeakKind::kFlops ? "fp32 GEMM" : "triad",
                                     options.threads > 0 ? options.threads : omp_get_num_procs())};
}

}  // namespace pdserve::engine
