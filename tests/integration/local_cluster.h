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

// Paths of the built binaries, set by CMake; the environment variables
// PDSERVE_TEST_ROUTER_BIN, PDSERVE_TEST_PREFILL_BIN and
// PDSERVE_TEST_DECODE_BIN replace them (to run the same scenarios against
// another build, e.g. a previous release's, for before/after figures).
std::string BinaryPath(const char* env, const char* built);
struct Binaries {
  std::string router = BinaryPath("PDSERVE_TEST_ROUTER_BIN", PDSERVE_ROUTER_BIN);
  std::string prefill = BinaryPath("PDSERVE_TEST_PREFILL_BIN", PDSERVE_PREFILL_BIN);
  std::string decode = BinaryPath("PDSERVE_TEST_DECODE_BIN", PDSERVE_DECODE_BIN);
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
  int http_port = -1;                        // the router's OpenAI-compatible HTTP port
  std::string internal_address;              // the router's worker-registration address
  std::map<std::string, std::string> ready;  // every field of the ready file
};

class LocalCluster {
 public:
  explicit LocalCluster(ClusterOptions options) : options_(std::move(options)) {}
  ~LocalCluster() { Stop(); }

  // Starts everything and waits until the router sees every worker.
  absl::Status Start();
  void Stop();

  // `binary`: another worker binary than the cluster's (e.g. a test-only
  // variant); empty: the cluster's.
  absl::Status AddPrefill(const std::vector<std::string>& extra_flags = {},
                          const std::string& binary = "");
  absl::Status AddDecode(const std::vector<std::string>& extra_flags = {},
                         const std::string& binary = "");
  // Waits until the router's pool gauges show these counts.
  absl::Status WaitForPools(int prefill, int decode, absl::Duration timeout);
  // Kills the router (-9) and starts it again on the same ports (client,
  // internal, HTTP, metrics), as a restarted pod behind the same Service;
  // returns once it is serving (its workers re-register by themselves).
  absl::Status RestartRouter();

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
  std::vector<std::string> router_argv_;
  Process router_;
  std::vector<std::unique_ptr<Process>> prefill_;
  std::vector<std::unique_ptr<Process>> decode_;
  int next_id_ = 0;
};

}  // namespace pdserve::testing
