// The CUDA ModelRunner (`--backend=cuda`): the decoder of
// engine/cpu/cpu_model_runner.h on one GPU, behind the same interface
// (engine/runtime/model_runner.h).
//
// Storage: weights in device memory, bf16 (device_weights.h: loaded one
// tensor at a time through a bounded pinned staging buffer, f16/f32
// converted on the device); the KV cache in device memory, bf16, paged
// exactly as the CPU runner's ([num_blocks, block_size, kv_heads,
// head_dim] per layer, K and V apart), registered as one KvRegion per layer
// with memory = kDevice. Activations: the residual stream fp32, GEMM inputs
// bf16, accumulation fp32 (forward_pass.h). Sampling on the device
// (step_sampling.h); only token ids and asked log-probabilities come back.
//
// Execution: Enqueue validates and queues; a runner thread takes steps in
// enqueue order, uploads each step's inputs in one copy, enqueues the
// forward pass and sampling on the runner's compute stream, records one
// event per layer right after that layer's K/V writes, then waits for the
// layers in order (WaitLayer) and for the step (Wait). Decode steps (every
// sequence one token and sampling, at most max_graph_batch sequences whose
// contexts fit max_graph_context) replay a CUDA graph captured per (batch
// bucket, context bucket) on first use, padded with rows that write no K/V;
// any other step, or a shape a graph cannot take, runs eagerly.
//
// Layer events (StepHandle::LayerDeviceEvent) are cudaEvent_t's owned by the
// step's handle: a transport stream may cudaStreamWaitEvent on layer i's
// event to read layer i's K/V of the step from the registered regions
// without blocking the host. The call returns once the event's record is
// enqueued (host issue, not device completion), and the event must be
// waited on (cudaStreamWaitEvent issued) before the handle is destroyed:
// afterwards it may be recorded for a later step. In graph-replayed decode
// steps every layer's event is recorded after the graph, i.e. once all
// layers are written (later than necessary, never early).
//
// Errors: every CUDA and cuBLAS error of a step becomes that step's status
// (absl::Status, cuda_status.h), returned by WaitLayer/Wait; the process
// goes on. A sticky device error (a fault in a kernel) fails every later
// step too, as the device does.
//
// Threading: as model_runner.h. ReadLayerKv/WriteLayerKv run on a stream of
// their own through a bounded device staging buffer, serialised with each
// other, concurrently with steps.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/cuda/base/cuda_handles.h"
#include "engine/cuda/base/device_memory.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/forward_pass.h"
#include "engine/model/weight_source.h"
#include "engine/runtime/model_runner.h"

namespace pdserve::cuda {

struct CudaRunnerOptions {
  int device = 0;          // CUDA device ordinal
  int kv_block_size = 16;  // tokens per block, >= 1
  int num_kv_blocks = 1;   // >= 1
  // Pinned host memory weights are staged through while loading.
  size_t weight_staging_bytes = size_t{64} << 20;
  // Device staging of ReadLayerKv/WriteLayerKv (a layer moves in pieces).
  size_t kv_staging_bytes = size_t{8} << 20;
  // Decode steps replay CUDA graphs (batch buckets 1, 2, 4, .. up to
  // max_graph_batch; context buckets 256, 512, .. up to max_graph_context
  // tokens); false: every step runs eagerly.
  bool cuda_graphs = true;
  int max_graph_batch = 64;
  int max_graph_context = 8192;
  // Queries per chunk of prefill attention (smaller for long prompts, so a
  // chunk's scores stay under 256 MiB).
  int prefill_query_chunk = 256;
};

class EventPool;

class CudaModelRunner : public engine::ModelRunner {
 public:
  // Loads `weights` onto the device and allocates the KV cache.
  // INVALID_ARGUMENT for bad options, FAILED_PRECONDITION without a usable
  // device, RESOURCE_EXHAUSTED when device memory does not suffice.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      const engine::WeightSource& weights, const CudaRunnerOptions& options);

  ~CudaModelRunner() override;  // finishes the steps already enqueued

  const engine::ModelConfig& config() const override { return config_; }
  std::string_view backend() const override { return "cuda"; }
  uint64_t fingerprint() const override { return fingerprint_; }
  engine::KvDtype kv_dtype() const override { return engine::KvDtype::kBF16; }
  int num_kv_blocks() const override { return options_.num_kv_blocks; }
  int kv_block_size() const override { return options_.kv_block_size; }
  int64_t DecodeWeightBytes() const override { return weights_.decode_bytes(); }

  absl::StatusOr<std::unique_ptr<engine::StepHandle>> Enqueue(engine::StepBatch batch) override;
  std::span<const engine::KvRegion> kv_regions() const override { return regions_; }

