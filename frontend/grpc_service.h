// pdserve.v1.Generation over a SessionManager: the gRPC adapter. It decodes
// the request (frontend/generate_request_proto.h), starts a session, writes
// each delta as one GenerateResponse (the last one together with the
// status), and reports a cancelled call or a failed write as the client
// going away. The call's deadline is the session's deadline.
//
// Served with gRPC's callback API, so an open stream costs nothing while no
// token is due: each call runs its session (RunSession, which blocks in the
// orchestration) on a thread of its own that sleeps between tokens; writes
// are started without waiting for the previous one's completion until the
// next delta is ready (tokens that arrive meanwhile go out together), and
// gRPC's OnCancel (the client left, or the deadline passed) interrupts the
// session at once instead of being polled for.
//
// The method is served with its request as raw bytes so that a request
// protobuf would refuse for invalid UTF-8 gets INVALID_ARGUMENT naming the
// field instead of INTERNAL with no message. Clients see the same service.
//
// Start the server without gRPC's receive limit (StartGrpcServer's
// max_receive_message_bytes = -1): the service refuses a message over
// kMaxGrpcMessageBytes itself (RESOURCE_EXHAUSTED, as gRPC would), so that
// the refusal is counted as rejected{reason="invalid_argument"} rather than
// looking like a client that went away. gRPC 1.51 holds a whole message
// before its own check either way; after a large one, the service returns
// the freed memory to the system (common/memory.h).
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "frontend/request_session.h"
#include "grpcpp/grpcpp.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::frontend {

class GrpcGenerationService final : public v1::Generation::CallbackService {
 public:
  // `sessions` must outlive the service.
  explicit GrpcGenerationService(SessionManager* sessions);
  // Waits for the calls' threads to return. Shut the server down first: that
  // ends the calls still open (their sessions end as cancelled).
  ~GrpcGenerationService() override;

  // Not called: the method is served with raw request bytes (see above).
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;

 private:
  class Call;
  friend class Call;
  // A call's thread ended (the last thing it does).
  void ThreadDone();
  bool NoThreadsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return threads_ == 0; }

  SessionManager* const sessions_;
  absl::Mutex mu_;
  int threads_ ABSL_GUARDED_BY(mu_) = 0;  // calls' threads not yet returned
};

}  // namespace pdserve::frontend
