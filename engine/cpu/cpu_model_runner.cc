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
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/cpu/kernels.h"

namespace pdserve::engine {
namespace {

// Appends b's rows below a's: [a; b] for row-major matrices of equal width.
std::vector<float> Concat(std::vector<float>& a, std::vector<float>& b) {
  std::vector<float> out;
  out.reserve(a.size() + b.size());
  out.insert(out.end(), a.begin(), a.end());
  out.insert(out.end(), b.begin(), b.end());
  a = {};
  b = {};
  return out;
}

// Decode attention reads each cached K and V row this many positions after
// prefetching it: the rows of one head are a KV row apart, a stride the
// hardware prefetchers do not follow, and the weights streamed every step
// have evicted them from cache.
constexpr int kKvPrefetch = 8;

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

CpuModelRunner::Matrix CpuModelRunner::MakeMatrix(const std::vector<float>& values, int64_t rows,
                                                  int64_t cols) const {
  return Matrix::FromF32(values, rows, cols, weight_dtype_);
}

void CpuModelRunner::MatMul(const float* x, const Matrix& w, float* y, int m,
                            [[maybe_unused]] int n, [[maybe_unused]] int k) const {
  assert(w.rows() == n && w.cols() == k);
  w.MatMul(x, y, m, num_threads_);
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
    const ModelConfig& config, ModelWeights weights, const CpuRunnerOptions& options) {
  if (options.kv_block_size < 1 || options.num_kv_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("CpuModelRunner: kv_block_size (",
                                                   options.kv_block_size, ") and num_kv_blocks (",
                                                   options.num_kv_blocks, ") must be >= 1"));
  }
  const int64_t h = config.hidden_size, q = config.q_size(), kv = config.kv_size();
  const int64_t inter = config.intermediate_size, vocab = config.vocab_size;
  auto wrong = [](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuModelRunner: weights do not match config: ", what));
  };
  if (weights.embed_tokens.size() != static_cast<size_t>(vocab * h)) return wrong("embed_tokens");
  if (weights.final_norm.size() != static_cast<size_t>(h)) return wrong("final_norm");
  if (config.tie_word_embeddings != weights.lm_head.empty() ||
      (!weights.lm_head.empty() && weights.lm_head.size() != static_cast<size_t>(vocab * h))) {
    return wrong("lm_head");
  }
  if (weights.layers.size() != static_cast<size_t>(config.num_layers)) return wrong("layer count");
  for (const LayerWeights& l : weights.layers) {
    if (l.input_norm.size() != static_cast<size_t>(h) ||
        l.post_norm.size() != static_cast<size_t>(h) ||
        l.q_proj.size() != static_cast<size_t>(q * h) ||
        l.k_proj.size() != static_cast<size_t>(kv * h) ||
        l.v_proj.size() != static_cast<size_t>(kv * h) ||
        l.o_proj.size() != static_cast<size_t>(h * q) ||
        l.gate_proj.size() != static_cast<size_t>(inter * h) ||
        l.up_proj.size() != static_cast<size_t>(inter * h) ||
        l.down_proj.size() != static_cast<size_t>(h * inter)) {
      return wrong("layer tensor sizes");
    }
    const size_t qb = config.qkv_bias ? static_cast<size_t>(q) : 0;
    const size_t kvb = config.qkv_bias ? static_cast<size_t>(kv) : 0;
    if (l.q_bias.size() != qb || l.k_bias.size() != kvb || l.v_bias.size() != kvb) {
      return wrong("q/k/v biases");
    }
    if (l.o_bias.size() != (config.o_bias ? static_cast<size_t>(h) : 0)) return wrong("o bias");
    const size_t norm = config.qk_norm ? static_cast<size_t>(config.head_dim) : 0;
    if (l.q_norm.size() != norm || l.k_norm.size() != norm) return wrong("q/k norms");
  }
  const int64_t slots = int64_t{options.num_kv_blocks} * options.kv_block_size;
  if (slots > std::numeric_limits<int32_t>::max() ||
      slots * kv * 4 * 2 * config.num_layers > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuModelRunner: KV cache of ", slots, " token slots is too large"));
  }

