// DisaggregatedOrchestrator's fault handling against scripted in-process
// workers (gRPC on loopback, no model): a prefill that fails is retried with
// a new decode reservation, a decode stream cut mid-way migrates with the
// relayed tokens as the continuation's generated tokens (no gap, no
// repeat) unless its last token ended the run, a stream on a worker judged
// hung or gone migrates while a merely slow one is left alone, a short
// deadline never takes a worker out of service, a worker without room
// queues the request instead of failing it, and the attempts are bounded.
// The scripted "model" generates token 10 + i at generated position i, so
// any gap or repeat shows in the stream. Every test runs twice: read with
// Next alone, and in push mode (the ready callback and Poll, as the gRPC
// adapter reads it).
#include <atomic>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "frontend/errors.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "router/disaggregated_orchestrator.h"

namespace pdserve::router {
namespace {

int32_t TokenAt(int position) { return 10 + position; }

// Accepts each Prefill, then answers with the token after the job's
// generated ones, or with UNAVAILABLE while the failures shared by every
// fake prefill last. While `silent` holds, a call is never accepted (the
// worker takes the call and says nothing until cancelled).
class FakePrefill final : public internal::v1::PrefillWorker::Service {
 public:
  FakePrefill(std::atomic<int>* failures, std::atomic<int>* silent)
      : failures_(failures), silent_(silent) {}
  grpc::Status Prefill(grpc::ServerContext* context, const internal::v1::PrefillJob* job,
                       grpc::ServerWriter<internal::v1::PrefillEvent>* writer) override {
    {
      absl::MutexLock lock(&mu);
      jobs.push_back(*job);
    }
    if (silent_->fetch_sub(1) > 0) {
      while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    if (failures_->fetch_sub(1) > 0) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scripted prefill failure");
    }
    absl::SleepFor(accept_delay);
    internal::v1::PrefillEvent event;
    event.mutable_accepted();
    writer->Write(event);
    event.mutable_result()->set_first_token_id(TokenAt(job->generated_token_ids_size()));
    writer->Write(event);
    return grpc::Status::OK;
  }
  absl::Mutex mu;
  std::vector<internal::v1::PrefillJob> jobs ABSL_GUARDED_BY(mu);
  absl::Duration accept_delay = absl::ZeroDuration();  // set before the calls

 private:
  std::atomic<int>* const failures_;
  std::atomic<int>* const silent_;
};

// kPause: the stream stops for `pause_for` after kCutAfter tokens, then
// goes on (a slow worker, not a dead one).
enum class Fault { kNone, kCut, kSilent, kPause, kFull };

// Reserves (after `reserve_delay`), then streams the tokens after the
// prefill's (one per message) and finishes. While the faults shared by
// every fake decode last, a call is cut (UNAVAILABLE), goes silent or pauses
// after `kCutAfter` tokens, or is refused for lack of room (kFull).
class FakeDecode final : public internal::v1::DecodeWorker::Service {
 public:
  static constexpr int kCutAfter = 3;
  FakeDecode(Fault* kind, std::atomic<int>* faults, const absl::Duration* pause)
      : kind_(kind), faults_(faults), pause_(pause) {}
  grpc::Status Decode(grpc::ServerContext* context, const internal::v1::DecodeJob* job,
                      grpc::ServerWriter<internal::v1::DecodeEvent>* writer) override {
    {
      absl::MutexLock lock(&mu);
      jobs.push_back(*job);
    }
    const Fault fault = faults_->fetch_sub(1) > 0 ? *kind_ : Fault::kNone;
    if (fault == Fault::kFull) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "scripted: no free KV blocks");
    }
    absl::SleepFor(reserve_delay);
    internal::v1::DecodeEvent reserved;
    reserved.mutable_reserved()->mutable_kv_target()->set_endpoint("tcp://127.0.0.1:1");
    writer->Write(reserved);
    // A real decode worker streams only once the KV and the first token
    // came from the prefill worker, which has answered the router by then.
    if (fault != Fault::kNone) absl::SleepFor(kv_delay);
    const int max_tokens = job->sampling().max_tokens();
    int sent = 0;
    for (int i = job->generated_token_ids_size() + 1; i < max_tokens; ++i) {
      if (fault != Fault::kNone && sent == kCutAfter) {
        if (fault == Fault::kCut) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scripted worker death");
        }
        if (fault == Fault::kPause) {
          absl::SleepFor(pause_for);
        } else {
          while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
          return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
        }
      }
      absl::SleepFor(*pause_);
      internal::v1::DecodeEvent tokens;
      tokens.mutable_tokens()->add_token_ids(TokenAt(i));
      if (!writer->Write(tokens)) return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
      ++sent;
    }
    internal::v1::DecodeEvent finished;
    finished.mutable_finished()->set_finish_reason(1);  // length
    writer->Write(finished);
    return grpc::Status::OK;
  }
  absl::Mutex mu;
  std::vector<internal::v1::DecodeJob> jobs ABSL_GUARDED_BY(mu);
  absl::Duration reserve_delay = absl::ZeroDuration();
  // Before a faulty stream's first token (the KV transfer's time).
  absl::Duration kv_delay = absl::Milliseconds(100);
  absl::Duration pause_for = absl::Seconds(1);

 private:
  const Fault* const kind_;
  std::atomic<int>* const faults_;
  const absl::Duration* const pause_;  // before each token
};

