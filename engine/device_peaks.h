// The peak rates of the device a backend computes on: the roofs of the
// workers' roofline gauges (prefill MFU = achieved FLOP/s / peak FLOP/s,
// decode bandwidth utilisation = achieved bytes/s / peak bytes/s).
//
// One place answers per backend:
//   cpu   measured at start-up (engine/cpu/roofline.h: sgemm FLOP/s, triad
//         bytes/s), in well under a second each;
//   cuda  from the device (engine/cuda/cuda_peaks.h): memory bandwidth as
//         2 x memory clock x bus width (the datasheet figure the device
//         reports), FLOP/s measured with a short cuBLAS bf16 GEMM run;
//         through the backend's hooks (engine/runner_factory.h), so a
//         binary without the CUDA backend answers UNIMPLEMENTED.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/runtime/backend_registry.h"

namespace pdserve::engine {

// FLOP/s or bytes/s of the backend's device; an error where the backend
// cannot tell.
absl::StatusOr<double> MeasurePeak(PeakKind kind, const PeakOptions& options);

struct ResolvedPeak {
  double value = 0;    // 0: unknown (the ratio gauge then stays 0)
  std::string source;  // for the start-up log: the flag, the measurement, or why none
};

// A worker's peak: `flag_value` when > 0 (the command line overrides), else
// MeasurePeak.
ResolvedPeak ResolvePeak(PeakKind kind, double flag_value, const std::string& flag_name,
                         const PeakOptions& options);

}  // namespace pdserve::engine