  std::unique_ptr<CpuModelRunner> r(new CpuModelRunner(config, options));
  cpu::InitBlasThreading();
  r->fingerprint_ = weights.fingerprint;
  r->embed_ = r->MakeMatrix(weights.embed_tokens, vocab, h);
  weights.embed_tokens = {};
  r->final_norm_ = std::move(weights.final_norm);
  r->inv_freq_ = config.RopeInverseFrequencies();
  if (!weights.lm_head.empty()) r->lm_head_ = r->MakeMatrix(weights.lm_head, vocab, h);
  weights.lm_head = {};
  r->layers_.reserve(weights.layers.size());
  for (LayerWeights& l : weights.layers) {
    Layer layer;
    layer.input_norm = std::move(l.input_norm);
    std::vector<float> qk = Concat(l.q_proj, l.k_proj);
    layer.wqkv = r->MakeMatrix(Concat(qk, l.v_proj), q + 2 * kv, h);
    if (config.qkv_bias) {
      std::vector<float> qk_bias = Concat(l.q_bias, l.k_bias);
      layer.bqkv = Concat(qk_bias, l.v_bias);
    }
    layer.q_norm = std::move(l.q_norm);
    layer.k_norm = std::move(l.k_norm);
    layer.wo = r->MakeMatrix(l.o_proj, h, q);
    l.o_proj = {};
    layer.bo = std::move(l.o_bias);
    layer.post_norm = std::move(l.post_norm);
    layer.wgu = r->MakeMatrix(Concat(l.gate_proj, l.up_proj), 2 * inter, h);
    layer.wdown = r->MakeMatrix(l.down_proj, h, inter);
    l.down_proj = {};
    r->layers_.push_back(std::move(layer));
  }
  try {
    r->k_cache_.assign(config.num_layers, std::vector<float>(static_cast<size_t>(slots * kv)));
    r->v_cache_.assign(config.num_layers, std::vector<float>(static_cast<size_t>(slots * kv)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CpuModelRunner: cannot allocate a KV cache of ", slots, " token slots"));
  }
  return r;
}

// ---- validation and addressing ----

absl::Status CpuModelRunner::CheckBlockTable(std::span<const int32_t> table, int num_tokens,
                                             const char* what, size_t index) const {
  const int64_t needed = (int64_t{num_tokens} + block_size_ - 1) / block_size_;
  if (static_cast<int64_t>(table.size()) < needed) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", index, ": block table of ",
                                                   table.size(), " blocks cannot hold ", num_tokens,
                                                   " tokens"));
  }
  for (int64_t i = 0; i < needed; ++i) {
    if (table[i] < 0 || table[i] >= num_blocks_) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", index, ": block id ", table[i],
                                                     " out of range [0, ", num_blocks_, ")"));
    }
  }
  return absl::OkStatus();
}

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
  const auto grow = [](std::vector<float>& v, int64_t n) {
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
#pragma omp parallel for num_threads(num_threads_) schedule(static) if (m > 16)
  for (int64_t r = 0; r < m; ++r) {
    embed_.RowsToFloat(tokens[r], 1, &scratch_.x[r * h]);
  }
}

