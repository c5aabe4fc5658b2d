// Faults end to end on loopback: a router with prefill and decode workers as
// real processes, where a worker is killed (-9) or stopped (SIGSTOP) in the
// middle of its work, the router itself is stopped for longer than the
// worker ttl, and clients abandon long prompts. Every test counts requests
// completed, migrated, failed and lost (a stream that never ended), checks
// that no KV block stays allocated on any live worker, and prints one
// "FAULT ..." line with those figures and the time to detect (the
// docs/reliability.md table quotes them). With seeded sampling every stream
// must equal the same request generated in one process, token for token.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "gtest/gtest.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/streaming_call.h"
#include "tests/util/constrained_output.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::testing {
namespace {

using Stream = StreamingCall;

// Every worker's KV cache, in blocks of 16 tokens.
constexpr int kKvBlocks = 1024;
constexpr char kKvBlocksFlag[] = "--num_kv_blocks=1024";
// Streams long enough to be cut in the middle (a few seconds on one core).
constexpr size_t kMaxTokens = 600;

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::testing::TempDir() + "/pdserve_fault_test_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(work_dir_);
    std::filesystem::create_directories(work_dir_);
    model_dir_ = work_dir_ + "/model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 8192;  // room for 6,000-token prompts
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/5, "f32", model_dir_).ok());
  }

  ClusterOptions Options(int num_prefill, int num_decode,
                         std::vector<std::string> router_flags = {}) const {
    return ClusterOptions{.model_dir = model_dir_,
                          .work_dir = work_dir_,
                          .num_prefill = num_prefill,
                          .num_decode = num_decode,
                          .router_flags = std::move(router_flags),
                          .prefill_flags = {"--threads=1", kKvBlocksFlag},
                          .decode_flags = {"--threads=1", kKvBlocksFlag}};
  }

  // The request as one process generates it.
  std::vector<int32_t> Expected(const std::vector<int32_t>& prompt,
                                const engine::SamplingParams& params) {
    if (local_ == nullptr) {
      auto runner = engine::CreateModelRunner(
          {.model_dir = model_dir_, .num_kv_blocks = 512, .num_threads = 1});
      EXPECT_TRUE(runner.ok()) << runner.status();
      if (!runner.ok()) return {};
      local_ = std::move(*runner);
    }
    auto expected = engine::GenerateLocally(*local_, prompt, params);
    EXPECT_TRUE(expected.ok()) << expected.status();
    return expected.ok() ? expected->tokens : std::vector<int32_t>{};
  }

  static engine::SamplingParams Seeded(uint64_t seed, int max_tokens) {
    return {.temperature = 0.8f, .seed = seed, .max_tokens = max_tokens, .ignore_eos = true};
  }
  static std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> p = {256};
    for (int t = 1; t < n; ++t) p.push_back(1 + (t * 37 + salt * 101) % 250);
    return p;
  }
  static v1::GenerateRequest Request(const std::vector<int32_t>& prompt,
                                     const engine::SamplingParams& params) {
    v1::GenerateRequest request = TokenRequest(prompt, params.max_tokens);
    request.mutable_sampling()->set_temperature(params.temperature);
    request.mutable_sampling()->set_seed(params.seed);
    request.mutable_sampling()->set_ignore_eos(params.ignore_eos);
    return request;
  }

  static std::string Metrics(const Process& p) {
    auto text = HttpGet(p.metrics_port, "/metrics");
    return text.ok() ? *text : "";
  }
  static double Metric(const Process& p, const std::string& name) {
    return MetricValue(Metrics(p), name);
  }
  double RouterSeries(LocalCluster& cluster, const std::string& series) {
    auto text = HttpGet(cluster.router_metrics_port(), "/metrics");
    return text.ok() ? SeriesValue(*text, series) : -1;
  }
  // Waits (bounded) until `p` holds no KV block.
  static bool KvFreed(const Process& p, absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (Metric(p, "pdserve_kv_cache_usage_ratio") == 0) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }
  // KV blocks allocated on `p` now (its usage ratio times its blocks).
  static int KvBlocksInUse(const Process& p) {
    return static_cast<int>(Metric(p, "pdserve_kv_cache_usage_ratio") * kKvBlocks + 0.5);
  }

  // The figures of one scenario, printed for docs/reliability.md.
  struct Outcome {
    int completed = 0;
    int migrated = 0;
    int failed = 0;
    int lost = 0;
    int leaked_blocks = 0;
    absl::Duration detect;
  };
  static void Report(const std::string& scenario, const Outcome& o) {
    std::cout << "FAULT " << scenario << ": completed=" << o.completed << " migrated=" << o.migrated
              << " failed=" << o.failed << " lost=" << o.lost
              << " leaked_blocks=" << o.leaked_blocks
              << " time_to_detect_ms=" << absl::ToInt64Milliseconds(o.detect) << std::endl;
  }
  // Waits for every stream; counts completed, failed and lost, and checks
  // each completed stream against the one-process run.
  Outcome Collect(std::vector<std::unique_ptr<Stream>>& streams,
                  const std::vector<std::vector<int32_t>>& expected) {
    Outcome o;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (!streams[i]->Wait(absl::Seconds(40))) {
        ++o.lost;
        continue;
      }
      const grpc::Status status = streams[i]->status();
      if (!status.ok()) {
        ADD_FAILURE() << "stream " << i << ": " << status.error_message();
        ++o.failed;
        continue;
      }
      EXPECT_EQ(streams[i]->tokens(), expected[i]) << "stream " << i;
      ++o.completed;
    }
    return o;
  }

  // Starts `n` long seeded streams together (after their one-process runs,
  // appended to `expected`) and returns once each has a few tokens and is
  // far from its end.
  std::vector<std::unique_ptr<Stream>> StartMidStream(v1::Generation::Stub& stub, int n, int salt,
                                                      std::vector<std::vector<int32_t>>* expected) {
    std::vector<v1::GenerateRequest> requests;
    for (int i = 0; i < n; ++i) {
      const auto prompt = Prompt(40 + i, salt + i);
      const auto params = Seeded(100 + salt + i, kMaxTokens);
      expected->push_back(Expected(prompt, params));
      requests.push_back(Request(prompt, params));
    }
    return StartStreams(stub, requests);
  }
  // Starts `requests` together and returns once each has a few tokens and
  // is far from its end.
  static std::vector<std::unique_ptr<Stream>> StartStreams(
      v1::Generation::Stub& stub, const std::vector<v1::GenerateRequest>& requests) {
    std::vector<std::unique_ptr<Stream>> streams;
    for (const auto& r : requests) {
      streams.push_back(std::make_unique<Stream>(stub, r, absl::Seconds(50)));
    }
    for (auto& s : streams) {
      EXPECT_TRUE(s->WaitTokens(3, absl::Seconds(20)));
      EXPECT_LT(s->tokens().size(), kMaxTokens / 2);
    }
    return streams;
  }

  void PrefillFault(bool stop);

  std::string work_dir_;
  std::string model_dir_;
  std::unique_ptr<engine::ModelRunner> local_;
};