// The parameter: whether Generate reads in push mode.
class OrchestratorFaultTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    push_ = GetParam();
    for (int i = 0; i < 2; ++i) {
      prefills_.push_back(std::make_unique<FakePrefill>(&prefill_failures_, &prefill_silent_));
      decodes_.push_back(
          std::make_unique<FakeDecode>(&decode_fault_, &decode_faults_, &decode_pause_));
    }
    for (int i = 0; i < 2; ++i) {
      Serve(prefills_[i].get(), Role::kPrefill, "prefill" + std::to_string(i));
      Serve(decodes_[i].get(), Role::kDecode, "decode" + std::to_string(i));
    }
  }
  void TearDown() override {
    for (auto& s : servers_) s.server->Shutdown();
  }

  void Serve(grpc::Service* service, Role role, const std::string& id) {
    auto server = StartGrpcServer("127.0.0.1", 0, {service});
    ASSERT_TRUE(server.ok()) << server.status();
    WorkerDesc desc{.id = id,
                    .role = role,
                    .address = JoinHostPort("127.0.0.1", server->port),
                    .kv_endpoint = role == Role::kDecode ? "tcp://127.0.0.1:1" : "",
                    .kv_block_size = 16};
    ASSERT_TRUE(registry_.Register(desc, {}, absl::Now()).ok());
    servers_.push_back(std::move(*server));
  }

  struct Run {
    absl::Status status;
    std::vector<int32_t> tokens;
    bool finished = false;
    engine::FinishReason finish_reason = engine::FinishReason::kNone;
    int next_calls = 0;
    int callbacks = 0;  // push mode: ready callbacks
  };
  // Starts a job and reads it to its end (bounded). With push_, in push
  // mode, as the gRPC adapter reads it: the ready callback polls on the
  // gRPC thread, Next (with long waits: events must end them) only for what
  // else comes, and a Poll after each Next; `mu` serializes the polls as the
  // session's lock does.
  Run Generate(DisaggregatedOrchestrator& orchestrator, int max_tokens,
               engine::SamplingParams sampling = {}, absl::Duration deadline = absl::Seconds(20)) {
    frontend::GenerationJob job{.request_id = "r", .prompt = {1, 2, 3}};
    job.sampling = std::move(sampling);
    job.sampling.max_tokens = max_tokens;
    job.deadline = absl::Now() + deadline;
    Run run;
    auto generation = orchestrator.Start(job);
    if (!generation.ok()) {
      run.status = generation.status();
      return run;
    }
    frontend::Generation* const g = generation->get();
    absl::Mutex mu;
    std::vector<frontend::GenerationEvent> polled;
    int callbacks = 0;
    if (push_) {
      EXPECT_TRUE(g->SetReadyCallback([&] {
        absl::MutexLock lock(&mu);
        g->Poll(&polled);
        ++callbacks;
      }));
    }
    const absl::Duration wait = push_ ? absl::Seconds(5) : absl::Milliseconds(50);
    while (!run.finished && absl::Now() < job.deadline) {
      std::vector<frontend::GenerationEvent> events;
      run.status = g->Next(wait, &events);
      ++run.next_calls;
      if (push_) {
        EXPECT_TRUE(events.empty()) << "push mode: Next appends nothing";
        absl::MutexLock lock(&mu);
        g->Poll(&polled);
        events = std::exchange(polled, {});
        run.callbacks = callbacks;
      }
      for (const auto& e : events) {
        run.tokens.insert(run.tokens.end(), e.tokens.begin(), e.tokens.end());
        run.finished |= e.finished;
        if (e.finished) run.finish_reason = e.finish_reason;
      }
      if (!run.status.ok()) break;
    }
    generation->reset();  // waits for the calls, and so for the callbacks
    return run;
  }
  static std::vector<int32_t> Expected(int n) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(TokenAt(i));
    return out;
  }
  double Series(const std::string& series) {
    const std::string text = prometheus::TextSerializer().Serialize(metrics_registry_.Collect());
    const size_t at = text.find(series + " ");
    return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 1));
  }
  int PrefillCalls() {
    int n = 0;
    for (auto& p : prefills_) {
      absl::MutexLock lock(&p->mu);
      n += static_cast<int>(p->jobs.size());
    }
    return n;
  }
  int DecodeCalls() {
    int n = 0;
    for (auto& d : decodes_) {
      absl::MutexLock lock(&d->mu);
      n += static_cast<int>(d->jobs.size());
    }
    return n;
  }

  // The decode worker that holds a call (the first fake with a job).
  std::string BusyDecodeId() {
    for (size_t i = 0; i < decodes_.size(); ++i) {
      absl::MutexLock lock(&decodes_[i]->mu);
      if (!decodes_[i]->jobs.empty()) return "decode" + std::to_string(i);
    }
    return "";
  }
  // Heartbeats `id` every 50 ms with work and a step count that moves when
  // `progressing`, until `stop`.
  std::thread Heartbeats(const std::string& id, bool progressing, std::atomic<bool>* stop) {
    return std::thread([this, id, progressing, stop] {
      uint64_t steps = 0;
      while (!stop->load()) {
        if (progressing) ++steps;
        registry_.Heartbeat(id, {.progress = steps, .has_work = true}, absl::Now());
        absl::SleepFor(absl::Milliseconds(50));
      }
    });
  }

  std::atomic<int> prefill_failures_{0};  // the next this many Prefill calls fail
  std::atomic<int> prefill_silent_{0};    // the next this many are never accepted
  Fault decode_fault_ = Fault::kNone;
  std::atomic<int> decode_faults_{0};  // the next this many Decode calls get decode_fault_
  absl::Duration decode_pause_ = absl::Milliseconds(2);  // before each decode token
  bool push_ = false;  // Generate reads in push mode (the parameter)
  WorkerRegistry registry_{
      RegistryOptions{.ttl = absl::Seconds(30), .hang_timeout = absl::Milliseconds(300)}};
  LeastLoadedPolicy policy_;
  prometheus::Registry metrics_registry_;
  RouterMetrics metrics_{metrics_registry_};
  std::vector<std::unique_ptr<FakePrefill>> prefills_;
  std::vector<std::unique_ptr<FakeDecode>> decodes_;
  std::vector<GrpcServerHandle> servers_;
};