void CpuModelRunner::AttentionInput(int layer, int m, std::span<const int32_t> positions) {
  const Layer& w = layers_[layer];
  const int h = config_.hidden_size, hd = config_.head_dim, half = hd / 2;
  const int q = config_.q_size(), kv = config_.kv_size(), stride = q + 2 * kv;
  cpu::RmsNorm(scratch_.x.data(), w.input_norm.data(), scratch_.xn.data(), m, h,
               config_.rms_norm_eps, num_threads_);
  MatMul(scratch_.xn.data(), w.wqkv, scratch_.qkv.data(), m, stride, h);
#pragma omp parallel for num_threads(num_threads_) schedule(static) if (m > 1)
  for (int r = 0; r < m; ++r) {
    float* row = &scratch_.qkv[int64_t{r} * stride];
    if (!w.bqkv.empty()) cpu::AddInPlace(row, w.bqkv.data(), stride, 1);
    if (!w.q_norm.empty()) {
      // Qwen3: RMSNorm over each head's head_dim values, before RoPE.
      cpu::RmsNorm(row, w.q_norm.data(), row, config_.num_heads, hd, config_.rms_norm_eps, 1);
      cpu::RmsNorm(row + q, w.k_norm.data(), row + q, config_.num_kv_heads, hd,
                   config_.rms_norm_eps, 1);
    }
    float* cos = &scratch_.cos[int64_t{r} * half];
    float* sin = &scratch_.sin[int64_t{r} * half];
    cpu::RopeCosSin(positions[r], inv_freq_.data(), half, cos, sin);
    cpu::ApplyRope(row, config_.num_heads, hd, cos, sin);
    cpu::ApplyRope(row + q, config_.num_kv_heads, hd, cos, sin);
  }
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
  const int64_t mh = int64_t{m} * h;
  MatMul(scratch_.attn.data(), w.wo, scratch_.proj.data(), m, h, config_.q_size());
  cpu::AddInPlace(scratch_.x.data(), scratch_.proj.data(), mh, num_threads_);
  if (!w.bo.empty()) cpu::AddBias(scratch_.x.data(), w.bo.data(), m, h, num_threads_);
  cpu::RmsNorm(scratch_.x.data(), w.post_norm.data(), scratch_.xn.data(), m, h,
               config_.rms_norm_eps, num_threads_);
  MatMul(scratch_.xn.data(), w.wgu, scratch_.gu.data(), m, 2 * inter, h);
#pragma omp parallel for num_threads(num_threads_) schedule(static) if (m > 1)
  for (int r = 0; r < m; ++r) {
    const float* gu = &scratch_.gu[int64_t{r} * 2 * inter];
    cpu::SwiGlu(gu, gu + inter, &scratch_.act[int64_t{r} * inter], inter);
  }
  MatMul(scratch_.act.data(), w.wdown, scratch_.proj.data(), m, h, inter);
  cpu::AddInPlace(scratch_.x.data(), scratch_.proj.data(), mh, num_threads_);
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

// ---- Prefill and Decode ----

absl::Status CpuModelRunner::Prefill(std::span<const PrefillSequence> seqs,
                                     const LayerDoneFn& on_layer_done, std::vector<float>& logits) {
  logits.clear();
  if (seqs.empty()) return absl::OkStatus();
  // Rows of the batch: every prompt token, sequences back to back.
  int64_t total = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const PrefillSequence& seq = seqs[s];
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    if (n == 0)
      return absl::InvalidArgumentError(absl::StrCat("prefill sequence ", s, ": empty prompt"));
    if (n > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("prefill sequence ", s, ": ", n,
                                                     " tokens exceed max_position_embeddings ",
                                                     config_.max_position_embeddings));
    }
    for (int32_t t : seq.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prefill sequence ", s, ": token ", t, " out of range [0, ", config_.vocab_size, ")"));
      }
    }
    if (absl::Status st =
            CheckBlockTable(seq.block_table, static_cast<int>(n), "prefill sequence", s);
        !st.ok()) {
      return st;
    }
    total += n;
  }
  if (total > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill batch of ", total, " tokens is too large"));
  }
  const int m = static_cast<int>(total);
  std::vector<int32_t> tokens, positions, row_seq, seq_start;
  tokens.reserve(m);
  positions.reserve(m);
  row_seq.reserve(m);
  std::vector<int> last_rows;
  for (size_t s = 0; s < seqs.size(); ++s) {
    seq_start.push_back(static_cast<int32_t>(tokens.size()));
    for (size_t i = 0; i < seqs[s].tokens.size(); ++i) {
      tokens.push_back(seqs[s].tokens[i]);
      positions.push_back(static_cast<int32_t>(i));
      row_seq.push_back(static_cast<int32_t>(s));
    }
    last_rows.push_back(static_cast<int>(tokens.size()) - 1);
  }

  ResizeScratch(m);
  Embed(tokens);
  const int hd = config_.head_dim, heads = config_.num_heads, group = heads / config_.num_kv_heads;
  const int q = config_.q_size(), kv = config_.kv_size(), stride = q + 2 * kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  int max_len = 0;
  for (const auto& seq : seqs) max_len = std::max(max_len, static_cast<int>(seq.tokens.size()));

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    AttentionInput(layer, m, positions);
#pragma omp parallel for num_threads(num_threads_) schedule(static) if (m > 16)
    for (int r = 0; r < m; ++r) {
      StoreKv(layer, r, SlotOffset(seqs[row_seq[r]].block_table, positions[r]));
    }
    if (on_layer_done) on_layer_done(layer);

