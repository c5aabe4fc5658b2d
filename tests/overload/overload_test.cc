// Overload is not failure, end to end on loopback: a router with prefill and
// decode workers as real processes, driven the way a busy or careless
// client drives them. Each test asserts that every request is served or
// clearly refused (RESOURCE_EXHAUSTED / UNAVAILABLE with a retry hint), that
// none fails for another reason than its client's own deadline, and that no
// worker is taken out of service for being slow; and prints one
// "OVERLOAD ..." line with its figures (docs/reliability.md quotes them).
// Timings are printed, never asserted.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/model/config.h"
#include "gtest/gtest.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/streaming_call.h"
#include "tools/model_writer.h"

namespace pdserve::testing {
namespace {

constexpr char kKvBlocksFlag[] = "--num_kv_blocks=1024";  // 16,384 tokens per worker

// How the requests of a scenario ended.
struct Tally {
  int served = 0;
  int refused = 0;          // RESOURCE_EXHAUSTED or UNAVAILABLE, with a retry hint
  int refused_no_hint = 0;  // the same without one (a defect)
  int client_deadline = 0;  // DEADLINE_EXCEEDED: the client's own deadline
  int failed = 0;           // anything else (a defect)
  int lost = 0;             // never ended (a defect)
  std::string Line() const {
    return absl::StrCat("served=", served, " refused=", refused,
                        " client_deadline=", client_deadline, " failed=", failed + refused_no_hint,
                        " lost=", lost);
  }
};

void Count(const StreamingCall& call, Tally& t) {
  const grpc::Status status = call.status();
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      ++t.served;
      return;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::UNAVAILABLE:
      if (call.Trailer("retry-after").empty()) {
        ADD_FAILURE() << "refused without a retry hint: " << status.error_message();
        ++t.refused_no_hint;
      } else {
        ++t.refused;
      }
      return;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      ++t.client_deadline;
      return;
    default:
      ADD_FAILURE() << "failed: " << status.error_code() << " " << status.error_message();
      ++t.failed;
  }
}

class OverloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::testing::TempDir() + "/pdserve_overload_test_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(work_dir_);
    std::filesystem::create_directories(work_dir_);
    model_dir_ = work_dir_ + "/model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 4096;  // room for 3,000-token prompts
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/5, "f32", model_dir_).ok());
  }

  ClusterOptions Options(int num_prefill, int num_decode,
                         std::vector<std::string> router_flags = {}) const {
    return ClusterOptions{.model_dir = model_dir_,
                          .work_dir = work_dir_,
                          .num_prefill = num_prefill,
                          .num_decode = num_decode,
                          .router_flags = std::move(router_flags),
                          .prefill_flags = {kKvBlocksFlag},
                          .decode_flags = {kKvBlocksFlag}};
  }

  static std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> p = {256};
    for (int t = 1; t < n; ++t) p.push_back(1 + (t * 37 + salt * 101) % 250);
    return p;
  }
  static v1::GenerateRequest Request(int prompt_tokens, int salt, int max_tokens) {
    v1::GenerateRequest r = TokenRequest(Prompt(prompt_tokens, salt), max_tokens);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  }
  static double Metric(int port, const std::string& series) {
    auto text = HttpGet(port, "/metrics");
    return text.ok() ? SeriesValue(*text, series) : -1;
  }
  // The router's pool gauges, as "prefill/decode".
  static std::string Pools(LocalCluster& cluster) {
    return absl::StrCat(
        Metric(cluster.router_metrics_port(), "pdserve_pool_workers{pool=\"prefill\"}"), "/",
        Metric(cluster.router_metrics_port(), "pdserve_pool_workers{pool=\"decode\"}"));
  }

  std::string work_dir_;
  std::string model_dir_;
};