// kill -9 of a decode worker while it streams: every stream it held is
// re-prefilled with its generated tokens and continues on the other decode
// worker, without a gap or a repeat, with the uninterrupted run's tokens.
TEST_F(FaultTest, DecodeWorkerKilledMidStreamMigratesItsStreams) {
  LocalCluster cluster(Options(1, 2));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  constexpr int kStreams = 4;
  std::vector<std::vector<int32_t>> expected;
  std::vector<std::unique_ptr<Stream>> streams = StartMidStream(*stub, kStreams, 0, &expected);
  ASSERT_FALSE(HasFailure());
  Process& victim = *cluster.decode()[0];
  const std::string victim_id = "decode-" + victim.grpc_address;
  const absl::Time kill_time = absl::Now();
  victim.proc.Kill();

  Outcome o = Collect(streams, expected);
  for (auto& s : streams) o.detect = std::max(o.detect, s->LongestGapAfter(kill_time));
  o.migrated =
      static_cast<int>(RouterSeries(cluster, "pdserve_migrations_total{reason=\"worker_failed\"}"));
  EXPECT_TRUE(KvFreed(*cluster.decode()[1]));
  EXPECT_TRUE(KvFreed(*cluster.prefill()[0]));
  o.leaked_blocks = KvBlocksInUse(*cluster.decode()[1]) + KvBlocksInUse(*cluster.prefill()[0]);
  Report("kill -9 decode worker mid-stream", o);
  EXPECT_EQ(o.completed, kStreams);
  EXPECT_EQ(o.lost, 0);
  EXPECT_GE(o.migrated, 1) << "no stream was on the killed worker";
  EXPECT_EQ(o.leaked_blocks, 0);
  for (auto& s : streams) EXPECT_NE(s->timings().decode_worker(), victim_id);
}

