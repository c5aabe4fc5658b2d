// KV transfer between a prefill worker (sender) and a decode worker
// (receiver). One transfer moves one request's KV, layer by layer, followed by
// the first token. Implementations: tcp/ (CPU clusters, tests); NCCL and CUDA
// IPC slot in behind the same interfaces.
//
// Ordering: layers may be sent in any order, each exactly once; the receiver
// completes the transfer only when every layer and the first token arrived.
// Failure on either side is reported to both as absl::Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::kvtransfer {

using TransferId = uint64_t;

// What sender and receiver must agree on; a receiver refuses a transfer whose
// spec differs from the one it expects, naming the field.
struct TransferSpec {
  uint64_t model_fingerprint = 0;
  std::string dtype;  // "f32", "bf16", "f16"
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int num_tokens = 0;
  int bytes_per_element = 4;

  // Bytes of one layer's payload: K then V, each [num_tokens, num_kv_heads, head_dim].
  size_t LayerBytes() const {
    return size_t{2} * num_tokens * num_kv_heads * head_dim * bytes_per_element;
  }
  // OK, or INVALID_ARGUMENT/FAILED_PRECONDITION naming the first differing field.
  absl::Status CheckMatches(const TransferSpec& expected) const;
  std::string DebugString() const;
};

// Receiving side of one transfer. Calls come from transport threads.
class ReceiveSink {
 public:
  virtual ~ReceiveSink() = default;
  // One layer's payload (TransferSpec::LayerBytes() bytes), valid only during
  // the call. A non-OK return fails the transfer.
  virtual absl::Status OnLayer(int layer, std::span<const std::byte> payload) = 0;
  // Called exactly once per Expect()ed transfer: the first token when every
  // layer arrived, else why not (a sender error, a spec mismatch, a timeout,
  // CANCELLED after Cancel()).
  virtual void OnComplete(absl::StatusOr<int32_t> first_token) = 0;
};

class KvReceiver {
 public:
  virtual ~KvReceiver() = default;
  // Where senders reach this receiver, e.g. "tcp://127.0.0.1:40123".
  virtual std::string endpoint() const = 0;
  // Announces a transfer. It fails with DEADLINE_EXCEEDED unless complete
  // within `timeout`.
  virtual absl::Status Expect(TransferId id, const TransferSpec& spec,
                              std::shared_ptr<ReceiveSink> sink, absl::Duration timeout) = 0;
  // Stops a transfer: its sink gets OnComplete(CANCELLED) unless it already
  // completed. After Cancel returns, the sink gets no OnLayer calls.
  virtual void Cancel(TransferId id) = 0;
};

// Sending side of one transfer. Methods are called from one thread; sending
// happens in the background so the caller (the prefill loop) does not wait
// for the network.
class SendSession {
 public:
  virtual ~SendSession() = default;
  // Queues one layer's payload (K then V). Fails fast if the session failed.
  virtual absl::Status SendLayer(int layer, std::vector<std::byte> payload) = 0;
  // Queues the first token and ends the session: `done` runs once, on a
  // transport thread, with OK when the receiver confirmed everything or the
  // error that stopped the transfer.
  virtual void Finish(int32_t first_token, std::function<void(absl::Status)> done) = 0;
  // Ends the session with an error sent to the receiver (if reachable).
  virtual void Abort(const absl::Status& why) = 0;
};

class KvSender {
 public:
  virtual ~KvSender() = default;
  // Starts a transfer to `endpoint`. The handshake (spec check) may complete
  // in the background; a refusal surfaces via SendLayer or Finish's `done`.
  virtual absl::StatusOr<std::unique_ptr<SendSession>> Open(const std::string& endpoint,
                                                            TransferId id,
                                                            const TransferSpec& spec) = 0;
};

}  // namespace pdserve::kvtransfer