// Picks prefill workers slowly, so that a decode worker that streams as
// soon as it has reserved (the fakes do not wait for KV) sends tokens before
// the router has made its reservation the attempt's current one.
class SlowPrefillPickPolicy final : public LeastLoadedPolicy {
 public:
  std::optional<size_t> PickPrefill(std::span<const WorkerView> workers,
                                    const PrefillQuery& query) const override {
    absl::SleepFor(absl::Milliseconds(100));
    return LeastLoadedPolicy::PickPrefill(workers, query);
  }
};

TEST_P(OrchestratorFaultTest, DecodeEventsBeforeThePrefillIsDispatchedAreKept) {
  SlowPrefillPickPolicy slow;
  DisaggregatedOrchestrator orchestrator(&registry_, &slow, &metrics_, {.max_attempts = 1});
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(run.finished);
  EXPECT_EQ(run.tokens, Expected(12));
}

// Tokens written right behind the reservation can reach the router before
// the thread that waits for the reservation has accepted it; they are kept.
// (They used to be dropped in that window: a lost token, then the migration
// of a silent stream repeated one.)
TEST_P(OrchestratorFaultTest, TokensRightBehindTheReservationAreKept) {
  decode_pause_ = absl::ZeroDuration();
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 1});
  for (int i = 0; i < 50; ++i) {
    const Run run = Generate(orchestrator, 12);
    ASSERT_TRUE(run.status.ok()) << run.status;
    ASSERT_TRUE(run.finished);
    ASSERT_EQ(run.tokens, Expected(12)) << "run " << i;
  }
}

