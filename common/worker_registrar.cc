#include "common/worker_registrar.h"

#include <algorithm>

#include "common/base/logging.h"
#include "common/grpc_util.h"

namespace pdserve {
namespace {
constexpr absl::Duration kRpcTimeout = absl::Seconds(2);
constexpr absl::Duration kRetryInterval = absl::Milliseconds(250);

void SetDeadline(grpc::ClientContext& ctx, absl::Duration timeout) {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}
}  // namespace

WorkerRegistrar::WorkerRegistrar(std::string router_address, internal::v1::WorkerInfo info,
                                 LoadFn load, RegisteredFn on_registered)
    : router_address_(std::move(router_address)),
      info_(std::move(info)),
      load_(std::move(load)),
      on_registered_(std::move(on_registered)),
      stub_(internal::v1::Registry::NewStub(MakeChannel(router_address_))) {
  thread_ = std::thread([this] { Run(); });
}

WorkerRegistrar::~WorkerRegistrar() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  internal::v1::DeregisterRequest req;
  req.set_worker_id(info_.worker_id());
  internal::v1::DeregisterResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(ctx, absl::Seconds(1));
  stub_->Deregister(&ctx, req, &resp);  // best effort: the router also expires us
}

bool WorkerRegistrar::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

void WorkerRegistrar::Poke() {
  absl::MutexLock lock(&mu_);
  poke_ = true;
}

void WorkerRegistrar::Run() {
  absl::Duration interval = absl::Seconds(1);
  bool registered = false;
  bool was_registered = false;
  bool logged_failure = false;
  while (true) {
    bool heartbeat_failed = false;
    if (registered) {
      internal::v1::HeartbeatRequest req;
      req.set_worker_id(info_.worker_id());
      *req.mutable_load() = load_();
      internal::v1::HeartbeatResponse resp;
      grpc::ClientContext ctx;
      SetDeadline(ctx, kRpcTimeout);
      grpc::Status status = stub_->Heartbeat(&ctx, req, &resp);
      if (status.ok() && !resp.known()) {
        // A restarted router (or one that dropped us): register at once.
        PDSERVE_LOG(WARNING) << "router forgot " << info_.worker_id() << "; registering again";
        registered = false;
      } else if (!status.ok()) {
        heartbeat_failed = true;
        if (!logged_failure) {
          PDSERVE_LOG(WARNING) << "heartbeat to " << router_address_
                               << " failed: " << status.error_message() << " (retrying)";
          logged_failure = true;
        }
      } else {
        logged_failure = false;
      }
    }
    if (!registered) {
      internal::v1::RegisterRequest req;
      *req.mutable_worker() = info_;
      *req.mutable_load() = load_();
      internal::v1::RegisterResponse resp;
      grpc::ClientContext ctx;
      SetDeadline(ctx, kRpcTimeout);
      grpc::Status status = stub_->Register(&ctx, req, &resp);
      if (status.ok()) {
        registered = true;
        logged_failure = false;
        if (resp.heartbeat_interval_ms() > 0)
          interval = absl::Milliseconds(resp.heartbeat_interval_ms());
        PDSERVE_LOG(INFO) << "registered with router " << router_address_ << " as "
                          << info_.worker_id();
      } else if (!logged_failure) {
        PDSERVE_LOG(WARNING) << "cannot register with router " << router_address_ << ": "
                             << status.error_message() << " (retrying)";
        logged_failure = true;
      }
    }
    if (on_registered_ && registered != was_registered) on_registered_(registered);
    was_registered = registered;
    absl::MutexLock lock(&mu_);
    registered_ = registered;
    auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || poke_; };
    // While the router cannot be reached, try again sooner than a
    // heartbeat interval, so a restarted router hears from us at once.
    mu_.AwaitWithTimeout(absl::Condition(&wake), registered && !heartbeat_failed
                                                     ? interval
                                                     : std::min(interval, kRetryInterval));
    if (stop_) return;
    poke_ = false;
  }
}

}  // namespace pdserve
