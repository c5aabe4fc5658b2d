// The reference ModelRunner: a Llama-family decoder (Llama, Mistral, Qwen2,
// Qwen3; see engine/model/config.h) on the CPU: fp32 activations and accumulation.
// Weight matrices are cpu::WeightMatrix (weight_matrix.h), stored as
// CpuRunnerOptions::weight_dtype says: by default in bf16 when every value is
// exactly a bf16 number (a bf16 checkpoint), else in fp32; or all fp32, all
// bf16, or int8 with per-group scales. They are built one tensor at a time
// from the checkpoint's stored bytes (engine/model/weight_source.h): a bf16
// tensor kept in bf16 is copied, never expanded to fp32 on the way.
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
// Every step is one forward pass over M rows (each sequence's new tokens, at
// positions num_cached..): a prompt, a prompt chunk after cached tokens, and
// decode tokens are the same computation. The new rows' K/V are written to
// the cache first; attention then reads every key through the block tables.
//
// Steps run on the runner's own thread (FIFO), so Enqueue returns at once and
// the caller can move layer i's KV while layer i+1 computes; the runner thread
// owns the scratch buffers and drives a WorkPool (every parallel loop of a
// step: GEMVs, GEMMs, attention, the row loops).
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/cpu/weight_matrix.h"
#include "engine/cpu/work_pool.h"
#include "engine/model/weight_source.h"
#include "engine/runtime/model_runner.h"
#include "engine/types/weight_dtype.h"

namespace pdserve::engine {

struct CpuRunnerOptions {
  int kv_block_size = 16;  // tokens per block, >= 1
  int num_kv_blocks = 1;   // >= 1
  int num_threads = 0;     // the WorkPool's threads; 0: all cores
  // How weight matrices (embeddings and LM head included) are stored; see
  // WeightDtype. kAuto keeps a bf16 checkpoint's matrices in bf16 (the same
  // numbers in half the bytes per decode step) and others in fp32.
  WeightDtype weight_dtype = WeightDtype::kAuto;
};

class CpuModelRunner : public ModelRunner {
 public:
  // Builds the weight matrices from `weights` (which may be dropped after).
  // INVALID_ARGUMENT for bad options; RESOURCE_EXHAUSTED when the KV cache
  // cannot be allocated.
  static absl::StatusOr<std::unique_ptr<CpuModelRunner>> Create(const WeightSource& weights,
                                                                const CpuRunnerOptions& options);

  ~CpuModelRunner() override;  // finishes the steps already enqueued

  const ModelConfig& config() const override { return config_; }
  std::string_view backend() const override { return "cpu"; }
  uint64_t fingerprint() const override { return fingerprint_; }
  KvDtype kv_dtype() const override { return KvDtype::kF32; }
  int num_kv_blocks() const override { return num_blocks_; }
  int kv_block_size() const override { return block_size_; }
  int num_threads() const { return num_threads_; }
  int64_t DecodeWeightBytes() const override;
  // Measured on the demo model (docs/performance.md, "Speculative
  // decoding"): 0.2 with AVX-512 (each weight read once for up to 8 rows,
  // attention 16 lanes wide), 0.6 with AVX2 (up to 6 rows a pass; 0.5-0.7
  // on a Zen 3 EPYC, where the demo model's weights sit in the last-level
  // cache and a step is bound by its FMAs), 1 on the portable kernels (a
  // row costs a step).
  double VerificationRowCost() const override;