TEST_P(OrchestratorFaultTest, APrefillFailureIsRetriedWithANewReservation) {
  prefill_failures_ = 1;
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 3});
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(run.finished);
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(PrefillCalls(), 2);
  EXPECT_EQ(DecodeCalls(), 2);  // the reservation was made again
  EXPECT_EQ(Series("pdserve_retries_total{pool=\"prefill\"}"), 1);
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"worker_failed\"}"), 0);
}

TEST_P(OrchestratorFaultTest, ACutDecodeStreamMigratesWithTheRelayedTokens) {
  decode_fault_ = Fault::kCut;
  decode_faults_ = 1;
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 3});
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(run.finished);
  EXPECT_EQ(run.tokens, Expected(12));  // no gap, no repeat
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"worker_failed\"}"), 1);
  // The continuation carried exactly what the client had: the first token
  // and the three streamed before the cut.
  std::vector<internal::v1::PrefillJob> jobs;
  for (auto& p : prefills_) {
    absl::MutexLock lock(&p->mu);
    jobs.insert(jobs.end(), p->jobs.begin(), p->jobs.end());
  }
  ASSERT_EQ(jobs.size(), 2u);
  const auto& continuation = jobs[0].generated_token_ids_size() > 0 ? jobs[0] : jobs[1];
  EXPECT_EQ(std::vector<int32_t>(continuation.generated_token_ids().begin(),
                                 continuation.generated_token_ids().end()),
            Expected(4));
}

// A decode worker that dies right after relaying a token that ended the
// run (EOS, or a stop token id of the request) lost only its finish: the
// stream finishes with reason stop and nothing is generated past the token.
// The cut comes after the fourth token, TokenAt(3).
TEST_P(OrchestratorFaultTest, ACutAfterAStopTokenFinishesInsteadOfMigrating) {
  engine::ModelConfig model;
  model.max_position_embeddings = 1024;
  model.eos_token_ids = {TokenAt(3)};
  for (bool by_eos : {true, false}) {
    SCOPED_TRACE(by_eos ? "EOS" : "stop token id");
    decode_fault_ = Fault::kCut;
    decode_faults_ = 1;
    engine::ModelConfig served = model;
    engine::SamplingParams sampling;
    if (!by_eos) {
      served.eos_token_ids.clear();
      sampling.stop_token_ids = {TokenAt(3)};
    }
    const int prefills_before = PrefillCalls();
    DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_,
                                           {.max_attempts = 3, .model = &served});
    const Run run = Generate(orchestrator, 12, sampling);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_TRUE(run.finished);
    EXPECT_EQ(run.finish_reason, engine::FinishReason::kStop);
    EXPECT_EQ(run.tokens, Expected(4));
    EXPECT_EQ(PrefillCalls(), prefills_before + 1);  // no continuation
  }
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"worker_failed\"}"), 0);
}

// With ignore_eos the same EOS token does not end the run: the request
// migrates and generates to max_tokens.
TEST_P(OrchestratorFaultTest, ACutAfterAnIgnoredEosMigrates) {
  engine::ModelConfig model;
  model.max_position_embeddings = 1024;
  model.eos_token_ids = {TokenAt(3)};
  decode_fault_ = Fault::kCut;
  decode_faults_ = 1;
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_,
                                         {.max_attempts = 3, .model = &model});
  engine::SamplingParams sampling;
  sampling.ignore_eos = true;
  const Run run = Generate(orchestrator, 12, sampling);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(run.finished);
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"worker_failed\"}"), 1);
}

// A decode worker that stops streaming for longer than the stall timeout
// while its steps keep moving (it is busy, e.g. preempted work) keeps the
// request: slowness is not failure.
TEST_P(OrchestratorFaultTest, ASlowStreamOnAProgressingWorkerIsNotMoved) {
  decode_fault_ = Fault::kPause;
  decode_faults_ = 1;
  for (auto& d : decodes_) d->pause_for = absl::Seconds(1);
  std::atomic<bool> stop{false};
  std::vector<std::thread> beats;
  for (const char* id : {"decode0", "decode1"}) beats.push_back(Heartbeats(id, true, &stop));
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 3, .stall_timeout = absl::Milliseconds(300)});
  const Run run = Generate(orchestrator, 12);
  stop = true;
  for (auto& t : beats) t.join();
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(DecodeCalls(), 1);
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"stalled\"}"), 0);
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"worker_failed\"}"), 0);
}

