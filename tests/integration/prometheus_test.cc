// The metrics, rules and dashboard against real processes:
//   - `promtool check metrics` accepts every process's live /metrics (router,
//     prefill, decode, colocated);
//   - a real Prometheus server (the Debian package's binary, our own process
//     on 127.0.0.1, a kernel-chosen port, a temporary TSDB) scrapes a local
//     cluster every second while a load runs, loads deploy/prometheus's
//     rules (evaluated every second here) and must return data for EVERY
//     PromQL query of the Grafana dashboard (template variables substituted)
//     and for every recording rule, except the queries on metrics that no
//     process exports yet (deploy/prometheus/pending_metrics.txt), which are
//     listed and must return nothing;
//   - the roofline ratios read real values with no peak flags given (the
//     workers measure their peaks), and the first rejected requests show in
//     rate() (labelled counters start at 0).
// Each test skips itself where its binary (promtool, prometheus) is absent.
// Bounded: Prometheus gets 60 s to answer every query; it is stopped by pid.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "tools/model_writer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/local_cluster.h"
#include "tests/util/poll.h"

namespace pdserve::testing {
namespace {

namespace fs = std::filesystem;

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// Every PromQL query of the dashboard, row panels included, with Grafana's
// template variables replaced by what they mean here.
std::vector<std::pair<std::string, std::string>> DashboardQueries(const nlohmann::json& dashboard) {
  std::vector<std::pair<std::string, std::string>> out;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& panels) {
    for (const auto& panel : panels) {
      if (panel.contains("panels")) walk(panel["panels"]);
      if (!panel.contains("targets")) continue;
      for (const auto& target : panel["targets"]) {
        std::string expr = target.value("expr", "");
        if (expr.empty()) continue;
        expr = absl::StrReplaceAll(
            expr, {{"$__rate_interval", "15s"}, {"${namespace}", ".*"}, {"$namespace", ".*"}});
        out.emplace_back(panel.value("title", "?"), expr);
      }
    }
  };
  walk(dashboard["panels"]);
  return out;
}

// Metric names of deploy/prometheus/pending_metrics.txt (first word of each
// line that is not a comment).
std::vector<std::string> PendingMetrics(const std::string& source_dir) {
  std::vector<std::string> out;
  std::istringstream in(ReadFile(source_dir + "/deploy/prometheus/pending_metrics.txt"));
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string name;
    if (words >> name) out.push_back(name);
  }
  return out;
}

class PrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::testing::TempDir() + "/pdserve_prometheus_test";
    fs::remove_all(work_dir_);
    fs::create_directories(work_dir_);
    model_dir_ = work_dir_ + "/model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 512;
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/5, "f32", model_dir_).ok());
  }

  void StartCluster() {
    cluster_ = std::make_unique<LocalCluster>(
        ClusterOptions{.model_dir = model_dir_,
                       .work_dir = work_dir_,
                       // No peak flags: the workers measure their peaks at start-up.
                       .prefill_flags = {"--threads=1"},
                       .decode_flags = {"--threads=1"}});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }

  // A steady load plus a few invalid requests (for the rejected-requests panel).
  void StartLoad() {
    for (int t = 0; t < 3; ++t) {
      load_.emplace_back([this, t] {
        auto stub = cluster_->NewClient();
        const absl::Time give_up = absl::Now() + absl::Seconds(150);
        for (int i = 0; !stop_load_.load() && absl::Now() < give_up; ++i) {
          v1::GenerateRequest request;
          for (int k = 0; k < 24 + 8 * t; ++k)
            request.mutable_token_ids()->add_ids(1 + (i + k * 13) % 250);
          // Every 10th request is invalid (max_tokens 0): INVALID_ARGUMENT.
          request.mutable_sampling()->set_max_tokens(i % 10 == 9 ? 0 : 16 + t * 8);
          request.mutable_sampling()->set_ignore_eos(i % 3 != 0);
          grpc::ClientContext ctx;
          ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
          auto reader = stub->Generate(&ctx, request);
          v1::GenerateResponse response;
          while (reader->Read(&response)) {
          }
          reader->Finish();
          absl::SleepFor(absl::Milliseconds(20));
        }
      });
    }
  }

  void TearDown() override {
    stop_load_.store(true);
    for (auto& t : load_) t.join();
    cluster_.reset();
  }

  std::string work_dir_;
  std::string model_dir_;
  std::unique_ptr<LocalCluster> cluster_;
  std::atomic<bool> stop_load_{false};
  std::vector<std::thread> load_;
};

