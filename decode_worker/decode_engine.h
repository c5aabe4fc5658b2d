// The decode worker's engine: the scheduler core (engine/scheduler) in its
// decode role. Admission reserves KV blocks for the prompt plus a small
// headroom and announces the transfer with those blocks as its destination;
// the transport writes the received KV straight into them; when the KV and
// the first token are in, the sequence joins continuous batching — one step
// over every running sequence, sequences joining and leaving between steps —
// and takes blocks as it grows. A failed or cancelled transfer's blocks are
// freed only once the transport has let go of them. When blocks run out, the
// newest sequences are preempted and later recomputed here, as a prompt step
// of their prompt and generated tokens on this worker's runner; their streams
// go on without a gap or a repeat (seeded sampling draws the same tokens).
//
// The step loop is the EngineCore's (engine/core/engine_core.h); this class
// is the decode role's policy over it. A KV transfer done, a cancel or an
// admission wakes the loop at once. With speculative decoding
// (engine/spec/spec_decoder.h), the policy proposes tokens for the decoding
// sequences before each plan; the step verifies them (the rejected ones'
// KV rolled back) and a sequence's stream gets every token that stood, plus
// the one drawn after them, in one message.
//
// Threads: the core's engine thread plans, runs and applies steps; transport
// threads write received KV into blocks reserved for (and only touched by)
// their sequence; gRPC handler threads Admit, read their stream and Cancel.
// The core's lock guards the scheduler and the stream table.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/base/output_queue.h"
#include "decode_worker/decode_metrics.h"
#include "engine/core/engine_core.h"
#include "engine/runtime/finish.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sampler.h"
#include "engine/scheduler/scheduler.h"
#include "engine/spec/spec_decoder.h"
#include "kvtransfer/transport.h"

namespace pdserve::decode {

struct DecodeRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  // A continuation (another decode worker failed): tokens already
  // generated. The KV received covers prompt + generated, the token it
  // brings is number generated.size(), and the stream carries the ones after
  // it; all of them count toward max_tokens and the penalties.
  std::vector<int32_t> generated;
  engine::SamplingParams sampling;
  // The KV must have arrived by then (the request's budget: the call's
  // deadline, so the router, which set it, decides first; a cancelled call
  // ends the wait sooner). Infinite: DecodeEngineOptions::kv_timeout from
  // admission.
  absl::Time kv_deadline = absl::InfiniteFuture();
};

// One message for the request's stream.
struct DecodeOutput {
  std::vector<engine::SampledToken> tokens;  // generated after the first token
  bool finished = false;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  int completion_tokens = 0;  // with the first token, when finished
  absl::Status error;         // non-OK ends the stream with this status
};

// Per-request output queue, filled by the engine, drained by the handler.
class DecodeStream : public OutputQueue<DecodeOutput> {
 public:
  DecodeStream(engine::SeqId seq, kvtransfer::TransferId transfer_id)
      : seq_(seq), transfer_id_(transfer_id) {}
  engine::SeqId seq() const { return seq_; }
  kvtransfer::TransferId transfer_id() const { return transfer_id_; }

 private:
  const engine::SeqId seq_;
  const kvtransfer::TransferId transfer_id_;
};

struct DecodeEngineOptions {
  int max_running = 256;  // sequences in the batch plus waiting for KV
  // Tokens reserved beyond the prompt at admission; later ones take blocks
  // as they come. Negative (or >= max_tokens): whole requests up front.
  int kv_headroom_tokens = 32;
  // Preempted sequences' computed blocks stay cached (evictable), so a
  // recomputation skips what was not reused meanwhile.
  bool enable_prefix_caching = true;
  // Tokens per step for recomputing preempted sequences (beside the decodes).
  int recompute_chunk_tokens = 256;
  // Admission to KV complete, for a request that brings no kv_deadline.
  absl::Duration kv_timeout = absl::Seconds(600);
  // Peak memory bandwidth in bytes/s for the utilisation gauge; 0: unknown.
  double peak_memory_bandwidth = 0;
};

