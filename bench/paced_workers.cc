// pdserve_paced_workers: a scripted prefill worker and decode worker in one
// process, for measuring the router alone. Both register with the router
// like real workers (common/worker_registrar.h: the same internal protocol,
// cluster token and the model description the router compares with its own)
// and serve the same internal services, but compute nothing: a Prefill
// streams `accepted`, `started` and then --token_id as the first token at
// once, and a Decode reserves at once, then streams one --token_id every
// --token_interval_ms per request until max_tokens, and finishes (LENGTH).
// Heartbeats report the streams open (has_work) and a progress count that
// moves with every token paced, as a real decode worker's steps do. No KV
// moves. Real decode workers on a small machine cannot pace
// a thousand streams at one token a second each; these can, so a benchmark
// (bench/router_cpu.sh) sees what holding many slow streams costs the
// router.
//
//   pdserve_paced_workers --model_dir=DIR --router=HOST:INTERNAL_PORT
//       [--cluster_token_file=F] [--token_interval_ms=1000] [--ready_file=F]
//
// --model_dir is loaded once on the CPU only to describe the model as a real
// worker of it does (fingerprints, KV block size, element type and layout). One pacing thread
// writes every stream's tokens; gRPC's callback API serves the calls.
#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <optional>
#include <queue>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/base/cli.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "common/grpc_util.h"
#include "common/ready_file.h"
#include "common/service/auth_flags.h"
#include "common/worker_registrar.h"
#include "engine/runner_factory.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

ABSL_FLAG(std::string, model_dir, "", "Model directory (fingerprint and KV block size only)");
ABSL_FLAG(std::string, router, "", "The router's internal (registry) address, host:port");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to serve on");
ABSL_FLAG(int, token_interval_ms, 1000, "Time between two tokens of one stream");
ABSL_FLAG(int, token_id, 100, "The token id every stream carries");
ABSL_FLAG(int, kv_blocks, 1 << 20, "Free KV blocks the decode worker reports");
ABSL_FLAG(std::string, ready_file, "", "Write the bound address here as JSON once registered");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace pdserve {
namespace {

using internal::v1::DecodeEvent;
using internal::v1::PrefillEvent;

// Tokens paced so far, by every stream: the decode worker's progress.
std::atomic<uint64_t> paced_tokens{0};

// One Decode call. Its state is guarded by mu_, and no gRPC operation is
// started with mu_ held (a reaction may run inline). The pacer holds a
// reference until the stream is over, the call holds one (self_) until
// OnDone. Finish is called only while no write is under way, so a write
// never follows it.
class PacedStream final : public grpc::ServerWriteReactor<DecodeEvent> {
 public:
  // `tokens`: how many token events to stream after the reservation.
  explicit PacedStream(int tokens) : remaining_(tokens) {}

  void Begin(std::shared_ptr<PacedStream> self) {
    self_ = std::move(self);
    {
      absl::MutexLock lock(&mu_);
      event_.mutable_reserved()->mutable_kv_target()->set_endpoint("tcp://127.0.0.1:1");
      writing_ = true;
    }
    StartWrite(&event_);
  }

  // The pacer's tick: writes the next token (or the finish) unless the
  // previous write is still under way. False once the stream needs no more
  // ticks.
  bool Tick(int token_id) {
    bool more = true;
    {
      absl::MutexLock lock(&mu_);
      if (over_) return false;
      if (writing_) return true;  // a slow reader: this tick is skipped
      event_.Clear();
      if (remaining_ > 0) {
        event_.mutable_tokens()->add_token_ids(token_id);
        --remaining_;
      } else {
        event_.mutable_finished()->set_finish_reason(1);  // FINISH_REASON_LENGTH
        finishing_ = true;
        more = false;
      }
      writing_ = true;
    }
    StartWrite(&event_);  // event_ stays untouched until OnWriteDone
    paced_tokens.fetch_add(1, std::memory_order_relaxed);
    return more;
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok || cancelled_) {
        finish = EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      } else if (finishing_) {
        finish = EndLocked(grpc::Status::OK);
      }
    }
    if (finish.has_value()) Finish(*std::move(finish));
  }

  void OnCancel() override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!writing_) finish = EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    }
    if (finish.has_value()) Finish(*std::move(finish));
  }

  void OnDone() override { self_.reset(); }

 private:
  // `status` the first time (the caller calls Finish with it), else nothing.
  std::optional<grpc::Status> EndLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (over_) return std::nullopt;
    over_ = true;
    return status;
  }

  std::shared_ptr<PacedStream> self_;
  absl::Mutex mu_;
  DecodeEvent event_;  // the write under way; changed only while writing_ is false
  int remaining_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool over_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
};

