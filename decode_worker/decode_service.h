// gRPC adapter of the decode worker: turns DecodeJob messages into
// DecodeRequests, streams DecodeEngine output as DecodeEvents, and cancels
// the request when the caller goes away.
#pragma once

#include <algorithm>
#include <atomic>

#include "decode_worker/decode_engine.h"
#include "engine/runtime/grammar/grammar_constraint.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve::decode {

class DecodeService final : public internal::v1::DecodeWorker::Service {
 public:
  // `engine` and `grammars` must outlive the service; without `grammars`
  // (no tokenizer) structured output is refused. `stream_interval`: tokens
  // gathered into one `tokens` event (at least 1). The last tokens of a
  // stream go at once with its end, and an error at once; so at N a client
  // sees tokens in bursts of N steps, for N times fewer messages per token
  // here and at the router (`--stream_interval`, as SGLang and vLLM call it).
  explicit DecodeService(DecodeEngine* engine, engine::grammar::GrammarCompiler* grammars = nullptr,
                         int stream_interval = 1)
      : engine_(engine), grammars_(grammars), stream_interval_(std::max(1, stream_interval)) {}

  grpc::Status Decode(grpc::ServerContext* context, const internal::v1::DecodeJob* job,
                      grpc::ServerWriter<internal::v1::DecodeEvent>* writer) override;

  // While draining, new requests get UNAVAILABLE; running ones finish.
  void SetDraining(bool draining) { draining_.store(draining); }
  bool draining() const { return draining_.load(); }

 private:
  DecodeEngine* const engine_;
  engine::grammar::GrammarCompiler* const grammars_;
  const int stream_interval_;
  std::atomic<bool> draining_{false};
};

}  // namespace pdserve::decode