// The same silence on a worker that heartbeats with work but completes no
// step (its engine hung) moves the request after the hang timeout.
TEST_P(OrchestratorFaultTest, AStreamOnAHungWorkerMigrates) {
  decode_fault_ = Fault::kSilent;
  decode_faults_ = 1;
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 3, .stall_timeout = absl::Milliseconds(300)});
  std::atomic<bool> stop{false};
  std::thread beats;
  std::thread starter([&] {
    // Once a decode worker holds the call, it reports work and no steps.
    while (BusyDecodeId().empty()) absl::SleepFor(absl::Milliseconds(5));
    beats = Heartbeats(BusyDecodeId(), false, &stop);
  });
  const Run run = Generate(orchestrator, 12);
  starter.join();
  stop = true;
  beats.join();
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"stalled\"}"), 1);
}

// A worker that left the pool (its heartbeats stopped: the registry dropped
// it) loses its requests to another worker at once.
TEST_P(OrchestratorFaultTest, AStreamOnAWorkerThatLeftMigrates) {
  decode_fault_ = Fault::kSilent;
  decode_faults_ = 1;
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 3});
  std::thread dropper([&] {
    while (BusyDecodeId().empty()) absl::SleepFor(absl::Milliseconds(5));
    registry_.Deregister(BusyDecodeId());
  });
  const Run run = Generate(orchestrator, 12);
  dropper.join();
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"worker_failed\"}"), 1);
}

// A prefill worker that takes the call but never accepts the prompt within
// the stall timeout is given up for this request; the request is served
// elsewhere and the worker stays in service.
TEST_P(OrchestratorFaultTest, APrefillNeverAcceptedIsRetriedElsewhereWithoutBlame) {
  prefill_silent_ = 1;
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 3, .stall_timeout = absl::Milliseconds(300)});
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(PrefillCalls(), 2);
  EXPECT_EQ(Series("pdserve_retries_total{pool=\"prefill\"}"), 1);
  EXPECT_EQ(registry_.Live(Role::kPrefill, absl::Now()).size(), 2u);
}

// A prefill worker slower to accept than the stall timeout, when it is the
// only one, is waited for: giving it up would leave nowhere to go, and
// slowness is not failure (its liveness is judged by its heartbeats).
TEST_P(OrchestratorFaultTest, ASlowOnlyPrefillWorkerIsWaitedFor) {
  registry_.Deregister("prefill1");
  prefills_[0]->accept_delay = absl::Seconds(1);
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 1, .stall_timeout = absl::Milliseconds(300)});
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(PrefillCalls(), 1);
  EXPECT_EQ(Series("pdserve_retries_total{pool=\"prefill\"}"), 0);
}

// Likewise the only decode worker, slower to reserve than the stall timeout.
TEST_P(OrchestratorFaultTest, ASlowOnlyDecodeWorkerIsWaitedFor) {
  registry_.Deregister("decode1");
  decodes_[0]->reserve_delay = absl::Seconds(1);
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 1, .stall_timeout = absl::Milliseconds(300)});
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(DecodeCalls(), 1);
}

// A prefill worker given up for being slow costs the request no attempt:
// with one attempt allowed, it is still served by the other worker.
TEST_P(OrchestratorFaultTest, GivingUpASlowWorkerCostsNoAttempt) {
  prefill_silent_ = 1;
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 1, .stall_timeout = absl::Milliseconds(300)});
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_EQ(PrefillCalls(), 2);
  EXPECT_EQ(registry_.Live(Role::kPrefill, absl::Now()).size(), 2u);
}

// A client whose deadline is shorter than a reservation takes gets
// DEADLINE_EXCEEDED; the decode workers stay in service, and the next
// client is served.
TEST_P(OrchestratorFaultTest, AShortDeadlineNeverTakesAWorkerOutOfService) {
  for (auto& d : decodes_) d->reserve_delay = absl::Milliseconds(100);
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 3, .stall_timeout = absl::Milliseconds(50)});
  for (int i = 0; i < 5; ++i) {
    const Run run = Generate(orchestrator, 12, {}, absl::Milliseconds(3));
    EXPECT_EQ(run.status.code(), absl::StatusCode::kDeadlineExceeded) << run.status;
  }
  EXPECT_EQ(registry_.Live(Role::kDecode, absl::Now()).size(), 2u);
  for (auto& d : decodes_) d->reserve_delay = absl::ZeroDuration();
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
}

