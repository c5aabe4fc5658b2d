#include "frontend/grpc_service.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/memory.h"
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
// Before Finish.
grpc::Status Reply(grpc::CallbackServerContext& context, const absl::Status& status) {
  if (std::string after = RetryAfterSeconds(status); !after.empty()) {
    context.AddTrailingMetadata("retry-after", after);
  }
  return ToGrpcStatus(status);
}

absl::Time Deadline(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

// How long a call that came without a request message waits to learn that
// it was cancelled before it is refused as invalid: gRPC tells the handler's
// OnCancel soon after, unless the machine is very busy.
constexpr absl::Duration kNoMessageCancelWait = absl::Seconds(2);

}  // namespace

// One Generate call. Its session runs on a thread of its own (Run), and in
// push mode (RequestSession::EnablePush) tokens are also relayed by the gRPC
// thread that received them (Pump), without waking that thread. Deltas are
// queued in order (under the session's lock) and written one at a time;
// gRPC's reactions (OnWriteDone, OnCancel, OnDone) update the state below
// under mu_ and start the next write. No gRPC operation is started with a
// lock held (a reaction may run inline). Deleted by whichever of the thread
// and OnDone lets go last.
class GrpcGenerationService::Call final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  Call(GrpcGenerationService* service, grpc::CallbackServerContext* context,
       const grpc::ByteBuffer* request)
      : service_(service),
        context_(context),
        request_(request),
        call_{.arrival = absl::Now(), .deadline = Deadline(*context)} {}

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) write_failed_ = true;
      if (!TakeNextWriteLocked()) return;
    }
    StartWrite(&response_);
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    // Not under mu_: gRPC may run a reaction from the generation's cancel
    // inline, and a Pump from it queues under mu_.
    absl::MutexLock lock(&session_mu_);
    if (session_ != nullptr) session_->Interrupt();
  }

  void OnDone() override { Unref(); }

  // Lets go of one reference: the thread's (as its last act) or gRPC's.
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  // The call's thread: the session from start to end, then the status.
  void Run() {
    pthread_setname_np(pthread_self(), "pdserve_session");
    const absl::Status status = Serve();
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Call::WritesDoneLocked));
      finishing_ = true;  // no write starts after this
    }
    if (status.ok() && last_.has_value()) {
      response_ = *std::move(last_);
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(Reply(*context_, status));
    }
    GrpcGenerationService* const service = service_;
    Unref();
    service->ThreadDone();
  }

 private:
  absl::Status Serve() {
    SessionManager& sessions = *service_->sessions_;
    // Destroyed last: after a large request, what it held goes back to the
    // system.
    ReleaseFreedMemoryAfter release;
    // gRPC's buffer is not used again once the handler has it; emptied here
    // so that a large message is not held until the call ends.
    grpc::ByteBuffer* const buffer = const_cast<grpc::ByteBuffer*>(request_);
    // A call cancelled (its deadline, say) before its message was read
    // comes with an empty buffer: abandoned, not an invalid request.
    if (Gone() || context_->IsCancelled()) {
      buffer->Clear();
      return sessions.AbandonedBeforeStart(call_);
    }
    // No message at all (an empty one is still a message): the call ended
    // before it came (cancelled, its deadline, a broken connection), which
    // gRPC may not have told this call yet, or the client closed its side
    // without sending one. OnCancel tells the two apart.
    if (!buffer->Valid()) {
      if (absl::Now() >= call_.deadline || AwaitCancelled(kNoMessageCancelWait)) {
        return sessions.AbandonedBeforeStart(call_);
      }
      return sessions.Refuse(absl::InvalidArgumentError("the call carried no request message"),
                             "invalid_argument");
    }
    const size_t length = buffer->Length();
    release.set_bytes(static_cast<int64_t>(length));
    if (length > static_cast<size_t>(kMaxGrpcMessageBytes)) {
      buffer->Clear();
      // gRPC's own refusal has this code; the client sent too much, so it is
      // counted as invalid_argument, as the HTTP port's 413 is.
      return sessions.Refuse(
          absl::ResourceExhaustedError(absl::StrCat("request message of ", length,
                                                    " bytes is larger than the limit of ",
                                                    kMaxGrpcMessageBytes, " bytes")),
          "invalid_argument");
    }
    std::string bytes = ToString(*buffer);
    buffer->Clear();
    absl::StatusOr<Request> request = DecodeGenerateRequest(
        bytes, {.max_prompt_token_ids = sessions.prompt_source().config.max_position_embeddings});
    bytes = std::string();
    if (!request.ok()) return sessions.Refuse(request.status(), "invalid_argument");
    if (Gone()) return sessions.AbandonedBeforeStart(call_);
    absl::StatusOr<std::unique_ptr<RequestSession>> started = sessions.Start(*request, call_);
    if (!started.ok()) return started.status();
    RequestSession* const session = started->get();
    {
      absl::MutexLock lock(&session_mu_);
      session_ = session;
    }
    if (Gone()) session->Interrupt();  // OnCancel came before

    const std::string& id = request->request_id;
    // Under the session's lock: queues only.
    const SessionOutput output{.send =
                                   [this, &id](const Delta& delta) {
                                     if (delta.finished) {
                                       last_ = DeltaToProto(delta, id);  // with the status
                                       return true;
                                     }
                                     return Queue(DeltaToProto(delta, id));
                                   },
                               .flush = [this] { Flush(); }};
    // The generation calls this until it is destroyed, which the session
    // does before it goes.
    session->EnablePush([session, &output] { session->Pump(output); });
    const absl::Status status = session->Run(
        output, [this] { return Gone(); }, absl::InfiniteDuration());
    {
      absl::MutexLock lock(&session_mu_);
      session_ = nullptr;
    }
    started->reset();
    return status;
  }

  // Queues a response; false: the client is gone.
  bool Queue(v1::GenerateResponse response) {
    absl::MutexLock lock(&mu_);
    if (write_failed_ || cancelled_) return false;
    queue_.push_back(std::move(response));
    return true;
  }
  // Starts writing the next queued response unless a write is under way.
  void Flush() {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || !TakeNextWriteLocked()) return;
    }
    StartWrite(&response_);
  }
  // Moves the next queued response to response_ for a write (true), unless
  // there is none or no write may start.
  bool TakeNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queue_.empty() || write_failed_ || finishing_) return false;
    response_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    return true;
  }

  bool Gone() {
    absl::MutexLock lock(&mu_);
    return cancelled_ || write_failed_;
  }
  // True once OnCancel came, waiting up to `timeout` for it.
  bool AwaitCancelled(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&cancelled_), timeout);
  }
  bool WritesDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !writing_ && (queue_.empty() || write_failed_);
  }

  GrpcGenerationService* const service_;
  grpc::CallbackServerContext* const context_;  // gRPC's, valid until OnDone
  const grpc::ByteBuffer* const request_;       // gRPC's, valid until OnDone
  const CallInfo call_;
  std::atomic<int> refs_{2};  // the thread, and gRPC until OnDone
  // Written under the session's lock (send), read by the thread at the end.
  std::optional<v1::GenerateResponse> last_;
  absl::Mutex mu_;
  // The write under way: changed only while writing_ is false.
  v1::GenerateResponse response_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);  // not yet written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // The thread clears it before the session goes.
  absl::Mutex session_mu_;
  RequestSession* session_ ABSL_GUARDED_BY(session_mu_) = nullptr;
};

GrpcGenerationService::GrpcGenerationService(SessionManager* sessions) : sessions_(sessions) {
  MarkMethodCallback(
      0, new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, v1::GenerateResponse>(
             [this](grpc::CallbackServerContext* context, const grpc::ByteBuffer* request)
                 -> grpc::ServerWriteReactor<v1::GenerateResponse>* {
               auto* call = new Call(this, context, request);
               {
                 absl::MutexLock lock(&mu_);
                 ++threads_;
               }
               try {
                 std::thread([call] { call->Run(); }).detach();
               } catch (const std::system_error& e) {
                 // No thread: the call ends at once (OnDone deletes it).
                 call->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                           std::string("cannot start a thread: ") + e.what()));
                 call->Unref();  // the thread's reference
                 ThreadDone();
               }
               return call;
             }));
}

GrpcGenerationService::~GrpcGenerationService() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &GrpcGenerationService::NoThreadsLocked));
}

void GrpcGenerationService::ThreadDone() {
  absl::MutexLock lock(&mu_);
  --threads_;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GrpcGenerationService::Generate(
    grpc::CallbackServerContext*, const v1::GenerateRequest*) {
  return nullptr;  // never called; gRPC would answer UNIMPLEMENTED
}

}  // namespace pdserve::frontend