// 200 prompts of 500 tokens at once on one prefill and one decode worker,
// whose KV holds about 30 of them: the rest wait at the router (and in the
// prefill queue) for far longer than the stall timeout, which judges only
// the workers' own progress. Every request is served. The router's bound on
// a wait (--max_queue_wait_ms, 120 s by default) is set to the clients'
// 600 s deadline: the burst takes about 50 s on an idle machine and over
// 120 s on a busy one, where the default bound refuses the last requests
// with a retry hint, as it should (admission_test covers that bound).
TEST_F(OverloadTest, ABurstWaitsAndIsServed) {
  LocalCluster cluster(Options(1, 1, {"--stall_timeout_ms=1000", "--max_queue_wait_ms=600000"}));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  constexpr int kRequests = 200;
  const absl::Time start = absl::Now();
  std::vector<std::unique_ptr<StreamingCall>> calls;
  for (int i = 0; i < kRequests; ++i) {
    calls.push_back(std::make_unique<StreamingCall>(*stub, Request(500, i, 8), absl::Seconds(600)));
  }
  Tally t;
  for (auto& c : calls) {
    if (!c->Wait(absl::Seconds(600))) {
      ++t.lost;
      continue;
    }
    Count(*c, t);
  }
  const absl::Duration took = absl::Now() - start;
  const int port = cluster.router_metrics_port();
  const double waited = Metric(port, "pdserve_admission_queue_wait_seconds_count");
  std::cout << "OVERLOAD burst of 200 x 500-token prompts, 1P+1D (stall timeout 1 s): " << t.Line()
            << " seconds=" << absl::ToDoubleSeconds(took) << " waited_at_router=" << waited
            << std::endl;
  EXPECT_EQ(t.served, kRequests);
  EXPECT_EQ(t.failed + t.refused_no_hint + t.lost, 0);
  EXPECT_GT(waited, 0) << "nothing waited: the burst did not overload the pools";
  EXPECT_EQ(Pools(cluster), "1/1");
  const std::string log = cluster.RouterLog();
  EXPECT_EQ(log.find("is hung"), std::string::npos) << log;
  EXPECT_EQ(log.find("connection lost"), std::string::npos) << log;
}

// A client sending 3 ms-deadline requests every 50 ms gets DEADLINE_EXCEEDED
// for most of them; another client's 100 requests are all served, and no
// worker is taken out of service.
TEST_F(OverloadTest, AnImpatientClientCannotTakeWorkersOut) {
  LocalCluster cluster(Options(1, 2));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  std::atomic<bool> stop{false};
  Tally impatient;
  std::thread pest([&] {
    auto pest_stub = cluster.NewClient();
    for (int i = 0; !stop.load() && i < 400; ++i) {
      StreamingCall call(*pest_stub, Request(64, 1000 + i, 16), absl::Milliseconds(3));
      call.Wait(absl::Seconds(30));
      Count(call, impatient);
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  Tally patient;
  std::vector<std::string> pools;
  for (int i = 0; i < 100; ++i) {
    StreamingCall call(*stub, Request(64, i, 16), absl::Seconds(60));
    if (!call.Wait(absl::Seconds(60))) {
      ++patient.lost;
      continue;
    }
    Count(call, patient);
    if (i % 10 == 0) pools.push_back(Pools(cluster));
  }
  stop = true;
  pest.join();
  std::cout << "OVERLOAD impatient client (3 ms deadlines every 50 ms) beside 100 requests, "
            << "1P+2D: patient " << patient.Line() << "; impatient " << impatient.Line()
            << std::endl;
  EXPECT_EQ(patient.served, 100);
  EXPECT_EQ(impatient.failed + impatient.refused_no_hint + impatient.lost, 0);
  for (const std::string& p : pools) EXPECT_EQ(p, "1/2");
  const std::string log = cluster.RouterLog();
  EXPECT_EQ(log.find("connection lost"), std::string::npos) << log;
}

// Requests already on a prefill worker that is then stopped (SIGSTOP, with
// router and decode defaults) are retried on the other prefill worker once
// its heartbeats stop (the worker ttl). The decode side waits for their KV
// as long as the request's deadline (the router's to act on first), not a
// fixed 30 s from the reservation that used to fail them DEADLINE_EXCEEDED.
TEST_F(OverloadTest, RequestsOnAStoppedPrefillWorkerAreRetried) {
  ClusterOptions options = Options(2, 1);
  options.prefill_flags.push_back("--max_batch_tokens=1024");
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  constexpr int kRequests = 8;
  std::vector<std::unique_ptr<StreamingCall>> calls;
  for (int i = 0; i < kRequests; ++i) {
    calls.push_back(
        std::make_unique<StreamingCall>(*stub, Request(1000, i, 8), absl::Seconds(300)));
  }
  // Stop a prefill worker while it holds prompts.
  Process* holder = nullptr;
  const absl::Time limit = absl::Now() + absl::Seconds(20);
  while (holder == nullptr && absl::Now() < limit) {
    for (auto& p : cluster.prefill()) {
      if (Metric(p->metrics_port, "pdserve_prefill_queued_tokens") > 0) holder = p.get();
    }
  }
  ASSERT_NE(holder, nullptr) << "no prefill worker ever held a prompt";
  Process& victim = *holder;
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(victim.proc.Signal(SIGSTOP));
  Tally t;
  absl::Duration longest;
  for (auto& c : calls) {
    if (!c->Wait(absl::Seconds(300))) {
      ++t.lost;
      continue;
    }
    Count(*c, t);
    longest = std::max(longest, c->ended() - stopped);
  }
  const double retries =
      Metric(cluster.router_metrics_port(), "pdserve_retries_total{pool=\"prefill\"}");
  ASSERT_TRUE(victim.proc.Signal(SIGCONT));
  std::cout << "OVERLOAD SIGSTOP of a prefill worker holding queued prompts, 2P+1D, defaults: "
            << t.Line() << " prefill_retries=" << retries
            << " last_served_after_stop_s=" << absl::ToDoubleSeconds(longest) << std::endl;
  EXPECT_EQ(t.served, kRequests);
  EXPECT_EQ(t.client_deadline + t.failed + t.refused_no_hint + t.lost, 0);
  EXPECT_GE(retries, 1);
}

// A worker of another model that registers first does not lock the right
// ones out: the router's own model is the reference, and the refusal names
// what differs.
TEST_F(OverloadTest, TheRoutersModelIsTheReference) {
  const std::string other_weights = work_dir_ + "/other_weights";
  engine::ModelConfig config = engine::DefaultDemoConfig();
  config.max_position_embeddings = 4096;
  ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/6, "f32", other_weights).ok());
  const std::string other_config = work_dir_ + "/other_config";
  config.max_position_embeddings = 2048;
  ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/5, "f32", other_config).ok());

  LocalCluster cluster(Options(0, 0));
  ASSERT_TRUE(cluster.Start().ok());
  // The strangers come first, into an empty pool.
  ASSERT_TRUE(cluster.AddPrefill({"--model_dir=" + other_weights}).ok());
  ASSERT_TRUE(cluster.AddDecode({"--model_dir=" + other_config}).ok());
  ASSERT_TRUE(cluster.AddPrefill().ok());
  ASSERT_TRUE(cluster.AddDecode().ok());
  ASSERT_TRUE(cluster.WaitForPools(1, 1, absl::Seconds(30)).ok());
  auto stub = cluster.NewClient();
  for (int i = 0; i < 4; ++i) {
    const StreamResult got = RunGenerate(*stub, Request(40, i, 8), absl::Seconds(30));
    EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  }
  const std::string stranger_prefill = cluster.prefill()[0]->proc.ReadLog();
  const std::string stranger_decode = cluster.decode()[0]->proc.ReadLog();
  EXPECT_NE(stranger_prefill.find("weights differs from the router's model"), std::string::npos)
      << stranger_prefill;
  EXPECT_NE(stranger_decode.find("config differs from the router's model"), std::string::npos)
      << stranger_decode;
  std::cout << "OVERLOAD strangers registered first (other weights, other config): pools "
            << Pools(cluster) << ", 4 of 4 requests served" << std::endl;
}