  size_t LayerKvBytes(int num_tokens) const override;
  absl::Status ReadLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                           std::span<std::byte> out) const override;
  absl::Status WriteLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                            std::span<const std::byte> in) override;

  // How steps ran, for tests and logs.
  struct Stats {
    int64_t steps = 0;                   // completed, successful or not
    int64_t graph_steps = 0;             // decode steps replayed from a graph
    int64_t graph_captures = 0;          // graphs captured
    int64_t eager_decode_steps = 0;      // decode steps no graph could take
    int64_t graph_capture_failures = 0;  // shapes whose capture failed (run eagerly)
    std::string last_graph_failure;
  };
  Stats stats() const;

 private:
  class Handle;
  struct Job {
    engine::StepBatch batch;
    std::shared_ptr<Handle> handle;
  };
  // A captured decode pass for `batch` rows and contexts up to `context`.
  struct DecodeGraph {
    UniqueGraphExec exec;
    ForwardShape shape;
    ForwardBuffers buffers;  // in graph_arena_
  };

  CudaModelRunner(const engine::ModelConfig& config, const CudaRunnerOptions& options)
      : config_(config), options_(options) {}

  absl::Status Init(const engine::WeightSource& weights);
  void RegisterKvRegions();

  // The runner thread: runs jobs in enqueue order.
  void Loop();
  // Enqueues one step's work on stream_ (layer events recorded through
  // `handle`), waits for it, and returns its output.
  absl::StatusOr<engine::StepOutput> RunStep(const engine::StepBatch& batch, Handle& handle);
  // Under the emulation: poisons the KV slots of the step's block tables
  // that no step has written by the end of this one (reuse_poison.h).
  absl::Status PoisonUnwrittenKv(const engine::StepBatch& batch, cudaStream_t stream);
  // The forward part of a step: eagerly, or by replaying a decode graph.
  // Sets *logits to the LM rows' logits ([sampling rows, vocab], device).
  absl::Status EnqueueEagerForward(const RowPlan& plan, Handle& handle, const float** logits);
  absl::Status EnqueueGraphForward(const engine::StepBatch& batch, DecodeGraph& graph,
                                   Handle& handle, const float** logits);
  // The graph for a decode batch of `batch` rows reaching `context` tokens;
  // null when graphs are off or the shape is beyond them (or its capture
  // failed once).
  absl::StatusOr<DecodeGraph*> GraphFor(int batch, int context);
  ForwardModel Model() const;
  // ReadLayerKv/WriteLayerKv after their checks: one layer of a sequence
  // between the cache and `host` (K then V), through io staging.
  absl::Status CopyLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                           std::byte* host, bool to_cache) const;

  // Grows (never shrinks) a buffer to hold `bytes`; only between steps.
  static absl::Status Reserve(DeviceAllocation& a, size_t bytes, const char* what);
  static absl::Status Reserve(PinnedAllocation& a, size_t bytes, const char* what);

  const engine::ModelConfig config_;
  const CudaRunnerOptions options_;
  uint64_t fingerprint_ = 0;

  // Device state, created by Init, released in reverse order. The streams
  // are non-blocking: never ordered with the legacy default stream, so a
  // capture on stream_ is never invalidated by other threads' copies.
  UniqueStream stream_;                // steps (runner thread only)
  UniqueStream io_stream_;             // ReadLayerKv/WriteLayerKv (under io_mu_)
  DeviceAllocation cublas_workspace_;  // outlives cublas_
  UniqueCublas cublas_;                // on stream_
  DeviceWeights weights_;
  DeviceAllocation inv_freq_;    // [head_dim / 2] fp32
  DeviceAllocation kv_storage_;  // every layer's K then V
  std::vector<__nv_bfloat16*> k_cache_, v_cache_;
  std::vector<engine::KvRegion> regions_;

  // Runner thread only: per-step regions, grown as steps need.
  DeviceAllocation step_arena_;  // eager forward pass + sampling
  PinnedAllocation host_in_;     // inputs staged for the step's uploads
  PinnedAllocation host_out_;    // sampled tokens, log-probabilities, logits
  // Decode graphs by (padded batch, context bucket), all sharing
  // graph_arena_ (replays run one at a time on stream_). A null exec marks a
  // shape whose capture failed: it runs eagerly.
  DeviceAllocation graph_arena_;
  std::map<std::pair<int, int>, DecodeGraph> graphs_;

  // ReadLayerKv/WriteLayerKv staging.
  mutable std::mutex io_mu_;
  // K then V of up to io_tokens_ tokens, then (256-byte aligned) their
  // block table slice.
  DeviceAllocation io_staging_;
  int io_tokens_ = 0;          // a multiple of the block size
  PinnedAllocation io_table_;  // the block table slice being uploaded

  // Layer events, shared with the handles that hold them (a handle may
  // outlive the runner).
  std::shared_ptr<EventPool> events_;

  mutable absl::Mutex stats_mu_;
  Stats stats_ ABSL_GUARDED_BY(stats_mu_);

  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: runs Loop() over everything above
};

}  // namespace pdserve::cuda
