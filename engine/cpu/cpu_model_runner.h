// The reference ModelRunner: a Llama-family decoder (Llama, Mistral, Qwen2,
// Qwen3; see engine/config.h) on the CPU: fp32 activations and accumulation.
// Weight matrices are cpu::WeightMatrix (weight_matrix.h), stored as
// CpuRunnerOptions::weight_dtype says: by default in bf16 when every value is
// exactly a bf16 number (a bf16 checkpoint), else in fp32; or all fp32, all
// bf16, or int8 with per-group scales.
//
// Forward pass per layer, for M rows (prefill: every prompt token of the
// batch concatenated; decode: one token per sequence):
//   xn  = RMSNorm(x) * input_norm
//   qkv = xn [M, H] x Wqkv^T (+ bqkv)   Wqkv = [q_proj; k_proj; v_proj], fused
//   q, k = per-head RMSNorm * q_norm, k_norm          (Qwen3 only)
//   RoPE(q, k) at each row's position (inv_freq from ModelConfig, llama3
//   scaling included); K/V written to the paged cache
//   a   = causal GQA attention, scale 1/sqrt(head_dim); with a sliding window
//         W (Mistral), query i sees keys i-W+1..i only
//   x  += a x o_proj^T (+ o_bias)
//   xn  = RMSNorm(x) * post_norm
//   gu  = xn x Wgu^T                Wgu = [gate_proj; up_proj], fused
//   x  += (silu(g) * u) x down_proj^T
// then logits = RMSNorm(x_last) * final_norm x lm_head^T.
//
// KV cache: per layer, K and V apart, each [num_blocks, block_size,
// num_kv_heads, head_dim] fp32 (KvDtype::kF32), as in model_runner.h. With a
// sliding window every position is still stored (no ring buffer): the window
// only limits what attention reads, so KV transfer is unchanged.
// Prefill attention reads the current layer's K/V from the contiguous qkv
// buffer; decode attention reads them from the cache through block tables.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cpu/weight_matrix.h"
#include "engine/model_runner.h"
#include "engine/weight_dtype.h"
#include "engine/weights.h"

namespace pdserve::engine {

struct CpuRunnerOptions {
  int kv_block_size = 16;  // tokens per block, >= 1
  int num_kv_blocks = 1;   // >= 1
  int num_threads = 0;     // OpenMP and OpenBLAS threads; 0: all cores
  // How weight matrices (embeddings and LM head included) are stored; see
  // WeightDtype. kAuto keeps a bf16 checkpoint's matrices in bf16 (the same
  // numbers in half the bytes per decode step) and others in fp32.
  WeightDtype weight_dtype = WeightDtype::kAuto;
};

class CpuModelRunner : public ModelRunner {
 public:
  // Takes the weights (their matrices are fused and the originals released).
  // INVALID_ARGUMENT for bad options or weights that do not fit `config`.
  static absl::StatusOr<std::unique_ptr<CpuModelRunner>> Create(const ModelConfig& config,
                                                                ModelWeights weights,
                                                                const CpuRunnerOptions& options);

  const ModelConfig& config() const override { return config_; }
  uint64_t fingerprint() const override { return fingerprint_; }
  KvDtype kv_dtype() const override { return KvDtype::kF32; }
  int num_kv_blocks() const override { return num_blocks_; }
  int kv_block_size() const override { return block_size_; }
  int num_threads() const { return num_threads_; }
  int64_t DecodeWeightBytes() const override;

  absl::Status Prefill(std::span<const PrefillSequence> seqs, const LayerDoneFn& on_layer_done,
                       std::vector<float>& logits) override;
  absl::Status Decode(std::span<const DecodeSequence> seqs, std::vector<float>& logits) override;

  size_t LayerKvBytes(int num_tokens) const override;
  // `out`/`in` must be exactly LayerKvBytes(num_tokens) bytes.
  absl::Status ReadLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                           std::span<std::byte> out) const override;
  absl::Status WriteLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                            std::span<const std::byte> in) override;

 private:
  using Matrix = cpu::WeightMatrix;
  struct Layer {
    std::vector<float> input_norm;  // [H]
    Matrix wqkv;                    // [Q + 2 KV, H]
    std::vector<float> bqkv;        // [Q + 2 KV]; empty: no bias
    std::vector<float> q_norm;      // [D]; empty: no q/k norm
    std::vector<float> k_norm;      // [D]
    Matrix wo;                      // [H, Q]
    std::vector<float> bo;          // [H]; empty: no bias
    std::vector<float> post_norm;   // [H]
    Matrix wgu;                     // [2 I, H]
    Matrix wdown;                   // [H, I]
  };
  // Activations for M rows, reused across calls (engine thread only).
  struct Scratch {
    std::vector<float> x, xn, qkv, attn, proj, gu, act;
    std::vector<float> cos, sin;  // [M, head_dim / 2]
  };

  CpuModelRunner(const ModelConfig& config, const CpuRunnerOptions& options);

  // Checks a block table covers `num_tokens` tokens with valid block ids.
  absl::Status CheckBlockTable(std::span<const int32_t> table, int num_tokens, const char* what,
                               size_t index) const;
  // Float offset of token `t`'s slot in a layer's K (or V) storage.
  int64_t SlotOffset(std::span<const int32_t> table, int t) const;

  // First position a query at `position` attends to (sliding window).
  int FirstVisible(int position) const {
    const int window = config_.sliding_window;
    return window > 0 && position >= window ? position - window + 1 : 0;
  }

  // Stores `values` [rows, cols] as options.weight_dtype says.
  Matrix MakeMatrix(const std::vector<float>& values, int64_t rows, int64_t cols) const;
  // y[m, n] = x[m, k] * w^T.
  void MatMul(const float* x, const Matrix& w, float* y, int m, int n, int k) const;
  void ResizeScratch(int m);
  void Embed(std::span<const int32_t> tokens);  // rows of scratch_.x
  // qkv for all rows (bias, q/k norm), RoPE at positions[r] applied to q and k.
  void AttentionInput(int layer, int m, std::span<const int32_t> positions);
  // Copies k/v of row r (qkv buffer) into the cache slot of the same token.
  void StoreKv(int layer, int row, int64_t slot_offset);
  void AttentionOutputAndMlp(int layer, int m);
  void LmHead(std::span<const int> rows, std::vector<float>& logits);

  const ModelConfig config_;
  uint64_t fingerprint_ = 0;
  int block_size_;
  int block_shift_;  // log2(block_size_) when a power of two, else -1
  int num_blocks_;
  int num_threads_;
  WeightDtype weight_dtype_;
  Matrix embed_;  // [vocab, H]
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;  // [head_dim / 2], config_.RopeInverseFrequencies()
  Matrix lm_head_;               // [vocab, H]; empty when tied to embed_
  std::vector<Layer> layers_;
  // K and V storage per layer, num_blocks * block_size * KV floats each.
  std::vector<std::vector<float>> k_cache_, v_cache_;
  Scratch scratch_;
};

}  // namespace pdserve::engine