// Ticks every stream once per interval from one thread.
class Pacer {
 public:
  Pacer(absl::Duration interval, int token_id)
      : interval_(interval), token_id_(token_id), thread_([this] { Run(); }) {}
  ~Pacer() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  void Add(std::shared_ptr<PacedStream> stream) {
    absl::MutexLock lock(&mu_);
    due_.push({absl::Now() + interval_, std::move(stream)});
  }
  int open() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(due_.size());
  }

 private:
  struct Due {
    absl::Time at;
    std::shared_ptr<PacedStream> stream;
    bool operator>(const Due& other) const { return at > other.at; }
  };

  void Run() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      const absl::Time next = due_.empty() ? absl::InfiniteFuture() : due_.top().at;
      auto wake = [this, next]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || (!due_.empty() && due_.top().at < next);
      };
      mu_.AwaitWithDeadline(absl::Condition(&wake), next);
      const absl::Time now = absl::Now();
      while (!stop_ && !due_.empty() && due_.top().at <= now) {
        Due d = due_.top();
        due_.pop();
        if (d.stream->Tick(token_id_)) {
          d.at += interval_;
          due_.push(std::move(d));
        }
      }
    }
  }

  const absl::Duration interval_;
  const int token_id_;
  absl::Mutex mu_;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: runs Run()
};

class PacedDecode final : public internal::v1::DecodeWorker::CallbackService {
 public:
  explicit PacedDecode(Pacer* pacer) : pacer_(pacer) {}
  grpc::ServerWriteReactor<DecodeEvent>* Decode(grpc::CallbackServerContext*,
                                                const internal::v1::DecodeJob* job) override {
    // The prefill worker's first token and the generated ones are counted.
    const int tokens =
        std::max(0, job->sampling().max_tokens() - 1 - job->generated_token_ids_size());
    auto stream = std::make_shared<PacedStream>(tokens);
    stream->Begin(stream);
    pacer_->Add(stream);
    return stream.get();
  }

 private:
  Pacer* const pacer_;
};

// One Prefill call: `accepted`, `started`, then the result, written one
// after the other (a write starts only from the previous one's OnWriteDone),
// the last together with the status. Deletes itself in OnDone.
class PacedPrefillCall final : public grpc::ServerWriteReactor<PrefillEvent> {
 public:
  explicit PacedPrefillCall(int token_id) {
    events_[0].mutable_accepted();
    events_[1].mutable_started();
    events_[2].mutable_result()->set_first_token_id(token_id);
    StartWrite(&events_[0]);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    if (++next_ == 1) {
      StartWrite(&events_[1]);
    } else {
      StartWriteAndFinish(&events_[2], grpc::WriteOptions(), grpc::Status::OK);
    }
  }
  void OnDone() override { delete this; }

 private:
  PrefillEvent events_[3];
  int next_ = 0;  // writes completed
};

class PacedPrefill final : public internal::v1::PrefillWorker::CallbackService {
 public:
  explicit PacedPrefill(int token_id) : token_id_(token_id) {}
  grpc::ServerWriteReactor<PrefillEvent>* Prefill(grpc::CallbackServerContext*,
                                                  const internal::v1::PrefillJob*) override {
    return new PacedPrefillCall(token_id_);
  }

 private:
  const int token_id_;
};

