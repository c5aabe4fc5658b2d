// Hostile and oversized clients against a local cluster of real processes
// (router, one prefill and one decode worker on loopback): what an
// unauthenticated peer or a client with huge requests can hold, and that
// every well-behaved request is still served. Each test counts requests
// served, refused and failed, asserts the counts (never a duration), and
// prints one "OVERLOAD <scenario>: ..." line that docs/reliability.md
// quotes.
//
// PDSERVE_OVERLOAD_BIN_DIR=<build dir> runs the same scenarios against
// other binaries (e.g. an older build, for the "before" figures); the
// assertions then say what that build does not withstand.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "engine/model/config.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/generate_client.h"
#include "tests/integration/http_client.h"
#include "tests/integration/local_cluster.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::testing {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

constexpr absl::Duration kRequestTimeout = absl::Seconds(60);

Binaries TestBinaries() {
  Binaries b;
  if (const char* dir = std::getenv("PDSERVE_OVERLOAD_BIN_DIR"); dir != nullptr && *dir != 0) {
    b.router = absl::StrCat(dir, "/router/pdserve_router");
    b.prefill = absl::StrCat(dir, "/prefill_worker/pdserve_prefill_worker");
    b.decode = absl::StrCat(dir, "/decode_worker/pdserve_decode_worker");
  }
  return b;
}

void RaiseDescriptorLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// A non-blocking connection to 127.0.0.1:port; -1 when none could be made.
int ConnectNonBlocking(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// `count` connections to a port, held open by a thread of their own and
// opened at most `per_second` a second (a slowloris opens its connections
// steadily, so that a listen backlog does not throttle it): any the server
// closes is opened again (at most every 20 ms per slot). In slow-header mode
// each sends one byte of an unending request head every `byte_every`; idle
// mode sends nothing at all (as a stranger on the KV port would).
class Flood {
 public:
  Flood(int port, int count, bool slow_header, int per_second = 200,
        absl::Duration byte_every = absl::Seconds(1))
      : port_(port),
        slow_header_(slow_header),
        per_second_(per_second),
        byte_every_(byte_every),
        slots_(count) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Flood() {
    stop_.store(true);
    thread_.join();
    for (Slot& s : slots_) {
      if (s.fd >= 0) close(s.fd);
    }
  }
  // Waits until every connection was opened once.
  bool WaitOpened(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (opened_.load() >= static_cast<int64_t>(slots_.size())) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }
  int64_t opened() const { return opened_.load(); }
  // Connections whose connect completed and that sent a byte since.
  int established() const { return established_.load(); }
  int64_t closed_by_server() const { return closed_.load(); }
  int open_now() const { return open_now_.load(); }

 private:
  struct Slot {
    int fd = -1;
    absl::Time retry_at = absl::InfinitePast();
    absl::Time next_byte = absl::InfinitePast();
    size_t sent = 0;
  };

  void Run() {
    static const std::string kHead = "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    std::vector<pollfd> fds(slots_.size());
    double budget = 0;  // connections that may be opened now
    absl::Time last = absl::Now();
    while (!stop_.load()) {
      const absl::Time now = absl::Now();
      budget = std::min<double>(budget + absl::ToDoubleSeconds(now - last) * per_second_,
                                per_second_ / 10.0 + 1);
      last = now;
      int open = 0;
      int established = 0;
      for (size_t i = 0; i < slots_.size(); ++i) {
        Slot& s = slots_[i];
        if (s.fd < 0 && now >= s.retry_at && budget >= 1) {
          budget -= 1;
          s.fd = ConnectNonBlocking(port_);
          s.retry_at = now + absl::Milliseconds(20);
          s.sent = 0;
          s.next_byte = now + byte_every_;
          if (s.fd >= 0) opened_.fetch_add(1);
        }
        if (s.fd >= 0 && slow_header_ && now >= s.next_byte) {
          const char byte = s.sent < kHead.size() ? kHead[s.sent] : 'a';
          if (send(s.fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) ++s.sent;
          s.next_byte = now + byte_every_;
        }
        fds[i] = {s.fd, POLLIN | POLLRDHUP, 0};
        open += s.fd >= 0 ? 1 : 0;
        established += s.fd >= 0 && s.sent > 0 ? 1 : 0;
      }
      open_now_.store(open);
      established_.store(established);
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].fd < 0 || fds[i].revents == 0) continue;
        char buf[512];
        const ssize_t n = recv(slots_[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0 && !(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
        // Closed (or answered and about to close) by the server: reopen.
        close(slots_[i].fd);
        slots_[i].fd = -1;
        closed_.fetch_add(1);
      }
    }
  }

  const int port_;
  const bool slow_header_;
  const int per_second_;
  const absl::Duration byte_every_;
  std::vector<Slot> slots_;  // the flood thread's only
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> opened_{0};
  std::atomic<int64_t> closed_{0};
  std::atomic<int> open_now_{0};
  std::atomic<int> established_{0};
  std::thread thread_;  // last
};

struct Tally {
  int served = 0;
  int refused = 0;  // INVALID_ARGUMENT / 400 as the test expects
  int failed = 0;   // anything else
  std::vector<std::string> failures;
};

// Router resident memory in bytes (VmRSS of /proc/<pid>/status).
int64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "VmRSS:")) {
      int64_t kb = 0;
      if (absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(rest), " kB"), &kb)) {
        return kb * 1024;
      }
    }
  }
  return -1;
}