#pragma omp parallel num_threads(num_threads_) if (int64_t{m} * heads * max_len * hd > (1 << 16))
    {
      // Causal attention of each (row, head) over its own sequence's rows.
      std::vector<float> scores(static_cast<size_t>(max_len));
#pragma omp for schedule(dynamic, 8)
      for (int64_t item = 0; item < int64_t{m} * heads; ++item) {
        const int r = static_cast<int>(item / heads), head = static_cast<int>(item % heads);
        // Keys first..positions[r] of the row's own sequence.
        const int start = seq_start[row_seq[r]], first = FirstVisible(positions[r]);
        const int len = positions[r] + 1 - first;
        const float* qv = &scratch_.qkv[int64_t{r} * stride + int64_t{head} * hd];
        const int64_t k_col = q + int64_t{head / group} * hd, v_col = k_col + kv;
        const float* k0 = &scratch_.qkv[int64_t{start + first} * stride + k_col];
        const float* v0 = &scratch_.qkv[int64_t{start + first} * stride + v_col];
        for (int j = 0; j < len; ++j) {
          scores[j] = cpu::Dot(qv, k0 + int64_t{j} * stride, hd) * scale;
        }
        cpu::Softmax(scores.data(), len);
        float* out = &scratch_.attn[int64_t{r} * q + int64_t{head} * hd];
        std::fill(out, out + hd, 0.0f);
        for (int j = 0; j < len; ++j) cpu::Axpy(scores[j], v0 + int64_t{j} * stride, out, hd);
      }
    }
    AttentionOutputAndMlp(layer, m);
  }
  LmHead(last_rows, logits);
  return absl::OkStatus();
}

absl::Status CpuModelRunner::Decode(std::span<const DecodeSequence> seqs,
                                    std::vector<float>& logits) {
  logits.clear();
  if (seqs.empty()) return absl::OkStatus();
  if (seqs.size() > (size_t{1} << 20)) return absl::InvalidArgumentError("decode batch too large");
  const int m = static_cast<int>(seqs.size());
  std::vector<int32_t> tokens(m), positions(m);
  for (int b = 0; b < m; ++b) {
    const DecodeSequence& seq = seqs[b];
    if (seq.token < 0 || seq.token >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("decode sequence ", b, ": token ", seq.token,
                                                     " out of range [0, ", config_.vocab_size,
                                                     ")"));
    }
    if (seq.position < 0 || seq.position >= config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("decode sequence ", b, ": position ",
                                                     seq.position, " out of range [0, ",
                                                     config_.max_position_embeddings, ")"));
    }
    if (absl::Status st = CheckBlockTable(seq.block_table, seq.position + 1, "decode sequence", b);
        !st.ok()) {
      return st;
    }
    tokens[b] = seq.token;
    positions[b] = seq.position;
  }

  ResizeScratch(m);
  Embed(tokens);
  const int hd = config_.head_dim, heads = config_.num_heads, group = heads / config_.num_kv_heads;
  const int q = config_.q_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int max_len = *std::max_element(positions.begin(), positions.end()) + 1;

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    AttentionInput(layer, m, positions);
    for (int b = 0; b < m; ++b) StoreKv(layer, b, SlotOffset(seqs[b].block_table, positions[b]));
    const float* k_cache = k_cache_[layer].data();
    const float* v_cache = v_cache_[layer].data();

    // Each (sequence, head) attends over cache slots FirstVisible..position.
