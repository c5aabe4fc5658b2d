// pdserve.v1.Generation over a SessionManager: the gRPC adapter. It decodes
// the request (frontend/generate_request_proto.h), starts a session, writes
// each delta as one GenerateResponse, and reports a cancelled call or a
// failed write as the client going away. The call's deadline is the
// session's deadline.
//
// The method is served with its request as raw bytes (a split-streaming
// handler, as the generated WithSplitStreamingMethod does) so that a request
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

#include "frontend/request_session.h"
#include "grpcpp/grpcpp.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::frontend {

class GrpcGenerationService final : public v1::Generation::Service {
 public:
  // `sessions` must outlive the service.
  explicit GrpcGenerationService(SessionManager* sessions);

  // Not called: the method is served by Serve (see above).
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;

 private:
  grpc::Status Serve(grpc::ServerContext* context,
                     grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::GenerateResponse>* stream);

  SessionManager* const sessions_;
};

}  // namespace pdserve::frontend
