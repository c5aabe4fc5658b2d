// gRPC adapter of the prefill worker: opens the KV session to the decode
// worker named in the job, submits the prompt, and answers with the first
// token. Cancelling the call drops a request that has not started.
#pragma once

#include <atomic>

#include "kvtransfer/transport.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "prefill_worker/prefill_engine.h"

namespace pdserve::prefill {

class PrefillService final : public internal::v1::PrefillWorker::Service {
 public:
  // `engine` and `sender` must outlive the service.
  PrefillService(PrefillEngine* engine, kvtransfer::KvSender* sender)
      : engine_(engine), sender_(sender) {}

  grpc::Status Prefill(grpc::ServerContext* context, const internal::v1::PrefillJob* job,
                       internal::v1::PrefillResult* result) override;

  void SetDraining(bool draining) { draining_.store(draining); }
  bool draining() const { return draining_.load(); }

 private:
  PrefillEngine* const engine_;
  kvtransfer::KvSender* const sender_;
  std::atomic<bool> draining_{false};
};

}  // namespace pdserve::prefill
