// CudaModelRunner: see cuda_model_runner.h for storage, execution and
// errors; forward_pass.h for the computation.
#include "engine/cuda/cuda_model_runner.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/cuda/base/cuda_status.h"
#include "engine/cuda/kv_cache.cuh"
#include "engine/cuda/reuse_poison.h"
#include "engine/cuda/row_plan.h"
#include "engine/cuda/step_sampling.h"
#include "engine/runtime/step_state.h"

namespace pdserve::cuda {

using engine::KvRegion;
using engine::StepBatch;
using engine::StepOutput;

namespace {

// cuBLAS's workspace, set explicitly so graph capture never makes it
// allocate (32 MiB is what cuBLAS asks for on Hopper).
#if defined(PDSERVE_GPU_EMULATION)
constexpr size_t kCublasWorkspaceBytes = size_t{1} << 20;
#else
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
#endif
constexpr int kMinGraphContext = 256;

int NextPowerOfTwo(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

// Layer events, reused across steps: a handle holds one per layer while it
// lives. Thread-safe.
class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}

  absl::StatusOr<std::vector<UniqueEvent>> Acquire(int n) {
    std::vector<UniqueEvent> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!free_.empty() && static_cast<int>(out.size()) < n) {
        out.push_back(std::move(free_.back()));
        free_.pop_back();
      }
    }
    if (static_cast<int>(out.size()) < n) {
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    }
    while (static_cast<int>(out.size()) < n) {
      absl::StatusOr<UniqueEvent> e = NewEvent(cudaEventDisableTiming | cudaEventBlockingSync);
      if (!e.ok()) {
        Release(std::move(out));
        return e.status();
      }
      out.push_back(*std::move(e));
    }
    return out;
  }

  void Release(std::vector<UniqueEvent> events) {
    std::lock_guard<std::mutex> lock(mu_);
    for (UniqueEvent& e : events) free_.push_back(std::move(e));
  }

 private:
  const int device_;
  std::mutex mu_;
  std::vector<UniqueEvent> free_;
};

// One step's completion (engine::StepState) and its layer events, shared by
// the runner thread (which issues and completes the step) and the caller.
class CudaModelRunner::Handle final : public engine::StepState {
 public:
  Handle(int num_layers, std::shared_ptr<EventPool> pool, std::vector<UniqueEvent> events)
      : StepState(num_layers), pool_(std::move(pool)), events_(std::move(events)) {}
  ~Handle() override {
    if (pool_ != nullptr) pool_->Release(std::move(events_));
  }

  // Blocks until the layer's event record is enqueued; null when it never
  // will be (a failed step, or a layer out of range).
  void* LayerDeviceEvent(int layer) const override {
    if (layer < 0 || layer >= num_layers() || events_.empty()) return nullptr;
    absl::MutexLock lock(&mu_);
    auto ready = [this, layer]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return layers_issued_ > layer || DoneLocked();
    };
    mu_.Await(absl::Condition(&ready));
    return layers_issued_ > layer ? events_[layer].get() : nullptr;
  }

  // Runner thread.
  cudaEvent_t event(int layer) const { return events_[layer].get(); }
  void LayerIssued(int layer) {
    absl::MutexLock lock(&mu_);
    layers_issued_ = layer + 1;
  }

 private:
  const std::shared_ptr<EventPool> pool_;
  std::vector<UniqueEvent> events_;  // one per layer; empty for an empty batch
  int layers_issued_ ABSL_GUARDED_BY(mu_) = 0;
};

// ---- creation ----

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const engine::WeightSource& weights, const CudaRunnerOptions& options) {
  const engine::ModelConfig& config = weights.config();
  if (options.kv_block_size < 1 || options.num_kv_blocks < 1 || options.prefill_query_chunk < 1 ||
      options.max_graph_batch < 1 || options.max_graph_context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModelRunner: kv_block_size (", options.kv_block_size,
                     "), num_kv_blocks (", options.num_kv_blocks,
                     "), prefill_query_chunk, max_graph_batch and max_graph_context "
                     "must be >= 1"));
  }
  const int64_t slots = int64_t{options.num_kv_blocks} * options.kv_block_size;
  if (slots > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModelRunner: KV cache of ", slots, " token slots is too large"));
  }
  if (config.head_dim > 512 || config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModelRunner: head_dim ", config.head_dim,
                                                   " (the kernels take even sizes <= 512)"));
  }
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner(config, options));
  if (absl::Status s = r->Init(weights); !s.ok()) return s;
  CudaModelRunner* raw = r.get();
  r->thread_ = std::thread([raw] { raw->Loop(); });
  return r;
}

