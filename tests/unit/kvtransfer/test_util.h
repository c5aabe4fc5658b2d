// Helpers for the kv transport tests: a sink that records what it is given,
// a `done` callback that can be waited on, and random layer payloads. Every
// wait is bounded (kWait) so a broken transport fails a test instead of
// hanging it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer::testing {

inline constexpr absl::Duration kWait = absl::Seconds(5);

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

inline std::vector<std::vector<std::byte>> RandomLayers(const TransferSpec& spec, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<std::byte>> layers(spec.num_layers);
  for (auto& layer : layers) {
    layer.resize(spec.LayerBytes());
    for (auto& b : layer) b = static_cast<std::byte>(rng());
  }
  return layers;
}

// Records every sink call. Thread-safe. `fail_on_layer` >= 0 makes OnLayer
// return RESOURCE_EXHAUSTED for that layer.
class RecordingSink final : public ReceiveSink {
 public:
  explicit RecordingSink(int fail_on_layer = -1) : fail_on_layer_(fail_on_layer) {}

  absl::Status OnLayer(int layer, std::span<const std::byte> payload) override {
    absl::MutexLock l(&mu_);
    if (complete_calls_ > 0) ++layers_after_complete_;
    ++layer_calls_;
    layers_[layer].assign(payload.begin(), payload.end());
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

}  // namespace pdserve::kvtransfer::testing