struct DecodeLoad {
  int running = 0;
  int waiting_kv = 0;
  int preempted = 0;    // waiting to be recomputed
  int free_blocks = 0;  // free beyond what preempted sequences wait for
  int total_blocks = 0;
  // Progress (the router's liveness judgement): steps completed since
  // start, and why the engine cannot serve (empty: it can).
  uint64_t progress = 0;
  bool has_work = false;  // the last plan had a step to run
  std::string unhealthy_reason;
};

class DecodeEngine : private engine::EnginePolicy {
 public:
  // `runner`, `receiver` and `metrics` must outlive the engine. `spec`:
  // speculative decoding (engine/spec/spec_decoder.h), or null.
  DecodeEngine(DecodeEngineOptions options, engine::ModelRunner* runner,
               kvtransfer::KvReceiver* receiver, DecodeMetrics* metrics,
               std::unique_ptr<engine::spec::SpecDecoder> spec = nullptr);
  ~DecodeEngine() override;  // cancels everything and joins the engine thread

  // Validates the request, reserves blocks for the prompt plus the headroom
  // and announces the KV transfer. INVALID_ARGUMENT for bad input,
  // RESOURCE_EXHAUSTED when blocks or slots run out, or when the whole
  // request could never fit this worker's cache.
  absl::StatusOr<std::shared_ptr<DecodeStream>> Admit(DecodeRequest request);
  // Stops the request and frees its blocks (now, or after the running step).
  void Cancel(const DecodeStream& stream);

  DecodeLoad load() const;
  const std::string& kv_endpoint() const { return kv_endpoint_; }
  const engine::ModelConfig& model_config() const { return runner_->config(); }

 private:
  // Per admitted request: its stream and what the scheduler does not keep.
  struct Entry {
    std::string request_id;
    std::shared_ptr<DecodeStream> stream;
    bool awaiting_kv = true;
    bool cancelled = false;      // while awaiting KV: the receiver's cancel frees it
    int num_generated = 0;       // generated elsewhere, then pushed (the first one included)
    absl::Time admitted;         // KV reserved
    absl::Time last_token_time;  // joining the batch, then each token's step end
  };
  class Sink;

  class Step;
  // EnginePolicy (on the engine thread, under the core's lock).
  void BeforePlan() override;
  void OnPlanned(const engine::ScheduledStep& step, double plan_seconds) override;
  std::unique_ptr<engine::EngineStep> BeginStep(const engine::ScheduledStep& step,
                                                absl::Time now) override;
  void UpdateGauges() override { UpdateGaugesLocked(); }
  // Called by a Sink when the transfer ended.
  void OnKvComplete(engine::SeqId seq, absl::StatusOr<int32_t> first_token);
  // Frees a sequence that is not in a step (awaiting KV, or between steps).
  void DropLocked(engine::SeqId seq);
  void UpdateGaugesLocked();

  const DecodeEngineOptions options_;
  engine::ModelRunner* const runner_;
  kvtransfer::KvReceiver* const receiver_;
  DecodeMetrics* const metrics_;
  const std::string kv_endpoint_;
  const double weight_bytes_;

  // Guarded by the core's lock.
  std::unordered_map<engine::SeqId, Entry> entries_;
  // Speculative decoding (null: off); used on the engine thread only.
  const std::unique_ptr<engine::spec::SpecDecoder> spec_;
  engine::SeqId next_seq_ = 1;
  // Transfer ids travel in the clear on the TCP KV port: one seen there must
  // not tell the next (a peer that could replay the port's fixed credential
  // could otherwise claim a coming transfer).
  const UnpredictableIds transfer_ids_;
  engine::EngineCore core_;  // last: its thread runs the policy over everything above
};

}  // namespace pdserve::decode