// The resident memory of `pid` once it is at most `limit` bytes, or after
// 20 s: a handler frees a refused request's memory (and returns it to the
// system) just after its answer went out, so the client can be faster.
// Callers wait for nearly idle and assert a looser bound.
int64_t ResidentOnceAtMost(pid_t pid, int64_t limit) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  int64_t rss = ResidentBytes(pid);
  while (rss > limit && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    rss = ResidentBytes(pid);
  }
  return rss;
}

// The highest resident memory of `pid` while it lives, sampled every 20 ms
// on a thread of its own.
class PeakResident {
 public:
  explicit PeakResident(pid_t pid) : pid_(pid), peak_(ResidentBytes(pid)) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        peak_.store(std::max(peak_.load(), ResidentBytes(pid_)));
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
  }
  ~PeakResident() { Stop(); }
  int64_t Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return peak_.load();
  }

 private:
  const pid_t pid_;
  std::atomic<int64_t> peak_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last
};

class OverloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::testing::TempDir() + "/pdserve_overload_test_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(work_dir_);
    std::filesystem::create_directories(work_dir_);
    model_dir_ = work_dir_ + "/model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 1024;
    engine::RandomModelOptions options{
        .seed = 5,
        .write_generation_config = true,
        .generation_eos_token_ids = {engine::kDemoEndOfTextId, engine::kDemoEotId}};
    ASSERT_TRUE(engine::WriteRandomModel(config, options, model_dir_).ok());
    ASSERT_TRUE(engine::WriteDemoTokenizer(config.vocab_size, model_dir_).ok());
  }

  void StartCluster(std::vector<std::string> router_flags = {}) {
    cluster_ = std::make_unique<LocalCluster>(
        ClusterOptions{.binaries = TestBinaries(),
                       .model_dir = model_dir_,
                       .work_dir = work_dir_,
                       .router_flags = std::move(router_flags),
                       .prefill_flags = {"--threads=1", "--num_kv_blocks=512"},
                       .decode_flags = {"--threads=1", "--num_kv_blocks=512"}});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
    // After the processes started: they keep the limit this test was given
    // (ulimit -Sn), the floods need more.
    RaiseDescriptorLimit();
  }

  // A channel to the router that sends messages of any size.
  std::unique_ptr<v1::Generation::Stub> UnlimitedClient() {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    return v1::Generation::NewStub(grpc::CreateCustomChannel(
        cluster_->router_address(), grpc::InsecureChannelCredentials(), args));
  }

  double RouterSeries(const std::string& series) {
    auto text = HttpGet(cluster_->router_metrics_port(), "/metrics");
    if (!text.ok()) return -1;
    const std::string key = series + " ";
    for (size_t at = text->find(key); at != std::string::npos; at = text->find(key, at + 1)) {
      if (at == 0 || (*text)[at - 1] == '\n') return std::stod(text->substr(at + key.size()));
    }
    return -1;
  }

  // The router's metric lines that start with `prefix` (for failure messages).
  std::string RouterLines(const std::string& prefix) {
    auto text = HttpGet(cluster_->router_metrics_port(), "/metrics");
    if (!text.ok()) return text.status().ToString();
    std::string lines;
    for (size_t at = 0; at < text->size();) {
      size_t end = text->find('\n', at);
      if (end == std::string::npos) end = text->size();
      if (text->compare(at, prefix.size(), prefix) == 0) {
        absl::StrAppend(&lines, text->substr(at, end - at), "\n");
      }
      at = end + 1;
    }
    return lines;
  }

  // Waits until the router has nothing in flight (or 60 s).
  bool WaitRouterIdle() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      if (RouterSeries("pdserve_requests_in_flight") == 0) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  // `n` token-id requests over gRPC, `concurrency` at a time.
  Tally GrpcRequests(int n, int concurrency, int max_tokens = 8) {
    Tally tally;
    absl::Mutex mu;
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < concurrency; ++c) {
      threads.emplace_back([&] {
        auto stub = cluster_->NewClient();
        for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
          const std::vector<int32_t> prompt = {256, 65 + i % 26, 66, 67, 68, 69 + i % 7};
          v1::GenerateRequest request = TokenRequest(prompt, max_tokens);
          request.mutable_sampling()->set_ignore_eos(true);
          StreamResult r = RunGenerate(*stub, request, kRequestTimeout);
          absl::MutexLock lock(&mu);
          if (r.status.ok() && static_cast<int>(r.tokens.size()) == max_tokens) {
            ++tally.served;
          } else {
            ++tally.failed;
            tally.failures.push_back(
                absl::StrCat(r.status.error_code(), " ", r.status.error_message()));
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return tally;
  }

  // `n` completions over HTTP (curl), all at once.
  Tally HttpRequests(int n) {
    Tally tally;
    absl::Mutex mu;
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        const Json body = {{"prompt", Json::array({256, 65 + i, 66, 67})},
                           {"max_tokens", 8},
                           {"ignore_eos", true}};
        HttpResult r = Curl(cluster_->router_http_port(), "/v1/completions", body.dump(),
                            absl::StrCat(work_dir_, "/http", i, ".json"));
        absl::MutexLock lock(&mu);
        if (r.status == 200) {
          ++tally.served;
        } else {
          ++tally.failed;
          tally.failures.push_back(absl::StrCat("HTTP ", r.status, " curl ", r.curl_exit));
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return tally;
  }

  std::string work_dir_;
  std::string model_dir_;
  std::unique_ptr<LocalCluster> cluster_;
};

std::string Failures(const Tally& t) {
  std::string out;
  for (size_t i = 0; i < t.failures.size() && i < 5; ++i)
    absl::StrAppend(&out, t.failures[i], "; ");
  return out;
}

// 300 idle connections that never present the cluster credential, against
// the decode worker's KV port (256 slots), held open (reopened when closed)
// while 48 requests run: every request is served.
TEST_F(OverloadTest, KvPortFloodOfIdleStrangers) {
  StartCluster();
  auto endpoint = cluster_->decode()[0]->ready.find("kv_endpoint");
  ASSERT_NE(endpoint, cluster_->decode()[0]->ready.end());
  const std::string& kv = endpoint->second;  // tcp://127.0.0.1:PORT
  int kv_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(kv.substr(kv.rfind(':') + 1), &kv_port)) << kv;
  constexpr int kStrangers = 300;
  constexpr int kRequests = 48;
  Flood flood(kv_port, kStrangers, /*slow_header=*/false);
  ASSERT_TRUE(flood.WaitOpened(absl::Seconds(60)));
  // Every stranger was closed by the receiver once (its handshake deadline,
  // or a refusal) and came back: the flood is in its steady state.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (flood.closed_by_server() < kStrangers && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const Tally t = GrpcRequests(kRequests, /*concurrency=*/8, /*max_tokens=*/32);
  std::cout << "OVERLOAD kv_port_flood: strangers=" << kStrangers << " requests=" << kRequests
            << " served=" << t.served << " failed=" << t.failed << " (" << Failures(t) << ")"
            << " stranger_connections=" << flood.opened()
            << " closed_by_receiver=" << flood.closed_by_server() << std::endl;
  EXPECT_EQ(t.served, kRequests) << Failures(t);
  EXPECT_EQ(t.failed, 0) << Failures(t);
  // The receiver did close strangers to make room (they were reopened).
  EXPECT_GT(flood.closed_by_server(), 0);
}

// ~1,500 connections sending request heads at one byte a second against the
// router's OpenAI port (and 200 against its metrics port) while 9 HTTP
// completions, 9 gRPC requests and 5 scrapes run: all served.
TEST_F(OverloadTest, HttpSlowloris) {
  StartCluster();
  constexpr int kSlow = 1500;
  constexpr int kSlowMetrics = 200;
  Flood slow(cluster_->router_http_port(), kSlow, /*slow_header=*/true);
  Flood slow_metrics(cluster_->router_metrics_port(), kSlowMetrics, /*slow_header=*/true);
  ASSERT_TRUE(slow.WaitOpened(absl::Seconds(60)));
  ASSERT_TRUE(slow_metrics.WaitOpened(absl::Seconds(60)));
  // Until (nearly) all are established and sending, or the server has
  // closed as many as there are (it drops them): a server that accepts
  // slowly (a short listen backlog) gets up to 60 s to take them.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (slow.established() < kSlow * 9 / 10 && slow.closed_by_server() < kSlow &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  absl::SleepFor(absl::Seconds(2));
  const int open_before = slow.established();
  Tally http = HttpRequests(9);
  const Tally grpc = GrpcRequests(9, 9);
  int scrapes = 0;
  for (int i = 0; i < 5; ++i) scrapes += HttpGet(cluster_->router_metrics_port(), "/metrics").ok();
  std::cout << "OVERLOAD http_slowloris: slow_connections=" << kSlow
            << " established_at_start=" << open_before
            << " closed_by_server=" << slow.closed_by_server() << " http_served=" << http.served
            << "/9"
            << " grpc_served=" << grpc.served << "/9 metrics_scrapes=" << scrapes
            << "/5 (200 slow connections on the metrics port)" << std::endl;
  EXPECT_EQ(http.served, 9) << Failures(http);
  EXPECT_EQ(grpc.served, 9) << Failures(grpc);
  EXPECT_EQ(scrapes, 5);
}

// Every list over its limit is refused naming the field, over gRPC and
// HTTP, and counted as rejected{reason="invalid_argument"}; 4 requests of
// 15 M stop token ids leave the router's memory where it was.
TEST_F(OverloadTest, OversizedListsAreRefusedNamingTheField) {
  StartCluster();
  ASSERT_EQ(GrpcRequests(2, 1).served, 2);  // warm
  const double invalid_before =
      RouterSeries("pdserve_requests_rejected_total{reason=\"invalid_argument\"}");
  auto stub = UnlimitedClient();
  struct GrpcCase {
    v1::GenerateRequest request;
    std::string field;
  };
  std::vector<GrpcCase> grpc_cases;
  auto text = [](const std::string& s) {
    v1::GenerateRequest r;
    r.set_text(s);
    r.mutable_sampling()->set_max_tokens(4);
    return r;
  };
  {
    v1::GenerateRequest r = text("x");
    for (int i = 0; i < 1025; ++i) r.mutable_sampling()->add_stop_token_ids(i % 300);
    grpc_cases.push_back({r, "sampling.stop_token_ids"});
  }
  {
    v1::GenerateRequest r = text("x");
    for (int i = 0; i < 17; ++i) r.mutable_sampling()->add_stop("s");
    grpc_cases.push_back({r, "sampling.stop"});
  }
  {
    v1::GenerateRequest r;
    for (int i = 0; i < 1025; ++i) {
      v1::ChatMessage* m = r.mutable_chat()->add_messages();
      m->set_role("user");
      m->set_content("x");
    }
    r.mutable_sampling()->set_max_tokens(4);
    grpc_cases.push_back({r, "chat.messages"});
  }
  {
    v1::GenerateRequest r;
    r.mutable_chat()->add_messages()->set_content("x");
    for (int i = 0; i < 17; ++i) {
      (*r.mutable_chat()->mutable_chat_template_kwargs())[absl::StrCat("k", i)] = true;
    }
    grpc_cases.push_back({r, "chat.chat_template_kwargs"});
  }
  {
    v1::GenerateRequest r;
    for (int i = 0; i < 5000; ++i) r.mutable_token_ids()->add_ids(65);
    r.mutable_sampling()->set_max_tokens(4);
    grpc_cases.push_back({r, "input"});  // as a prompt too long for the context
  }
  int grpc_named = 0;
  for (const GrpcCase& c : grpc_cases) {
    StreamResult r = RunGenerate(*stub, c.request, kRequestTimeout);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(r.status.error_message(), HasSubstr(c.field));
    grpc_named += r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
                  r.status.error_message().find(c.field) != std::string::npos;
  }

  const Json user = {{"role", "user"}, {"content", "x"}};
  const Json tool = {{"type", "function"}, {"function", {{"name", "f"}}}};
  auto list = [](int n, const Json& item) { return Json(std::vector<Json>(n, item)); };
  Json kwargs = Json::object();
  for (int i = 0; i < 17; ++i) kwargs[absl::StrCat("k", i)] = true;
  struct HttpCase {
    std::string path;
    Json body;
    std::string field;
  };
  const std::vector<HttpCase> http_cases = {
      {"/v1/completions", {{"prompt", "x"}, {"stop_token_ids", list(1025, 1)}}, "stop_token_ids"},
      {"/v1/completions", {{"prompt", "x"}, {"stop", list(17, "s")}}, "stop"},
      {"/v1/chat/completions", {{"messages", list(1025, user)}}, "messages"},
      {"/v1/chat/completions", {{"messages", {user}}, {"tools", list(129, tool)}}, "tools"},
      {"/v1/chat/completions",
       {{"messages", {user}}, {"chat_template_kwargs", kwargs}},
       "chat_template_kwargs"},
      {"/v1/chat/completions",
       {{"messages", {{{"role", "assistant"}, {"content", "x"}, {"tool_calls", list(129, tool)}}}}},
       "messages[0].tool_calls"},
      {"/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"5", 1}}}}, "logit_bias"},
  };
  int http_named = 0;
  for (const HttpCase& c : http_cases) {
    HttpResult r =
        Curl(cluster_->router_http_port(), c.path, c.body.dump(), work_dir_ + "/caps.json");
    EXPECT_EQ(r.status, 400) << c.field << ": " << r.body.substr(0, 200);
    const Json body = Json::parse(r.body, nullptr, false);
    const bool named =
        !body.is_discarded() && body.contains("error") && body["error"]["param"] == c.field;
    EXPECT_TRUE(named) << c.field << ": " << r.body.substr(0, 200);
    http_named += r.status == 400 && named;
  }
  const double invalid_after =
      RouterSeries("pdserve_requests_rejected_total{reason=\"invalid_argument\"}");
  EXPECT_EQ(invalid_after - invalid_before, grpc_cases.size() + http_cases.size());

  // 4 requests of 15 M stop token ids (about 30 MB each on the wire) at once.
  ASSERT_TRUE(WaitRouterIdle());
  const int64_t idle = ResidentBytes(cluster_->router_pid());
  PeakResident sampler(cluster_->router_pid());
  std::atomic<int> huge_refused{0};
  {
    v1::GenerateRequest huge = text("x");
    huge.mutable_sampling()->mutable_stop_token_ids()->Reserve(15'000'000);
    for (int i = 0; i < 15'000'000; ++i) huge.mutable_sampling()->add_stop_token_ids(200 + i % 100);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&] {
        auto client = UnlimitedClient();
        StreamResult r = RunGenerate(*client, huge, kRequestTimeout);
        if (r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
            r.status.error_message().find("sampling.stop_token_ids") != std::string::npos) {
          huge_refused.fetch_add(1);
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ASSERT_TRUE(WaitRouterIdle());
  const int64_t peak = sampler.Stop();
  const int64_t after = ResidentOnceAtMost(cluster_->router_pid(), idle + 10'000'000);
  std::cout << "OVERLOAD oversized_lists: grpc_refused_naming_field=" << grpc_named << "/"
            << grpc_cases.size() << " http_refused_naming_field=" << http_named << "/"
            << http_cases.size() << " huge_stop_ids_refused=" << huge_refused.load()
            << "/4 router_rss_mb idle=" << idle / 1000000 << " peak=" << peak / 1000000
            << " after=" << after / 1000000 << std::endl;
  EXPECT_EQ(huge_refused.load(), 4);
  EXPECT_LE(after - idle, 100'000'000);
  // The cluster still serves.
  EXPECT_EQ(GrpcRequests(4, 2).served, 4);
}

// 4 x 60 MiB inputs (gRPC text, then HTTP bodies), all at once: refused
// (over --max_prompt_bytes), and the router's resident memory returns to
// within 100 MB of what it was before them.
TEST_F(OverloadTest, MemoryOfOversizedInputsIsReturned) {
  StartCluster();
  ASSERT_EQ(GrpcRequests(4, 2).served, 4);  // warm
  ASSERT_EQ(HttpRequests(2).served, 2);
  ASSERT_TRUE(WaitRouterIdle());
  const int64_t idle = ResidentBytes(cluster_->router_pid());
  const std::string big(60 << 20, 'a');
  std::atomic<int> refused{0};
  PeakResident sampler(cluster_->router_pid());
  {
    v1::GenerateRequest request;
    request.set_text(big);
    request.mutable_sampling()->set_max_tokens(4);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&] {
        auto client = UnlimitedClient();
        StreamResult r = RunGenerate(*client, request, kRequestTimeout);
        if (r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) refused.fetch_add(1);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ASSERT_TRUE(WaitRouterIdle());
  const int64_t after_grpc = ResidentOnceAtMost(cluster_->router_pid(), idle + 10'000'000);
  {
    const std::string body = Json({{"prompt", big}, {"max_tokens", 4}}).dump();
    std::ofstream(work_dir_ + "/big.json", std::ios::binary) << body;
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&] {
        const CommandResult run = RunCommand(
            absl::StrCat("curl -sS --max-time 120 -o /dev/null -w '%{http_code}' "
                         "-H 'Content-Type: application/json' --data-binary @'",
                         work_dir_, "/big.json' 'http://127.0.0.1:", cluster_->router_http_port(),
                         "/v1/completions'"));
        if (run.output == "400") refused.fetch_add(1);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ASSERT_TRUE(WaitRouterIdle());
  const int64_t peak = sampler.Stop();
  const int64_t after = ResidentOnceAtMost(cluster_->router_pid(), idle + 10'000'000);
  std::cout << "OVERLOAD oversized_inputs: inputs=8x60MiB refused=" << refused.load()
            << "/8 router_rss_mb idle=" << idle / 1000000 << " peak=" << peak / 1000000
            << " after_grpc=" << after_grpc / 1000000 << " after_http=" << after / 1000000
            << std::endl;
  EXPECT_EQ(refused.load(), 8);
  EXPECT_LE(after_grpc - idle, 100'000'000);
  EXPECT_LE(after - idle, 100'000'000);
  EXPECT_EQ(GrpcRequests(4, 2).served, 4);
}

// A message over the 64 MiB limit and requests whose deadlines are too
// short to be served are counted for what they are: rejected as
// invalid_argument, and deadline; and the impatient client costs no one
// else a request.
TEST_F(OverloadTest, RefusalsAreCountedUnderTheirReasons) {
  StartCluster();
  ASSERT_EQ(GrpcRequests(2, 1).served, 2);
  ASSERT_TRUE(WaitRouterIdle());
  auto series = [&](const std::string& label) {
    return RouterSeries(absl::StrCat("pdserve_requests_total{finish_reason=\"", label, "\"}"));
  };
  const double invalid_before =
      RouterSeries("pdserve_requests_rejected_total{reason=\"invalid_argument\"}");
  const double rejected_before = series("rejected");
  const double cancelled_before = series("cancelled");
  const int64_t idle = ResidentBytes(cluster_->router_pid());
  {
    v1::GenerateRequest request;
    request.set_text(std::string((64 << 20) + 1024, 'a'));
    request.mutable_sampling()->set_max_tokens(4);
    auto client = UnlimitedClient();
    StreamResult r = RunGenerate(*client, request, kRequestTimeout);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << r.status.error_message();
  }
  ASSERT_TRUE(WaitRouterIdle());
  const int64_t after_too_large = ResidentOnceAtMost(cluster_->router_pid(), idle + 10'000'000);
  EXPECT_LE(after_too_large - idle, 100'000'000);
  const double too_large_invalid =
      RouterSeries("pdserve_requests_rejected_total{reason=\"invalid_argument\"}") - invalid_before;
  const double too_large_cancelled = series("cancelled") - cancelled_before;
  EXPECT_EQ(too_large_invalid, 1);
  EXPECT_EQ(series("rejected") - rejected_before, 1);
  EXPECT_EQ(too_large_cancelled, 0);

  // 100 requests with a 3 ms deadline, one every 20 ms, while another
  // client sends 40 normal ones.
  const double deadline_before = series("deadline");
  const double rejected_before_tiny = series("rejected");
  const std::string reasons_before = RouterLines("pdserve_requests_rejected_total{");
  std::atomic<int> tiny_deadline{0};
  std::atomic<int> tiny_other{0};
  std::thread impatient([&] {
    auto stub = cluster_->NewClient();
    for (int i = 0; i < 100; ++i) {
      StreamResult r =
          RunGenerate(*stub, TokenRequest({256, 70, 71, 72}, 8), absl::Milliseconds(3));
      if (r.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        tiny_deadline.fetch_add(1);
      } else if (!r.status.ok()) {
        tiny_other.fetch_add(1);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  const Tally others = GrpcRequests(40, 2);
  impatient.join();
  ASSERT_TRUE(WaitRouterIdle());
  const double counted_deadline = series("deadline") - deadline_before;
  const double counted_rejected = series("rejected") - rejected_before_tiny;
  std::cout << "OVERLOAD refusal_labels: over_64mib counted invalid_argument=" << too_large_invalid
            << " cancelled=" << too_large_cancelled << " router_rss_mb idle=" << idle / 1000000
            << " after=" << after_too_large / 1000000
            << "; tiny_deadline clients_saw_deadline=" << tiny_deadline.load()
            << " clients_saw_other=" << tiny_other.load()
            << " router_counted_deadline=" << counted_deadline
            << " router_counted_rejected=" << counted_rejected
            << "; other_client served=" << others.served << "/40" << std::endl;
  EXPECT_EQ(tiny_other.load(), 0);
  EXPECT_EQ(counted_rejected, 0) << "refusals by reason before:\n"
                                 << reasons_before << "after:\n"
                                 << RouterLines("pdserve_requests_rejected_total{")
                                 << "router log:\n"
                                 << cluster_->RouterLog();
  EXPECT_LE(counted_deadline, 100);
  EXPECT_EQ(others.served, 40) << Failures(others);
}

}  // namespace
}  // namespace pdserve::testing
