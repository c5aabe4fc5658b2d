// bench/paced_workers.cc against a real router: the scripted worker pair
// registers like real workers (the router lists one prefill and one decode
// worker), and many concurrent requests each get max_tokens tokens, the
// first from the "prefill" and the rest paced by the "decode", ending with
// finish reason length; so the router benchmark's slow streams measure a
// router that relays real streams.
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/local_cluster.h"

namespace pdserve::testing {
namespace {

TEST(PacedWorkersTest, RegisterAndPaceConcurrentStreams) {
  const std::string work_dir = ::testing::TempDir() + "/pdserve_paced_workers_test";
  std::filesystem::remove_all(work_dir);
  std::filesystem::create_directories(work_dir);
  const std::string model_dir = std::string(PDSERVE_SOURCE_DIR) + "/tools/demo_model";
  LocalCluster cluster(ClusterOptions{
      .model_dir = model_dir, .work_dir = work_dir, .num_prefill = 0, .num_decode = 0});
  ASSERT_TRUE(cluster.Start().ok());
  Subprocess paced;
  ASSERT_TRUE(paced
                  .Start({PDSERVE_PACED_WORKERS_BIN, "--model_dir=" + model_dir,
                          "--router=" + cluster.router_internal_address(), "--token_interval_ms=50",
                          "--token_id=100", "--ready_file=" + work_dir + "/paced.ready"},
                         work_dir + "/paced.log")
                  .ok());
  ASSERT_TRUE(paced.WaitReady(work_dir + "/paced.ready", absl::Seconds(60)).ok())
      << paced.ReadLog();
  ASSERT_TRUE(cluster.WaitForPools(1, 1, absl::Seconds(30)).ok());

  constexpr int kStreams = 16;
  constexpr int kTokens = 6;
  auto stub = cluster.NewClient();
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      results[i] = RunGenerate(*stub, TokenRequest({1, 2, 3}, kTokens));
    });
  }
  for (std::thread& t : threads) t.join();
  for (const StreamResult& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, std::vector<int32_t>(kTokens, 100));
    EXPECT_EQ(r.last.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.last.usage().completion_tokens(), kTokens);
    // The first token came alone, then at least one message per paced token.
    EXPECT_GE(r.messages, 2);
  }
  EXPECT_EQ(paced.Stop(), 0);
}

}  // namespace
}  // namespace pdserve::testing
