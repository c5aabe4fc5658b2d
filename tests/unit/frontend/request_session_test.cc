// The request session against a scripted orchestration: what reaches the
// client, what the workers are told, and that every request is counted in
// pdserve_requests_total exactly once, however it ends.
#include "frontend/request_session.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "frontend/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/unit/frontend/fake_orchestrator.h"

namespace pdserve::frontend {
namespace {

using testing::Bytes;
using testing::FakeOrchestrator;
using testing::Finished;
using ::testing::HasSubstr;
using testing::Step;
using testing::Tokens;

class RequestSessionTest : public ::testing::Test {
 protected:
  RequestSessionTest() : metrics_(registry_) {
    source_.config.vocab_size = 300;
    source_.config.max_position_embeddings = 64;
    source_.tokenizer = std::make_unique<text::ByteTokenizer>(300);
  }

  std::unique_ptr<SessionManager> Manager(SessionOptions options = {}) {
    return std::make_unique<SessionManager>(std::move(options), &source_, &orchestrator_,
                                            &metrics_);
  }

  static Request TextRequest(const std::string& text, int max_tokens) {
    Request r;
    r.input = Request::Input::kText;
    r.text = text;
    r.sampling.max_tokens = max_tokens;
    return r;
  }

  // Runs a session to its end, collecting every delta.
  absl::Status Run(
      RequestSession& session, std::vector<Delta>* deltas,
      std::function<bool()> client_gone = [] { return false; }) {
    return RunSession(
        session,
        [&](const Delta& d) {
          deltas->push_back(d);
          return true;
        },
        client_gone, absl::Milliseconds(5));
  }

  double Requests(const std::string& label) {
    return metrics_.requests.Add({{"finish_reason", label}}).Value();
  }
  double Rejected(const std::string& reason) {
    return metrics_.rejected.Add({{"reason", reason}}).Value();
  }
  double TotalRequests() {
    double total = 0;
    for (const char* label :
         {"length", "stop", "context", "cancelled", "deadline", "error", "rejected"}) {
      total += Requests(label);
    }
    return total;
  }
  static uint64_t Count(prometheus::Histogram& h) { return h.Collect().histogram.sample_count; }

