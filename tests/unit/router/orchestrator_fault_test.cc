// DisaggregatedOrchestrator's fault handling against scripted in-process
// workers (gRPC on loopback, no model): a prefill that fails is retried with
// a new decode reservation, a decode stream cut mid-way migrates with the
// relayed tokens as the continuation's generated tokens (no gap, no
// repeat) unless its last token ended the run, a silent stream migrates
// after the stall timeout, and the attempts are bounded. The scripted "model" generates token 10 +
// i at generated position i, so any gap or repeat shows in the stream.
#include <atomic>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "router/disaggregated_orchestrator.h"

namespace pdserve::router {
namespace {

int32_t TokenAt(int position) { return 10 + position; }

// Answers each Prefill with the token after the job's generated ones, or
// with UNAVAILABLE while the failures shared by every fake prefill last.
class FakePrefill final : public internal::v1::PrefillWorker::Service {
 public:
  explicit FakePrefill(std::atomic<int>* failures) : failures_(failures) {}
  grpc::Status Prefill(grpc::ServerContext*, const internal::v1::PrefillJob* job,
                       internal::v1::PrefillResult* result) override {
    absl::MutexLock lock(&mu);
    jobs.push_back(*job);
    if (failures_->fetch_sub(1) > 0) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scripted prefill failure");
    }
    result->set_first_token_id(TokenAt(job->generated_token_ids_size()));
    return grpc::Status::OK;
  }
  absl::Mutex mu;
  std::vector<internal::v1::PrefillJob> jobs ABSL_GUARDED_BY(mu);

 private:
  std::atomic<int>* const failures_;
};

enum class Fault { kNone, kCut, kSilent };

// Reserves, then streams the tokens after the prefill's (one per message)
// and finishes. While the faults shared by every fake decode last, a call
// is cut (UNAVAILABLE) or goes silent after `kCutAfter` tokens.
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
    internal::v1::DecodeEvent reserved;
    reserved.mutable_reserved()->mutable_kv_target()->set_endpoint("tcp://127.0.0.1:1");
    writer->Write(reserved);
    const int max_tokens = job->sampling().max_tokens();
    int sent = 0;
    for (int i = job->generated_token_ids_size() + 1; i < max_tokens; ++i) {
      if (fault != Fault::kNone && sent == kCutAfter) {
        if (fault == Fault::kCut) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scripted worker death");
        }
        while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
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

 private:
  const Fault* const kind_;
  std::atomic<int>* const faults_;
  const absl::Duration* const pause_;  // before each token
};

class OrchestratorFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      prefills_.push_back(std::make_unique<FakePrefill>(&prefill_failures_));
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
  };
  // Starts a job and reads it to its end (bounded).
  Run Generate(DisaggregatedOrchestrator& orchestrator, int max_tokens,
               engine::SamplingParams sampling = {}) {
    frontend::GenerationJob job{.request_id = "r", .prompt = {1, 2, 3}};
    job.sampling = std::move(sampling);
    job.sampling.max_tokens = max_tokens;
    job.deadline = absl::Now() + absl::Seconds(20);
    Run run;
    auto generation = orchestrator.Start(job);
    if (!generation.ok()) {
      run.status = generation.status();
      return run;
    }
    while (!run.finished && absl::Now() < job.deadline) {
      std::vector<frontend::GenerationEvent> events;
      run.status = (*generation)->Next(absl::Milliseconds(50), &events);
      if (!run.status.ok()) break;
      for (const auto& e : events) {
        run.tokens.insert(run.tokens.end(), e.tokens.begin(), e.tokens.end());
        run.finished |= e.finished;
        if (e.finished) run.finish_reason = e.finish_reason;
      }
    }
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

  std::atomic<int> prefill_failures_{0};  // the next this many Prefill calls fail
  Fault decode_fault_ = Fault::kNone;
  std::atomic<int> decode_faults_{0};  // the next this many Decode calls get decode_fault_
  absl::Duration decode_pause_ = absl::Milliseconds(2);  // before each decode token
  WorkerRegistry registry_{absl::Seconds(30)};
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

TEST_F(OrchestratorFaultTest, DecodeEventsBeforeThePrefillIsDispatchedAreKept) {
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
TEST_F(OrchestratorFaultTest, TokensRightBehindTheReservationAreKept) {
  decode_pause_ = absl::ZeroDuration();
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 1});
  for (int i = 0; i < 50; ++i) {
    const Run run = Generate(orchestrator, 12);
    ASSERT_TRUE(run.status.ok()) << run.status;
    ASSERT_TRUE(run.finished);
    ASSERT_EQ(run.tokens, Expected(12)) << "run " << i;
  }
}

TEST_F(OrchestratorFaultTest, APrefillFailureIsRetriedWithANewReservation) {
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

TEST_F(OrchestratorFaultTest, ACutDecodeStreamMigratesWithTheRelayedTokens) {
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
TEST_F(OrchestratorFaultTest, ACutAfterAStopTokenFinishesInsteadOfMigrating) {
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
TEST_F(OrchestratorFaultTest, ACutAfterAnIgnoredEosMigrates) {
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

// The stall timeout is far above any pause of a healthy stream on a busy
// machine (the replacement stream must not be taken for stalled too), and
// far below the silent stream's silence (for ever).
TEST_F(OrchestratorFaultTest, ASilentDecodeStreamMigratesAfterTheStallTimeout) {
  decode_fault_ = Fault::kSilent;
  decode_faults_ = 1;
  constexpr absl::Duration kStall = absl::Seconds(2);
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_,
                                         {.max_attempts = 3, .stall_timeout = kStall});
  const absl::Time start = absl::Now();
  const Run run = Generate(orchestrator, 12);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.tokens, Expected(12));
  EXPECT_GE(absl::Now() - start, kStall);
  EXPECT_EQ(Series("pdserve_migrations_total{reason=\"stalled\"}"), 1);
}

// Workers that come and go on new addresses (pods restarted elsewhere) do
// not leave their channels behind: each round serves on a fresh pair and
// the channels of the pairs that left are dropped once no call holds them.
TEST_F(OrchestratorFaultTest, ChannelsOfWorkersThatLeftAreDropped) {
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 1});
  std::vector<std::string> ids = {"prefill0", "prefill1", "decode0", "decode1"};
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    for (const std::string& id : ids) registry_.Deregister(id);
    prefills_.push_back(std::make_unique<FakePrefill>(&prefill_failures_));
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

TEST_F(OrchestratorFaultTest, AttemptsAreBounded) {
  prefill_failures_ = 100;
  DisaggregatedOrchestrator orchestrator(&registry_, &policy_, &metrics_, {.max_attempts = 2});
  const Run run = Generate(orchestrator, 12);
  EXPECT_EQ(run.status.code(), absl::StatusCode::kUnavailable) << run.status;
  EXPECT_NE(run.status.message().find("attempt 2 of 2"), absl::string_view::npos) << run.status;
  EXPECT_TRUE(run.tokens.empty());
  EXPECT_EQ(PrefillCalls(), 2);
  EXPECT_EQ(Series("pdserve_retries_total{pool=\"prefill\"}"), 1);
  // Both prefill workers failed as if gone: not offered until heard from.
  EXPECT_TRUE(registry_.Live(Role::kPrefill, absl::Now()).empty());
}

}  // namespace
}  // namespace pdserve::router
