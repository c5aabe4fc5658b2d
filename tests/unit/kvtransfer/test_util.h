// Helpers for the kv transport tests: host KV regions with a block
// allocator (so block ids, block sizes and their order differ between the
// sides, and leaks show), a sink that records what it is given, a `done`
// callback that can be waited on, and random layer payloads. Every wait is
// bounded (kWait, generous: a busy machine is slow, not broken) so a broken
// transport fails a test instead of hanging it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/runtime/model_runner.h"
#include "kvtransfer/kv_blocks.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer::testing {

inline constexpr absl::Duration kWait = absl::Minutes(1);

inline TransferSpec SmallSpec(int num_layers = 4, int num_tokens = 8) {
  TransferSpec spec;
  spec.model_fingerprint = 0x1234abcd5678ef00ULL;
  spec.dtype = "f32";
  spec.num_layers = num_layers;
  spec.num_kv_heads = 2;
  spec.head_dim = 8;
  spec.num_tokens = num_tokens;
  spec.bytes_per_element = 4;
  return spec;
}

// One random payload per layer, in the wire layout (K rows then V rows).
inline std::vector<std::vector<std::byte>> RandomLayers(const TransferSpec& spec, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<std::byte>> layers(spec.num_layers);
  for (auto& layer : layers) {
    layer.resize(spec.LayerBytes());
    for (auto& b : layer) b = static_cast<std::byte>(rng());
  }
  return layers;
}

inline engine::KvDtype DtypeOf(const TransferSpec& spec) {
  if (spec.dtype == "bf16") return engine::KvDtype::kBF16;
  if (spec.dtype == "f16") return engine::KvDtype::kF16;
  return engine::KvDtype::kF32;
}

// Hands out block ids in a shuffled order and counts those in use (a leak
// shows as a count above zero). Thread-safe.
class BlockAllocator {
 public:
  BlockAllocator(int num_blocks, int block_size, uint32_t seed) : block_size_(block_size) {
    for (int b = 0; b < num_blocks; ++b) free_.push_back(b);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(seed));
  }
  int block_size() const { return block_size_; }
  // Blocks for `num_tokens` tokens, or an empty table when they run out.
  std::vector<int32_t> Allocate(int num_tokens) {
    const int n = (num_tokens + block_size_ - 1) / block_size_;
    absl::MutexLock l(&mu_);
    if (static_cast<int>(free_.size()) < n) return {};
    std::vector<int32_t> table(free_.end() - n, free_.end());
    free_.resize(free_.size() - n);
    in_use_ += n;
    return table;
  }
  void Free(const std::vector<int32_t>& table) {
    absl::MutexLock l(&mu_);
    free_.insert(free_.end(), table.begin(), table.end());
    in_use_ -= static_cast<int>(table.size());
  }
  int blocks_in_use() {
    absl::MutexLock l(&mu_);
    return in_use_;
  }

 private:
  const int block_size_;
  absl::Mutex mu_;
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

// KV regions in host memory shaped for `spec` (num_layers layers of
// num_blocks blocks of block_size tokens), filled with 0xee.
class HostKv : public BlockAllocator {
 public:
  HostKv(const TransferSpec& spec, int num_blocks, int block_size, uint32_t seed = 1)
      : BlockAllocator(num_blocks, block_size, seed),
        token_bytes_(static_cast<int64_t>(spec.TokenBytes())) {
    const int64_t stride = token_bytes_ * block_size;
    storage_.resize(spec.num_layers);
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      storage_[layer].assign(2 * static_cast<size_t>(stride) * num_blocks, std::byte{0xee});
      std::byte* base = storage_[layer].data();
      regions_.push_back({.layer = layer,
                          .memory = engine::MemoryKind::kHost,
                          .k_base = base,
                          .v_base = base + stride * num_blocks,
                          .block_stride_bytes = stride,
                          .num_blocks = num_blocks,
                          .block_size = block_size,
                          .num_kv_heads = spec.num_kv_heads,
                          .head_dim = spec.head_dim,
                          .dtype = DtypeOf(spec)});
    }
  }

  std::span<const engine::KvRegion> regions() const { return regions_; }

  // Scatters `payload` (K rows then V rows of tokens [0, n)) into the blocks.
  void WriteLayer(int layer, const std::vector<int32_t>& table,
                  std::span<const std::byte> payload) {
    const int n = static_cast<int>(payload.size() / (2 * token_bytes_));
    std::vector<std::span<std::byte>> rows;
    AppendRowSpans(regions_[layer], table, 0, n, &rows);
    for (std::span<std::byte> r : rows) {
      std::memcpy(r.data(), payload.data(), r.size());
      payload = payload.subspan(r.size());
    }
  }
  // K rows then V rows of tokens [0, n) of a layer.
  std::vector<std::byte> ReadLayer(int layer, const std::vector<int32_t>& table, int n) const {
    std::vector<std::span<std::byte>> rows;
    AppendRowSpans(regions_[layer], table, 0, n, &rows);
    std::vector<std::byte> out;
    for (std::span<std::byte> r : rows) out.insert(out.end(), r.begin(), r.end());
    return out;
  }

 private:
  const int64_t token_bytes_;
  std::vector<std::vector<std::byte>> storage_;
  std::vector<engine::KvRegion> regions_;
};

// Records every sink call. Thread-safe. `fail_on_layer` >= 0 makes OnLayer
// return RESOURCE_EXHAUSTED for that layer. With Watch(), a layer's bytes
// are read out of the destination blocks when its last tokens land.
class RecordingSink final : public ReceiveSink {
 public:
  explicit RecordingSink(int fail_on_layer = -1) : fail_on_layer_(fail_on_layer) {}

