// What the weight-matrix tests (weight_matrix_test, int4_test) compare
// with: random values, the float64 product and a bound on fp32 summation,
// and the instruction sets this CPU runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_gemv.h"
#include "engine/model/safetensors.h"

namespace pdserve::engine::cpu::testing_gemv {

// n normal(0, 1) values; with bf16_exact, each rounded to a bf16 number.
inline std::vector<float> Normal(int64_t n, uint32_t seed, bool bf16_exact = false) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = dist(gen);
    if (bf16_exact) x = engine::Bf16ToFloat(FloatToBf16(x));
  }
  return v;
}

// Exact (float64) y = x W^T and the summation bound of each output.
struct Reference {
  std::vector<double> y;
  std::vector<double> bound;
};

// x [m, k] times w [n, k]^T; bound: (k + 1) * 2^-24 * sum |w x| (a gamma_k
// bound with room for any summation order).
inline Reference Exact(const std::vector<float>& w, const std::vector<float>& x, int m, int n,
                       int k) {
  Reference ref{std::vector<double>(static_cast<size_t>(m) * n),
                std::vector<double>(static_cast<size_t>(m) * n)};
  for (int i = 0; i < m; ++i) {
    for (int r = 0; r < n; ++r) {
      double sum = 0, abs_sum = 0;
      for (int c = 0; c < k; ++c) {
        const double p = double{w[int64_t{r} * k + c]} * x[int64_t{i} * k + c];
        sum += p;
        abs_sum += std::abs(p);
      }
      ref.y[int64_t{i} * n + r] = sum;
      ref.bound[int64_t{i} * n + r] = (k + 1) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
    }
  }
  return ref;
}

// Rows quantized by QuantizeInt8, and their values back in fp32.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> scales, values;
};
inline QuantizedRows Quantize(const std::vector<float>& w, int n, int k) {
  QuantizedRows out{std::vector<int8_t>(w.size()),
                    std::vector<float>(static_cast<size_t>(n * Int8Groups(k))),
                    std::vector<float>(w.size())};
  QuantizeInt8(w.data(), n, k, out.q.data(), out.scales.data());
  DequantizeInt8(out.q.data(), out.scales.data(), n, k, out.values.data());
  return out;
}

inline std::vector<Isa> IsasHere() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    if (isa <= BestIsa()) isas.push_back(isa);
  }
  return isas;
}

}  // namespace pdserve::engine::cpu::testing_gemv
