#include "common/metrics_server.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/time/clock.h"
#include "common/base/cli.h"
#include "common/grpc_util.h"
#include "common/process_metrics.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "prometheus/counter.h"
#include "tests/util/loopback_socket.h"

namespace pdserve {
namespace {

TEST(MetricsServerTest, ServesTheRegistryOnAnEphemeralPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& counter = prometheus::BuildCounter()
                      .Name("pdserve_test_things_total")
                      .Help("t")
                      .Register(*registry)
                      .Add({});
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

// /livez and /readyz follow the gRPC health of the process's servers: up
// while serving, /readyz down while not ready (a worker not registered),
// both down after draining.
TEST(MetricsServerTest, HttpProbesFollowTheGrpcHealth) {
  auto metrics = MetricsServer::Start(std::make_shared<prometheus::Registry>(), "127.0.0.1", 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  httplib::Client client("127.0.0.1", (*metrics)->port());
  const auto status = [&](const char* path) {
    auto res = client.Get(path);
    return res ? res->status : -1;
  };
  auto grpc = StartGrpcServer("127.0.0.1", 0, {});
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  EXPECT_EQ(status("/livez"), 200);
  EXPECT_EQ(status("/readyz"), 200);
  SetReady(*grpc->server, false);
  EXPECT_EQ(status("/livez"), 200);
  EXPECT_EQ(status("/readyz"), 503);
  SetReady(*grpc->server, true);
  EXPECT_EQ(status("/readyz"), 200);
  SetServing(*grpc->server, false);
  EXPECT_EQ(status("/livez"), 503);
  EXPECT_EQ(status("/readyz"), 503);
  grpc->server->Shutdown();
}

TEST(MetricsServerTest, PortInUseIsAnError) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(first.ok());
  auto second = MetricsServer::Start(registry, "127.0.0.1", (*first)->port());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

// Reads until the peer closes (or the 10 s receive timeout).
std::string ReadToClose(int fd, bool* closed) {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) {
      *closed = n == 0;
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

double Sample(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

TEST(MetricsServerTest, ExportsProcessMetricsAndBuildInfo) {
  auto registry = std::make_shared<prometheus::Registry>();
  RegisterBuildInfo(*registry, "cpu", "demo");
  auto server = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  const std::string& text = res->body;
  EXPECT_NE(text.find("pdserve_build_info{backend=\"cpu\",model=\"demo\",version=\"" +
                      std::string(ProjectVersion()) + "\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter"), std::string::npos) << text;
  EXPECT_GE(Sample(text, "process_cpu_seconds_total"), 0);
  EXPECT_GT(Sample(text, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(Sample(text, "process_virtual_memory_bytes"),
            Sample(text, "process_resident_memory_bytes"));
  EXPECT_GE(Sample(text, "process_open_fds"), 3);  // stdio and the listening socket at least
  EXPECT_GT(Sample(text, "process_max_fds"), Sample(text, "process_open_fds"));
  EXPECT_GE(Sample(text, "process_threads"), 2);  // this thread and the server's
  const double start = Sample(text, "process_start_time_seconds");
  const double now = absl::ToUnixSeconds(absl::Now());
  EXPECT_GT(start, now - 3600) << "started within the hour";
  EXPECT_LE(start, now + 1);
}

TEST(MetricsServerTest, ModelNameFromConfigOrDirectory) {
  const std::string dir = ::testing::TempDir() + "/pdserve_model_name_test";
  std::filesystem::create_directories(dir);
  EXPECT_EQ(ModelNameOf(dir + "/"), "pdserve_model_name_test");
  std::ofstream(dir + "/config.json") << R"({"_name_or_path": "meta-llama/Llama-3.2-1B"})";
  EXPECT_EQ(ModelNameOf(dir), "meta-llama/Llama-3.2-1B");
  std::filesystem::remove_all(dir);
}

// A scrape gets its answer with "Connection: close" and the connection ends:
// no idle keep-alive connection is left to hold the server at shutdown.
TEST(MetricsServerTest, EveryConnectionServesOneRequestAndCloses) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto server = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const int fd = testing::ConnectLoopback((*server)->port());
  ASSERT_GE(fd, 0);
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n";
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  bool closed = false;
  const std::string response = ReadToClose(fd, &closed);
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("Connection: close"), std::string::npos) << response;
  EXPECT_TRUE(closed) << "the server kept the connection open";
}

// The server stops with a connection open that sent nothing (cpp-httplib,
// used before, waited for an idle connection's next request: 5 s, later
// 1 s), and that connection sees its end. Asserted by the events, not by a
// time: the stop returns (a stop that waited on the client would hang the
// test), and the read sees the end within a generous minute.
TEST(MetricsServerTest, StopsWithAnIdleConnectionOpenAndClosesIt) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto server = MetricsServer::Start(registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const int fd = testing::ConnectLoopback((*server)->port(), /*read_timeout_s=*/60);
  ASSERT_GE(fd, 0);
  server->reset();
  bool closed = false;
  const std::string response = ReadToClose(fd, &closed);
  close(fd);
  EXPECT_TRUE(closed) << "the idle connection was not closed within a minute";
  EXPECT_EQ(response, "");
}

// The client-facing histograms cover stalls and keep ~10% resolution where
// serving runs and where the SLO rules read them.
void ExpectBuckets(const std::vector<double>& b, double lo, double hi, double dense_lo,
                   double dense_hi, double max_ratio, std::vector<double> thresholds) {
  ASSERT_FALSE(b.empty());
  EXPECT_LE(b.front(), lo);
  EXPECT_GE(b.back(), hi);
  for (size_t i = 1; i < b.size(); ++i) {
    EXPECT_LT(b[i - 1], b[i]) << i;
    if (b[i - 1] >= dense_lo && b[i] <= dense_hi) {
      EXPECT_LE(b[i] / b[i - 1], max_ratio) << b[i - 1] << " -> " << b[i];
    }
  }
  for (double t : thresholds) {
    EXPECT_NE(std::find(b.begin(), b.end(), t), b.end()) << "no bucket at " << t;
  }
}

TEST(MetricsServerTest, LatencyBucketsFitLlmServing) {
  // TTFT: 1 ms to 120 s; at most 7.5% apart from 0.1 s to 5 s; the 2 s SLO
  // and alert, the former 2.5 s SLO bucket.
  ExpectBuckets(TimeToFirstTokenBuckets(), 0.001, 120, 0.1, 5.0, 1.075, {1.0, 2.0, 2.5});
  // ITL: 1 ms to at least 30 s; at most 15% apart from 3 ms to 1 s and 7.5%
  // around the 200 ms SLO and alert.
  ExpectBuckets(InterTokenLatencyBuckets(), 0.001, 30, 0.003, 1.0, 1.15, {0.1, 0.2, 0.25});
  ExpectBuckets(InterTokenLatencyBuckets(), 0.001, 30, 0.1, 0.3, 1.075, {});
  // Stalls of 1-10 s (ITL) and overloads of 5-10 s (TTFT) read within ~12%.
  ExpectBuckets(InterTokenLatencyBuckets(), 0.001, 30, 1.0, 10.0, 1.15, {});
  ExpectBuckets(TimeToFirstTokenBuckets(), 0.001, 120, 5.0, 10.0, 1.15, {});
}

}  // namespace
}  // namespace pdserve
