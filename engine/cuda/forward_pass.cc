// The CUDA runner's forward pass (see forward_pass.h).
#include "engine/cuda/forward_pass.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cuda/base/cuda_status.h"
#include "engine/cuda/base/device_memory.h"
#include "engine/cuda/bias_add.cuh"
#include "engine/cuda/convert.cuh"
#include "engine/cuda/decode_attention.cuh"
#include "engine/cuda/embedding.cuh"
#include "engine/cuda/head_norm.cuh"
#include "engine/cuda/kv_cache.cuh"
#include "engine/cuda/linear.h"
#include "engine/cuda/prefill_attention.h"
#include "engine/cuda/reuse_poison.h"
#include "engine/cuda/rms_norm.cuh"
#include "engine/cuda/rope.cuh"
#include "engine/cuda/silu_mul.cuh"

namespace pdserve::cuda {
namespace {

// Scores and probabilities of one chunk of prefill queries stay under this
// many bytes: long prompts take smaller query chunks.
constexpr size_t kPrefillWorkspaceBudget = size_t{256} << 20;
constexpr int kMinQueryChunk = 16;

DecodeAttentionArgs DecodeArgs(const engine::ModelConfig& c, int batch, int max_context) {
  DecodeAttentionArgs a;
  a.batch = batch;
  a.q_heads = c.num_heads;
  a.kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.max_context = max_context;
  a.sliding_window = c.sliding_window;
  a.block_size = 1;  // only sizes matter here; the pass sets the cache's
  return a;
}

}  // namespace

ForwardShape ShapeOf(const engine::ModelConfig& config, const RowPlan& plan, int query_chunk) {
  ForwardShape s;
  s.rows = plan.num_rows;
  s.decode_rows = plan.num_decode;
  s.decode_table_stride = plan.decode_table_stride;
  s.max_decode_context = plan.max_decode_context;
  s.prefill_table_entries = static_cast<int>(plan.prefill_tables.size());
  s.max_prefill_keys = plan.max_prefill_keys;
  s.lm_rows = static_cast<int>(plan.sample_rows.size() + plan.verify_rows.size());
  s.query_chunk = query_chunk;
  const size_t per_query = size_t{6} * config.num_heads * std::max(plan.max_prefill_keys, 1);
  while (s.query_chunk > kMinQueryChunk && s.query_chunk * per_query > kPrefillWorkspaceBudget) {
    s.query_chunk /= 2;
  }
  for (const PrefillSpan& span : plan.prefill) {
    const int keys = span.num_cached + span.num_tokens - span.k_position;
    s.prefill_workspace_bytes = std::max(
        s.prefill_workspace_bytes,
        PrefillAttentionWorkspaceBytes(span.num_tokens, config.num_heads, s.query_chunk, keys));
  }
  return s;
}

ForwardBuffers LayoutForward(const engine::ModelConfig& c, const ForwardShape& s, uintptr_t base) {
  ArenaLayout layout;
  auto take = [&](size_t count, size_t element_bytes) {
    return reinterpret_cast<void*>(base + layout.Take(count * element_bytes));
  };
  const size_t rows = static_cast<size_t>(s.rows);
  const size_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  ForwardBuffers b;
  b.tokens = static_cast<int32_t*>(take(rows, 4));
  b.positions = static_cast<int32_t*>(take(rows, 4));
  b.slots = static_cast<int64_t*>(take(rows, 8));
  b.decode_tables =
      static_cast<int32_t*>(take(static_cast<size_t>(s.decode_rows) * s.decode_table_stride, 4));
  b.prefill_tables = static_cast<int32_t*>(take(s.prefill_table_entries, 4));
  b.lm_rows = static_cast<int32_t*>(take(s.lm_rows, 4));
  b.input_bytes = layout.size();
  b.x = static_cast<float*>(take(rows * h, 4));
  b.delta = static_cast<float*>(take(rows * h, 4));
  b.xn = static_cast<__nv_bfloat16*>(take(rows * h, 2));
  b.qkv = static_cast<float*>(take(rows * (q + 2 * kv), 4));
  const bool prefill = s.rows > s.decode_rows;
  b.qkv_bf16 = static_cast<__nv_bfloat16*>(take(prefill ? rows * (q + 2 * kv) : 0, 2));
  b.attn = static_cast<__nv_bfloat16*>(take(rows * q, 2));
  b.gu = static_cast<__nv_bfloat16*>(take(rows * 2 * inter, 2));
  b.act = static_cast<__nv_bfloat16*>(take(rows * inter, 2));
  b.k_gather = static_cast<__nv_bfloat16*>(take(static_cast<size_t>(s.max_prefill_keys) * kv, 2));
  b.v_gather = static_cast<__nv_bfloat16*>(take(static_cast<size_t>(s.max_prefill_keys) * kv, 2));
  if (s.decode_rows > 0) {
    b.decode_workspace_bytes =
        DecodeAttentionWorkspaceBytes(DecodeArgs(c, s.decode_rows, s.max_decode_context));
  }
  b.decode_workspace = take(b.decode_workspace_bytes, 1);
  b.prefill_workspace_bytes = s.prefill_workspace_bytes;
  b.prefill_workspace = take(b.prefill_workspace_bytes, 1);
  b.xs = static_cast<__nv_bfloat16*>(take(static_cast<size_t>(s.lm_rows) * h, 2));
  b.logits = static_cast<float*>(take(static_cast<size_t>(s.lm_rows) * c.vocab_size, 4));
  b.total_bytes = layout.size();
  return b;
}

void FillForwardInputs(const RowPlan& plan, std::span<const int32_t> lm_rows,
                       const ForwardShape& shape, const ForwardBuffers& host) {
  auto copy = [](void* dst, const auto& v) {
    if (!v.empty()) std::memcpy(dst, v.data(), v.size() * sizeof(v[0]));
  };
  copy(host.tokens, plan.tokens);
  copy(host.positions, plan.positions);
  copy(host.slots, plan.slots);
  copy(host.decode_tables, plan.decode_tables);
  copy(host.prefill_tables, plan.prefill_tables);
  copy(host.lm_rows, lm_rows);
}

absl::Status EnqueueForward(const ForwardModel& m, const ForwardShape& s,
                            std::span<const PrefillSpan> spans, const ForwardBuffers& b,
                            const AfterKvWrite& after_kv_write) {
  const engine::ModelConfig& c = *m.config;
  const int h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), qkv = q + 2 * kv;
  const int inter = c.intermediate_size, rows = s.rows;
  const float eps = c.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  cudaStream_t stream = m.stream;