absl::Status CudaModelRunner::Init(const engine::WeightSource& source) {
  fingerprint_ = source.fingerprint();
  int count = 0;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (options_.device < 0 || options_.device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CudaModelRunner: device ", options_.device, " of ", count, " CUDA devices"));
  }
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  absl::StatusOr<UniqueStream> stream = NewNonBlockingStream();
  if (!stream.ok()) return stream.status();
  stream_ = *std::move(stream);
  stream = NewNonBlockingStream();
  if (!stream.ok()) return stream.status();
  io_stream_ = *std::move(stream);
  absl::StatusOr<UniqueCublas> cublas = NewCublas(stream_.get());
  if (!cublas.ok()) return cublas.status();
  cublas_ = *std::move(cublas);
  absl::StatusOr<DeviceAllocation> workspace =
      DeviceAllocation::Create(kCublasWorkspaceBytes, "cuBLAS workspace");
  if (!workspace.ok()) return workspace.status();
  cublas_workspace_ = *std::move(workspace);
  PDSERVE_CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(cublas_.get(), cublas_workspace_.get(), cublas_workspace_.size()));

  absl::StatusOr<DeviceWeights> weights =
      DeviceWeights::Load(source, stream_.get(), options_.weight_staging_bytes);
  if (!weights.ok()) return weights.status();
  weights_ = *std::move(weights);

  const std::vector<float> inv_freq = config_.RopeInverseFrequencies();
  absl::StatusOr<DeviceAllocation> freq =
      DeviceAllocation::Create(inv_freq.size() * sizeof(float), "RoPE frequencies");
  if (!freq.ok()) return freq.status();
  inv_freq_ = *std::move(freq);
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(inv_freq_.get(), inv_freq.data(),
                                          inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));

  const size_t kv = static_cast<size_t>(config_.kv_size());
  const size_t layer_elements =
      static_cast<size_t>(options_.num_kv_blocks) * options_.kv_block_size * kv;
  absl::StatusOr<DeviceAllocation> cache = DeviceAllocation::Create(
      2 * layer_elements * config_.num_layers * sizeof(__nv_bfloat16), "KV cache");
  if (!cache.ok()) return cache.status();
  kv_storage_ = *std::move(cache);
  for (int l = 0; l < config_.num_layers; ++l) {
    k_cache_.push_back(kv_storage_.as<__nv_bfloat16>((2 * l) * layer_elements * 2));
    v_cache_.push_back(kv_storage_.as<__nv_bfloat16>((2 * l + 1) * layer_elements * 2));
  }
  RegisterKvRegions();

  const int bs = options_.kv_block_size;
  const size_t token_bytes = kv * sizeof(__nv_bfloat16);
  io_tokens_ =
      std::max<int>(bs, static_cast<int>(options_.kv_staging_bytes / (2 * token_bytes)) / bs * bs);
  const size_t io_blocks = static_cast<size_t>(io_tokens_ / bs);
  absl::StatusOr<DeviceAllocation> staging = DeviceAllocation::Create(
      Align(2 * io_tokens_ * token_bytes) + io_blocks * sizeof(int32_t), "KV staging");
  if (!staging.ok()) return staging.status();
  io_staging_ = *std::move(staging);
  absl::StatusOr<PinnedAllocation> table =
      PinnedAllocation::Create(io_blocks * sizeof(int32_t), "KV staging block table");
  if (!table.ok()) return table.status();
  io_table_ = *std::move(table);

  events_ = std::make_shared<EventPool>(options_.device);
  return absl::OkStatus();
}

