// The compute-backend interface of the engine (runner interface v2).
//
// A ModelRunner owns the weights, in its backend's own storage, and the paged
// KV cache. Schedulers and services drive it with steps and never see
// tensors: a step is a batch of sequences, each bringing new tokens (a prompt
// chunk, or one decode token) at the positions after the tokens already in
// its cache, with its block table and, when it samples, its sampling state.
// The runner computes, writes the new tokens' K/V into the cache, samples on
// its own device and returns the sampled tokens (and log-probabilities only
// when asked): full-vocabulary logits never have to leave the device.
//
// Steps are asynchronous: Enqueue returns a StepHandle at once; the handle
// signals each layer's completion (a transport waits on layer i and moves its
// K/V while layer i+1 computes) and then the result. Steps run one after the
// other, in enqueue order.
//
// The KV cache is exposed as registered regions, one per layer (KvRegion), so
// a transport can move blocks by descriptor without going through the
// runner; ReadLayerKv/WriteLayerKv stage a layer through host memory for
// transports that need bytes (TCP).
//
// KV layout (per layer, K and V apart): [num_blocks, block_size,
// num_kv_heads, head_dim] in kv_dtype(). Token t of a sequence lives in block
// block_table[t / block_size], slot t % block_size.
//
// Threading: Enqueue is called from one engine thread. A handle may be waited
// on from any one thread. ReadLayerKv/WriteLayerKv may be called from other
// threads at the same time as a step, as long as the blocks (and, for a
// layer of a running step, the layer: wait for it first) they touch are not
// written by that step.
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
#include "engine/model/config.h"
#include "engine/runtime/sampler.h"

namespace pdserve::engine {

// Element type of the KV cache as stored and as sent over the wire.
enum class KvDtype { kF32, kBF16, kF16 };
std::string_view KvDtypeName(KvDtype dtype);  // "f32", "bf16", "f16"
int KvDtypeBytes(KvDtype dtype);

// Where a KV region's memory lives.
enum class MemoryKind { kHost, kDevice };

// One layer's KV storage as registered by the runner: a transport moves
// blocks of it by address. K and V each hold num_blocks blocks of
// block_size * num_kv_heads * head_dim elements of `dtype`; block b of K
// starts at k_base + b * block_stride_bytes (V likewise). Within a block,
// token slots are consecutive, each num_kv_heads * head_dim elements
// (layout "NHD"). Valid for the runner's lifetime.
struct KvRegion {
  int layer = 0;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;  // device ordinal when memory == kDevice
  std::byte* k_base = nullptr;
  std::byte* v_base = nullptr;
  int64_t block_stride_bytes = 0;
  int num_blocks = 0;
  int block_size = 0;  // tokens per block
  int num_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::kF32;

  int64_t token_bytes() const { return int64_t{num_kv_heads} * head_dim * KvDtypeBytes(dtype); }
};
// The layout name carried in KV handshakes, e.g. "paged_nhd".
inline constexpr std::string_view kKvLayoutPagedNhd = "paged_nhd";

// One sequence of a step.
struct StepSequence {
  // New tokens at positions num_cached .. num_cached + tokens.size() - 1: a
  // prompt chunk, or the one newest token of a decoding sequence. Non-empty.
  std::span<const int32_t> tokens;
  // Tokens of this sequence whose K/V is already in the cache (positions
  // 0 .. num_cached - 1): 0 for a prompt's first chunk.
  int num_cached = 0;
  // Blocks covering at least num_cached + tokens.size() tokens.
  std::span<const int32_t> block_table;
  // Samples the token after the last of `tokens` when set; null for a prompt
  // chunk that does not end the prompt. Must outlive the step.
  const SamplingParams* sampling = nullptr;
  // What penalties and min_tokens read; the draw is step
  // history.generated.size() of the request (engine/runtime/sampler.h).
  TokenHistory history;
  // Verification (speculative decoding): the step returns the raw logits of
  // the last `num_verify_rows` positions of `tokens` in
  // StepOutput::verify_logits, and the caller samples from them
  // (engine/spec/rejection_sampler.h). 0: none. At most tokens.size(); a verifying
  // sequence does not sample (sampling must be null).
  int num_verify_rows = 0;
};

struct StepBatch {
  std::vector<StepSequence> seqs;
  // Also return the sampling rows' raw logits (tests and tools only: a
  // device backend copies them to the host).
  bool return_logits = false;
};

struct StepOutput {
  // sampled[i] is sequence i's token; meaningful only where
  // seqs[i].sampling was set (logprob fields only when asked).
  std::vector<SampledToken> sampled;
  // With return_logits: [number of sampling sequences, vocab_size], in
  // batch order of the sampling sequences.
  std::vector<float> logits;
  // [sum of seqs[i].num_verify_rows, vocab_size]: each verifying sequence's
  // rows, positions in order, sequences in batch order.
  std::vector<float> verify_logits;
};

// Completion of one enqueued step. Every method may block. After a failed
// step, WaitLayer and Wait return its error.
class StepHandle {
 public:
  virtual ~StepHandle() = default;  // waits for the step if it still runs
  // Returns once layer `layer` has written the K/V of every sequence of the
  // step (layers complete in order).
  virtual absl::Status WaitLayer(int layer) = 0;
  // Returns once the whole step is done. Call at most once.
  virtual absl::StatusOr<StepOutput> Wait() = 0;
  // A device backend's event recorded after layer `layer`'s K/V writes (e.g.
  // a cudaEvent_t), for a transport stream to wait on without blocking the
  // host; nullptr on host backends.
  virtual void* LayerDeviceEvent(int layer) const { return nullptr; }
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  // "cpu", "cuda".
  virtual std::string_view backend() const = 0;
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
  // What one more row costs a batch-1 decode step, in plain steps (a step of
  // 1 + k rows costs about 1 + k times this): speculative decoding prices its
  // verification rows with it (engine/spec/spec_decoder.h). Counted from the
  // backend and the CPU's instruction set, never timed, so decisions priced
  // with it are the same in every run on one machine type. The default, a
  // GPU's: extra rows cost little until the step is compute-bound.
  virtual double VerificationRowCost() const { return 0.1; }

