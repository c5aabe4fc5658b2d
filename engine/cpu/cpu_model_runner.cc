// CpuModelRunner: see cpu_model_runner.h for the forward pass and layouts.
#include "engine/cpu/cpu_model_runner.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_gemv.h"
#include "engine/runtime/step_state.h"

namespace pdserve::engine {
namespace {

std::vector<float> ToF32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements));
  t.ToF32(out);
  return out;
}

}  // namespace

CpuModelRunner::CpuModelRunner(const ModelConfig& config, const CpuRunnerOptions& options)
    : config_(config),
      block_size_(options.kv_block_size),
      block_shift_(std::has_single_bit(static_cast<unsigned>(options.kv_block_size))
                       ? std::countr_zero(static_cast<unsigned>(options.kv_block_size))
                       : -1),
      num_blocks_(options.num_kv_blocks),
      num_threads_(options.num_threads > 0 ? options.num_threads : omp_get_num_procs()),
      weight_dtype_(options.weight_dtype) {}

absl::StatusOr<CpuModelRunner::Matrix> CpuModelRunner::MakeMatrix(
    std::initializer_list<const TensorView*> parts) const {
  const int64_t cols = (*parts.begin())->shape[1];
  int64_t rows = 0;
  bool same_dtype = true;
  for (const TensorView* t : parts) {
    rows += t->shape[0];
    same_dtype = same_dtype && t->dtype == (*parts.begin())->dtype;
  }
  if (parts.size() == 1) {
    const TensorView* t = *parts.begin();
    return Matrix::FromRaw(t->dtype, t->bytes, rows, cols, weight_dtype_);
  }
  if (same_dtype) {
    // One matrix of the stored bytes, rows of the parts one after another.
    std::vector<std::byte> joined;
    for (const TensorView* t : parts) joined.insert(joined.end(), t->bytes.begin(), t->bytes.end());
    return Matrix::FromRaw((*parts.begin())->dtype, joined, rows, cols, weight_dtype_);
  }
  std::vector<float> joined(static_cast<size_t>(rows * cols));
  int64_t at = 0;
  for (const TensorView* t : parts) {
    t->ToF32(std::span<float>(joined).subspan(static_cast<size_t>(at), t->num_elements));
    at += t->num_elements;
  }
  return Matrix::FromF32(joined, rows, cols, weight_dtype_);
}

void CpuModelRunner::MatMul(const float* x, const Matrix& w, float* y, int m,
                            [[maybe_unused]] int n, [[maybe_unused]] int k) const {
  assert(w.rows() == n && w.cols() == k);
  w.MatMul(x, y, m, num_threads_, pool_.get());
}

void CpuModelRunner::ForRows(int64_t m, int64_t min_rows,
                             absl::FunctionRef<void(int64_t)> fn) const {
  if (m > min_rows && pool_->num_threads() > 1) return pool_->ParallelFor(m, fn);
  for (int64_t r = 0; r < m; ++r) fn(r);
}

double CpuModelRunner::VerificationRowCost() const {
  switch (cpu::BestIsa()) {
    case cpu::Isa::kAvx512:
      return 0.2;
    case cpu::Isa::kAvx2:
      return 0.6;
    case cpu::Isa::kPortable:
      return 1.0;
  }
  return 1.0;
}

int64_t CpuModelRunner::DecodeWeightBytes() const {
  // Of the input embedding a step reads one row per sequence: counted as
  // none, unless it is also the LM head.
  int64_t bytes = !lm_head_.empty() ? lm_head_.bytes() : embed_.bytes();
  for (const Layer& l : layers_) {
    bytes += l.wqkv.bytes() + l.wo.bytes() + l.wgu.bytes() + l.wdown.bytes();
    bytes += static_cast<int64_t>((l.input_norm.size() + l.post_norm.size() + l.bqkv.size() +
                                   l.bo.size() + l.q_norm.size() + l.k_norm.size()) *
                                  sizeof(float));
  }
  return bytes + static_cast<int64_t>(final_norm_.size() * sizeof(float));
}