void CudaModelRunner::RegisterKvRegions() {
  const int64_t block_bytes =
      int64_t{options_.kv_block_size} * config_.kv_size() * int64_t{sizeof(__nv_bfloat16)};
  regions_.clear();
  for (int l = 0; l < config_.num_layers; ++l) {
    regions_.push_back(KvRegion{.layer = l,
                                .memory = engine::MemoryKind::kDevice,
                                .device = options_.device,
                                .k_base = reinterpret_cast<std::byte*>(k_cache_[l]),
                                .v_base = reinterpret_cast<std::byte*>(v_cache_[l]),
                                .block_stride_bytes = block_bytes,
                                .num_blocks = options_.num_kv_blocks,
                                .block_size = options_.kv_block_size,
                                .num_kv_heads = config_.num_kv_heads,
                                .head_dim = config_.head_dim,
                                .dtype = engine::KvDtype::kBF16});
  }
}

CudaModelRunner::~CudaModelRunner() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (stream_ != nullptr) cudaStreamSynchronize(stream_.get());
}

CudaModelRunner::Stats CudaModelRunner::stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

ForwardModel CudaModelRunner::Model() const {
  return ForwardModel{.config = &config_,
                      .weights = &weights_,
                      .k_cache = k_cache_,
                      .v_cache = v_cache_,
                      .block_size = options_.kv_block_size,
                      .inv_freq = inv_freq_.as<float>(),
                      .cublas = cublas_.get(),
                      .stream = stream_.get()};
}

template <typename Allocation>
absl::Status ReserveBytes(Allocation& a, size_t bytes, const char* what) {
  if (a.size() >= bytes) return absl::OkStatus();
  a.Reset();  // the previous step is complete: nothing reads it
  absl::StatusOr<Allocation> grown = Allocation::Create(bytes + bytes / 2, what);
  if (!grown.ok()) return grown.status();
  a = *std::move(grown);
  return absl::OkStatus();
}
absl::Status CudaModelRunner::Reserve(DeviceAllocation& a, size_t bytes, const char* what) {
  return ReserveBytes(a, bytes, what);
}
absl::Status CudaModelRunner::Reserve(PinnedAllocation& a, size_t bytes, const char* what) {
  return ReserveBytes(a, bytes, what);
}

// ---- steps ----

absl::StatusOr<std::unique_ptr<engine::StepHandle>> CudaModelRunner::Enqueue(StepBatch batch) {
  if (absl::Status s =
          engine::ValidateStepBatch(batch, config_, options_.kv_block_size, options_.num_kv_blocks);
      !s.ok()) {
    return s;
  }
  std::shared_ptr<Handle> handle;
  if (batch.seqs.empty()) {
    handle = std::make_shared<Handle>(config_.num_layers, nullptr, std::vector<UniqueEvent>{});
    handle->Complete(StepOutput{});
  } else {
    absl::StatusOr<std::vector<UniqueEvent>> events = events_->Acquire(config_.num_layers);
    if (!events.ok()) return events.status();
    handle = std::make_shared<Handle>(config_.num_layers, events_, *std::move(events));
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("CudaModelRunner is shutting down");
    jobs_.push_back(Job{std::move(batch), handle});
  }
  return engine::CallerHandle(std::move(handle));
}

void CudaModelRunner::Loop() {
  cudaSetDevice(options_.device);  // a failure shows in the first step's status
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !jobs_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // stop_ and nothing left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    absl::StatusOr<StepOutput> result = RunStep(job.batch, *job.handle);
    if (!result.ok()) {
      // Nothing of this step may still run when its buffers are reused.
      cudaStreamSynchronize(stream_.get());
      cudaGetLastError();
    }
    {
      absl::MutexLock lock(&stats_mu_);
      ++stats_.steps;
    }
    job.handle->Complete(std::move(result));
  }
}

