// Scaling and draining on loopback, under a steady load from client threads:
//   1. a cluster of 1 prefill + 1 decode worker gets a second decode and a
//      second prefill worker; the new workers take traffic (seen in the final
//      message's timings.prefill_worker / decode_worker);
//   2. SIGTERM to a decode worker with streams in flight: every stream
//      finishes OK (no request lost), the router stops routing to it, and it
//      exits cleanly once drained;
//   3. SIGTERM to the router with streams in flight: they finish OK, health
//      goes NOT_SERVING and new calls get UNAVAILABLE "router is draining".
// Every wait is bounded in time; processes are ended by pid.
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "tools/model_writer.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/local_cluster.h"

namespace pdserve::testing {
namespace {

struct Outcome {
  grpc::Status status;
  int tokens = 0;
  std::string prefill_worker;
  std::string decode_worker;
  absl::Time start;
  absl::Time end;
};

Outcome Generate(v1::Generation::Stub& stub, int salt, int max_tokens, absl::Duration timeout,
                 std::atomic<int>* first_tokens = nullptr) {
  v1::GenerateRequest request;
  // Prompts of 96 tokens keep each prefill busy long enough to overlap.
  for (int i = 0; i < 96; ++i) request.mutable_token_ids()->add_ids(1 + (salt * 31 + i * 7) % 250);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  Outcome out;
  out.start = absl::Now();
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (out.tokens == 0 && response.token_ids_size() > 0 && first_tokens != nullptr)
      first_tokens->fetch_add(1);
    out.tokens += response.token_ids_size();
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out.prefill_worker = response.timings().prefill_worker();
      out.decode_worker = response.timings().decode_worker();
    }
  }
  out.status = reader->Finish();
  out.end = absl::Now();
  return out;
}

// Client threads that send one request after another until stopped.
class SteadyLoad {
 public:
  SteadyLoad(const LocalCluster& cluster, int threads, int max_tokens) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, &cluster, t, max_tokens] {
        auto stub = cluster.NewClient();
        const absl::Time give_up = absl::Now() + absl::Seconds(120);  // bounds the loop
        for (int i = 0; !stop_.load() && absl::Now() < give_up; ++i) {
          Outcome o = Generate(*stub, t * 1000 + i, max_tokens, absl::Seconds(30));
          std::lock_guard<std::mutex> lock(mu_);
          outcomes_.push_back(std::move(o));
        }
      });
    }
  }
  ~SteadyLoad() { Stop(); }

  void Stop() {
    stop_.store(true);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  std::vector<Outcome> outcomes() {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_;
  }
  // Requests that started at or after `since`, per worker id.
  std::map<std::string, int> ServedSince(absl::Time since, bool decode) {
    std::map<std::string, int> served;
    for (const Outcome& o : outcomes()) {
      if (o.status.ok() && o.start >= since) ++served[decode ? o.decode_worker : o.prefill_worker];
    }
    return served;
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Outcome> outcomes_;
  std::vector<std::thread> threads_;
};

double Metric(int port, const std::string& name) {
  auto text = HttpGet(port, "/metrics");
  return text.ok() ? MetricValue(*text, name) : -1;
}

class ScalingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::testing::TempDir() + "/pdserve_scaling_test";
    std::filesystem::remove_all(work_dir_);
    std::filesystem::create_directories(work_dir_);
    const std::string model_dir = work_dir_ + "/model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 1024;
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/11, "f32", model_dir).ok());
    // Drain and call deadlines far above what the streams need, so a slow
    // (sanitizer or loaded) machine cannot turn a drain into a failure.
    cluster_ = std::make_unique<LocalCluster>(
        ClusterOptions{.model_dir = model_dir,
                       .work_dir = work_dir_,
                       .router_flags = {"--drain_timeout_ms=180000"},
                       .decode_flags = {"--drain_timeout_ms=180000"}});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  void TearDown() override { cluster_.reset(); }

  std::string work_dir_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(ScalingTest, NewWorkersTakeTrafficAndADrainedWorkerLosesNothing) {
  SteadyLoad load(*cluster_, /*threads=*/6, /*max_tokens=*/48);
  absl::SleepFor(absl::Seconds(1));

  // 1. Scale both pools out under load.
  ASSERT_TRUE(cluster_->AddDecode().ok());
  ASSERT_TRUE(cluster_->AddPrefill().ok());
  ASSERT_TRUE(cluster_->WaitForPools(2, 2, absl::Seconds(20)).ok());
  const absl::Time scaled = absl::Now();
  const std::string new_decode = "decode-" + cluster_->decode()[1]->grpc_address;
  const std::string new_prefill = "prefill-" + cluster_->prefill()[1]->grpc_address;
  const std::string old_decode = "decode-" + cluster_->decode()[0]->grpc_address;
  const absl::Time deadline = scaled + absl::Seconds(30);
  while (absl::Now() < deadline) {
    auto decode = load.ServedSince(scaled, /*decode=*/true);
    auto prefill = load.ServedSince(scaled, /*decode=*/false);
    if (decode[new_decode] >= 5 && prefill[new_prefill] >= 3 && decode[old_decode] >= 5) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  {
    auto decode = load.ServedSince(scaled, true);
    auto prefill = load.ServedSince(scaled, false);
    EXPECT_GE(decode[new_decode], 5) << "the new decode worker took no traffic";
    EXPECT_GE(prefill[new_prefill], 3) << "the new prefill worker took no traffic";
    for (const auto& [id, n] : decode)
      std::cout << "after scale-out, decode " << id << ": " << n << "\n";
    for (const auto& [id, n] : prefill)
      std::cout << "after scale-out, prefill " << id << ": " << n << "\n";
  }

  // 2. Drain the first decode worker while it streams.
  Process& drained = *cluster_->decode()[0];
  const absl::Time busy_deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < busy_deadline &&
         Metric(drained.metrics_port, "pdserve_decode_running_sequences") < 1) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(Metric(drained.metrics_port, "pdserve_decode_running_sequences"), 1)
      << "no stream in flight";
  const absl::Time term = absl::Now();
  ASSERT_EQ(kill(drained.proc.pid(), SIGTERM), 0);
  // It exits by itself once its streams are done (well within its drain timeout).
  EXPECT_TRUE(WaitUntilExited(drained.proc.pid(), absl::Seconds(30)));
  const absl::Time exited = absl::Now();
  EXPECT_EQ(drained.proc.Stop(absl::Seconds(1)), 0) << drained.proc.ReadLog();
  EXPECT_TRUE(cluster_->WaitForPools(2, 1, absl::Seconds(10)).ok());
  absl::SleepFor(absl::Seconds(1));  // more traffic, on the remaining workers
  load.Stop();

  const std::vector<Outcome> outcomes = load.outcomes();
  int in_flight_at_term = 0, after_term_on_drained = 0, ok = 0;
  for (const Outcome& o : outcomes) {
    EXPECT_TRUE(o.status.ok()) << o.status.error_code() << ": " << o.status.error_message();
    if (!o.status.ok()) continue;
    ++ok;
    EXPECT_EQ(o.tokens, 48);
    if (o.decode_worker != old_decode) continue;
    if (o.start < term && o.end > term) ++in_flight_at_term;
    // The worker tells the router it drains at once; allow one heartbeat.
    if (o.start > term + absl::Milliseconds(300)) ++after_term_on_drained;
  }
  std::cout << outcomes.size() << " requests, " << ok << " OK; " << in_flight_at_term
            << " streams in flight on the drained worker finished; it exited "
            << absl::FormatDuration(exited - term) << " after SIGTERM\n";
  EXPECT_GE(in_flight_at_term, 1);
  EXPECT_EQ(after_term_on_drained, 0) << "the router kept routing to a draining worker";
}