absl::StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::Create(
    const WeightSource& weights, const CpuRunnerOptions& options) {
  const ModelConfig& config = weights.config();
  if (options.kv_block_size < 1 || options.num_kv_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("CpuModelRunner: kv_block_size (",
                                                   options.kv_block_size, ") and num_kv_blocks (",
                                                   options.num_kv_blocks, ") must be >= 1"));
  }
  const int64_t kv = config.kv_size();
  const int64_t slots = int64_t{options.num_kv_blocks} * options.kv_block_size;
  if (slots > std::numeric_limits<int32_t>::max() ||
      slots * kv * 4 * 2 * config.num_layers > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuModelRunner: KV cache of ", slots, " token slots is too large"));
  }

  std::unique_ptr<CpuModelRunner> r(new CpuModelRunner(config, options));
  cpu::InitBlasThreading();
  // Storage that changes the checkpoint's numbers (int8, or bf16 from another
  // dtype) computes different KV: it must not pair with a lossless runner.
  bool lossy = options.weight_dtype == WeightDtype::kInt8 ||
               options.weight_dtype == WeightDtype::kW8A8 ||
               options.weight_dtype == WeightDtype::kInt4;
  // WeightSource validated every tensor the config needs, so these exist.
  auto t = [&weights](const std::string& name) { return weights.Find(name); };
  auto matrix = [&](std::initializer_list<const TensorView*> parts, Matrix& out) -> absl::Status {
    for (const TensorView* p : parts) {
      lossy = lossy || (options.weight_dtype == WeightDtype::kBf16 && p->dtype != StDtype::kBF16);
    }
    absl::StatusOr<Matrix> m = r->MakeMatrix(parts);
    if (!m.ok()) return m.status();
    out = *std::move(m);
    return absl::OkStatus();
  };
  if (absl::Status s = matrix({t("model.embed_tokens.weight")}, r->embed_); !s.ok()) return s;
  r->final_norm_ = ToF32(*t("model.norm.weight"));
  r->inv_freq_ = config.RopeInverseFrequencies();
  if (!config.tie_word_embeddings) {
    if (absl::Status s = matrix({t("lm_head.weight")}, r->lm_head_); !s.ok()) return s;
  }
  r->layers_.resize(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    Layer& layer = r->layers_[i];
    auto l = [&weights, i](const char* suffix) { return weights.Layer(i, suffix); };
    layer.input_norm = ToF32(*l("input_layernorm.weight"));
    layer.post_norm = ToF32(*l("post_attention_layernorm.weight"));
    for (absl::Status s : {matrix({l("self_attn.q_proj.weight"), l("self_attn.k_proj.weight"),
                                   l("self_attn.v_proj.weight")},
                                  layer.wqkv),
                           matrix({l("self_attn.o_proj.weight")}, layer.wo),
                           matrix({l("mlp.gate_proj.weight"), l("mlp.up_proj.weight")}, layer.wgu),
                           matrix({l("mlp.down_proj.weight")}, layer.wdown)}) {
      if (!s.ok()) return s;
    }
    if (config.qkv_bias) {
      for (const char* name :
           {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) {
        const std::vector<float> b = ToF32(*l(name));
        layer.bqkv.insert(layer.bqkv.end(), b.begin(), b.end());
      }
    }
    if (config.o_bias) layer.bo = ToF32(*l("self_attn.o_proj.bias"));
    if (config.qk_norm) {
      layer.q_norm = ToF32(*l("self_attn.q_norm.weight"));
      layer.k_norm = ToF32(*l("self_attn.k_norm.weight"));
    }
  }
  r->fingerprint_ =
      lossy ? MixFingerprint(weights.fingerprint(), WeightDtypeName(options.weight_dtype))
            : weights.fingerprint();
  try {
    r->k_cache_.assign(config.num_layers,
                       cpu::AlignedVector<float>(static_cast<size_t>(slots * kv)));
    r->v_cache_.assign(config.num_layers,
                       cpu::AlignedVector<float>(static_cast<size_t>(slots * kv)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CpuModelRunner: cannot allocate a KV cache of ", slots, " token slots"));
  }
  r->RegisterKvRegions();
  r->pool_ = std::make_unique<cpu::WorkPool>(r->num_threads_);
  CpuModelRunner* raw = r.get();
  r->thread_ = std::thread([raw] { raw->Loop(); });
  return r;
}

// ---- validation and addressing ----

int64_t CpuModelRunner::SlotOffset(std::span<const int32_t> table, int t) const {
  // Decode attention asks this for every cached position: shifts, not
  // divisions, for the usual power-of-two block sizes.
  const int64_t slot =
      block_shift_ >= 0
          ? (int64_t{table[t >> block_shift_]} << block_shift_) | (t & (block_size_ - 1))
          : int64_t{table[t / block_size_]} * block_size_ + t % block_size_;
  return slot * config_.kv_size();
}

// ---- forward building blocks ----

void CpuModelRunner::ResizeScratch(int m) {
  const auto grow = [](cpu::AlignedVector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  };
  const int64_t h = config_.hidden_size;
  grow(scratch_.x, m * h);
  grow(scratch_.xn, m * h);
  grow(scratch_.proj, m * h);
  grow(scratch_.qkv, m * int64_t{config_.q_size() + 2 * config_.kv_size()});
  grow(scratch_.attn, m * int64_t{config_.q_size()});
  grow(scratch_.gu, m * 2 * int64_t{config_.intermediate_size});
  grow(scratch_.act, m * int64_t{config_.intermediate_size});
  grow(scratch_.cos, m * int64_t{config_.head_dim / 2});
  grow(scratch_.sin, m * int64_t{config_.head_dim / 2});
}

void CpuModelRunner::Embed(std::span<const int32_t> tokens) {
  const int64_t h = config_.hidden_size;
  const int64_t m = static_cast<int64_t>(tokens.size());
  ForRows(m, 16, [&](int64_t r) { embed_.RowsToFloat(tokens[r], 1, &scratch_.x[r * h]); });
}

void CpuModelRunner::AttentionInput(int layer, int m) {
  const Layer& w = layers_[layer];
  const int h = config_.hidden_size, hd = config_.head_dim, half = hd / 2;
  const int q = config_.q_size(), kv = config_.kv_size(), stride = q + 2 * kv;
  ForRows(m, 1, [&](int64_t r) {
    cpu::RmsNorm(&scratch_.x[r * h], w.input_norm.data(), &scratch_.xn[r * h], 1, h,
                 config_.rms_norm_eps, 1);
  });
  MatMul(scratch_.xn.data(), w.wqkv, scratch_.qkv.data(), m, stride, h);
  ForRows(m, 1, [&](int64_t r) {
    float* row = &scratch_.qkv[r * stride];
    if (!w.bqkv.empty()) cpu::AddInPlace(row, w.bqkv.data(), stride, 1);
    if (!w.q_norm.empty()) {
      // Qwen3: RMSNorm over each head's head_dim values, before RoPE.
      cpu::RmsNorm(row, w.q_norm.data(), row, config_.num_heads, hd, config_.rms_norm_eps, 1);
      cpu::RmsNorm(row + q, w.k_norm.data(), row + q, config_.num_kv_heads, hd,
                   config_.rms_norm_eps, 1);
    }
    const float* cos = &scratch_.cos[r * half];
    const float* sin = &scratch_.sin[r * half];
    cpu::ApplyRope(row, config_.num_heads, hd, cos, sin);
    cpu::ApplyRope(row + q, config_.num_kv_heads, hd, cos, sin);
  });
}

void CpuModelRunner::StoreKv(int layer, int row, int64_t slot_offset) {
  const int q = config_.q_size(), kv = config_.kv_size();
  const float* src = &scratch_.qkv[int64_t{row} * (q + 2 * kv)];
  std::memcpy(&k_cache_[layer][slot_offset], src + q, kv * sizeof(float));
  std::memcpy(&v_cache_[layer][slot_offset], src + q + kv, kv * sizeof(float));
}

void CpuModelRunner::AttentionOutputAndMlp(int layer, int m) {
  const Layer& w = layers_[layer];
  const int h = config_.hidden_size, inter = config_.intermediate_size;
  MatMul(scratch_.attn.data(), w.wo, scratch_.proj.data(), m, h, config_.q_size());
  ForRows(m, 1, [&](int64_t r) {
    float* x = &scratch_.x[r * h];
    cpu::AddInPlace(x, &scratch_.proj[r * h], h, 1);
    if (!w.bo.empty()) cpu::AddBias(x, w.bo.data(), 1, h, 1);
    cpu::RmsNorm(x, w.post_norm.data(), &scratch_.xn[r * h], 1, h, config_.rms_norm_eps, 1);
  });
  MatMul(scratch_.xn.data(), w.wgu, scratch_.gu.data(), m, 2 * inter, h);
  ForRows(m, 1, [&](int64_t r) {
    const float* gu = &scratch_.gu[r * 2 * inter];
    cpu::SwiGlu(gu, gu + inter, &scratch_.act[r * inter], inter);
  });
  MatMul(scratch_.act.data(), w.wdown, scratch_.proj.data(), m, h, inter);
  ForRows(m, 1,
          [&](int64_t r) { cpu::AddInPlace(&scratch_.x[r * h], &scratch_.proj[r * h], h, 1); });
}

void CpuModelRunner::LmHead(std::span<const int> rows, std::vector<float>& logits) {
  const int h = config_.hidden_size, vocab = config_.vocab_size;
  const int b = static_cast<int>(rows.size());
  for (int i = 0; i < b; ++i) {
    cpu::RmsNorm(&scratch_.x[int64_t{rows[i]} * h], final_norm_.data(),
                 &scratch_.xn[int64_t{i} * h], 1, h, config_.rms_norm_eps, 1);
  }
  logits.resize(static_cast<size_t>(b) * vocab);
  const Matrix& head = !lm_head_.empty() ? lm_head_ : embed_;
  MatMul(scratch_.xn.data(), head, logits.data(), b, vocab, h);
}

// ---- steps ----

// Shared by the runner thread (which completes it) and the caller (which
// waits on it).
class CpuModelRunner::Handle final : public StepState {
 public:
  using StepState::StepState;
};

CpuModelRunner::~CpuModelRunner() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void CpuModelRunner::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      // Not while a Step runs on its caller's thread.
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !busy_ && (stop_ || !jobs_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // stop_ and nothing left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    absl::StatusOr<StepOutput> out = Forward(job.batch, *job.handle);
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
    job.handle->Complete(std::move(out));
  }
}

absl::StatusOr<StepOutput> CpuModelRunner::Step(StepBatch batch) {
  if (absl::Status s = Validate(batch); !s.ok()) return s;
  if (batch.seqs.empty()) return StepOutput{};
  {
    absl::ReleasableMutexLock lock(&mu_);
    if (busy_ || !jobs_.empty() || stop_) {
      lock.Release();
      return ModelRunner::Step(std::move(batch));
    }
    busy_ = true;
  }
  Handle handle(config_.num_layers);
  absl::StatusOr<StepOutput> out = Forward(batch, handle);
  absl::MutexLock lock(&mu_);
  busy_ = false;
  return out;
}

absl::Status CpuModelRunner::Validate(const StepBatch& batch) const {
  return ValidateStepBatch(batch, config_, block_size_, num_blocks_);
}

absl::StatusOr<std::unique_ptr<StepHandle>> CpuModelRunner::Enqueue(StepBatch batch) {
  if (absl::Status s = Validate(batch); !s.ok()) return s;
  auto handle = std::make_shared<Handle>(config_.num_layers);
  if (batch.seqs.empty()) {
    handle->Complete(StepOutput{});
  } else {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("CpuModelRunner is shutting down");
    jobs_.push_back(Job{std::move(batch), handle});
  }
  return CallerHandle(std::move(handle));
}

void CpuModelRunner::Attention(int layer, const StepBatch& batch, int m,
                               std::span<const int32_t> row_seq,
                               std::span<const int32_t> positions) {
  const int hd = config_.head_dim, heads = config_.num_heads, kv_heads = config_.num_kv_heads;
  const int group = heads / kv_heads;
  const int q = config_.q_size(), kv = config_.kv_size(), stride = q + 2 * kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* k_cache = k_cache_[layer].data();
  const float* v_cache = v_cache_[layer].data();
  int max_len = 0;
  for (int r = 0; r < m; ++r) max_len = std::max(max_len, positions[r] + 1);
  const bool parallel = int64_t{m} * heads * max_len * hd > (1 << 16);
  const int threads = parallel ? num_threads_ : 1;
  // Work items: a row and a range of its KV heads with their query heads.
  // Each cached token's K (V) row holds every KV head back to back, so an
  // item of all KV heads reads the cache in address order; rows are split
  // by KV head only when there are fewer rows than threads.
  const int kv_per_item = m >= threads ? kv_heads : 1;
  const int items_per_row = kv_heads / kv_per_item;
  const auto run_item = [&](int64_t item) {
    // Scores of the item's query heads; each thread keeps its buffer.
    thread_local std::vector<float> scores;
    if (scores.size() < static_cast<size_t>(kv_per_item) * group * max_len) {
      scores.resize(static_cast<size_t>(kv_per_item) * group * max_len);
    }
    const int r = static_cast<int>(item / items_per_row);
    const int kv0 = static_cast<int>(item % items_per_row) * kv_per_item;
    const std::span<const int32_t> table = batch.seqs[row_seq[r]].block_table;
    // Keys first..positions[r], read block by block through the table;
    // scores[(h - first head) * len + t - first] for the item's heads.
    const int first = FirstVisible(positions[r]), last = positions[r];
    const int len = last + 1 - first;
    const int64_t col = int64_t{kv0} * hd;
    const int cols = kv_per_item * hd;
    const float* qv = &scratch_.qkv[int64_t{r} * stride + int64_t{kv0} * group * hd];
    // fn(t, count, rows) for the runs of tokens [t, t + count) in [first,
    // last] that share a block, `rows` the first one's cached K (or V) from
    // the item's first KV head (one token every kv floats), in order. An
    // item of some KV heads first prefetches the next run's rows: they are a
    // KV row apart, a stride the hardware prefetchers do not follow, and the
    // weights streamed every step have evicted them from cache. An item of
    // all KV heads reads each block as one ascending run, which the
    // prefetchers do follow; prefetching it anyway stalled on the line fill
    // buffers (5% of a demo-model verification step in perf).
    const auto for_each_run = [&](const float* cache, const auto& fn) {
      for (int t = first; t <= last;) {
        const int count = std::min(block_size_ - t % block_size_, last + 1 - t);
        if (cols < kv && t + count <= last) {
          const float* next = cache + SlotOffset(table, t + count) + col;
          const int next_count = std::min(block_size_, last + 1 - t - count);
          for (int j = 0; j < next_count; ++j) cpu::Prefetch(next + int64_t{j} * kv, cols);
        }
        fn(t, count, cache + SlotOffset(table, t) + col);
        t += count;
      }
    };
    for_each_run(k_cache, [&](int t, int count, const float* k) {
      for (int h = 0; h < kv_per_item; ++h) {
        cpu::DotsOfKeys(qv + int64_t{h} * group * hd, group, k + int64_t{h} * hd, kv, count, hd,
                        scale, &scores[int64_t{h} * group * len + t - first], len);
      }
    });
    for (int h = 0; h < kv_per_item * group; ++h) cpu::Softmax(&scores[int64_t{h} * len], len);
    float* out = &scratch_.attn[int64_t{r} * q + int64_t{kv0} * group * hd];
    std::fill(out, out + int64_t{kv_per_item} * group * hd, 0.0f);
    for_each_run(v_cache, [&](int t, int count, const float* v) {
      for (int h = 0; h < kv_per_item; ++h) {
        cpu::AxpysOfValues(&scores[int64_t{h} * group * len + t - first], len, v + int64_t{h} * hd,
                           kv, count, hd, out + int64_t{h} * group * hd, group);
      }
    });
  };
  const int64_t items = int64_t{m} * items_per_row;
  if (parallel) {
    pool_->ParallelFor(items, run_item);
  } else {
    for (int64_t item = 0; item < items; ++item) run_item(item);
  }
}

absl::StatusOr<StepOutput> CpuModelRunner::Forward(const StepBatch& batch, Handle& handle) {
  // Rows of the step: each sequence's new tokens, sequences back to back.
  std::vector<int32_t>& tokens = scratch_.tokens;
  std::vector<int32_t>& positions = scratch_.positions;
  std::vector<int32_t>& row_seq = scratch_.row_seq;
  std::vector<int>& sample_rows = scratch_.sample_rows;  // last row of each sampling sequence
  tokens.clear();
  positions.clear();
  row_seq.clear();
  sample_rows.clear();
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const StepSequence& seq = batch.seqs[s];
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      tokens.push_back(seq.tokens[i]);
      positions.push_back(seq.num_cached + static_cast<int32_t>(i));
      row_seq.push_back(static_cast<int32_t>(s));
    }
    if (seq.sampling != nullptr) sample_rows.push_back(static_cast<int>(tokens.size()) - 1);
  }
  // Verification rows follow the sampling rows in the LM head's output.
  const size_t num_sample_rows = sample_rows.size();
  for (size_t s = 0, first = 0; s < batch.seqs.size(); first += batch.seqs[s].tokens.size(), ++s) {
    const StepSequence& seq = batch.seqs[s];
    const size_t end = first + seq.tokens.size();
    for (size_t r = end - seq.num_verify_rows; r < end; ++r)
      sample_rows.push_back(static_cast<int>(r));
  }
  const int m = static_cast<int>(tokens.size());
  ResizeScratch(m);
  Embed(tokens);
  // RoPE tables of every row's position, for all layers.
  const int half = config_.head_dim / 2;
  ForRows(m, 16, [&](int64_t r) {
    cpu::RopeCosSin(positions[r], inv_freq_.data(), half, &scratch_.cos[r * half],
                    &scratch_.sin[r * half]);
  });
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    AttentionInput(layer, m);
    ForRows(m, 16, [&](int64_t r) {
      StoreKv(layer, static_cast<int>(r),
              SlotOffset(batch.seqs[row_seq[r]].block_table, positions[r]));
    });
    handle.LayerDone(layer);
    Attention(layer, batch, m, row_seq, positions);
    AttentionOutputAndMlp(layer, m);
  }

  StepOutput out;
  out.sampled.resize(batch.seqs.size());
  if (sample_rows.empty()) return out;
  LmHead(sample_rows, logits_);
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  if (sample_rows.size() > num_sample_rows) {
    out.verify_logits.assign(logits_.begin() + static_cast<int64_t>(num_sample_rows * vocab),
                             logits_.end());
    logits_.resize(num_sample_rows * vocab);
  }
  size_t row = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const StepSequence& seq = batch.seqs[s];
    if (seq.sampling == nullptr) continue;
    out.sampled[s] = Sample(std::span<const float>(logits_).subspan(row * vocab, vocab),
                            *seq.sampling, seq.history, config_.eos_token_ids, scratch_.sample);
    ++row;
  }
  if (batch.return_logits) out.logits = logits_;
  return out;
}

