// gRPC adapter of the prefill worker: submits the prompt and streams where
// it stands (accepted with its place in the queue, started), opens the KV
// session to the decode worker named in the job once the prompt starts, and
// answers with the first token. Cancelling the call drops the request (at
// once while it waits, at the end of its step while it computes).
#pragma once

#include <atomic>

#include "engine/runtime/grammar/grammar_constraint.h"
#include "kvtransfer/transport.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "prefill_worker/prefill_engine.h"

namespace pdserve::prefill {

class PrefillService final : public internal::v1::PrefillWorker::Service {
 public:
  // `engine`, `sender` and `grammars` must outlive the service; without
  // `grammars` (no tokenizer) structured output is refused.
  PrefillService(PrefillEngine* engine, kvtransfer::KvSender* sender,
                 engine::grammar::GrammarCompiler* grammars = nullptr)
      : engine_(engine), sender_(sender), grammars_(grammars) {}

  grpc::Status Prefill(grpc::ServerContext* context, const internal::v1::PrefillJob* job,
                       grpc::ServerWriter<internal::v1::PrefillEvent>* writer) override;

  void SetDraining(bool draining) { draining_.store(draining); }
  bool draining() const { return draining_.load(); }

 private:
  PrefillEngine* const engine_;
  kvtransfer::KvSender* const sender_;
  engine::grammar::GrammarCompiler* const grammars_;
  std::atomic<bool> draining_{false};
};

}  // namespace pdserve::prefill
