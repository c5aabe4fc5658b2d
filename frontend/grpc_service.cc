#include "frontend/grpc_service.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "frontend/errors.h"
#include "common/memory.h"
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
  // Destroyed last: after a large request, what it held goes back to the
  // system.
  ReleaseFreedMemoryAfter release;
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) {
    // What gRPC held of a message that did not arrive whole.
    release.set_bytes(kTrimAfterRequestBytes);
    return ToGrpcStatus(sessions_->AbandonedBeforeStart(call));
  }
  release.set_bytes(static_cast<int64_t>(buffer.Length()));
  if (buffer.Length() > static_cast<size_t>(kMaxGrpcMessageBytes)) {
    const size_t length = buffer.Length();
    buffer.Clear();
    // gRPC's own refusal has this code; the client sent too much, so it is
    // counted as invalid_argument, as the HTTP port's 413 is.
    return ToGrpcStatus(sessions_->Refuse(
        absl::ResourceExhaustedError(absl::StrCat("request message of ", length,
                                                  " bytes is larger than the limit of ",
                                                  kMaxGrpcMessageBytes, " bytes")),
        "invalid_argument"));
  }
  std::string bytes = ToString(buffer);
  buffer.Clear();
  absl::StatusOr<Request> request = DecodeGenerateRequest(
      bytes, {.max_prompt_token_ids = sessions_->prompt_source().config.max_position_embeddings});
  bytes = std::string();
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