// The same fault under structured output: streams constrained by a JSON
// Schema whose shortest value is hundreds of tokens. The continuation on
// the other decode worker compiles the grammar there and resumes its mask
// from the tokens carried over, so every reply is the uninterrupted run's,
// token for token, and parses and validates.
TEST_F(FaultTest, ConstrainedStreamsMigratedFromAKilledDecodeWorkerStayValid) {
  const engine::ModelConfig config = engine::DefaultDemoConfig();
  ASSERT_TRUE(engine::WriteDemoTokenizer(config.vocab_size, model_dir_).ok());
  auto grammars = engine::grammar::CreateGrammarCompiler(model_dir_, config);
  ASSERT_TRUE(grammars.ok()) << grammars.status();
  const nlohmann::ordered_json schema = LongSchema(/*min_tags=*/45);
  const std::string spec = SpecOf(schema);
  LocalCluster cluster(Options(1, 2));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  constexpr int kStreams = 4;
  std::vector<std::vector<int32_t>> expected;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kStreams; ++i) {
    const auto prompt = Prompt(40 + i, 70 + i);
    engine::SamplingParams params{.temperature = 0.8f, .seed = 300u + i, .max_tokens = kMaxTokens};
    expected.push_back(Expected(prompt, Constrained(params, **grammars, spec)));
    ASSERT_FALSE(expected.back().empty());
    EXPECT_TRUE(config.IsEos(expected.back().back())) << "the grammar ends the reply";
    EXPECT_EQ(ReplyViolation(schema, TextOf((*grammars)->vocab(), expected.back())), "");
    v1::GenerateRequest request = Request(prompt, params);
    auto* format = request.mutable_sampling()->mutable_response_format()->mutable_json_schema();
    format->set_schema(schema.dump());
    format->set_strict(true);
    requests.push_back(request);
  }
  std::vector<std::unique_ptr<Stream>> streams = StartStreams(*stub, requests);
  ASSERT_FALSE(HasFailure());
  Process& victim = *cluster.decode()[0];
  const std::string victim_id = "decode-" + victim.grpc_address;
  victim.proc.Kill();

  Outcome o = Collect(streams, expected);
  o.migrated =
      static_cast<int>(RouterSeries(cluster, "pdserve_migrations_total{reason=\"worker_failed\"}"));
  EXPECT_EQ(o.completed, kStreams);
  EXPECT_EQ(o.lost, 0);
  EXPECT_GE(o.migrated, 1) << "no stream was on the killed worker";
  for (auto& s : streams) {
    EXPECT_NE(s->timings().decode_worker(), victim_id);
    EXPECT_EQ(ReplyViolation(schema, TextOf((*grammars)->vocab(), s->tokens())), "");
  }
  EXPECT_TRUE(KvFreed(*cluster.decode()[1]));
  EXPECT_TRUE(KvFreed(*cluster.prefill()[0]));
}

