#include "frontend/grpc_service.h"

#include <chrono>
#include <vector>

#include "common/grpc_util.h"
#include "frontend/errors.h"
#include "frontend/generate_request_proto.h"

namespace pdserve::frontend {
namespace {

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// The status for the client, with a retry hint as `retry-after` trailing
// metadata (whole seconds, as HTTP's header) when the refusal carries one.
grpc::Status Reply(grpc::ServerContext& context, const absl::Status& status) {
  if (std::string after = RetryAfterSeconds(status); !after.empty()) {
    context.AddTrailingMetadata("retry-after", after);
  }
  return ToGrpcStatus(status);
}

absl::Time Deadline(const grpc::ServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

}  // namespace

GrpcGenerationService::GrpcGenerationService(SessionManager* sessions) : sessions_(sessions) {
  MarkMethodStreamed(
      0, new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer, v1::GenerateResponse>(
             [this](grpc::ServerContext* context,
                    grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::GenerateResponse>* stream) {
               return Serve(context, stream);
             }));
}

grpc::Status GrpcGenerationService::Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                                             grpc::ServerWriter<v1::GenerateResponse>*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "served as raw bytes");
}

grpc::Status GrpcGenerationService::Serve(
    grpc::ServerContext* context,
    grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::GenerateResponse>* stream) {
  const CallInfo call{.arrival = absl::Now(), .deadline = Deadline(*context)};
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) return ToGrpcStatus(sessions_->AbandonedBeforeStart(call));
  absl::StatusOr<Request> request = DecodeGenerateRequest(ToString(buffer));
  if (!request.ok()) return ToGrpcStatus(sessions_->Refuse(request.status(), "invalid_argument"));
  absl::StatusOr<std::unique_ptr<RequestSession>> session = sessions_->Start(*request, call);
  if (!session.ok()) return Reply(*context, session.status());
  absl::Status status = RunSession(
      **session,
      [&](const Delta& delta) { return stream->Write(DeltaToProto(delta, request->request_id)); },
      [&] { return context->IsCancelled(); });
  return Reply(*context, status);
}

}  // namespace pdserve::frontend