#pragma omp parallel num_threads(num_threads_) if (int64_t{m} * heads * max_len * hd > (1 << 16))
    {
      std::vector<float> scores(static_cast<size_t>(max_len));
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < int64_t{m} * heads; ++item) {
        const int b = static_cast<int>(item / heads), head = static_cast<int>(item % heads);
        const std::span<const int32_t> table = seqs[b].block_table;
        const int first = FirstVisible(positions[b]), len = positions[b] + 1 - first;
        const int64_t kv_col = int64_t{head / group} * hd;
        const float* qv =
            &scratch_.qkv[int64_t{b} * (q + 2 * config_.kv_size()) + int64_t{head} * hd];
        for (int j = 0; j < len; ++j) {
          if (j + kKvPrefetch < len) {
            cpu::Prefetch(k_cache + SlotOffset(table, first + j + kKvPrefetch) + kv_col, hd);
          }
          scores[j] = cpu::Dot(qv, k_cache + SlotOffset(table, first + j) + kv_col, hd) * scale;
        }
        cpu::Softmax(scores.data(), len);
        float* out = &scratch_.attn[int64_t{b} * q + int64_t{head} * hd];
        std::fill(out, out + hd, 0.0f);
        for (int j = 0; j < len; ++j) {
          if (j + kKvPrefetch < len) {
            cpu::Prefetch(v_cache + SlotOffset(table, first + j + kKvPrefetch) + kv_col, hd);
          }
          cpu::Axpy(scores[j], v_cache + SlotOffset(table, first + j) + kv_col, out, hd);
        }
      }
    }
    AttentionOutputAndMlp(layer, m);
  }
  std::vector<int> rows(m);
  for (int b = 0; b < m; ++b) rows[b] = b;
  LmHead(rows, logits);
  return absl::OkStatus();
}

// ---- KV export / import ----

size_t CpuModelRunner::LayerKvBytes(int num_tokens) const {
  return num_tokens <= 0
             ? 0
             : size_t{2} * static_cast<size_t>(num_tokens) * config_.kv_size() * sizeof(float);
}

absl::Status CpuModelRunner::ReadLayerKv(int layer, std::span<const int32_t> block_table,
                                         int num_tokens, std::span<std::byte> out) const {
  if (layer < 0 || layer >= config_.num_layers || num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadLayerKv: bad layer ", layer, " or token count ", num_tokens));
  }
  if (absl::Status s = CheckBlockTable(block_table, num_tokens, "ReadLayerKv table", 0); !s.ok())
    return s;
  if (out.size() != LayerKvBytes(num_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("ReadLayerKv: buffer of ", out.size(),
                                                   " bytes, need ", LayerKvBytes(num_tokens)));
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
  if (layer < 0 || layer >= config_.num_layers || num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteLayerKv: bad layer ", layer, " or token count ", num_tokens));
  }
  if (absl::Status s = CheckBlockTable(block_table, num_tokens, "WriteLayerKv table", 0); !s.ok())
    return s;
  if (in.size() != LayerKvBytes(num_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("WriteLayerKv: buffer of ", in.size(),
                                                   " bytes, need ", LayerKvBytes(num_tokens)));
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
