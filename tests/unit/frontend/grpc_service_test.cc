// The gRPC adapter (frontend/grpc_service.h) on a loopback server over a
// scripted orchestration: tokens fed to a generation reach the client in
// order and the last message comes with the status; a client that cancels,
// or a deadline that passes, ends the session at once (gRPC's OnCancel, no
// polling: the session's thread wakes once); and in push mode the tokens
// are relayed without waking the session's thread at all. A call that
// brings no request message is counted for how it ended: as the deadline
// or cancellation that cut it short, or refused as invalid when the client
// closed its side without one.
#include "frontend/grpc_service.h"

#include <grpcpp/generic/generic_stub.h>

#include <memory>

#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/unit/frontend/fake_orchestrator.h"

namespace pdserve::frontend {
namespace {

using testing::Bytes;
using testing::FakeGeneration;
using testing::FakeOrchestrator;
using testing::Finished;
using testing::Tokens;

class GrpcServiceTest : public ::testing::TestWithParam<bool> {
 protected:
  GrpcServiceTest() : metrics_(registry_) {
    source_.config.vocab_size = 300;
    source_.config.max_position_embeddings = 64;
    source_.tokenizer = std::make_unique<text::ByteTokenizer>(300);
    orchestrator_.push = GetParam();
    sessions_ =
        std::make_unique<SessionManager>(SessionOptions{}, &source_, &orchestrator_, &metrics_);
    service_ = std::make_unique<GrpcGenerationService>(sessions_.get());
    auto server = StartGrpcServer("127.0.0.1", 0, {service_.get()});
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(server->server);
    channel_ = grpc::CreateChannel(JoinHostPort("127.0.0.1", server->port),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Generation::NewStub(channel_);
  }
  ~GrpcServiceTest() override {
    server_->Shutdown();
    service_.reset();  // waits for the calls' threads
  }

  static v1::GenerateRequest TextRequest(const std::string& text, int max_tokens) {
    v1::GenerateRequest r;
    r.set_text(text);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    return r;
  }
  // The generation of the `i`-th request, once started; its session's
  // thread is then asleep in Next.
  FakeGeneration& Generation(int i) {
    for (int k = 0; k < 2000 && orchestrator_.log.started.load() <= i; ++k) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_GT(orchestrator_.log.started.load(), i);
    FakeGeneration& generation = *orchestrator_.generations[i];
    generation.AwaitWaiting();
    return generation;
  }
  double Requests(const std::string& label) {
    return metrics_.requests.Add({{"finish_reason", label}}).Value();
  }
  // Waits (bounded) until `label` was counted once: the server counts a
  // request when its session ends, which may follow the client's status.
  bool AwaitCounted(const std::string& label) {
    for (int k = 0; k < 2000 && Requests(label) < 1; ++k) absl::SleepFor(absl::Milliseconds(5));
    return Requests(label) == 1;
  }

  // A raw Generate call that sends no request message: with `half_close`
  // the client closes its side at once; otherwise the call waits for its
  // deadline. Returns the status the client got.
  grpc::Status CallWithoutAMessage(bool half_close, absl::Duration deadline) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        stub.PrepareCall(&context, "/pdserve.v1.Generation/Generate", &cq);
    void* tag = nullptr;
    bool ok = false;
    // One operation at a time, each awaited before the next.
    auto await = [&] { EXPECT_TRUE(cq.Next(&tag, &ok)); };
    call->StartCall(nullptr);
    await();
    if (half_close) {
      call->WritesDone(nullptr);
      await();
    }
    grpc::ByteBuffer response;
    call->Read(&response, nullptr);
    await();
    EXPECT_FALSE(ok) << "a response message came";
    grpc::Status status;
    call->Finish(&status, nullptr);
    await();
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  }

  prometheus::Registry registry_;
  ClientMetrics metrics_;
  PromptSource source_;
  FakeOrchestrator orchestrator_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<GrpcGenerationService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_P(GrpcServiceTest, StreamsTokensInOrderAndTheLastMessageWithTheStatus) {
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, TextRequest("hi", 8));
  FakeGeneration& generation = Generation(0);
  std::string text;
  v1::GenerateResponse response;
  for (const char* piece : {"ab", "c", "de"}) {
    generation.Push({{Tokens(Bytes(piece))}});
    ASSERT_TRUE(reader->Read(&response));
    EXPECT_EQ(response.text(), piece);
    EXPECT_EQ(response.token_ids_size(), static_cast<int>(std::string(piece).size()));
  }
  generation.Push({{Tokens(Bytes("f")), Finished(engine::FinishReason::kLength)}});
  while (reader->Read(&response)) text += response.text();
  EXPECT_EQ(text, "f");
  EXPECT_EQ(response.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(response.usage().completion_tokens(), 6);
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(AwaitCounted("length"));
  if (GetParam()) {
    // Push mode: the session's thread woke once, for the end.
    EXPECT_LE(orchestrator_.log.next_calls.load(), 2);
  } else {
    EXPECT_LE(orchestrator_.log.next_calls.load(), 5);  // one per batch, one for the end
  }
}

TEST_P(GrpcServiceTest, ClientThatCancelsEndsTheSessionAtOnce) {
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, TextRequest("hi", 8));
  FakeGeneration& generation = Generation(0);
  generation.Push({{Tokens(Bytes("a"))}});
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  generation.AwaitWaiting();
  const int calls = orchestrator_.log.next_calls.load();
  context.TryCancel();
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(AwaitCounted("cancelled"));
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
  // The wait under way was ended by OnCancel; no poll woke the thread.
  EXPECT_EQ(orchestrator_.log.next_calls.load(), calls);
  EXPECT_EQ(sessions_->in_flight(), 0);
}

TEST_P(GrpcServiceTest, DeadlineEndsASilentStreamAtOnce) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
  auto reader = stub_->Generate(&context, TextRequest("hi", 8));
  Generation(0);
  v1::GenerateResponse response;
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(AwaitCounted("deadline"));
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
  // One wait, ended by the deadline (or by gRPC's cancel at it): no polls.
  EXPECT_LE(orchestrator_.log.next_calls.load(), 2);
}

TEST_P(GrpcServiceTest, CallWhoseDeadlineCameBeforeItsMessageIsCountedAsDeadline) {
  const grpc::Status status = CallWithoutAMessage(/*half_close=*/false, absl::Milliseconds(300));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_TRUE(AwaitCounted("deadline"));
  EXPECT_EQ(Requests("rejected"), 0);
  EXPECT_EQ(orchestrator_.log.started.load(), 0);
  EXPECT_EQ(sessions_->in_flight(), 0);
}

TEST_P(GrpcServiceTest, CallClosedWithoutAMessageIsRefusedAsInvalid) {
  const grpc::Status status = CallWithoutAMessage(/*half_close=*/true, absl::Seconds(60));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("no request message"), std::string::npos)
      << status.error_message();
  EXPECT_TRUE(AwaitCounted("rejected"));
  EXPECT_EQ(metrics_.rejected.Add({{"reason", "invalid_argument"}}).Value(), 1);
  EXPECT_EQ(orchestrator_.log.started.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(ThreadAndPushMode, GrpcServiceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Push" : "Thread";
                         });

}  // namespace
}  // namespace pdserve::frontend
