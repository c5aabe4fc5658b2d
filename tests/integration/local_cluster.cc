#include "tests/integration/local_cluster.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"

namespace pdserve::testing {
namespace {
constexpr absl::Duration kStartTimeout = absl::Seconds(60);
}

std::string BinaryPath(const char* env, const char* built) {
  const char* path = std::getenv(env);
  return path != nullptr && *path != '\0' ? path : built;
}

absl::Status LocalCluster::StartProcess(Process& p, const std::string& name,
                                        std::vector<std::string> argv) {
  const std::string ready = absl::StrCat(options_.work_dir, "/", name, ".ready");
  std::remove(ready.c_str());
  argv.push_back(absl::StrCat("--ready_file=", ready));
  if (absl::Status s = p.proc.Start(argv, absl::StrCat(options_.work_dir, "/", name, ".log"));
      !s.ok()) {
    return s;
  }
  auto fields = p.proc.WaitReady(ready, kStartTimeout);
  if (!fields.ok())
    return absl::Status(fields.status().code(),
                        absl::StrCat(name, ": ", fields.status().message()));
  p.ready = *fields;
  p.grpc_address = (*fields)["grpc_address"];
  if (!absl::SimpleAtoi((*fields)["metrics_port"], &p.metrics_port)) {
    return absl::InternalError(absl::StrCat(name, ": bad ready file"));
  }
  if (fields->count("http_port") > 0 && !absl::SimpleAtoi((*fields)["http_port"], &p.http_port)) {
    return absl::InternalError(absl::StrCat(name, ": bad http_port in the ready file"));
  }
  if (fields->count("internal_port") > 0) {
    int port = 0;
    if (!absl::SimpleAtoi((*fields)["internal_port"], &port)) {
      return absl::InternalError(absl::StrCat(name, ": bad internal_port in the ready file"));
    }
    p.internal_address = JoinHostPort("127.0.0.1", port);
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::Start() {
  const Binaries& bin = options_.binaries;
  std::vector<std::string> argv = {bin.router, "--model_dir=" + options_.model_dir,
                                   "--heartbeat_interval_ms=200", "--worker_timeout_ms=1500"};
  argv.insert(argv.end(), options_.router_flags.begin(), options_.router_flags.end());
  router_argv_ = argv;
  if (absl::Status s = StartProcess(router_, "router", argv); !s.ok()) return s;
  for (int i = 0; i < options_.num_prefill; ++i) {
    if (absl::Status s = AddPrefill(); !s.ok()) return s;
  }
  for (int i = 0; i < options_.num_decode; ++i) {
    if (absl::Status s = AddDecode(); !s.ok()) return s;
  }
  return WaitForPools(options_.num_prefill, options_.num_decode, absl::Seconds(30));
}

absl::Status LocalCluster::AddPrefill(const std::vector<std::string>& extra_flags,
                                      const std::string& binary) {
  const Binaries& bin = options_.binaries;
  std::vector<std::string> argv = {binary.empty() ? bin.prefill : binary,
                                   "--model_dir=" + options_.model_dir,
                                   "--router=" + router_.internal_address, "--threads=1"};
  argv.insert(argv.end(), options_.prefill_flags.begin(), options_.prefill_flags.end());
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  auto p = std::make_unique<Process>();
  if (absl::Status s = StartProcess(*p, absl::StrCat("prefill", next_id_++), argv); !s.ok())
    return s;
  prefill_.push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status LocalCluster::AddDecode(const std::vector<std::string>& extra_flags,
                                     const std::string& binary) {
  const Binaries& bin = options_.binaries;
  std::vector<std::string> argv = {binary.empty() ? bin.decode : binary,
                                   "--model_dir=" + options_.model_dir,
                                   "--router=" + router_.internal_address, "--threads=1"};
  argv.insert(argv.end(), options_.decode_flags.begin(), options_.decode_flags.end());
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  auto p = std::make_unique<Process>();
  if (absl::Status s = StartProcess(*p, absl::StrCat("decode", next_id_++), argv); !s.ok())
    return s;
  decode_.push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForPools(int prefill, int decode, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (absl::Now() < deadline) {
    auto text = HttpGet(router_.metrics_port, "/metrics");
    if (text.ok()) {
      last = *text;
      const double p = MetricValue(*text, "pdserve_pool_workers{pool=\"prefill\"}");
      const double d = MetricValue(*text, "pdserve_pool_workers{pool=\"decode\"}");
      if (p == prefill && d == decode) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("router never saw ", prefill, " prefill and ",
                                                  decode, " decode workers; router log:\n",
                                                  router_.proc.ReadLog()));
}

absl::Status LocalCluster::RestartRouter() {
  std::vector<std::string> argv = router_argv_;
  const std::string& address = router_.grpc_address;
  argv.push_back("--port=" + address.substr(address.rfind(':') + 1));
  argv.push_back("--internal_port=" +
                 router_.internal_address.substr(router_.internal_address.rfind(':') + 1));
  argv.push_back(absl::StrCat("--metrics_port=", router_.metrics_port));
  argv.push_back(absl::StrCat("--http_port=", router_.http_port));
  router_.proc.Kill();
  return StartProcess(router_, absl::StrCat("router", next_id_++), argv);
}

void LocalCluster::Stop() {
  for (auto& p : prefill_) p->proc.Stop();
  for (auto& p : decode_) p->proc.Stop();
  router_.proc.Stop();
}

std::unique_ptr<v1::Generation::Stub> LocalCluster::NewClient() const {
  return v1::Generation::NewStub(MakeChannel(router_.grpc_address));
}

}  // namespace pdserve::testing