// With a single attempt allowed, the streams of a killed decode worker fail
// at once with UNAVAILABLE (none hangs), the others complete, and no KV is
// left anywhere: the bound on attempts ends requests cleanly.
TEST_F(FaultTest, WhenNoAttemptIsLeftTheStreamsFailCleanly) {
  LocalCluster cluster(Options(1, 2, {"--max_attempts=1"}));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  std::vector<std::vector<int32_t>> expected;
  std::vector<std::unique_ptr<Stream>> streams = StartMidStream(*stub, 4, 40, &expected);
  ASSERT_FALSE(HasFailure());
  const absl::Time kill_time = absl::Now();
  cluster.decode()[0]->proc.Kill();
  Outcome o;
  for (size_t i = 0; i < streams.size(); ++i) {
    if (!streams[i]->Wait(absl::Seconds(40))) {
      ++o.lost;
    } else if (streams[i]->status().ok()) {
      EXPECT_EQ(streams[i]->tokens(), expected[i]);
      ++o.completed;
    } else {
      EXPECT_EQ(streams[i]->status().error_code(), grpc::StatusCode::UNAVAILABLE)
          << streams[i]->status().error_message();
      o.detect = std::max(o.detect, streams[i]->ended() - kill_time);
      ++o.failed;
    }
  }
  EXPECT_TRUE(KvFreed(*cluster.decode()[1]));
  EXPECT_TRUE(KvFreed(*cluster.prefill()[0]));
  o.leaked_blocks = KvBlocksInUse(*cluster.decode()[1]) + KvBlocksInUse(*cluster.prefill()[0]);
  Report("kill -9 decode worker, --max_attempts=1", o);
  EXPECT_GE(o.failed, 1) << "no stream was on the killed worker";
  EXPECT_EQ(o.completed + o.failed, 4);
  EXPECT_EQ(o.lost, 0);
  EXPECT_EQ(o.leaked_blocks, 0);
  EXPECT_EQ(RouterSeries(cluster, "pdserve_migrations_total{reason=\"worker_failed\"}"), 0);
}

// A prefill worker killed (-9) or stopped (SIGSTOP) while idle: the next
// request it is picked for fails at once (connection refused), or is not
// accepted within the stall timeout (or the worker's heartbeats stop for
// its ttl, whichever comes first), and is retried on the other prefill
// worker; the router then stops offering it. No request fails.
void FaultTest::PrefillFault(bool stop) {
  LocalCluster cluster(Options(2, 1, {"--stall_timeout_ms=1000"}));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  constexpr int kRequests = 8;
  std::vector<std::vector<int32_t>> expected;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    const auto prompt = Prompt(30 + i, 10 + i);
    const auto params = Seeded(200 + i, 16);
    expected.push_back(Expected(prompt, params));
    requests.push_back(Request(prompt, params));
  }
  // Where idle ties go: the next request goes to the same worker.
  const auto warm = RunGenerate(*stub, Request(Prompt(20, 0), Seeded(1, 4)));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  const std::string picked = warm.last.timings().prefill_worker();
  auto victim = std::find_if(cluster.prefill().begin(), cluster.prefill().end(),
                             [&](auto& p) { return "prefill-" + p->grpc_address == picked; });
  ASSERT_NE(victim, cluster.prefill().end()) << picked;
  Process& survivor = **(victim == cluster.prefill().begin() ? cluster.prefill().begin() + 1
                                                             : cluster.prefill().begin());
  const absl::Time fault_time = absl::Now();
  if (stop) {
    ASSERT_TRUE((*victim)->proc.Signal(SIGSTOP));
  } else {
    (*victim)->proc.Kill();
  }

  std::vector<std::unique_ptr<Stream>> streams;
  for (const auto& r : requests) {
    streams.push_back(std::make_unique<Stream>(*stub, r, absl::Seconds(30)));
    ASSERT_TRUE(streams.back()->Wait(absl::Seconds(30)));
  }
  Outcome o = Collect(streams, expected);
  const double retries = RouterSeries(cluster, "pdserve_retries_total{pool=\"prefill\"}");
  // Detection is the failed (or unanswered) call: the first request's wait.
  o.detect = streams[0]->LongestGapAfter(fault_time);
  if (stop) {
    ASSERT_TRUE((*victim)->proc.Signal(SIGCONT));
  }
  EXPECT_TRUE(KvFreed(*cluster.decode()[0]));
  EXPECT_TRUE(KvFreed(survivor));
  o.leaked_blocks = KvBlocksInUse(*cluster.decode()[0]) + KvBlocksInUse(survivor);
  if (stop) {
    EXPECT_TRUE(KvFreed(**victim));
    o.leaked_blocks += KvBlocksInUse(**victim);
    EXPECT_GE(o.detect, absl::Milliseconds(900));  // the stall timeout, or the ttl
  }
  Report(absl::StrCat(stop ? "SIGSTOP" : "kill -9", " prefill worker (", retries, " retries)"), o);
  EXPECT_EQ(o.completed, kRequests);
  EXPECT_EQ(o.failed, 0);
  EXPECT_GE(retries, 1);
  EXPECT_EQ(o.leaked_blocks, 0);
}