  prometheus::Registry registry_;
  ClientMetrics metrics_;
  PromptSource source_;
  FakeOrchestrator orchestrator_;
};

TEST_F(RequestSessionTest, StreamsDetokenizedDeltasThenTheLastMessage) {
  // "é" is two bytes: the first alone must not reach the client.
  orchestrator_.script = {
      Step{{Tokens(Bytes("h"))}},
      Step{{Tokens({0xC3})}},
      Step{{Tokens({0xA9, 'y'}), Finished(engine::FinishReason::kLength)}},
  };
  orchestrator_.script[0].events[0].queue_seconds = 0.25;
  auto manager = Manager();
  const CallInfo call{.arrival = absl::Now() - absl::Milliseconds(3)};
  auto session = manager->Start(TextRequest("hi", 4), call);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(manager->in_flight(), 1);
  ASSERT_EQ(orchestrator_.log.jobs.size(), 1u);
  EXPECT_EQ(orchestrator_.log.jobs[0].prompt, Bytes("hi"));
  EXPECT_EQ(orchestrator_.log.jobs[0].sampling.max_tokens, 4);

  std::vector<Delta> deltas;
  ASSERT_TRUE(Run(**session, &deltas).ok());
  ASSERT_EQ(deltas.size(), 4u);
  EXPECT_EQ(deltas[0].text, "h");
  EXPECT_EQ(deltas[1].text, "");
  EXPECT_EQ(deltas[1].token_ids, std::vector<int32_t>({0xC3}));
  EXPECT_EQ(deltas[2].text, "éy");
  EXPECT_FALSE(deltas[2].finished);
  const Delta& last = deltas[3];
  EXPECT_TRUE(last.finished);
  EXPECT_TRUE(last.token_ids.empty());
  EXPECT_EQ(last.finish_reason, engine::FinishReason::kLength);
  EXPECT_EQ(last.prompt_tokens, 2);
  EXPECT_EQ(last.completion_tokens, 4);
  EXPECT_GE(last.timings.queue_seconds, 0.25);
  EXPECT_GT(last.timings.time_to_first_token_seconds, 0);
  EXPECT_GE(last.timings.e2e_seconds, last.timings.time_to_first_token_seconds);
  EXPECT_EQ(last.timings.prefill_worker, "prefill-0");
  EXPECT_EQ(last.timings.decode_worker, "decode-0");

  EXPECT_TRUE((*session)->ended());
  EXPECT_EQ(manager->in_flight(), 0);
  EXPECT_EQ(Requests("length"), 1);
  EXPECT_EQ(TotalRequests(), 1);
  EXPECT_EQ(Count(metrics_.time_to_first_token), 1u);
  // Three deltas with tokens: two gaps, plus one zero for the token that
  // arrived with another.
  EXPECT_EQ(Count(metrics_.inter_token_latency), 3u);
  // One request, one mean gap: its value is the timings' mean.
  EXPECT_EQ(Count(metrics_.time_per_output_token), 1u);
  EXPECT_DOUBLE_EQ(metrics_.time_per_output_token.Collect().histogram.sample_sum,
                   last.timings.mean_inter_token_seconds);
  EXPECT_EQ(Count(metrics_.queue_time), 1u);
  EXPECT_EQ(Count(metrics_.e2e_latency), 1u);
  EXPECT_EQ(metrics_.generation_tokens.Value(), 4);
  EXPECT_EQ(metrics_.prompt_tokens.Value(), 2);
  EXPECT_EQ(metrics_.in_flight.Value(), 0);
  session->reset();
  EXPECT_EQ(orchestrator_.log.destroyed.load(), 1);
  EXPECT_EQ(TotalRequests(), 1);  // not counted again
}

TEST_F(RequestSessionTest, StopStringEndsTheRequestAndCancelsTheGeneration) {
  orchestrator_.script = {Step{{Tokens(Bytes("ab"))}}, Step{{Tokens(Bytes("cST"))}},
                          Step{{Tokens(Bytes("OPdef"))}}};
  auto manager = Manager();
  Request r = TextRequest("x", 20);
  r.stop = {"STOP"};
  auto session = manager->Start(r, {});
  ASSERT_TRUE(session.ok());
  std::vector<Delta> deltas;
  ASSERT_TRUE(Run(**session, &deltas).ok());
  std::string text;
  std::vector<int32_t> tokens;
  for (const Delta& d : deltas) {
    text += d.text;
    tokens.insert(tokens.end(), d.token_ids.begin(), d.token_ids.end());
  }
  EXPECT_EQ(text, "abc");
  // Tokens up to the one that completed the stop string.
  EXPECT_EQ(tokens, Bytes("abcSTOP"));
  EXPECT_EQ(deltas.back().finish_reason, engine::FinishReason::kStop);
  EXPECT_EQ(deltas.back().matched_stop, "STOP");
  EXPECT_EQ(deltas.back().completion_tokens, 7);
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
  EXPECT_EQ(Requests("stop"), 1);
  EXPECT_EQ(TotalRequests(), 1);
}

TEST_F(RequestSessionTest, LogprobsOnlyWhenAsked) {
  orchestrator_.script = {
      Step{{Tokens(Bytes("ab"), /*with_logprobs=*/true), Finished(engine::FinishReason::kLength)}}};
  auto manager = Manager();
  for (int logprobs : {-1, 2}) {
    Request r = TextRequest("x", 2);
    r.sampling.logprobs = logprobs;
    auto session = manager->Start(r, {});
    ASSERT_TRUE(session.ok());
    std::vector<Delta> deltas;
    ASSERT_TRUE(Run(**session, &deltas).ok());
    EXPECT_EQ(deltas[0].logprobs.size(), logprobs < 0 ? 0u : 2u);
    if (logprobs >= 0) {
      EXPECT_EQ(deltas[0].logprobs[1].logprob, -2.0f);
    }
  }
}

TEST_F(RequestSessionTest, EveryRefusalIsCountedOnceWithItsReason) {
  auto manager = Manager({.max_in_flight = 1});
  // Invalid input, named.
  auto bad = manager->Start(TextRequest("", 4), {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorField(bad.status()), "text");
  // Capacity: one session holds the only slot.
  orchestrator_.script = {};
  auto held = manager->Start(TextRequest("a", 4), {});
  ASSERT_TRUE(held.ok());
  auto full = manager->Start(TextRequest("a", 4), {});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  held->reset();  // the client left: counted as cancelled
  // The orchestration's refusals: with a reason, and by code.
  orchestrator_.refusal =
      WithRejectReason(absl::UnavailableError("no live decode worker"), "no_decode_worker");
  EXPECT_EQ(manager->Start(TextRequest("a", 4), {}).status().code(),
            absl::StatusCode::kUnavailable);
  orchestrator_.refusal = absl::ResourceExhaustedError("every decode worker refused");
  EXPECT_EQ(manager->Start(TextRequest("a", 4), {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  orchestrator_.refusal = absl::OkStatus();
  // Draining.
  manager->SetDraining(true);
  auto draining = manager->Start(TextRequest("a", 4), {});
  EXPECT_EQ(draining.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(draining.status().message(), HasSubstr("router is draining"));
  // A refusal the adapter made itself.
  EXPECT_EQ(manager->Refuse(absl::InvalidArgumentError("not JSON"), "invalid_argument").code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(Rejected("invalid_argument"), 2);
  EXPECT_EQ(Rejected("capacity"), 1);
  EXPECT_EQ(Rejected("no_decode_worker"), 1);
  EXPECT_EQ(Rejected("resource_exhausted"), 1);
  EXPECT_EQ(Rejected("draining"), 1);
  EXPECT_EQ(Requests("rejected"), 6);
  EXPECT_EQ(Requests("cancelled"), 1);
  EXPECT_EQ(TotalRequests(), 7);
  EXPECT_EQ(manager->in_flight(), 0);
  EXPECT_EQ(metrics_.in_flight.Value(), 0);
}

TEST_F(RequestSessionTest, DeadlineCancelsTheGenerationAndIsCountedAsDeadline) {
  orchestrator_.script = {Step{{Tokens(Bytes("a"))}}};  // then silence
  auto manager = Manager();
  const absl::Time now = absl::Now();
  auto session = manager->Start(TextRequest("x", 8),
                                {.arrival = now, .deadline = now + absl::Milliseconds(60)});
  ASSERT_TRUE(session.ok());
  EXPECT_EQ(orchestrator_.log.jobs[0].deadline, now + absl::Milliseconds(60));
  std::vector<Delta> deltas;
  absl::Status status = Run(**session, &deltas);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(deltas.size(), 1u);
  EXPECT_GE(absl::Now(), now + absl::Milliseconds(60));
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
  EXPECT_EQ(Requests("deadline"), 1);
  EXPECT_EQ(Requests("cancelled"), 0);
  EXPECT_EQ(TotalRequests(), 1);
}

TEST_F(RequestSessionTest, ClientGoneIsCancelled) {
  orchestrator_.script = {Step{{Tokens(Bytes("a"))}}};
  auto manager = Manager();
  // The client leaves while the generation is silent.
  auto session = manager->Start(TextRequest("x", 8), {});
  ASSERT_TRUE(session.ok());
  std::vector<Delta> deltas;
  absl::Status status = Run(**session, &deltas, [&] { return !deltas.empty(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  // A write that fails.
  auto second = manager->Start(TextRequest("x", 8), {});
  ASSERT_TRUE(second.ok());
  status = RunSession(
      **second, [](const Delta&) { return false; }, [] { return false; }, absl::Milliseconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  // A client that left before the first output.
  auto third = manager->Start(TextRequest("x", 8), {});
  ASSERT_TRUE(third.ok());
  status = Run(**third, &deltas, [] { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);

  EXPECT_EQ(orchestrator_.log.cancelled.load(), 3);
  EXPECT_EQ(Requests("cancelled"), 3);
  EXPECT_EQ(TotalRequests(), 3);
  EXPECT_EQ(manager->in_flight(), 0);
}

TEST_F(RequestSessionTest, GenerationFailureIsAnErrorAfterItsTokens) {
  orchestrator_.script = {Step{{Tokens(Bytes("ab"))}},
                          Step{{}, absl::UnavailableError("decode failed: worker went away")}};
  auto manager = Manager();
  auto session = manager->Start(TextRequest("x", 8), {});
  ASSERT_TRUE(session.ok());
  std::vector<Delta> deltas;
  absl::Status status = Run(**session, &deltas);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("decode failed"));
  ASSERT_EQ(deltas.size(), 1u);
  EXPECT_EQ(deltas[0].text, "ab");
  EXPECT_EQ(Requests("error"), 1);
  EXPECT_EQ(TotalRequests(), 1);
}

TEST_F(RequestSessionTest, CallsAbandonedBeforeTheirRequestAreCounted) {
  auto manager = Manager();
  EXPECT_EQ(manager->AbandonedBeforeStart({}).code(), absl::StatusCode::kCancelled);
  const absl::Time now = absl::Now();
  EXPECT_EQ(manager->AbandonedBeforeStart({.arrival = now, .deadline = now}).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Requests("cancelled"), 1);
  EXPECT_EQ(Requests("deadline"), 1);
  EXPECT_EQ(TotalRequests(), 2);
}

TEST_F(RequestSessionTest, StartPastTheDeadlineIsDeadlineNotRejected) {
  orchestrator_.refusal = absl::DeadlineExceededError("deadline");
  auto manager = Manager();
  auto session = manager->Start(TextRequest("x", 8), {});
  EXPECT_EQ(session.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Requests("deadline"), 1);
  EXPECT_EQ(TotalRequests(), 1);
}

// gRPC ends the workers' calls at the deadline on its own clock, a little
// ahead of absl::Now() at times: what fails in the last few milliseconds
// (a retry refused for want of room, say) is the deadline's, not a refusal.
TEST_F(RequestSessionTest, RefusalsRightBeforeTheDeadlineAreCountedAsDeadline) {
  orchestrator_.refusal = WithRejectReason(absl::ResourceExhaustedError("no room"), "overloaded");
  auto manager = Manager();
  absl::Time now = absl::Now();
  auto refused = manager->Start(TextRequest("x", 8),
                                {.arrival = now, .deadline = now + absl::Milliseconds(2)});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded);

  orchestrator_.refusal = absl::OkStatus();
  orchestrator_.script = {
      Step{{}, WithRejectReason(absl::ResourceExhaustedError("no room"), "overloaded")}};
  now = absl::Now();
  auto session = manager->Start(TextRequest("x", 8),
                                {.arrival = now, .deadline = now + absl::Milliseconds(2)});
  ASSERT_TRUE(session.ok()) << session.status();
  std::vector<Delta> deltas;
  EXPECT_EQ(Run(**session, &deltas).code(), absl::StatusCode::kDeadlineExceeded);

  EXPECT_EQ(Requests("deadline"), 2);
  EXPECT_EQ(Requests("rejected"), 0);
  EXPECT_EQ(Rejected("overloaded"), 0);
  EXPECT_EQ(TotalRequests(), 2);

  // Far from the deadline they are refusals, as before.
  orchestrator_.script = {
      Step{{}, WithRejectReason(absl::ResourceExhaustedError("no room"), "overloaded")}};
  now = absl::Now();
  auto early =
      manager->Start(TextRequest("x", 8), {.arrival = now, .deadline = now + absl::Seconds(600)});
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_EQ(Run(**early, &deltas).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Requests("rejected"), 1);
  EXPECT_EQ(Rejected("overloaded"), 1);
}

TEST_F(RequestSessionTest, SeedIsResolvedOnceAndKeptWhenGiven) {
  orchestrator_.script = {Step{{Finished(engine::FinishReason::kStop)}}};
  auto manager = Manager();
  Request r = TextRequest("x", 8);
  ASSERT_TRUE(manager->Start(r, {}).ok());
  ASSERT_TRUE(manager->Start(r, {}).ok());
  r.seed = 42;
  ASSERT_TRUE(manager->Start(r, {}).ok());
  ASSERT_EQ(orchestrator_.log.jobs.size(), 3u);
  EXPECT_NE(orchestrator_.log.jobs[0].sampling.seed, orchestrator_.log.jobs[1].sampling.seed);
  EXPECT_EQ(orchestrator_.log.jobs[2].sampling.seed, 42u);
}

// --- Waking: event-driven, never polled -------------------------------------

// Runs a session on a thread of its own, as an adapter does, with no poll
// (InfiniteDuration): it must sleep until something happens. With `push`,
// in push mode: a generation's ready callback pumps on the thread that fed
// it.
class SessionThread {
 public:
  explicit SessionThread(RequestSession& session, bool push = false)
      : output_{.send =
                    [this](const Delta& d) {
                      absl::MutexLock lock(&mu_);
                      deltas_.push_back(d);
                      senders_.push_back(std::this_thread::get_id());
                      return accept_;
                    }},
        push_(push && session.EnablePush([this, &session] { session.Pump(output_); })),
        thread_([this, &session] {
          status_ = session.Run(
              output_,
              [this] {
                gone_checks_.fetch_add(1);
                return false;
              },
              absl::InfiniteDuration());
        }) {}
  ~SessionThread() { Join().IgnoreError(); }

  absl::Status Join() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  // Blocks until `n` deltas were sent.
  void AwaitDeltas(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return deltas_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
  }
  std::vector<Delta> deltas() {
    absl::MutexLock lock(&mu_);
    return deltas_;
  }
  std::vector<std::thread::id> senders() {
    absl::MutexLock lock(&mu_);
    return senders_;
  }
  std::thread::id id() const { return thread_.get_id(); }
  void RefuseDeltas() {
    absl::MutexLock lock(&mu_);
    accept_ = false;
  }
  int gone_checks() const { return gone_checks_.load(); }
  bool push() const { return push_; }

 private:
  absl::Mutex mu_;
  std::vector<Delta> deltas_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> senders_ ABSL_GUARDED_BY(mu_);
  bool accept_ ABSL_GUARDED_BY(mu_) = true;
  std::atomic<int> gone_checks_{0};
  const SessionOutput output_;
  const bool push_;
  absl::Status status_;
  std::thread thread_;  // last: runs with everything above
};

// Time a poller would have used to wake several times (20 ms polls); the
// assertions are on counts, not on time.
constexpr absl::Duration kIdle = absl::Milliseconds(150);

TEST_F(RequestSessionTest, InterruptEndsAWaitingSessionAtOnceWithoutPolling) {
  auto manager = Manager();
  auto session = manager->Start(TextRequest("x", 8), {});  // a silent generation
  ASSERT_TRUE(session.ok());
  SessionThread runner(**session);
  orchestrator_.generations[0]->AwaitWaiting();
  absl::SleepFor(kIdle);
  EXPECT_EQ(orchestrator_.log.next_calls.load(), 1);
  (*session)->Interrupt();  // e.g. gRPC's OnCancel, on another thread
  EXPECT_EQ(runner.Join().code(), absl::StatusCode::kCancelled);
  // One wait, ended by the interrupt; the client was asked once, up front.
  EXPECT_EQ(orchestrator_.log.next_calls.load(), 1);
  EXPECT_EQ(runner.gone_checks(), 1);
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
  EXPECT_EQ(Requests("cancelled"), 1);
  EXPECT_EQ(TotalRequests(), 1);
  EXPECT_EQ(manager->in_flight(), 0);
  (*session)->Interrupt();  // after the end: nothing
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
}

TEST_F(RequestSessionTest, PassedDeadlineEndsAWaitingSessionWithoutPolling) {
  auto manager = Manager();
  const absl::Time now = absl::Now();
  auto session = manager->Start(TextRequest("x", 8),
                                {.arrival = now, .deadline = now + absl::Milliseconds(300)});
  ASSERT_TRUE(session.ok());
  SessionThread runner(**session);
  EXPECT_EQ(runner.Join().code(), absl::StatusCode::kDeadlineExceeded);
  // The wait ends at the deadline (a second one covers a wait that woke a
  // hair early); 20 ms polls would have made about 15 calls.
  EXPECT_LE(orchestrator_.log.next_calls.load(), 2);
  EXPECT_LE(runner.gone_checks(), 2);
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
  EXPECT_EQ(Requests("deadline"), 1);
  EXPECT_EQ(TotalRequests(), 1);
}

TEST_F(RequestSessionTest, SlowStreamWakesTheSessionOncePerToken) {
  auto manager = Manager();
  auto session = manager->Start(TextRequest("x", 8), {});
  ASSERT_TRUE(session.ok());
  SessionThread runner(**session);
  testing::FakeGeneration& generation = *orchestrator_.generations[0];
  for (size_t i = 1; i <= 3; ++i) {
    generation.AwaitWaiting();
    absl::SleepFor(kIdle);  // an idle stream between tokens
    generation.Push({{Tokens(Bytes("a"))}});
    runner.AwaitDeltas(i);
  }
  generation.AwaitWaiting();
  // One wait per token, plus the one under way now.
  EXPECT_EQ(orchestrator_.log.next_calls.load(), 4);
  generation.Push({{Finished(engine::FinishReason::kLength)}});
  EXPECT_TRUE(runner.Join().ok());
  EXPECT_EQ(orchestrator_.log.next_calls.load(), 4);
  EXPECT_EQ(runner.gone_checks(), 1);
  ASSERT_EQ(runner.deltas().size(), 4u);
  EXPECT_TRUE(runner.deltas().back().finished);
  EXPECT_EQ(runner.deltas().back().completion_tokens, 3);
  EXPECT_EQ(Requests("length"), 1);
}

TEST_F(RequestSessionTest, PushModeRelaysTokensWithoutWakingTheSessionThread) {
  orchestrator_.push = true;
  auto manager = Manager();
  auto session = manager->Start(TextRequest("x", 8), {});
  ASSERT_TRUE(session.ok());
  SessionThread runner(**session, /*push=*/true);
  ASSERT_TRUE(runner.push());
  testing::FakeGeneration& generation = *orchestrator_.generations[0];
  generation.AwaitWaiting();
  for (const char* piece : {"ab", "c", "de"}) {
    absl::SleepFor(absl::Milliseconds(20));
    generation.Push({{Tokens(Bytes(piece))}});  // relayed on this thread
  }
  ASSERT_EQ(runner.deltas().size(), 3u);
  EXPECT_EQ(runner.deltas()[0].text, "ab");
  EXPECT_EQ(runner.deltas()[2].text, "de");
  for (std::thread::id sender : runner.senders()) EXPECT_EQ(sender, std::this_thread::get_id());
  EXPECT_EQ(orchestrator_.log.next_calls.load(), 1);  // still the first wait
  // The end wakes the session's thread, which sends the last delta.
  const std::thread::id session_thread = runner.id();
  generation.Push({{Finished(engine::FinishReason::kLength)}});
  EXPECT_TRUE(runner.Join().ok());
  ASSERT_EQ(runner.deltas().size(), 4u);
  EXPECT_TRUE(runner.deltas()[3].finished);
  EXPECT_EQ(runner.deltas()[3].completion_tokens, 5);
  EXPECT_EQ(runner.senders()[3], session_thread);
  EXPECT_LE(orchestrator_.log.next_calls.load(), 2);
  EXPECT_EQ(metrics_.generation_tokens.Value(), 5);
  EXPECT_EQ(Count(metrics_.time_to_first_token), 1u);
  EXPECT_EQ(Count(metrics_.inter_token_latency), 4u);  // two gaps, two shared
  EXPECT_EQ(Requests("length"), 1);
  EXPECT_EQ(TotalRequests(), 1);
}

TEST_F(RequestSessionTest, PushModeStopStringIsFinishedByTheSessionThread) {
  orchestrator_.push = true;
  auto manager = Manager();
  Request r = TextRequest("x", 20);
  r.stop = {"STOP"};
  auto session = manager->Start(r, {});
  ASSERT_TRUE(session.ok());
  SessionThread runner(**session, /*push=*/true);
  ASSERT_TRUE(runner.push());
  testing::FakeGeneration& generation = *orchestrator_.generations[0];
  generation.AwaitWaiting();
  generation.Push({{Tokens(Bytes("abST"))}});
  generation.Push({{Tokens(Bytes("OPxy"))}});  // completes the stop string: cancels
  EXPECT_TRUE(runner.Join().ok());
  const std::vector<Delta> deltas = runner.deltas();
  std::string text;
  for (const Delta& d : deltas) text += d.text;
  EXPECT_EQ(text, "ab");
  EXPECT_EQ(deltas.back().finish_reason, engine::FinishReason::kStop);
  EXPECT_EQ(deltas.back().matched_stop, "STOP");
  EXPECT_EQ(deltas.back().completion_tokens, 6);
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
  EXPECT_EQ(Requests("stop"), 1);
  EXPECT_EQ(TotalRequests(), 1);
}

TEST_F(RequestSessionTest, PushModeRefusedDeltaEndsTheRequestAsCancelled) {
  orchestrator_.push = true;
  auto manager = Manager();
  auto session = manager->Start(TextRequest("x", 8), {});
  ASSERT_TRUE(session.ok());
  SessionThread runner(**session, /*push=*/true);
  ASSERT_TRUE(runner.push());
  testing::FakeGeneration& generation = *orchestrator_.generations[0];
  generation.AwaitWaiting();
  runner.RefuseDeltas();  // the client's connection failed
  generation.Push({{Tokens(Bytes("a"))}});
  EXPECT_EQ(runner.Join().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(orchestrator_.log.cancelled.load(), 1);
  EXPECT_EQ(Requests("cancelled"), 1);
  EXPECT_EQ(TotalRequests(), 1);
  EXPECT_EQ(manager->in_flight(), 0);
}

}  // namespace
}  // namespace pdserve::frontend