#if defined(PDSERVE_DECODE_EMULATED_CUDA_BIN)
// Waits (bounded) until `process`'s log holds `text`.
bool LogShows(const Process& process, const std::string& text) {
  const absl::Time limit = absl::Now() + absl::Seconds(30);
  while (absl::Now() < limit) {
    if (process.proc.ReadLog().find(text) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// A CPU prefill worker (KV f32) beside a CUDA decode worker (KV bf16, the
// CUDA backend under the CPU emulation): without a KV reference both
// register and only pairs whose KV matches serve, so with no CPU decode
// worker a request is refused before its first token naming the reason,
// and once one joins every request goes to it; with --kv_dtype=f32 the CUDA
// worker is refused at registration, naming kv_dtype.
TEST_F(OverloadTest, MixedKvFormatsArePairedOnlyWhereTheyMatch) {
  const std::vector<std::string> cuda_flags = {"--backend=cuda", "--num_kv_blocks=64"};
  {
    LocalCluster cluster(Options(1, 0));
    ASSERT_TRUE(cluster.Start().ok());
    ASSERT_TRUE(cluster.AddDecode(cuda_flags, PDSERVE_DECODE_EMULATED_CUDA_BIN).ok());
    ASSERT_TRUE(cluster.WaitForPools(1, 1, absl::Seconds(30)).ok());
    auto stub = cluster.NewClient();
    StreamingCall refused(*stub, Request(40, 1, 8), absl::Seconds(30));
    ASSERT_TRUE(refused.Wait(absl::Seconds(30)));
    EXPECT_EQ(refused.status().error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(refused.status().error_message().find("KV format"), std::string::npos)
        << refused.status().error_message();
    EXPECT_TRUE(refused.tokens().empty());
    EXPECT_FALSE(refused.Trailer("retry-after").empty());
    ASSERT_TRUE(cluster.AddDecode().ok());
    ASSERT_TRUE(cluster.WaitForPools(1, 2, absl::Seconds(30)).ok());
    const std::string cuda_id = "decode-" + cluster.decode()[0]->grpc_address;
    for (int i = 0; i < 4; ++i) {
      const StreamResult got = RunGenerate(*stub, Request(40, i, 8), absl::Seconds(30));
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      EXPECT_NE(got.last.timings().decode_worker(), cuda_id);
    }
  }
  {
    LocalCluster cluster(Options(1, 1, {"--kv_dtype=f32"}));
    ASSERT_TRUE(cluster.Start().ok());
    ASSERT_TRUE(cluster.AddDecode(cuda_flags, PDSERVE_DECODE_EMULATED_CUDA_BIN).ok());
    EXPECT_TRUE(LogShows(*cluster.decode()[1], "kv_dtype differs from the router's model"))
        << cluster.decode()[1]->proc.ReadLog();
    EXPECT_EQ(Pools(cluster), "1/1");
  }
  std::cout << "OVERLOAD CPU prefill + CUDA decode (emulated): refused before the first token "
               "without a compatible pair, served by the CPU decode worker once it joins; "
               "with --kv_dtype=f32 the CUDA worker is refused at registration"
            << std::endl;
}
#endif

// Four rounds of 32 long prompts that their clients abandon: with prefill
// chunked by default, each stops within one chunk, and the next request's
// prompt does not wait behind abandoned ones.
TEST_F(OverloadTest, ACancelStormLeavesNoAbandonedWork) {
  LocalCluster cluster(Options(1, 1));
  ASSERT_TRUE(cluster.Start().ok());
  auto stub = cluster.NewClient();
  Process& prefill = *cluster.prefill()[0];
  std::vector<double> ttft_ms;
  int cancelled = 0;
  for (int round = 0; round < 4; ++round) {
    std::vector<std::unique_ptr<StreamingCall>> calls;
    for (int i = 0; i < 32; ++i) {
      calls.push_back(std::make_unique<StreamingCall>(*stub, Request(3000, round * 32 + i, 8),
                                                      absl::Seconds(120)));
    }
    // Abandoned once the worker computes them.
    const absl::Time limit = absl::Now() + absl::Seconds(30);
    const double before = Metric(prefill.metrics_port, "pdserve_prefill_batch_tokens_sum");
    while (Metric(prefill.metrics_port, "pdserve_prefill_batch_tokens_sum") <= before &&
           absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    for (auto& c : calls) c->Cancel();
    for (auto& c : calls) {
      ASSERT_TRUE(c->Wait(absl::Seconds(30)));
      cancelled += c->status().error_code() == grpc::StatusCode::CANCELLED;
    }
    // The next request is computed at once: the queue is empty.
    StreamingCall next(*stub, Request(64, 5000 + round, 4), absl::Seconds(60));
    ASSERT_TRUE(next.Wait(absl::Seconds(60)));
    ASSERT_TRUE(next.status().ok()) << next.status().error_message();
    ttft_ms.push_back(absl::ToDoubleMilliseconds(next.TimeToFirstToken().value()));
  }
  const double computed = Metric(prefill.metrics_port, "pdserve_prefill_batch_tokens_sum");
  std::cout << "OVERLOAD cancel storm: 4 rounds of 32 abandoned 3000-token prompts; " << cancelled
            << " cancelled; prompt tokens computed " << computed << " of " << 4 * 32 * 3000
            << "; next request's TTFT ms:";
  for (double t : ttft_ms) std::cout << " " << t;
  std::cout << std::endl;
  // Most of the abandoned prompts were never computed.
  EXPECT_LT(computed, 4 * 32 * 3000 / 4);
  EXPECT_EQ(Metric(prefill.metrics_port, "pdserve_prefill_queued_tokens"), 0);
}

// The router restarts (kill -9, the same ports): every worker registers
// again within a heartbeat or so, and until then clients are answered
// UNAVAILABLE with a retry hint, then served.
TEST_F(OverloadTest, WorkersAreBackRightAfterARouterRestart) {
  LocalCluster cluster(Options(1, 1));
  ASSERT_TRUE(cluster.Start().ok());
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster.RestartRouter().ok());
  const absl::Time serving = absl::Now();
  auto stub = cluster.NewClient();
  Tally t;
  absl::Time back = absl::InfiniteFuture();
  for (int i = 0; i < 400 && t.served < 4; ++i) {
    StreamingCall call(*stub, Request(40, i, 4), absl::Seconds(30));
    ASSERT_TRUE(call.Wait(absl::Seconds(30)));
    Count(call, t);
    if (t.served == 1 && back == absl::InfiniteFuture()) back = absl::Now();
    if (!call.status().ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(cluster.WaitForPools(1, 1, absl::Seconds(10)).ok());
  std::cout << "OVERLOAD router restart (kill -9, same ports), heartbeat 200 ms: " << t.Line()
            << " restart_s=" << absl::ToDoubleSeconds(serving - killed)
            << " first_served_after_serving_s=" << absl::ToDoubleSeconds(back - serving)
            << std::endl;
  EXPECT_EQ(t.served, 4);
  EXPECT_EQ(t.failed + t.refused_no_hint + t.client_deadline, 0);
}

}  // namespace
}  // namespace pdserve::testing