TEST_F(FaultTest, PrefillWorkerKilledRequestsAreRetried) { PrefillFault(/*stop=*/false); }

TEST_F(FaultTest, PrefillWorkerStoppedRequestsAreRetriedAfterTheStallTimeout) {
  PrefillFault(/*stop=*/true);
}

// SIGSTOP of a decode worker while it streams: its heartbeats stop, the
// router drops it after its ttl and its streams migrate (a stream's own
// silence is never the judge); new requests go elsewhere; resumed, it frees
// what it held.
TEST_F(FaultTest, DecodeWorkerStoppedStreamsMigrateWhenItsHeartbeatsStop) {
  LocalCluster cluster(Options(1, 2, {"--stall_timeout_ms=1000"}));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  constexpr int kStreams = 4;
  std::vector<std::vector<int32_t>> expected;
  std::vector<std::unique_ptr<Stream>> streams = StartMidStream(*stub, kStreams, 20, &expected);
  ASSERT_FALSE(HasFailure());
  Process& victim = *cluster.decode()[0];
  const std::string victim_id = "decode-" + victim.grpc_address;
  const absl::Time stop_time = absl::Now();
  ASSERT_TRUE(victim.proc.Signal(SIGSTOP));

  Outcome o = Collect(streams, expected);
  for (auto& s : streams) o.detect = std::max(o.detect, s->LongestGapAfter(stop_time));
  o.migrated =
      static_cast<int>(RouterSeries(cluster, "pdserve_migrations_total{reason=\"worker_failed\"}"));
  EXPECT_GE(o.migrated, 1) << "no stream was on the stopped worker";
  EXPECT_GE(o.detect, absl::Milliseconds(900));  // the ttl (1.5 s), not earlier

  // Dropped after its ttl: new requests all go to the live worker.
  ASSERT_TRUE(cluster.WaitForPools(1, 1, absl::Seconds(10)).ok());
  for (int i = 0; i < 4; ++i) {
    const auto got =
        RunGenerate(*stub, Request(Prompt(12, 40 + i), Seeded(400 + i, 8)), absl::Seconds(20));
    EXPECT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_NE(got.last.timings().decode_worker(), victim_id);
  }
  ASSERT_TRUE(victim.proc.Signal(SIGCONT));
  // Resumed: it sees its calls cancelled, frees their KV and registers again.
  EXPECT_TRUE(cluster.WaitForPools(1, 2, absl::Seconds(10)).ok());
  EXPECT_TRUE(KvFreed(victim));
  EXPECT_TRUE(KvFreed(*cluster.decode()[1]));
  EXPECT_TRUE(KvFreed(*cluster.prefill()[0]));
  o.leaked_blocks = KvBlocksInUse(victim) + KvBlocksInUse(*cluster.decode()[1]) +
                    KvBlocksInUse(*cluster.prefill()[0]);
  Report("SIGSTOP decode worker mid-stream (worker ttl 1.5 s)", o);
  EXPECT_EQ(o.completed, kStreams);
  EXPECT_EQ(o.lost, 0);
  EXPECT_EQ(o.leaked_blocks, 0);
}

