// Peak rates of this CPU, measured in a fraction of a second: the roofs that
// the workers' roofline gauges divide by when no peak is given on the
// command line (prefill MFU over sgemm FLOP/s, decode bandwidth utilisation
// over triad bytes/s).
//
//   MeasureTriadBandwidth  STREAM triad a[i] = b[i] + s * c[i] over doubles
//                          (24 bytes per element), OpenMP-parallel, over
//                          three arrays each as large as the last-level
//                          caches the process can reach together (16-256 MiB
//                          per array: up to 768 MiB held while it runs)
//   MeasureSgemmFlops      every thread multiplies its own 512x512 fp32
//                          matrices with the GEMM the CPU runner's fp32
//                          prefill runs: the AVX-512 panel GEMM where the
//                          CPU has AVX-512 (kernels_gemm_float.h), else
//                          single-threaded OpenBLAS sgemm; 2 n^3 FLOPs per
//                          call
//
// Each takes a wall-clock budget: set-up (allocation and first touch) and
// one pass always run; further passes run while the last pass's duration
// still fits before the deadline, and the best pass is reported. So it
// returns within `budget` unless set-up and one pass alone are longer. Both
// use `threads` OpenMP threads (0: all cores). On a busy machine the figures
// come out low (the ratio gauges then read high): the workers' peak flags
// override them.
#pragma once

#include "absl/time/time.h"

namespace pdserve::engine::cpu {

struct RooflineMeasurement {
  double per_second = 0;   // bytes/s or FLOP/s of the best pass
  int passes = 0;          // measured passes
  int threads = 0;         // OpenMP threads used
  absl::Duration elapsed;  // the whole call, set-up included
};

RooflineMeasurement MeasureTriadBandwidth(int threads, absl::Duration budget);
RooflineMeasurement MeasureSgemmFlops(int threads, absl::Duration budget);

}  // namespace pdserve::engine::cpu