absl::StatusOr<CudaModelRunner::DecodeGraph*> CudaModelRunner::GraphFor(int batch, int context) {
  const int cap = std::min(options_.max_graph_context, config_.max_position_embeddings);
  if (!options_.cuda_graphs || batch > options_.max_graph_batch || context > cap) return nullptr;
  const int rows = std::min(NextPowerOfTwo(batch), options_.max_graph_batch);
  const int bucket = std::min(NextPowerOfTwo(std::max(context, kMinGraphContext)), cap);
  const std::pair<int, int> key{rows, bucket};
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    return it->second.exec != nullptr ? &it->second : nullptr;
  }
  auto shape_of = [this](int r, int c) {
    ForwardShape s;
    s.rows = s.decode_rows = s.lm_rows = r;
    s.decode_table_stride = (c + options_.kv_block_size - 1) / options_.kv_block_size;
    s.max_decode_context = c;
    s.query_chunk = options_.prefill_query_chunk;
    return s;
  };
  if (graph_arena_.get() == nullptr) {
    // Every graph lays its buffers out from the same base; the largest
    // shape bounds them all.
    const ForwardShape largest = shape_of(options_.max_graph_batch, cap);
    absl::StatusOr<DeviceAllocation> arena =
        DeviceAllocation::Create(LayoutForward(config_, largest, 0).total_bytes, "decode graphs");
    if (!arena.ok()) return arena.status();
    graph_arena_ = *std::move(arena);
  }
  DecodeGraph graph;
  graph.shape = shape_of(rows, bucket);
  graph.buffers =
      LayoutForward(config_, graph.shape, reinterpret_cast<uintptr_t>(graph_arena_.get()));

  absl::Status captured = CudaStatus(
      cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal), "begin capture");
  if (captured.ok()) {
    captured = EnqueueForward(Model(), graph.shape, {}, graph.buffers, nullptr);
    cudaGraph_t g = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_.get(), &g);
    if (captured.ok()) captured = CudaStatus(ended, "cudaStreamEndCapture");
    if (captured.ok()) {
      cudaGraphExec_t exec = nullptr;
      captured = CudaStatus(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
      if (captured.ok()) graph.exec.reset(exec);
    }
    if (g != nullptr) cudaGraphDestroy(g);
  }
  if (!captured.ok()) {
    cudaGetLastError();  // a failed capture is not the device's error
    // The engine has no logger of its own (common/ sits above it): stderr,
    // once per shape, and the stats.
    const std::string message =
        absl::StrCat("decode graph for ", rows, " sequences up to ", bucket,
                     " tokens not captured, running eagerly: ", captured.ToString());
    std::fprintf(stderr, "pdserve cuda runner: %s\n", message.c_str());
    absl::MutexLock lock(&stats_mu_);
    ++stats_.graph_capture_failures;
    stats_.last_graph_failure = message;
  } else {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.graph_captures;
  }
  DecodeGraph& stored = graphs_[key] = std::move(graph);
  return stored.exec != nullptr ? &stored : nullptr;
}

