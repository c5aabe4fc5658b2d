#include "common/metrics_server.h"

#include "gtest/gtest.h"
#include "httplib.h"
#include "prometheus/counter.h"

namespace pdserve {
namespace {

TEST(MetricsServerTest, ServesTheRegistryOnAnEphemeralPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& counter = prometheus::BuildCounter().Name("pdserve_test_things_total").Help("t").Register(*registry).Add({});
  counter.Increment(3);
  auto server = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  httplib::Client client("127.0.0.1", (*server)->port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("pdserve_test_things_total 3"), std::string::npos) << res->body;
  EXPECT_EQ(client.Get("/healthz")->status, 200);
}

TEST(MetricsServerTest, PortInUseIsAnError) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(first.ok());
  auto second = MetricsServer::Start(registry, "127.0.0.1", (*first)->port());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdserve
