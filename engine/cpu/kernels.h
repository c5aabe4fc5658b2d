// fp32 CPU kernels of the decoder forward pass. All matrices are row-major.
// Weight matrices and their GEMVs: weight_matrix.h and kernels_gemv.h.
// GEMMs go to OpenBLAS; the rest are plain loops the compiler vectorises.
// Kernels with a `num_threads` argument parallelise with OpenMP; the others
// are meant to be called from inside an already-parallel loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdserve::engine::cpu {

// Makes OpenBLAS single-threaded (process-wide). The runner parallelises
// GEMMs itself with OpenMP: OpenBLAS's own pthread pool and OpenMP's spinning
// workers fight over the cores (measured: decode 15x slower with both).
void InitBlasThreading();

// Threads worth using for an m x n x k matmul split by rows of w: each gets
// at least ~2^17 multiply-adds and 64 rows, or the fork and join cost more
// than they save. At most num_threads, at least 1.
int MatMulThreads(int m, int n, int k, int num_threads);

// bf16 weights: the upper 16 bits of fp32 values. A matrix whose every value
// is exactly a bf16 number (any bf16 checkpoint) is stored so: the same
// numbers in half the bytes, which is what memory-bound decode streams.
bool IsBf16Exact(const float* values, int64_t n);
// The upper halves of `n` values (exact when IsBf16Exact).
std::vector<uint16_t> ToBf16(const float* values, int64_t n);
// out[i] = the fp32 value of bf16 in[i].
void Bf16ToFloat(const uint16_t* in, float* out, int64_t n);

// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of `dim`.
// y may alias x.
void RmsNorm(const float* x, const float* weight, float* y, int rows, int dim, float eps,
             int num_threads);

// Hugging Face rotary embedding tables for one position: for i < half,
// angle = float(position) * inv_freq[i] (an fp32 product, as HF's
// inv_freq @ position_ids), cos_out[i] = cos(angle), sin_out[i] = sin(angle).
// inv_freq comes from ModelConfig::RopeInverseFrequencies.
void RopeCosSin(int position, const float* inv_freq, int half, float* cos_out, float* sin_out);

// Rotates `num_heads` heads of `head_dim` in place with the rotate-half
// convention: (x[i], x[i+d/2]) -> (x[i]c - x[i+d/2]s, x[i+d/2]c + x[i]s).
void ApplyRope(float* x, int num_heads, int head_dim, const float* cos, const float* sin);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);

// y[i] += x[i].
void AddInPlace(float* y, const float* x, int64_t n, int num_threads);

// y[r, i] += bias[i] for `rows` rows of `n`.
void AddBias(float* y, const float* bias, int rows, int n, int num_threads);

// Dot and Axpy run the widest instructions the CPU has (kernels_gemv.h).
float Dot(const float* a, const float* b, int n);
// y[i] += a * x[i].
void Axpy(float a, const float* x, float* y, int n);
// Attention over one cached position for the `count` query heads that share
// a KV head (GQA), each of n values, heads back to back in q and out:
//   scores[j * stride] = scale * Dot(q + j * n, k, n),
//   out + j * n += weights[j * stride] * v          for j in [0, count).
// The key or value row is read once for all of them.
void DotsOfOneKey(const float* q, int count, const float* k, int n, float scale, float* scores,
                  int64_t stride);
void AxpysOfOneValue(const float* weights, int64_t stride, const float* v, int n, float* out,
                     int count);
// DotsOfOneKey and AxpysOfOneValue over `tokens` keys or values at once,
// key (value) t at k + t * k_stride (v + t * v_stride), for the cached tokens
// of one KV block:
//   scores[j * stride + t] = DotsOfOneKey's score of q head j and key t,
//   out + j * n += weights[j * stride + t] * v_t, for t = 0, 1, ... in turn,
// bit for bit what the one-key functions give called key by key. With
// AVX-512 and n <= 128 the heads' accumulators stay in registers across the
// keys and the scores of 16 keys are summed at once (lane_sums.h), not one
// call and one horizontal sum per key and head; with AVX2 the same for the
// scores of n <= 64 (8 keys summed at once, HorizontalSums8) and for the
// outputs of any n (64 columns of a head at a time).
void DotsOfKeys(const float* q, int count, const float* k, int64_t k_stride, int tokens, int n,
                float scale, float* scores, int64_t stride);
void AxpysOfValues(const float* weights, int64_t stride, const float* v, int64_t v_stride,
                   int tokens, int n, float* out, int count);
// Asks the CPU to bring x[0..n) into cache (a hint: no effect on results).
inline void Prefetch(const float* x, int n) {
  for (int i = 0; i < n; i += 16) __builtin_prefetch(x + i);
}
// In-place softmax of x[0..n), n >= 1; max-subtracted for stability.
void Softmax(float* x, int n);

}  // namespace pdserve::engine::cpu