absl::Status CudaModelRunner::PoisonUnwrittenKv(const StepBatch& batch, cudaStream_t stream) {
  const int64_t bs = options_.kv_block_size, kv = config_.kv_size();
  // Runs of consecutive unwritten slots [first, end), per layer K and V.
  auto poison = [&](int64_t first, int64_t end) -> absl::Status {
    const size_t bytes = static_cast<size_t>((end - first) * kv) * sizeof(__nv_bfloat16);
    for (int l = 0; l < config_.num_layers; ++l) {
      PDSERVE_CUDA_RETURN_IF_ERROR(PoisonForReuse(k_cache_[l] + first * kv, bytes, stream));
      PDSERVE_CUDA_RETURN_IF_ERROR(PoisonForReuse(v_cache_[l] + first * kv, bytes, stream));
    }
    return absl::OkStatus();
  };
  for (const engine::StepSequence& s : batch.seqs) {
    const int64_t written = s.num_cached + static_cast<int64_t>(s.tokens.size());
    int64_t run_first = -1, run_end = -1;
    for (size_t j = static_cast<size_t>(written / bs); j < s.block_table.size(); ++j) {
      const int64_t first = int64_t{s.block_table[j]} * bs +
                            (static_cast<int64_t>(j) == written / bs ? written % bs : 0);
      const int64_t end = (int64_t{s.block_table[j]} + 1) * bs;
      if (first == run_end) {
        run_end = end;
        continue;
      }
      if (run_first >= 0) {
        if (absl::Status st = poison(run_first, run_end); !st.ok()) return st;
      }
      run_first = first;
      run_end = end;
    }
    if (run_first >= 0) {
      if (absl::Status st = poison(run_first, run_end); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> CudaModelRunner::RunStep(const StepBatch& batch, Handle& handle) {
  const int bs = options_.kv_block_size, vocab = config_.vocab_size;
  cudaStream_t stream = stream_.get();

  // The path: a decode graph, or eagerly.
  DecodeGraph* graph = nullptr;
  const bool decode = IsPureDecode(batch);
  if (decode) {
    int context = 0;
    for (const engine::StepSequence& s : batch.seqs) context = std::max(context, s.num_cached + 1);
    absl::StatusOr<DecodeGraph*> g = GraphFor(static_cast<int>(batch.seqs.size()), context);
    if (!g.ok()) return g.status();
    graph = *g;
  }
  RowPlan plan = graph != nullptr ? PlanRows(batch, bs, config_.sliding_window, graph->shape.rows,
                                             graph->shape.decode_table_stride)
                                  : PlanRows(batch, bs, config_.sliding_window);
  std::vector<int32_t> lm_rows = plan.sample_rows;
  lm_rows.insert(lm_rows.end(), plan.verify_rows.begin(), plan.verify_rows.end());
  if (graph != nullptr) {  // a graph computes the logits of every row, padding included
    lm_rows.resize(graph->shape.rows);
    std::iota(lm_rows.begin(), lm_rows.end(), 0);
  }
  const ForwardShape shape =
      graph != nullptr ? graph->shape : ShapeOf(config_, plan, options_.prefill_query_chunk);
  const SamplingPlan sampling = PlanSampling(batch, plan.sample_seqs, config_.eos_token_ids, vocab);
  const int logit_rows = static_cast<int>(plan.sample_seqs.size());

  // Sizes: the eager pass's region, then sampling's, in step_arena_; the
  // inputs of both staged in host_in_; outputs and logits in host_out_.
  const size_t forward_bytes =
      graph != nullptr ? 0 : Align(LayoutForward(config_, shape, 0).total_bytes);
  const SamplingBuffers sampling_size = LayoutSampling(sampling, 0);
  const size_t forward_inputs = Align(LayoutForward(config_, shape, 0).input_bytes);
  const size_t outputs_bytes = Align(LayoutSamplingOutputs(sampling, 0).bytes);
  const size_t logits_bytes = batch.return_logits ? size_t{sizeof(float)} * logit_rows * vocab : 0;
  const size_t verify_bytes = size_t{sizeof(float)} * plan.verify_rows.size() * vocab;
  if (absl::Status s = Reserve(step_arena_, forward_bytes + sampling_size.total_bytes, "step");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Reserve(host_in_, forward_inputs + sampling_size.input_bytes, "inputs");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Reserve(host_out_, outputs_bytes + logits_bytes + verify_bytes, "outputs");
      !s.ok()) {
    return s;
  }

  // Everything this step reuses from the last one, poisoned under the
  // emulation (reuse_poison.h): what the step does not write reads as NaN.
  // The last step's work is complete (RunStep and Loop synchronise).
  PDSERVE_CUDA_RETURN_IF_ERROR(
      PoisonHostForReuse(host_in_.get(), forward_inputs + sampling_size.input_bytes));
  PDSERVE_CUDA_RETURN_IF_ERROR(PoisonHostForReuse(host_out_.get(), outputs_bytes + logits_bytes));
  PDSERVE_CUDA_RETURN_IF_ERROR(
      PoisonForReuse(step_arena_.get(), forward_bytes + sampling_size.total_bytes, stream));
  if (graph != nullptr) {
    PDSERVE_CUDA_RETURN_IF_ERROR(
        PoisonForReuse(graph_arena_.get(), graph->buffers.total_bytes, stream));
  }
  if constexpr (kPoisonsReuse) {
    if (absl::Status s = PoisonUnwrittenKv(batch, stream); !s.ok()) return s;
  }

  // Inputs: one upload for the pass, one for sampling.
  const uintptr_t arena = reinterpret_cast<uintptr_t>(step_arena_.get());
  const ForwardBuffers buffers =
      graph != nullptr ? graph->buffers : LayoutForward(config_, shape, arena);
  const uintptr_t host_in = reinterpret_cast<uintptr_t>(host_in_.get());
  FillForwardInputs(plan, lm_rows, shape, LayoutForward(config_, shape, host_in));
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffers.tokens, host_in_.get(), buffers.input_bytes,
                                               cudaMemcpyHostToDevice, stream));
  const SamplingBuffers sampling_buffers = LayoutSampling(sampling, arena + forward_bytes);
  const SamplingOutputs outputs =
      LayoutSamplingOutputs(sampling, arena + forward_bytes + sampling_buffers.output_offset);
  if (logit_rows > 0) {
    FillSamplingInputs(sampling, LayoutSampling(sampling, host_in + forward_inputs));
    PDSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(sampling_buffers.params, reinterpret_cast<void*>(host_in + forward_inputs),
                        sampling_buffers.input_bytes, cudaMemcpyHostToDevice, stream));
  }

  // The forward pass, each layer's event recorded once its K/V is written.
  if (graph != nullptr) {
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->exec.get(), stream));
    for (int l = 0; l < config_.num_layers; ++l) {
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(handle.event(l), stream));
      handle.LayerIssued(l);
    }
  } else {
    const AfterKvWrite record = [&handle, stream](int layer) {
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(handle.event(layer), stream));
      handle.LayerIssued(layer);
      return absl::OkStatus();
    };
    if (absl::Status s = EnqueueForward(Model(), shape, plan.prefill, buffers, record); !s.ok()) {
      return s;
    }
  }
  {
    absl::MutexLock lock(&stats_mu_);
    if (graph != nullptr) ++stats_.graph_steps;
    if (graph == nullptr && decode) ++stats_.eager_decode_steps;
  }

  // Sampling, and the small results back to the host.
  if (logit_rows > 0) {
    if (absl::Status s =
            EnqueueSampling(sampling, buffers.logits, sampling_buffers, outputs, stream);
        !s.ok()) {
      return s;
    }
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out_.get(), outputs.tokens, outputs.bytes,
                                                 cudaMemcpyDeviceToHost, stream));
    if (logits_bytes > 0) {
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out_.as<char>(outputs_bytes),
                                                   buffers.logits, logits_bytes,
                                                   cudaMemcpyDeviceToHost, stream));
    }
  }
  if (verify_bytes > 0) {  // the rows after the sampling rows
    PDSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_out_.as<char>(outputs_bytes + logits_bytes),
                        buffers.logits + static_cast<size_t>(logit_rows) * vocab, verify_bytes,
                        cudaMemcpyDeviceToHost, stream));
  }
  for (int l = 0; l < config_.num_layers; ++l) {
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(handle.event(l)));
    handle.LayerDone(l);
  }
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));

  StepOutput out;
  out.sampled.resize(batch.seqs.size());
  if (verify_bytes > 0) {
    const float* rows = host_out_.as<float>(outputs_bytes + logits_bytes);
    out.verify_logits.assign(rows, rows + plan.verify_rows.size() * vocab);
  }
  if (logit_rows == 0) return out;
  ReadSampled(batch, plan.sample_seqs, sampling,
              LayoutSamplingOutputs(sampling, reinterpret_cast<uintptr_t>(host_out_.get())),
              out.sampled);
  if (logits_bytes > 0) {
    const float* logits = host_out_.as<float>(outputs_bytes);
    out.logits.assign(logits, logits + static_cast<size_t>(logit_rows) * vocab);
  }
  return out;
}

