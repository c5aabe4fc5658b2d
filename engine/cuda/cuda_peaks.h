// Peak rates of a CUDA device, for the workers' roofline gauges
// (engine/device_peaks.h) and for the CUDA benchmark's ratios:
//   DeviceMemoryBandwidth  the datasheet figure the device reports:
//                          2 (double data rate) x memory clock x bus width;
//   MeasureBf16GemmFlops   what cuBLAS reaches on square bf16 GEMMs (fp32
//                          accumulation, bf16 output), measured: sizes double
//                          from 256 until one GEMM takes 1/16 of the budget
//                          (or n = 8192), then it repeats for the budget;
//   MeasureCopyBandwidth   device-to-device cudaMemcpy, counted as bytes read
//                          plus bytes written per second.
// Each measurement allocates its own buffers and frees them before it
// returns; errors are statuses (no device: FAILED_PRECONDITION).
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::cuda {

absl::StatusOr<double> DeviceMemoryBandwidth(int device);
absl::StatusOr<double> MeasureBf16GemmFlops(int device, absl::Duration budget);
absl::StatusOr<double> MeasureCopyBandwidth(int device, absl::Duration budget, size_t bytes);

}  // namespace pdserve::cuda