int Main() {
  if (!SetLogLevelFlag(absl::GetFlag(FLAGS_log_level))) return 2;
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  const std::string router = absl::GetFlag(FLAGS_router);
  if (model_dir.empty() || router.empty()) {
    std::cerr << "--model_dir and --router are required\n";
    return 2;
  }
  const std::string host = absl::GetFlag(FLAGS_host);
  if (absl::Status s = InitClusterAuthFromFlags(host); !s.ok()) {
    PDSERVE_LOG(ERROR) << s;
    return 2;
  }
  engine::RunnerOptions runner_options{
      .model_dir = model_dir, .num_kv_blocks = 1, .num_threads = 1};
  auto runner = engine::CreateModelRunner(runner_options);
  if (!runner.ok()) {
    PDSERVE_LOG(ERROR) << "cannot load model: " << runner.status();
    return 1;
  }

  const engine::ServedModel served = engine::DescribeServedModel(**runner, runner_options);
  const int token_id = absl::GetFlag(FLAGS_token_id);
  Pacer pacer(absl::Milliseconds(absl::GetFlag(FLAGS_token_interval_ms)), token_id);
  PacedPrefill prefill(token_id);
  PacedDecode decode(&pacer);
  auto server = StartGrpcServer(host, 0, {&prefill, &decode}, InternalServerCredentials());
  if (!server.ok()) {
    PDSERVE_LOG(ERROR) << server.status();
    return 1;
  }
  const std::string address = JoinHostPort(host, server->port);

  std::vector<std::unique_ptr<WorkerRegistrar>> registrars;
  for (const auto role : {internal::v1::WORKER_ROLE_PREFILL, internal::v1::WORKER_ROLE_DECODE}) {
    const bool is_decode = role == internal::v1::WORKER_ROLE_DECODE;
    internal::v1::WorkerInfo info;
    info.set_worker_id(absl::StrCat(is_decode ? "paced-decode-" : "paced-prefill-", address));
    info.set_role(role);
    info.set_address(address);
    if (is_decode) info.set_kv_endpoint("tcp://127.0.0.1:1");
    info.set_model_fingerprint((*runner)->fingerprint());
    info.set_kv_block_size((*runner)->kv_block_size());
    info.set_config_fingerprint(served.config_fingerprint);
    info.set_checkpoint_fingerprint(served.checkpoint_fingerprint);
    info.set_weight_dtype(served.weight_dtype);
    info.set_kv_dtype(served.kv_dtype);
    info.set_kv_layout(served.kv_layout);
    info.set_backend(served.backend);
    const int kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
    registrars.push_back(
        std::make_unique<WorkerRegistrar>(router, info, [&pacer, kv_blocks, is_decode] {
          internal::v1::WorkerLoad load;
          if (is_decode) {
            const int open = pacer.open();
            load.set_running_sequences(open);
            load.set_has_work(open > 0);
            load.set_progress(paced_tokens.load(std::memory_order_relaxed));
          }
          load.set_free_kv_blocks(kv_blocks);
          load.set_total_kv_blocks(kv_blocks);
          return load;
        }));
  }
  for (int i = 0; i < 600; ++i) {
    if (registrars[0]->registered() && registrars[1]->registered()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!registrars[0]->registered() || !registrars[1]->registered()) {
    PDSERVE_LOG(ERROR) << "the router at " << router << " did not accept the workers";
    return 1;
  }
  AnnounceReady(absl::GetFlag(FLAGS_ready_file), address, 0);
  PDSERVE_LOG(INFO) << "paced workers serving on " << address << ", one token every "
                    << absl::GetFlag(FLAGS_token_interval_ms) << " ms per stream";
  const int sig = WaitForShutdownSignal();
  PDSERVE_LOG(INFO) << "signal " << sig << ": stopping";
  registrars.clear();
  server->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::BlockShutdownSignals();
  pdserve::ParseFlags(argc, argv,
                      "A scripted prefill and decode worker pair that registers with a router and "
                      "streams one token per interval per request (router benchmarks)",
                      __FILE__);
  return pdserve::Main();
}