// ---- KV export / import ----

size_t CudaModelRunner::LayerKvBytes(int num_tokens) const {
  return num_tokens <= 0 ? 0
                         : size_t{2} * static_cast<size_t>(num_tokens) * config_.kv_size() *
                               sizeof(__nv_bfloat16);
}

namespace {

// Moves one layer of a sequence between the paged cache and host bytes
// (K of every token, then V), io_tokens at a time through device staging.
struct KvIo {
  cudaStream_t stream;
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
  int block_size;
  int kv_size;
  int io_tokens;
  __nv_bfloat16* k_stage;  // [io_tokens, kv_size]
  __nv_bfloat16* v_stage;
  int32_t* table_stage;  // device, io_tokens / block_size entries
  int32_t* table_host;   // pinned, the same
};

absl::Status CopyLayer(const KvIo& io, std::span<const int32_t> table, int num_tokens,
                       std::byte* host, bool to_cache) {
  const size_t token_bytes = static_cast<size_t>(io.kv_size) * sizeof(__nv_bfloat16);
  const size_t half = static_cast<size_t>(num_tokens) * token_bytes;
  const cudaMemcpyKind dir = to_cache ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  for (int t0 = 0; t0 < num_tokens; t0 += io.io_tokens) {
    const int count = std::min(io.io_tokens, num_tokens - t0);
    const int blocks = (count + io.block_size - 1) / io.block_size;
    // The staging is reused chunk after chunk (poisoned under the emulation).
    PDSERVE_CUDA_RETURN_IF_ERROR(
        PoisonForReuse(io.k_stage, static_cast<size_t>(io.io_tokens) * token_bytes, io.stream));
    PDSERVE_CUDA_RETURN_IF_ERROR(
        PoisonForReuse(io.v_stage, static_cast<size_t>(io.io_tokens) * token_bytes, io.stream));
    PDSERVE_CUDA_RETURN_IF_ERROR(PoisonForReuse(
        io.table_stage, static_cast<size_t>(io.io_tokens / io.block_size) * sizeof(int32_t),
        io.stream));
    std::memcpy(io.table_host, table.data() + t0 / io.block_size, blocks * sizeof(int32_t));
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(io.table_stage, io.table_host,
                                                 blocks * sizeof(int32_t), cudaMemcpyHostToDevice,
                                                 io.stream));
    const KvCopyArgs args{.k_cache = io.k_cache,
                          .v_cache = io.v_cache,
                          .block_size = io.block_size,
                          .kv_size = io.kv_size,
                          .block_table = io.table_stage,
                          .first = 0,
                          .count = count,
                          .k = io.k_stage,
                          .v = io.v_stage};
    std::byte* k_host = host + t0 * token_bytes;
    std::byte* v_host = host + half + t0 * token_bytes;
    const size_t bytes = count * token_bytes;
    if (to_cache) {
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(io.k_stage, k_host, bytes, dir, io.stream));
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(io.v_stage, v_host, bytes, dir, io.stream));
      PDSERVE_CUDA_RETURN_IF_ERROR(ScatterKv(args, io.stream));
    } else {
      PDSERVE_CUDA_RETURN_IF_ERROR(GatherKv(args, io.stream));
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(k_host, io.k_stage, bytes, dir, io.stream));
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v_host, io.v_stage, bytes, dir, io.stream));
    }
    // The pinned table slice is refilled next round; `host` is read now.
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(io.stream));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaModelRunner::CopyLayerKv(int layer, std::span<const int32_t> block_table,
                                          int num_tokens, std::byte* host, bool to_cache) const {
  std::lock_guard<std::mutex> lock(io_mu_);
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  const size_t stage_bytes = size_t{sizeof(__nv_bfloat16)} * io_tokens_ * config_.kv_size();
  const KvIo io{io_stream_.get(),
                k_cache_[layer],
                v_cache_[layer],
                options_.kv_block_size,
                config_.kv_size(),
                io_tokens_,
                io_staging_.as<__nv_bfloat16>(),
                io_staging_.as<__nv_bfloat16>(stage_bytes),
                io_staging_.as<int32_t>(Align(2 * stage_bytes)),
                io_table_.as<int32_t>()};
  return CopyLayer(io, block_table, num_tokens, host, to_cache);
}

absl::Status CudaModelRunner::ReadLayerKv(int layer, std::span<const int32_t> block_table,
                                          int num_tokens, std::span<std::byte> out) const {
  if (absl::Status s = engine::CheckLayerKvArgs(
          "ReadLayerKv", config_, layer, block_table, num_tokens, options_.kv_block_size,
          options_.num_kv_blocks, out.size(), LayerKvBytes(num_tokens));
      !s.ok()) {
    return s;
  }
  return CopyLayerKv(layer, block_table, num_tokens, out.data(), /*to_cache=*/false);
}

absl::Status CudaModelRunner::WriteLayerKv(int layer, std::span<const int32_t> block_table,
                                           int num_tokens, std::span<const std::byte> in) {
  if (absl::Status s = engine::CheckLayerKvArgs(
          "WriteLayerKv", config_, layer, block_table, num_tokens, options_.kv_block_size,
          options_.num_kv_blocks, in.size(), LayerKvBytes(num_tokens));
      !s.ok()) {
    return s;
  }
  // CopyLayer only reads `host` when it copies into the cache.
  return CopyLayerKv(layer, block_table, num_tokens, const_cast<std::byte*>(in.data()),
                     /*to_cache=*/true);
}

}  // namespace pdserve::cuda