TEST_F(PrometheusTest, PromtoolAcceptsEveryProcessMetrics) {
  const std::string promtool = FindInPath("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool not found (Debian: apt-get install prometheus)";
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  StartLoad();
  absl::SleepFor(absl::Seconds(2));  // every histogram and labelled counter has samples

  std::vector<std::pair<std::string, int>> targets = {
      {"router", cluster_->router_metrics_port()},
      {"prefill", cluster_->prefill()[0]->metrics_port},
      {"decode", cluster_->decode()[0]->metrics_port}};
  Subprocess colocated;
  const std::string ready = work_dir_ + "/colocated.ready";
  ASSERT_TRUE(colocated
                  .Start({PDSERVE_COLOCATED_BIN, "--model_dir=" + model_dir_, "--threads=1",
                          "--ready_file=" + ready},
                         work_dir_ + "/colocated.log")
                  .ok());
  auto fields = colocated.WaitReady(ready, absl::Seconds(30));
  ASSERT_TRUE(fields.ok()) << fields.status();
  targets.emplace_back("colocated", std::stoi((*fields)["metrics_port"]));

  for (const auto& [name, port] : targets) {
    auto text = HttpGet(port, "/metrics");
    ASSERT_TRUE(text.ok()) << name << ": " << text.status();
    const std::string file = absl::StrCat(work_dir_, "/", name, ".metrics");
    WriteFile(file, *text);
    const std::string out = file + ".promtool";
    const int rc =
        std::system(absl::StrCat(promtool, " check metrics < ", file, " > ", out, " 2>&1").c_str());
    EXPECT_EQ(rc, 0) << name << ": promtool check metrics:\n" << ReadFile(out);
    EXPECT_NE(text->find("pdserve_"), std::string::npos) << name;
  }
  EXPECT_EQ(colocated.Stop(absl::Seconds(10)), 0);
}

TEST_F(PrometheusTest, EveryDashboardQueryAndRecordingRuleReturnsData) {
  const std::string prometheus = FindInPath("prometheus");
  if (prometheus.empty())
    GTEST_SKIP() << "prometheus not found (Debian: apt-get install prometheus)";
  const std::string source = PDSERVE_SOURCE_DIR;
  const nlohmann::json dashboard =
      nlohmann::json::parse(ReadFile(source + "/deploy/grafana/dashboards/pdserve.json"));
  const auto queries = DashboardQueries(dashboard);
  ASSERT_GE(queries.size(), 60u);
  const std::vector<std::string> pending_metrics = PendingMetrics(source);  // may be empty

  ASSERT_NO_FATAL_FAILURE(StartCluster());
  StartLoad();

  // Our config: the local layout of deploy/prometheus/prometheus.yml with
  // static targets, a 1 s scrape, and the rules evaluated every second.
  const std::string prom_dir = work_dir_ + "/prometheus";
  fs::create_directories(prom_dir + "/data");
  std::string rules = ReadFile(source + "/deploy/prometheus/pdserve.rules.yml");
  rules = std::regex_replace(rules, std::regex("interval: 15s"), "interval: 1s");
  WriteFile(prom_dir + "/pdserve.rules.yml", rules);
  auto job = [](const std::string& name, int port) {
    return absl::StrCat("- job_name: ", name,
                        "\n  static_configs:\n  - targets: ['127.0.0.1:", port, "']\n");
  };
  WriteFile(prom_dir + "/prometheus.yml",
            absl::StrCat("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n",
                         "rule_files:\n- pdserve.rules.yml\nscrape_configs:\n",
                         job("router", cluster_->router_metrics_port()),
                         job("prefill", cluster_->prefill()[0]->metrics_port),
                         job("decode", cluster_->decode()[0]->metrics_port)));

  Subprocess server;
  const std::string log = prom_dir + "/prometheus.log";
  ASSERT_TRUE(
      server
          .Start({prometheus, "--config.file=" + prom_dir + "/prometheus.yml",
                  "--storage.tsdb.path=" + prom_dir + "/data", "--web.listen-address=127.0.0.1:0",
                  "--storage.tsdb.retention.time=1h", "--log.level=info"},
                 log)
          .ok());
  // The bound port, from its log: msg="Listening on" address=127.0.0.1:PORT
  int port = 0;
  const std::regex listening(R"re(msg="Listening on" address=127\.0\.0\.1:(\d+))re");
  PollUntil(
      [&] {
        std::smatch m;
        const std::string text = ReadFile(log);
        if (std::regex_search(text, m, listening)) port = std::stoi(m[1]);
        return port != 0;
      },
      kGenerousDeadline, absl::Milliseconds(50));
  ASSERT_NE(port, 0) << "Prometheus did not start:\n" << ReadFile(log);

  auto query = [&](const std::string& promql) -> nlohmann::json {
    auto body = HttpGet(port, "/api/v1/query?query=" + UrlEncode(promql));
    if (!body.ok()) return nlohmann::json();
    auto j = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("status", "") != "success") return nlohmann::json();
    return j["data"]["result"];
  };

  // The recording rules, as Prometheus loaded them.
  std::vector<std::string> records;
  const absl::Time rules_deadline = absl::Now() + kGenerousDeadline;
  while (records.empty() && absl::Now() < rules_deadline) {
    auto body = HttpGet(port, "/api/v1/rules");
    if (body.ok()) {
      auto j = nlohmann::json::parse(*body, nullptr, false);
      if (!j.is_discarded()) {
        for (const auto& group : j["data"]["groups"]) {
          for (const auto& rule : group["rules"]) {
            if (rule.value("type", "") == "recording") records.push_back(rule["name"]);
          }
        }
      }
    }
    if (records.empty()) absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_GE(records.size(), 40u) << ReadFile(log);

  // Queries on metrics that later changes add: expected to return nothing.
  std::vector<std::pair<std::string, std::string>> expected_empty;
  std::vector<std::pair<std::string, std::string>> pending;
  for (const auto& q : queries) {
    const bool reads_pending =
        std::any_of(pending_metrics.begin(), pending_metrics.end(),
                    [&](const std::string& m) { return q.second.find(m) != std::string::npos; });
    (reads_pending ? expected_empty : pending).push_back(q);
  }
  for (const auto& [title, promql] : expected_empty) {
    std::cout << "expected empty (metric not exported yet): \"" << title << "\": " << promql
              << "\n";
  }
  EXPECT_EQ(expected_empty.empty(), pending_metrics.empty()) << "a pending metric no query reads";
  for (const std::string& r : records) pending.emplace_back("recording rule", r);
  // What the first version got wrong: roofline ratios stuck at 0 without
  // peak flags, and rejections invisible to rate() until a second one came.
  pending.emplace_back("MFU with a measured peak",
                       "pdserve_prefill_mfu_ratio{job=\"prefill\"} > 0");
  pending.emplace_back("bandwidth utilisation with a measured peak",
                       "pdserve_decode_bandwidth_utilization_ratio{job=\"decode\"} > 0");
  pending.emplace_back(
      "rejections in rate()",
      "rate(pdserve_requests_rejected_total{job=\"router\",reason=\"invalid_argument\"}[15s]) > 0");
  for (const char* job : {"router", "prefill", "decode"}) {
    pending.emplace_back(
        absl::StrCat("build info of ", job),
        absl::StrCat("pdserve_build_info{job=\"", job, "\",version=~\".+\",model=\"model\"} == 1"));
    pending.emplace_back(absl::StrCat("resident memory of ", job),
                         absl::StrCat("process_resident_memory_bytes{job=\"", job, "\"} > 1e6"));
  }

  // Poll until every query has data (or 60 s passed).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!pending.empty() && absl::Now() < deadline) {
    std::erase_if(pending, [&](const auto& q) {
      const nlohmann::json result = query(q.second);
      return result.is_array() && !result.empty();
    });
    if (!pending.empty()) absl::SleepFor(absl::Seconds(1));
  }
  for (const auto& [title, promql] : pending) {
    ADD_FAILURE() << "no data for \"" << title << "\": " << promql;
  }
  for (const auto& [title, promql] : expected_empty) {
    const nlohmann::json result = query(promql);
    EXPECT_TRUE(result.is_array() && result.empty())
        << "\"" << title
        << "\" returns data: take its metric out of pending_metrics.txt: " << promql << " -> "
        << result.dump();
  }

  // Rule health: no evaluation errors.
  auto body = HttpGet(port, "/api/v1/rules");
  ASSERT_TRUE(body.ok());
  auto j = nlohmann::json::parse(*body, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  int alerts = 0;
  for (const auto& group : j["data"]["groups"]) {
    for (const auto& rule : group["rules"]) {
      EXPECT_NE(rule.value("health", ""), "err")
          << rule.value("name", "") << ": " << rule.value("lastError", "");
      if (rule.value("type", "") == "alerting") ++alerts;
    }
  }
  EXPECT_GE(alerts, 14);
  std::cout << queries.size() - expected_empty.size() << " dashboard queries and " << records.size()
            << " recording rules returned data, " << expected_empty.size()
            << " queries on metrics not exported yet returned none; " << alerts
            << " alerts loaded\n";
  EXPECT_EQ(server.Stop(absl::Seconds(10)), 0) << ReadFile(log);
}

}  // namespace
}  // namespace pdserve::testing