  PDSERVE_CUDA_RETURN_IF_ERROR(
      EmbeddingGather(m.weights->embed(), c.vocab_size, h, b.tokens, rows, b.x, stream));
  for (int l = 0; l < c.num_layers; ++l) {
    const DeviceLayerWeights& w = m.weights->layers()[l];
    PDSERVE_CUDA_RETURN_IF_ERROR(
        FusedAddRmsNorm(b.x, l == 0 ? nullptr : b.delta, w.input_norm, rows, h, eps, b.xn, stream));
    if (absl::Status st = Linear(m.cublas, b.xn, w.wqkv, b.qkv, CUDA_R_32F, rows, qkv, h);
        !st.ok()) {
      return st;
    }
    if (w.bqkv != nullptr) {
      PDSERVE_CUDA_RETURN_IF_ERROR(AddBias(b.qkv, rows, qkv, qkv, w.bqkv, stream));
    }
    if (w.q_norm != nullptr) {
      const HeadNormArgs norm{.rows = rows,
                              .row_stride = qkv,
                              .q_heads = c.num_heads,
                              .kv_heads = c.num_kv_heads,
                              .head_dim = c.head_dim,
                              .q_weight = w.q_norm,
                              .k_weight = w.k_norm,
                              .eps = eps};
      PDSERVE_CUDA_RETURN_IF_ERROR(HeadRmsNorm(b.qkv, norm, stream));
    }
    const RopeArgs rope{.rows = rows,
                        .row_stride = qkv,
                        .positions = b.positions,
                        .inv_freq = m.inv_freq,
                        .q_heads = c.num_heads,
                        .kv_heads = c.num_kv_heads,
                        .head_dim = c.head_dim};
    PDSERVE_CUDA_RETURN_IF_ERROR(ApplyRope(b.qkv, rope, stream));
    const KvWriteArgs write{.rows = rows,
                            .row_stride = qkv,
                            .k_col = q,
                            .v_col = q + kv,
                            .kv_size = kv,
                            .slots = b.slots,
                            .k_cache = m.k_cache[l],
                            .v_cache = m.v_cache[l]};
    PDSERVE_CUDA_RETURN_IF_ERROR(WriteKvCache(b.qkv, write, stream));
    if (after_kv_write) {
      if (absl::Status st = after_kv_write(l); !st.ok()) return st;
    }

    if (s.decode_rows > 0) {
      DecodeAttentionArgs a = DecodeArgs(c, s.decode_rows, s.max_decode_context);
      a.q_stride = qkv;
      a.k_cache = m.k_cache[l];
      a.v_cache = m.v_cache[l];
      a.block_size = m.block_size;
      a.block_tables = b.decode_tables;
      a.block_table_stride = s.decode_table_stride;
      a.positions = b.positions;
      a.scale = scale;
      a.workspace = b.decode_workspace;
      a.out = b.attn;
      a.out_stride = q;
      // Each layer reuses the workspace (poisoned under the emulation).
      PDSERVE_CUDA_RETURN_IF_ERROR(
          PoisonForReuse(b.decode_workspace, b.decode_workspace_bytes, stream));
      PDSERVE_CUDA_RETURN_IF_ERROR(DecodeAttention(b.qkv, a, stream));
    }
    if (!spans.empty()) {
      const int64_t first = int64_t{s.decode_rows} * qkv;
      PDSERVE_CUDA_RETURN_IF_ERROR(ConvertF32ToBf16(b.qkv + first, b.qkv_bf16 + first,
                                                    int64_t{rows - s.decode_rows} * qkv, stream));
    }
    for (const PrefillSpan& span : spans) {
      const __nv_bfloat16* rows_bf16 = b.qkv_bf16 + int64_t{span.first_row} * qkv;
      PrefillAttentionArgs a;
      a.q = rows_bf16;
      a.q_stride = qkv;
      if (span.num_cached == 0) {  // its keys are its own rows
        a.k = rows_bf16 + q;
        a.v = rows_bf16 + q + kv;
        a.k_stride = a.v_stride = qkv;
      } else {  // cached keys too: gathered from the cache
        const KvCopyArgs gather{.k_cache = m.k_cache[l],
                                .v_cache = m.v_cache[l],
                                .block_size = m.block_size,
                                .kv_size = kv,
                                .block_table = b.prefill_tables + span.table_offset,
                                .first = span.k_position,
                                .count = span.num_cached + span.num_tokens - span.k_position,
                                .k = b.k_gather,
                                .v = b.v_gather};
        const size_t gather_bytes = size_t{sizeof(__nv_bfloat16)} * s.max_prefill_keys * kv;
        PDSERVE_CUDA_RETURN_IF_ERROR(PoisonForReuse(b.k_gather, gather_bytes, stream));
        PDSERVE_CUDA_RETURN_IF_ERROR(PoisonForReuse(b.v_gather, gather_bytes, stream));
        PDSERVE_CUDA_RETURN_IF_ERROR(GatherKv(gather, stream));
        a.k = b.k_gather;
        a.v = b.v_gather;
        a.k_stride = a.v_stride = kv;
        a.q_position = span.num_cached;
        a.k_position = span.k_position;
      }
      a.out = b.attn + int64_t{span.first_row} * q;
      a.out_stride = q;
      a.num_tokens = span.num_tokens;
      a.q_heads = c.num_heads;
      a.kv_heads = c.num_kv_heads;
      a.head_dim = c.head_dim;
      a.scale = scale;
      a.sliding_window = c.sliding_window;
      a.query_chunk = s.query_chunk;
      a.workspace = b.prefill_workspace;
      a.workspace_bytes = b.prefill_workspace_bytes;
      PDSERVE_CUDA_RETURN_IF_ERROR(
          PoisonForReuse(b.prefill_workspace, b.prefill_workspace_bytes, stream));
      if (absl::Status st = PrefillAttention(m.cublas, stream, a); !st.ok()) return st;
    }

    if (absl::Status st = Linear(m.cublas, b.attn, w.wo, b.delta, CUDA_R_32F, rows, h, q);
        !st.ok()) {
      return st;
    }
    if (w.bo != nullptr) PDSERVE_CUDA_RETURN_IF_ERROR(AddBias(b.delta, rows, h, h, w.bo, stream));
    PDSERVE_CUDA_RETURN_IF_ERROR(
        FusedAddRmsNorm(b.x, b.delta, w.post_norm, rows, h, eps, b.xn, stream));
    if (absl::Status st = Linear(m.cublas, b.xn, w.wgu, b.gu, CUDA_R_16BF, rows, 2 * inter, h);
        !st.ok()) {
      return st;
    }
    PDSERVE_CUDA_RETURN_IF_ERROR(SiluMul(b.gu, rows, inter, b.act, stream));
    if (absl::Status st = Linear(m.cublas, b.act, w.wdown, b.delta, CUDA_R_32F, rows, h, inter);
        !st.ok()) {
      return st;
    }
  }
  if (s.lm_rows == 0) return absl::OkStatus();
  PDSERVE_CUDA_RETURN_IF_ERROR(FusedAddRmsNormGather(
      b.x, b.delta, b.lm_rows, m.weights->final_norm(), s.lm_rows, h, eps, b.xs, stream));
  return Linear(m.cublas, b.xs, m.weights->lm_head(), b.logits, CUDA_R_32F, s.lm_rows, c.vocab_size,
                h);
}

}  // namespace pdserve::cuda