// Every decode worker without room: the request waits in the admission
// queue (Start returns it) and is served once room comes, not failed.
TEST_P(OrchestratorFaultTest, ARequestWaitsForRoomInsteadOfFailing) {
  decode_fault_ = Fault::kFull;
  decode_faults_ = 6;  // refused three times by each of the two
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 1, .watch_interval = absl::Milliseconds(20)});
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_GE(DecodeCalls(), 7);
  EXPECT_EQ(orchestrator.queued(), 0);
}

// Push mode (what the gRPC adapter uses): tokens come through the ready
// callback and Poll, in order; Next wakes for the first token and the end,
// not per token. (Every test runs in both modes: faults and the admission
// queue are handled alike.)
TEST_P(OrchestratorFaultTest, PushModeRelaysTokensThroughTheCallback) {
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 1});
  const Run run = Generate(orchestrator, 24);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(run.finished);
  EXPECT_EQ(run.tokens, Expected(24));
  if (push_) {
    EXPECT_GE(run.callbacks, 1);
    // First token, the end, and perhaps one more: not one per token.
    EXPECT_LE(run.next_calls, 4);
  } else {
    EXPECT_EQ(run.callbacks, 0);
  }
}

// With the queue full, a request that cannot be placed is refused at once
// with RESOURCE_EXHAUSTED, reason overloaded, and a retry hint.
TEST_P(OrchestratorFaultTest, AFullQueueRefusesAtOnceWithARetryHint) {
  decode_fault_ = Fault::kFull;
  decode_faults_ = 1000000;
  DisaggregatedOrchestrator orchestrator(
      &registry_, &policy_, &metrics_,
      {.max_attempts = 1, .admission = {.max_queued = 1, .max_wait = absl::Seconds(30)}});
  frontend::GenerationJob job{.request_id = "r", .prompt = {1, 2, 3}};
  job.sampling.max_tokens = 4;
  job.deadline = absl::Now() + absl::Seconds(20);
  // The first is granted its turn at once (its reservation is tried when
  // its session reads it); the second waits; the queue holds one.
  auto first = orchestrator.Start(job);
  ASSERT_TRUE(first.ok()) << first.status();
  auto waiting = orchestrator.Start(job);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(orchestrator.queued(), 1);
  auto second = orchestrator.Start(job);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(frontend::RejectReason(second.status()), "overloaded");
  ASSERT_TRUE(frontend::RetryAfter(second.status()).has_value());
  EXPECT_GE(*frontend::RetryAfter(second.status()), absl::Seconds(1));
  decode_faults_ = 0;
}

// Workers that come and go on new addresses (pods restarted elsewhere) do
// not leave their channels behind: each round serves on a fresh pair and
// the channels of the pairs that left are dropped once no call holds them.
TEST_P(OrchestratorFaultTest, ChannelsOfWorkersThatLeftAreDropped) {
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 1});
  std::vector<std::string> ids = {"prefill0", "prefill1", "decode0", "decode1"};
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    for (const std::string& id : ids) registry_.Deregister(id);
    prefills_.push_back(std::make_unique<FakePrefill>(&prefill_failures_, &prefill_silent_));
    decodes_.push_back(
        std::make_unique<FakeDecode>(&decode_fault_, &decode_faults_, &decode_pause_));
    ids = {absl::StrCat("p", round), absl::StrCat("d", round)};
    Serve(prefills_.back().get(), Role::kPrefill, ids[0]);
    Serve(decodes_.back().get(), Role::kDecode, ids[1]);
    const Run run = Generate(orchestrator, 6);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.tokens, Expected(6));
    EXPECT_EQ(orchestrator.channel_count(), 2);
  }
}

TEST_P(OrchestratorFaultTest, AttemptsAreBounded) {
  prefill_failures_ = 100;
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 2});
  const Run run = Generate(orchestrator, 12);
  EXPECT_EQ(run.status.code(), absl::StatusCode::kUnavailable) << run.status;
  EXPECT_NE(run.status.message().find("attempt 2 of 2"), absl::string_view::npos) << run.status;
  EXPECT_TRUE(run.tokens.empty());
  EXPECT_EQ(PrefillCalls(), 2);
  EXPECT_EQ(Series("pdserve_retries_total{pool=\"prefill\"}"), 1);
  // The workers answered (with an error): their connections hold, so they
  // stay in service.
  EXPECT_EQ(registry_.Live(Role::kPrefill, absl::Now()).size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(ThreadAndPushMode, OrchestratorFaultTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Push" : "Thread";
                         });

}  // namespace
}  // namespace pdserve::router