  // Validates `batch` (INVALID_ARGUMENT naming the sequence and field) and
  // starts it. The spans in `batch` must stay valid until the handle's Wait
  // returns. An empty batch completes at once.
  virtual absl::StatusOr<std::unique_ptr<StepHandle>> Enqueue(StepBatch batch) = 0;

  // One region per layer, in layer order.
  virtual std::span<const KvRegion> kv_regions() const = 0;

  // Bytes of one layer's KV for `num_tokens` tokens: K then V, each
  // [num_tokens, num_kv_heads, head_dim] in kv_dtype().
  virtual size_t LayerKvBytes(int num_tokens) const = 0;
  // Copies layer `layer` of tokens 0..num_tokens-1 out of the cache.
  virtual absl::Status ReadLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                                   std::span<std::byte> out) const = 0;
  // Scatters a layer received from a peer into the cache.
  virtual absl::Status WriteLayerKv(int layer, std::span<const int32_t> block_table, int num_tokens,
                                    std::span<const std::byte> in) = 0;

  // Enqueue, then Wait. A backend may run the step on the calling thread
  // instead when nothing else is queued (the CPU runner does): the same
  // result without two thread hand-offs, for callers that wait at once (a
  // draft model's proposal steps).
  virtual absl::StatusOr<StepOutput> Step(StepBatch batch);
};

// Argument checks every backend applies, so a batch is refused the same way
// whatever runs it (INVALID_ARGUMENT naming the sequence and the field).
// `block_table` must name valid blocks (< num_blocks) for `num_tokens`
// tokens; `what` and `index` start the message ("step sequence 2: ...").
absl::Status CheckBlockTable(std::span<const int32_t> block_table, int num_tokens, int block_size,
                             int num_blocks, const char* what, size_t index);
// Enqueue's checks: non-empty token lists of ids in [0, vocab_size),
// positions below max_position_embeddings, block tables that cover them,
// valid sampling parameters, at most 2^24 tokens in all.
absl::Status ValidateStepBatch(const StepBatch& batch, const ModelConfig& config, int block_size,
                               int num_blocks);
// ReadLayerKv/WriteLayerKv's checks (`what` names the call): layer and token
// count in range, the table covering num_tokens, and a buffer of exactly
// `expected_bytes`.
absl::Status CheckLayerKvArgs(const char* what, const ModelConfig& config, int layer,
                              std::span<const int32_t> block_table, int num_tokens, int block_size,
                              int num_blocks, size_t buffer_bytes, size_t expected_bytes);

// Convenience for tests and tools that want logits: whole prompts from
// position 0 (`on_layer_done`, if set, runs on the caller's thread after each
// layer completes) and single decode tokens. `logits` gets [seqs, vocab].
struct PrefillSequence {
  std::span<const int32_t> tokens;       // prompt, positions 0..size-1
  std::span<const int32_t> block_table;  // covers tokens.size()
};
struct DecodeSequence {
  int32_t token = 0;                     // the newest token, at `position`
  int32_t position = 0;                  // KV of 0..position-1 is in the cache
  std::span<const int32_t> block_table;  // covers position + 1
};
using LayerDoneFn = std::function<void(int layer)>;
absl::Status PrefillForLogits(ModelRunner& runner, std::span<const PrefillSequence> seqs,
                              const LayerDoneFn& on_layer_done, std::vector<float>& logits);
absl::Status DecodeForLogits(ModelRunner& runner, std::span<const DecodeSequence> seqs,
                             std::vector<float>& logits);

}  // namespace pdserve::engine