  absl::StatusOr<std::unique_ptr<StepHandle>> Enqueue(StepBatch batch) override;
  // On the calling thread when no step is queued or running, else as
  // Enqueue then Wait.
  absl::StatusOr<StepOutput> Step(StepBatch batch) override;
  std::span<const KvRegion> kv_regions() const override { return regions_; }

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
  // Activations for M rows and a step's bookkeeping, reused across steps so
  // that a decode step allocates nothing once warm (runner thread only).
  // The activation buffers are 64-byte aligned (cpu::AlignedVector): the
  // GEMV kernels read them a cache line at a time, and a vector load that
  // straddles two lines costs a second access.
  struct Scratch {
    cpu::AlignedVector<float> x, xn, qkv, attn, proj, gu, act;
    cpu::AlignedVector<float> cos, sin;               // [M, head_dim / 2]: RoPE at each row
    std::vector<int32_t> tokens, positions, row_seq;  // [M]
    std::vector<int> sample_rows;  // LM-head rows: sampling rows, then verification rows
    std::vector<float> sample;     // Sample's scratch
  };

  class Handle;
  struct Job {
    StepBatch batch;
    std::shared_ptr<Handle> handle;
  };

  CpuModelRunner(const ModelConfig& config, const CpuRunnerOptions& options);

  absl::Status Validate(const StepBatch& batch) const;
  // The runner thread: runs enqueued jobs in order.
  void Loop();
  // One forward pass over every new token of the batch, then sampling.
  // Calls handle.LayerDone(layer) after each layer's K/V is in the cache.
  absl::StatusOr<StepOutput> Forward(const StepBatch& batch, Handle& handle);
  // Causal attention of `m` rows over the cache; row r belongs to sequence
  // row_seq[r] at position positions[r].
  void Attention(int layer, const StepBatch& batch, int m, std::span<const int32_t> row_seq,
                 std::span<const int32_t> positions);

  // Float offset of token `t`'s slot in a layer's K (or V) storage.
  int64_t SlotOffset(std::span<const int32_t> table, int t) const;

  // First position a query at `position` attends to (sliding window).
  int FirstVisible(int position) const {
    const int window = config_.sliding_window;
    return window > 0 && position >= window ? position - window + 1 : 0;
  }

  // Stores the row-wise concatenation of `parts` ([rows_i, cols] each) as
  // options.weight_dtype says.
  absl::StatusOr<Matrix> MakeMatrix(std::initializer_list<const TensorView*> parts) const;
  // y[m, n] = x[m, k] * w^T.
  void MatMul(const float* x, const Matrix& w, float* y, int m, int n, int k) const;
  // fn(r) for every row r < m: on the WorkPool's threads when m > min_rows
  // (and it has more than one), else in order on this thread. The step's
  // row loops run here rather than in OpenMP teams: an OpenMP worker that
  // spins after its loop holds a core the WorkPool's next loop needs (17%
  // of a 2-thread int8 prefill was libgomp's spinning on a 2-core AVX2
  // machine).
  void ForRows(int64_t m, int64_t min_rows, absl::FunctionRef<void(int64_t)> fn) const;
  void ResizeScratch(int m);
  void Embed(std::span<const int32_t> tokens);  // rows of scratch_.x
  // qkv for all rows (bias, q/k norm), RoPE (the tables in scratch_.cos and
  // scratch_.sin) applied to q and k.
  void AttentionInput(int layer, int m);
  // Copies k/v of row r (qkv buffer) into the cache slot of the same token.
  void StoreKv(int layer, int row, int64_t slot_offset);
  void AttentionOutputAndMlp(int layer, int m);
  void LmHead(std::span<const int> rows, std::vector<float>& logits);
  // Fills regions_ from the cache vectors.
  void RegisterKvRegions();

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
  std::vector<cpu::AlignedVector<float>> k_cache_, v_cache_;
  std::vector<KvRegion> regions_;  // over k_cache_/v_cache_
  Scratch scratch_;                // the thread running the step (busy_)
  std::vector<float> logits_;      // the thread running the step (busy_)
  // Threads of every parallel loop of a step (num_threads_ in all, the
  // runner thread included).
  std::unique_ptr<cpu::WorkPool> pool_;

  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  // A step runs (on the runner thread or a Step caller's): one at a time.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: runs Loop() over everything above
};

}  // namespace pdserve::engine
