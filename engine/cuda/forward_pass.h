// The CUDA runner's forward pass over the rows of one step (row_plan.h),
// enqueued on one stream: every matrix product on cuBLAS (linear.h,
// prefill_attention.h), everything else in the kernels of engine/cuda.
// Per layer, for M rows:
//   xn   = RMSNorm(x += delta) * input_norm          FusedAddRmsNorm, bf16 out
//   qkv  = xn Wqkv^T (+ bqkv)                       fp32 out
//   q, k = per-head RMSNorm (Qwen3), then RoPE       in place, fp32
//   K/V of every row -> the paged cache (bf16)       then `after_kv_write(layer)`
//   attn = decode rows: paged split-K kernel (fp32 q)
//          prefill spans: chunked cuBLAS attention (bf16 q; cached keys
//          gathered from the cache)                  bf16 out
//   delta = attn Wo^T (+ bo)                         fp32 out
//   xn   = RMSNorm(x += delta) * post_norm
//   gu   = xn Wgu^T                                  bf16 out
//   delta = silu(g) * u  Wdown^T                     fp32 out
// then for the LM rows only: xs = RMSNorm(x += delta) * final_norm,
// logits = xs LM^T (fp32). The residual stream x stays fp32.
//
// Every buffer of a pass lives in one device region laid out by
// LayoutForward; its inputs (tokens .. lm_rows) come first, so one copy
// uploads them. A pass with fixed shape and fixed region enqueues the same
// work every time, which is what a CUDA graph captures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/cuda/base/cuda_compat.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/row_plan.h"
#include "engine/model/config.h"

namespace pdserve::cuda {

// What every pass reads and nothing in it changes.
struct ForwardModel {
  const engine::ModelConfig* config = nullptr;
  const DeviceWeights* weights = nullptr;
  std::span<__nv_bfloat16* const> k_cache;  // per layer, the paged layout of kv_cache.cuh
  std::span<__nv_bfloat16* const> v_cache;
  int block_size = 0;
  const float* inv_freq = nullptr;  // device, [head_dim / 2]
  cublasHandle_t cublas = nullptr;  // set to `stream`
  cudaStream_t stream = nullptr;
};

// The sizes a pass's region is laid out for.
struct ForwardShape {
  int rows = 0;
  int decode_rows = 0;
  int decode_table_stride = 0;
  int max_decode_context = 0;  // sizes the decode kernel's grid and workspace
  int prefill_table_entries = 0;
  int max_prefill_keys = 0;            // gathered keys of one span
  size_t prefill_workspace_bytes = 0;  // one span's chunked attention
  int lm_rows = 0;                     // rows whose logits are computed
  int query_chunk = 256;               // prefill attention's chunk of queries
};

// The shape of `plan` (its LM rows: the sampling rows).
ForwardShape ShapeOf(const engine::ModelConfig& config, const RowPlan& plan, int query_chunk);

// Addresses of one pass's buffers inside a region starting at `base`.
struct ForwardBuffers {
  // Inputs: bytes [0, input_bytes) of the region, in this order.
  int32_t* tokens = nullptr;          // [rows]
  int32_t* positions = nullptr;       // [rows]
  int64_t* slots = nullptr;           // [rows]
  int32_t* decode_tables = nullptr;   // [decode_rows, decode_table_stride]
  int32_t* prefill_tables = nullptr;  // [prefill_table_entries]
  int32_t* lm_rows = nullptr;         // [lm_rows]: row of each LM row
  size_t input_bytes = 0;
  // Activations and scratch.
  float* x = nullptr;                 // [rows, H] residual stream
  float* delta = nullptr;             // [rows, H] projection outputs
  __nv_bfloat16* xn = nullptr;        // [rows, H] normed GEMM inputs
  float* qkv = nullptr;               // [rows, Q + 2 KV]
  __nv_bfloat16* qkv_bf16 = nullptr;  // the same rows in bf16 (prefill attention's input)
  __nv_bfloat16* attn = nullptr;      // [rows, Q]
  __nv_bfloat16* gu = nullptr;        // [rows, 2 I]
  __nv_bfloat16* act = nullptr;       // [rows, I]
  __nv_bfloat16* k_gather = nullptr;  // [max_prefill_keys, KV]
  __nv_bfloat16* v_gather = nullptr;
  void* decode_workspace = nullptr;
  size_t decode_workspace_bytes = 0;
  void* prefill_workspace = nullptr;
  size_t prefill_workspace_bytes = 0;
  // Outputs.
  __nv_bfloat16* xs = nullptr;  // [lm_rows, H]
  float* logits = nullptr;      // [lm_rows, vocab]
  size_t total_bytes = 0;       // the region's size
};

// Lays the buffers of `shape` out from `base` (a device region, or 0 to
// learn the sizes; a host address gives where the inputs go in a staging
// copy of the same layout).
ForwardBuffers LayoutForward(const engine::ModelConfig& config, const ForwardShape& shape,
                             uintptr_t base);

// Writes plan's inputs (and lm_rows) into `host`, a LayoutForward of the
// same shape over host memory.
void FillForwardInputs(const RowPlan& plan, std::span<const int32_t> lm_rows,
                       const ForwardShape& shape, const ForwardBuffers& host);

// Called after each layer's K/V writes are enqueued (e.g. to record the
// layer's event); an error stops the pass.
using AfterKvWrite = std::function<absl::Status(int layer)>;

// Enqueues the pass; `spans` are the plan's prefill spans (none in a
// decode graph). CUDA and cuBLAS errors as statuses (cuda_status.h).
absl::Status EnqueueForward(const ForwardModel& model, const ForwardShape& shape,
                            std::span<const PrefillSpan> spans, const ForwardBuffers& buffers,
                            const AfterKvWrite& after_kv_write);

}  // namespace pdserve::cuda
