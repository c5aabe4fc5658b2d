// Keeps a worker registered with the router: registers, then heartbeats with
// the worker's load at the interval the router asks for; registers again if
// the router forgot it (router restart, or the worker was declared dead);
// deregisters on destruction. Runs one background thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve {

class WorkerRegistrar {
 public:
  using LoadFn = std::function<internal::v1::WorkerLoad()>;
  // Told whether the worker is registered, from the registrar thread, each
  // time that changes (e.g. to set the gRPC health status: a worker the
  // router refuses, wrong cluster token or router down, reports NOT_SERVING).
  using RegisteredFn = std::function<void(bool registered)>;

  // `load` is called from the registrar thread and must be thread-safe.
  WorkerRegistrar(std::string router_address, internal::v1::WorkerInfo info, LoadFn load,
                  RegisteredFn on_registered = nullptr);
  ~WorkerRegistrar();

  bool registered() const;
  // Sends a heartbeat now (e.g. when draining starts) instead of at the next tick.
  void Poke();

 private:
  void Run();

  const std::string router_address_;
  const internal::v1::WorkerInfo info_;
  const LoadFn load_;
  const RegisteredFn on_registered_;
  std::unique_ptr<internal::v1::Registry::Stub> stub_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool poke_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started after everything above exists
};

}  // namespace pdserve