TEST_F(ScalingTest, RouterDrainsStreamsAndRefusesNewCalls) {
  const pid_t router_pid = cluster_->router_pid();

  constexpr int kStreams = 4;
  constexpr int kTokens = 700;  // long enough to be in flight across the SIGTERM
  std::atomic<int> started{0};
  std::vector<Outcome> streams(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto stub = cluster_->NewClient();
      streams[i] = Generate(*stub, 5000 + i, kTokens, absl::Seconds(180), &started);
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (started.load() < kStreams && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  ASSERT_EQ(started.load(), kStreams);
  ASSERT_EQ(kill(router_pid, SIGTERM), 0);

  // New calls are refused while the streams finish; health says NOT_SERVING.
  auto channel = MakeChannel(cluster_->router_address());
  auto stub = v1::Generation::NewStub(channel);
  grpc::Status refused;
  for (int i = 0; i < 200; ++i) {
    refused = Generate(*stub, 9000 + i, 4, absl::Seconds(5)).status;
    if (refused.error_code() == grpc::StatusCode::UNAVAILABLE) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.error_message(), "router is draining");
  {
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, req, &resp);
    if (s.ok()) {
      EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    }
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(streams[i].status.ok()) << i << ": " << streams[i].status.error_message();
    EXPECT_EQ(streams[i].tokens, kTokens) << i;
    EXPECT_GT(streams[i].end, streams[i].start);
  }
  // The router exits by itself once the streams are done: its port closes.
  const absl::Time gone_deadline = absl::Now() + absl::Seconds(15);
  bool gone = false;
  while (!gone && absl::Now() < gone_deadline) {
    gone = !HttpGet(cluster_->router_metrics_port(), "/metrics").ok();
    if (!gone) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(gone) << "router still serving /metrics after draining";
}

}  // namespace
}  // namespace pdserve::testing
