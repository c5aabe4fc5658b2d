// The compute-backend interface of the engine. Schedulers and services drive a
// ModelRunner and never see tensors: the runner owns the weights and the KV
// storage, and reads/writes KV through block tables handed out by a
// BlockManager (engine/kvcache/block_manager.h). The CPU runner (engine/cpu/) is the
// reference; a CUDA runner implements the same interface.
//
// KV storage layout (per layer, K and V apart): [num_blocks, block_size,
// num_kv_heads, head_dim]. Token t of a sequence lives in block
// block_table[t / block_size], slot t % block_size.
//
// Threading: Prefill and Decode are called from one engine thread.
// ReadLayerKv/WriteLayerKv may be called from other threads at the same time
// as long as the blocks they touch are not used by the running call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/config.h"

namespace pdserve::engine {

// Element type of the KV cache as stored and as sent over the wire.
enum class KvDtype { kF32, kBF16, kF16 };
std::string_view KvDtypeName(KvDtype dtype);  // "f32", "bf16", "f16"
int KvDtypeBytes(KvDtype dtype);

struct PrefillSequence {
  // Prompt tokens at positions 0..tokens.size()-1.
  std::span<const int32_t> tokens;
  // Blocks holding at least tokens.size() slots.
  std::span<const int32_t> block_table;
};

struct DecodeSequence {
  int32_t token = 0;     // the newest token, at `position`
  int32_t position = 0;  // its position; KV of 0..position-1 is in the cache
  // Blocks holding at least position+1 slots.
  std::span<const int32_t> block_table;
};

// Called after layer `layer` of a prefill has written its K/V for every
// sequence of the batch: the layer's KV may be read from then on.
using LayerDoneFn = std::function<void(int layer)>;

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  // Identifies the weights: equal fingerprints mean interchangeable KV.
  virtual uint64_t fingerprint() const = 0;
  virtual KvDtype kv_dtype() const = 0;
  virtual int num_kv_blocks() const = 0;
  virtual int kv_block_size() const = 0;
  // Bytes of weights one decode step reads (every matrix it multiplies by,
  // in the dtype it is stored in; the input embedding counts only as the LM
  // head when tied). With the KV read, the numerator of decode's
  // bandwidth utilisation.
  virtual int64_t DecodeWeightBytes() const = 0;

  // Runs whole prompts, writes their K/V, and fills `logits` with
  // [seqs.size(), vocab_size] logits of each prompt's last token.
  // `on_layer_done` may be empty.
  virtual absl::Status Prefill(std::span<const PrefillSequence> seqs,
                               const LayerDoneFn& on_layer_done, std::vector<float>& logits) = 0;

  // One step for a batch: each sequence's token is appended at its position
  // (its K/V written) and `logits` gets [seqs.size(), vocab_size].
  virtual absl::Status Decode(std::span<const DecodeSequence> seqs, std::vector<float>& logits) = 0;

  // Bytes of one layer's KV for `num_tokens` tokens: K then V, each
  // [num_tokens, num_kv_heads, head_dim] in kv_dtype().
  virtual size_t LayerKvBytes(int num_tokens) const = 0;
  // Copies layer `layer` of tokens 0..num_tokens-1 out of the cache.
  virtual absl::Status ReadLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                                   std::span<std::byte> out) const = 0;
  // Scatters a layer received from a peer into the cache.
  virtual absl::Status WriteLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                                    std::span<const std::byte> in) = 0;
};

}  // namespace pdserve::engine