void CpuModelRunner::RegisterKvRegions() {
  const int64_t block_floats = int64_t{block_size_} * config_.kv_size();
  regions_.clear();
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    regions_.push_back(
        KvRegion{.layer = layer,
                 .memory = MemoryKind::kHost,
                 .device = 0,
                 .k_base = reinterpret_cast<std::byte*>(k_cache_[layer].data()),
                 .v_base = reinterpret_cast<std::byte*>(v_cache_[layer].data()),
                 .block_stride_bytes = block_floats * static_cast<int64_t>(sizeof(float)),
                 .num_blocks = num_blocks_,
                 .block_size = block_size_,
                 .num_kv_heads = config_.num_kv_heads,
                 .head_dim = config_.head_dim,
                 .dtype = KvDtype::kF32});
  }
}

// ---- KV export / import ----

size_t CpuModelRunner::LayerKvBytes(int num_tokens) const {
  return num_tokens <= 0
             ? 0
             : size_t{2} * static_cast<size_t>(num_tokens) * config_.kv_size() * sizeof(float);
}

absl::Status CpuModelRunner::ReadLayerKv(int layer, std::span<const int32_t> block_table,
                                         int num_tokens, std::span<std::byte> out) const {
  if (absl::Status s =
          CheckLayerKvArgs("ReadLayerKv", config_, layer, block_table, num_tokens, block_size_,
                           num_blocks_, out.size(), LayerKvBytes(num_tokens));
      !s.ok()) {
    return s;
  }
  const int64_t kv = config_.kv_size();
  auto* dst = reinterpret_cast<unsigned char*>(out.data());
  const size_t half = LayerKvBytes(num_tokens) / 2;
  // Tokens of one block are contiguous in the cache: copy a block at a time.
  for (int t = 0; t < num_tokens; t += block_size_) {
    const int count = std::min(block_size_, num_tokens - t);
    const int64_t src = SlotOffset(block_table, t);
    const size_t bytes = static_cast<size_t>(count * kv) * sizeof(float);
    const size_t at = static_cast<size_t>(int64_t{t} * kv) * sizeof(float);
    std::memcpy(dst + at, &k_cache_[layer][src], bytes);
    std::memcpy(dst + half + at, &v_cache_[layer][src], bytes);
  }
  return absl::OkStatus();
}

absl::Status CpuModelRunner::WriteLayerKv(int layer, std::span<const int32_t> block_table,
                                          int num_tokens, std::span<const std::byte> in) {
  if (absl::Status s =
          CheckLayerKvArgs("WriteLayerKv", config_, layer, block_table, num_tokens, block_size_,
                           num_blocks_, in.size(), LayerKvBytes(num_tokens));
      !s.ok()) {
    return s;
  }
  const int64_t kv = config_.kv_size();
  const auto* src = reinterpret_cast<const unsigned char*>(in.data());
  const size_t half = LayerKvBytes(num_tokens) / 2;
  for (int t = 0; t < num_tokens; t += block_size_) {
    const int count = std::min(block_size_, num_tokens - t);
    const int64_t dst = SlotOffset(block_table, t);
    const size_t bytes = static_cast<size_t>(count * kv) * sizeof(float);
    const size_t at = static_cast<size_t>(int64_t{t} * kv) * sizeof(float);
    std::memcpy(&k_cache_[layer][dst], src + at, bytes);
    std::memcpy(&v_cache_[layer][dst], src + half + at, bytes);
  }
  return absl::OkStatus();
}

}  // namespace pdserve::engine