// SIGSTOP of the router for twice the worker ttl: on resume it gives its
// workers one ttl to be heard instead of dropping them all, and requests
// sent right after succeed.
TEST_F(FaultTest, RouterStoppedLongerThanTheWorkerTtlKeepsItsWorkers) {
  LocalCluster cluster(Options(1, 2));  // ttl 1.5 s, heartbeats every 200 ms
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  ASSERT_TRUE(kill(cluster.router_pid(), SIGSTOP) == 0);
  absl::SleepFor(absl::Seconds(3));
  ASSERT_TRUE(kill(cluster.router_pid(), SIGCONT) == 0);
  const absl::Time resume = absl::Now();
  Outcome o;
  for (int i = 0; i < 6; ++i) {
    const auto prompt = Prompt(16, 50 + i);
    const auto params = Seeded(500 + i, 8);
    const auto got = RunGenerate(*stub, Request(prompt, params), absl::Seconds(20));
    if (got.status.ok()) {
      ++o.completed;
      EXPECT_EQ(got.tokens, Expected(prompt, params));
    } else {
      ++o.failed;
      ADD_FAILURE() << got.status.error_message();
    }
  }
  o.detect = absl::Now() - resume;  // all six served, from resume
  EXPECT_TRUE(KvFreed(*cluster.decode()[0]));
  EXPECT_TRUE(KvFreed(*cluster.decode()[1]));
  EXPECT_TRUE(KvFreed(*cluster.prefill()[0]));
  o.leaked_blocks = KvBlocksInUse(*cluster.decode()[0]) + KvBlocksInUse(*cluster.decode()[1]) +
                    KvBlocksInUse(*cluster.prefill()[0]);
  // No worker was dropped: the registry logged the pause, not expiries.
  const std::string log = cluster.RouterLog();
  EXPECT_EQ(log.find("missed its heartbeats"), std::string::npos) << log;
  EXPECT_NE(log.find("the router was not running for"), std::string::npos) << log;
  Report("SIGSTOP router 3 s (worker ttl 1.5 s)", o);
  EXPECT_EQ(o.completed, 6);
  EXPECT_EQ(o.leaked_blocks, 0);
}

// Clients abandoning four 3,000-token prompts: each is dropped from the
// prefill queue, or stops at the next chunk boundary if it is computing, on
// every worker it touched, and the KV is freed on both sides. The next
// request then costs the prefill worker its own prompt only, as on an
// idle cluster (the worker's computed-token count says so, not a clock).
TEST_F(FaultTest, CancelledLongPromptsLeaveThePrefillQueue) {
  ClusterOptions options = Options(1, 1);
  options.prefill_flags.push_back("--max_prefill_chunk_tokens=256");
  options.prefill_flags.push_back("--max_batch_tokens=512");
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  Process& prefill = *cluster.prefill()[0];
  constexpr int kLong = 3000;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 4; ++i) {
    streams.push_back(std::make_unique<Stream>(
        *stub, Request(Prompt(kLong, 60 + i), Seeded(600 + i, 8)), absl::Seconds(50)));
  }
  // Cancel once the worker has them (queued) and computes the first chunks.
  const absl::Time limit = absl::Now() + absl::Seconds(20);
  while (Metric(prefill, "pdserve_prefill_batch_tokens_sum") <= 0 && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(Metric(prefill, "pdserve_prefill_batch_tokens_sum"), 0);
  const absl::Time cancel_time = absl::Now();
  for (auto& s : streams) s->Cancel();
  Outcome o;
  for (auto& s : streams) {
    if (!s->Wait(absl::Seconds(10)))
      ++o.lost;
    else if (s->status().error_code() != grpc::StatusCode::CANCELLED)
      ++o.failed;
  }
  // Out of the queue and out of the running step, everywhere.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && (Metric(prefill, "pdserve_prefill_queued_tokens") > 0 ||
                                    Metric(prefill, "pdserve_kv_cache_usage_ratio") > 0)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  o.detect = absl::Now() - cancel_time;
  EXPECT_EQ(Metric(prefill, "pdserve_prefill_queued_tokens"), 0);
  EXPECT_TRUE(KvFreed(prefill));
  EXPECT_TRUE(KvFreed(*cluster.decode()[0]));
  const double computed = Metric(prefill, "pdserve_prefill_batch_tokens_sum");
  EXPECT_LT(computed, 4 * kLong / 2) << "the abandoned prompts were computed anyway";

  // The next request: the worker computes its prompt and nothing else.
  const auto prompt = Prompt(24, 70);
  const auto params = Seeded(700, 8);
  const auto got = RunGenerate(*stub, Request(prompt, params), absl::Seconds(20));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, Expected(prompt, params));
  EXPECT_EQ(Metric(prefill, "pdserve_prefill_batch_tokens_sum") - computed, prompt.size());
  o.completed = 1;
  o.leaked_blocks = KvBlocksInUse(prefill) + KvBlocksInUse(*cluster.decode()[0]);
  Report(absl::StrCat("4 cancelled 3000-token prompts (", computed, " of ", 4 * kLong,
                      " tokens computed)"),
         o);
  EXPECT_EQ(o.lost, 0);
  EXPECT_EQ(o.failed, 0);
  EXPECT_EQ(o.leaked_blocks, 0);
}