  // `read(layer)` returns a layer's bytes from the destination blocks.
  void Watch(std::function<std::vector<std::byte>(int layer)> read, int num_tokens) {
    absl::MutexLock l(&mu_);
    read_ = std::move(read);
    num_tokens_ = num_tokens;
  }
  void Watch(const HostKv* kv, std::vector<int32_t> table, int num_tokens) {
    Watch([kv, table = std::move(table),
           num_tokens](int layer) { return kv->ReadLayer(layer, table, num_tokens); },
          num_tokens);
  }

  absl::Status OnLayer(int layer, int token_begin, int num_tokens) override {
    absl::MutexLock l(&mu_);
    if (complete_calls_ > 0) ++layers_after_complete_;
    ++layer_calls_;
    if (read_ && token_begin + num_tokens == num_tokens_) layers_[layer] = read_(layer);
    if (layer == fail_on_layer_) return absl::ResourceExhaustedError("no free KV blocks");
    return absl::OkStatus();
  }
  void OnComplete(absl::StatusOr<int32_t> first_token) override {
    absl::MutexLock l(&mu_);
    ++complete_calls_;
    if (complete_calls_ == 1) result_ = std::move(first_token);
  }

  // The OnComplete result, or nullopt if it did not come within `timeout`.
  std::optional<absl::StatusOr<int32_t>> WaitResult(absl::Duration timeout = kWait) {
    absl::MutexLock l(&mu_);
    const auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return complete_calls_ > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) return std::nullopt;
    return result_;
  }
  bool WaitLayers(int n, absl::Duration timeout = kWait) {
    absl::MutexLock l(&mu_);
    const auto enough = [this, n]()
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return layer_calls_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::map<int, std::vector<std::byte>> layers() {
    absl::MutexLock l(&mu_);
    return layers_;
  }
  int layer_calls() {
    absl::MutexLock l(&mu_);
    return layer_calls_;
  }
  int complete_calls() {
    absl::MutexLock l(&mu_);
    return complete_calls_;
  }
  int layers_after_complete() {
    absl::MutexLock l(&mu_);
    return layers_after_complete_;
  }

 private:
  const int fail_on_layer_;
  absl::Mutex mu_;
  std::function<std::vector<std::byte>(int)> read_ ABSL_GUARDED_BY(mu_);
  int num_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::vector<std::byte>> layers_ ABSL_GUARDED_BY(mu_);
  int layer_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int complete_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int layers_after_complete_ ABSL_GUARDED_BY(mu_) = 0;
  absl::StatusOr<int32_t> result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("no result");
};

// A Finish `done` callback whose calls can be waited on. The callback shares
// ownership of the state, so a late call after a failed test is harmless.
class DoneWaiter {
 public:
  std::function<void(absl::Status)> Callback() {
    return [state = state_](absl::Status s) {
      absl::MutexLock l(&state->mu);
      if (++state->calls == 1) state->status = std::move(s);
    };
  }
  std::optional<absl::Status> Wait(absl::Duration timeout = kWait) {
    absl::MutexLock l(&state_->mu);
    State* s = state_.get();
    const auto called = [s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->calls > 0; };
    if (!state_->mu.AwaitWithTimeout(absl::Condition(&called), timeout)) return std::nullopt;
    return state_->status;
  }
  int calls() {
    absl::MutexLock l(&state_->mu);
    return state_->calls;
  }

 private:
  struct State {
    absl::Mutex mu;
    int calls ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// One side of the test transfers: KV regions (HostKv, or a device twin with
// the same interface) and the blocks of each transfer id, allocated on
// first use and given back by Release (when the transport lets go of them).
template <typename Kv>
class SideOf {
 public:
  template <typename... Args>
  explicit SideOf(Args&&... args) : kv_(std::forward<Args>(args)...) {}
  Kv& kv() { return kv_; }
  std::span<const engine::KvRegion> regions() const { return kv_.regions(); }
  int blocks_in_use() { return kv_.blocks_in_use(); }

  // The blocks of transfer `id` (allocated on first use, for `num_tokens`).
  const std::vector<int32_t>& Table(TransferId id, int num_tokens) {
    absl::MutexLock l(&mu_);
    auto [it, inserted] = tables_.try_emplace(id);
    if (inserted) it->second = kv_.Allocate(num_tokens);
    return it->second;
  }
  void Release(TransferId id) {
    std::vector<int32_t> table;
    {
      absl::MutexLock l(&mu_);
      auto it = tables_.find(id);
      if (it == tables_.end()) return;
      table = std::move(it->second);
      tables_.erase(it);
    }
    kv_.Free(table);
  }

 private:
  Kv kv_;
  absl::Mutex mu_;
  std::map<TransferId, std::vector<int32_t>> tables_ ABSL_GUARDED_BY(mu_);
};
using Side = SideOf<HostKv>;

// Sends layer `layer`'s `payload` of transfer `id` from `side`: stages it
// into the transfer's blocks and queues the whole layer.
inline absl::Status SendPayload(SendSession& session, Side& side, TransferId id, int layer,
                                std::span<const std::byte> payload, int num_tokens) {
  const std::vector<int32_t>& table = side.Table(id, num_tokens);
  side.kv().WriteLayer(layer, table, payload);
  return session.SendLayer(
      {.layer = layer, .token_begin = 0, .num_tokens = num_tokens, .block_table = table});
}

}  // namespace pdserve::kvtransfer::testing
