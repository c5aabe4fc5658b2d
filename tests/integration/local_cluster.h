// Test helper: a router with prefill and decode workers as real processes on
// loopback, every port chosen by the kernel (port 0) and read back from the
// processes' ready files.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pdserve/v1/generation.grpc.pb.h"
#include "tests/integration/subprocess.h"

namespace pdserve::testing {

// Paths of the built binaries, set by CMake.
struct Binaries {
  std::string router = PDSERVE_ROUTER_BIN;
  std::string prefill = PDSERVE_PREFILL_BIN;
  std::string decode = PDSERVE_DECODE_BIN;
};

struct ClusterOptions {
  Binaries binaries;  // e.g. test-only worker variants
  std::string model_dir;
  std::string work_dir;  // logs and ready files
  int num_prefill = 1;
  int num_decode = 1;
  std::vector<std::string> router_flags;
  std::vector<std::string> prefill_flags;
  std::vector<std::string> decode_flags;
};

struct Process {
  Subprocess proc;
  std::string grpc_address;
  int metrics_port = 0;
  int http_port = -1;  // the router's OpenAI-compatible HTTP port
  std::string internal_address;  // the router's worker-registration address
  std::map<std::string, std::string> ready;  // every field of the ready file
};

class LocalCluster {
 public:
  explicit LocalCluster(ClusterOptions options) : options_(std::move(options)) {}
  ~LocalCluster() { Stop(); }

  // Starts everything and waits until the router sees every worker.
  absl::Status Start();
  void Stop();

  absl::Status AddPrefill(const std::vector<std::string>& extra_flags = {});
  absl::Status AddDecode(const std::vector<std::string>& extra_flags = {});
  // Waits until the router's pool gauges show these counts.
  absl::Status WaitForPools(int prefill, int decode, absl::Duration timeout);

  const std::string& router_address() const { return router_.grpc_address; }
  // Where workers register (--router of the workers).
  const std::string& router_internal_address() const { return router_.internal_address; }
  int router_metrics_port() const { return router_.metrics_port; }
  int router_http_port() const { return router_.http_port; }
  pid_t router_pid() const { return router_.proc.pid(); }
  std::string RouterLog() const { return router_.proc.ReadLog(); }
  // Faults: Process::proc.Kill() is kill -9; proc.Signal(SIGSTOP) and
  // proc.Signal(SIGCONT) stop and resume one process by its pid.
  std::vector<std::unique_ptr<Process>>& prefill() { return prefill_; }
  std::vector<std::unique_ptr<Process>>& decode() { return decode_; }
  std::unique_ptr<v1::Generation::Stub> NewClient() const;

 private:
  absl::Status StartProcess(Process& p, const std::string& name, std::vector<std::string> argv);

  ClusterOptions options_;
  Process router_;
  std::vector<std::unique_ptr<Process>> prefill_;
  std::vector<std::unique_ptr<Process>> decode_;
  int next_id_ = 0;
};

}  // namespace pdserve::testing