// Heartbeats run on a thread of their own that compute cannot starve: a
// prefill worker computing whole 6,000-token prompts (a step of 1.4 s per
// 3,000-token prompt at a load of 5 once the prefill GEMMs were the
// project's own, attention most of it; twice the tokens, four times the
// attention) stays registered with a
// router whose ttl is 2 s, ten heartbeat intervals. The ttl is not shorter
// because a busy machine (a load average of 30 and more on 2 cores) leaves
// any thread unscheduled for over half a second at times, compute or not:
// with 500 ms the worker was dropped before its first step; the steps
// outlast the ttl all the same (asserted below), so a heartbeat that waited
// for the step would still be caught.
TEST_F(FaultTest, HeartbeatsGoOnWhileAWorkerComputes) {
  constexpr double kTtlSeconds = 2.0;
  // A hang guard, not a time to meet: with 3,000-token prompts and OpenBLAS
  // sgemm the two steps took about 11 s on an idle machine and over 50 s
  // beside stress-ng at a load average of 35.
  constexpr absl::Duration kDeadline = absl::Seconds(300);
  ClusterOptions options = Options(1, 1, {"--worker_timeout_ms=2000"});
  options.prefill_flags.push_back("--max_batch_tokens=12000");
  options.prefill_flags.push_back("--max_prefill_chunk_tokens=0");  // whole prompts: long steps
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  Process& prefill = *cluster.prefill()[0];
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 2; ++i) {
    streams.push_back(std::make_unique<Stream>(
        *stub, Request(Prompt(6000, 80 + i), Seeded(800 + i, 4)), kDeadline));
  }
  for (auto& s : streams) {
    ASSERT_TRUE(s->Wait(kDeadline));
    EXPECT_TRUE(s->status().ok()) << s->status().error_message();
  }
  // Some step outlasted the ttl (the mean of the steps did).
  const double steps = Metric(prefill, "pdserve_prefill_step_seconds_count");
  const double mean_step =
      Metric(prefill, "pdserve_prefill_step_seconds_sum") / std::max(steps, 1.0);
  std::cout << "prefill: " << steps << " steps, " << mean_step << " s each on average" << std::endl;
  EXPECT_GT(mean_step, kTtlSeconds) << "no step outlasted the ttl: the test showed nothing";
  const std::string log = cluster.RouterLog();
  EXPECT_EQ(log.find("missed its heartbeats"), std::string::npos) << log;
  EXPECT_TRUE(KvFreed(prefill));
  EXPECT_TRUE(KvFreed(*cluster.decode()[0]));
}

}  // namespace
}  // namespace pdserve::testing
