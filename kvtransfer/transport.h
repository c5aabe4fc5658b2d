// KV transfer between a prefill worker (sender) and a decode worker
// (receiver): one transfer moves one request's KV, layer by layer, then the
// first token. Two parts:
//
//   control channel  per transfer a handshake (TransferSpec: model
//                    fingerprint, dtype, layout, layers, heads, head_dim,
//                    tokens; the receiver refuses a mismatch naming the
//                    field), the first token, abort, and the transport's own
//                    metadata. TCP carries it in-band (tcp/wire.h); the
//                    device transport (device/) over a gRPC stream per pair.
//   data plane       moves {layer, token range, source blocks} ->
//                    {destination blocks} between the KV regions each runner
//                    registered once (engine::KvRegion: base, block stride,
//                    layout, dtype, host or device memory). Block ids, block
//                    sizes and batches differ freely between the sides; the
//                    caller hands over descriptors, never byte vectors.
//
// Implementations: tcp/ (host memory; device memory staged through the host),
// device/ (NCCL between GPUs, CUDA IPC on one GPU).
//
// Block lifetimes: the sender reads its source blocks until Finish's `done`
// has run or Abort has returned; the receiver writes its destination blocks
// until the sink's OnComplete has run. Each side keeps the blocks allocated
// until then (a prefix-cached or device block is never freed under a
// transfer).
//
// Ordering: layers in any order; the token ranges of one layer in increasing,
// contiguous order, each token once. The receiver completes the transfer
// only when every layer's tokens [0, num_tokens) and the first token arrived.
// Failure on either side is reported to both as absl::Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/runtime/model_runner.h"

namespace pdserve::kvtransfer {

using TransferId = uint64_t;

// What sender and receiver must agree on; a receiver refuses a transfer whose
// spec differs from the one it expects, naming the field.
struct TransferSpec {
  uint64_t model_fingerprint = 0;
  std::string dtype;  // "f32", "bf16", "f16"
  // Layout of the KV regions (engine::kKvLayoutPagedNhd).
  std::string layout = std::string(engine::kKvLayoutPagedNhd);
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int num_tokens = 0;
  int bytes_per_element = 4;

  // Bytes of one token's K (or V) row: num_kv_heads * head_dim elements.
  size_t TokenBytes() const { return size_t{1} * num_kv_heads * head_dim * bytes_per_element; }
  // Bytes of one layer: K then V, each [num_tokens, num_kv_heads, head_dim].
  size_t LayerBytes() const { return 2 * TokenBytes() * num_tokens; }
  // OK, or FAILED_PRECONDITION naming the first differing field.
  absl::Status CheckMatches(const TransferSpec& expected) const;
  std::string DebugString() const;
};

// The spec of a `num_tokens`-token transfer from or to `runner`. Both sides
// build it here, so they agree by construction when their models do.
TransferSpec TransferSpecFor(const engine::ModelRunner& runner, int num_tokens);

// INVALID_ARGUMENT unless every dimension is positive, a layer fits
// kMaxLayerBytes and a known dtype has its element size (f32 4, f16/bf16 2).
inline constexpr uint64_t kMaxLayerBytes = uint64_t{4} << 30;
absl::Status ValidateSpec(const TransferSpec& spec);

// INVALID_ARGUMENT unless `regions` can hold `spec`: a region for each of its
// layers whose dtype and token shape match it.
absl::Status CheckRegionsMatch(std::span<const engine::KvRegion> regions, const TransferSpec& spec);

// The label of pdserve_kv_transfer_failures_total{reason} for a failed
// transfer's status: one of kKvFailureReasons.
inline constexpr std::string_view kKvFailureReasons[] = {
    "refused", "timeout", "unavailable", "aborted", "cancelled", "resource_exhausted",
    "invalid", "internal"};
std::string_view KvFailureReason(const absl::Status& status);

// One call's share of a transfer: tokens [token_begin, token_begin +
// num_tokens) of `layer`, read from the sequence's `block_table` (its blocks
// in the sender's regions, from token 0; the transport copies what it needs).
struct LayerChunk {
  int layer = 0;
  int token_begin = 0;
  int num_tokens = 0;
  std::span<const int32_t> block_table;
  // A device backend's event after the layer's K/V writes
  // (StepHandle::LayerDeviceEvent); see SendSession::OrdersOnDeviceEvents.
  void* ready_event = nullptr;
};

// Receiving side of one transfer. Calls come from transport threads and
// never overlap for one transfer.
class ReceiveSink {
 public:
  virtual ~ReceiveSink() = default;
  // Tokens [token_begin, token_begin + num_tokens) of `layer` are in the
  // destination blocks. A non-OK return fails the transfer.
  virtual absl::Status OnLayer(int layer, int token_begin, int num_tokens) {
    return absl::OkStatus();
  }
  // Called exactly once per Expect()ed transfer: the first token when every
  // layer arrived, else why not (a sender error, a spec mismatch, a timeout,
  // CANCELLED after Cancel()). The transport writes the destination blocks
  // no more: they may be freed.
  virtual void OnComplete(absl::StatusOr<int32_t> first_token) = 0;
};

class KvReceiver {
 public:
  virtual ~KvReceiver() = default;
  // Where senders reach this receiver, e.g. "tcp://127.0.0.1:40123".
  virtual std::string endpoint() const = 0;
  // Announces a transfer into `block_table` (destination blocks in this
  // receiver's regions, from token 0, covering spec.num_tokens). It fails
  // with DEADLINE_EXCEEDED unless complete within `timeout`.
  virtual absl::Status Expect(TransferId id, const TransferSpec& spec,
                              std::vector<int32_t> block_table, std::shared_ptr<ReceiveSink> sink,
                              absl::Duration timeout) = 0;
  // Stops a transfer. Returns once its sink has completed (with CANCELLED
  // unless it had completed before); a no-op for an unknown id.
  virtual void Cancel(TransferId id) = 0;
};

// Sending side of one transfer. Methods are called from one thread at a
// time; the data moves in the background so the caller (the prefill loop)
// does not wait for the network.
class SendSession {
 public:
  virtual ~SendSession() = default;  // without Finish: Abort
  // True when the transport orders its reads of a chunk after the chunk's
  // ready_event on the device, so the caller may pass a chunk before its
  // layer has finished computing. False: the caller passes a chunk only
  // once its KV is in the source blocks (ready_event is ignored).
  virtual bool OrdersOnDeviceEvents() const { return false; }
  // Queues one chunk. Fails fast if the session failed; INVALID_ARGUMENT for
  // a layer out of range, a token range that does not continue the layer's,
  // or a block table that does not cover it.
  virtual absl::Status SendLayer(const LayerChunk& chunk) = 0;
  // Queues the first token and ends the session: `done` runs once, on a
  // transport thread (inline when the session already failed), with OK when
  // the receiver confirmed everything or the error that stopped the
  // transfer. The source blocks are read no more by then.
  virtual void Finish(int32_t first_token, std::function<void(absl::Status)> done) = 0;
  // Ends the session with an error sent to the receiver (if reachable).
  // Returns once the source blocks are read no more.
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
