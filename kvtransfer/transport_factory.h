// Builds KV transports by kind. Built in: "tcp". The device transport
// ("nccl": NCCL between GPUs, CUDA IPC on one GPU) and the device staging
// that lets "tcp" move device regions come from the device transport
// library, which registers them (kvtransfer/device/register.h) in builds
// that link it. Asking for a kind that is not registered is
// INVALID_ARGUMENT.
//
// Endpoints name their transport by scheme: "tcp://host:port" is kind "tcp".
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/runtime/model_runner.h"
#include "kvtransfer/device_staging.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer {

// A receiver of `kind` listening on `bind_host`:`port` (0 = any free port),
// writing into `regions` (the runner's; they must outlive the receiver).
absl::StatusOr<std::unique_ptr<KvReceiver>> CreateKvReceiver(
    const std::string& kind, const std::string& bind_host, int port,
    std::span<const engine::KvRegion> regions);
// A sender of `kind` reading from `regions` (they must outlive the sender).
absl::StatusOr<std::unique_ptr<KvSender>> CreateKvSender(const std::string& kind,
                                                         std::span<const engine::KvRegion> regions);

// The kind an endpoint's scheme names ("tcp" for "tcp://..."); INVALID_ARGUMENT
// if it has no "scheme://" prefix. The kind may still not be built in.
absl::StatusOr<std::string> TransportKindOf(absl::string_view endpoint);

// A sender for any registered kind: each Open() picks the transport by the
// endpoint's scheme, creating one underlying sender per kind on first use.
// Open() is thread-safe. An endpoint of a kind not built in fails Open() with
// INVALID_ARGUMENT.
std::unique_ptr<KvSender> CreateKvSenderForAnyEndpoint(std::span<const engine::KvRegion> regions);

// Registration of transports beyond "tcp", once at start-up (thread-safe).
struct KvTransportFactory {
  std::function<absl::StatusOr<std::unique_ptr<KvSender>>(std::span<const engine::KvRegion>)>
      sender;
  std::function<absl::StatusOr<std::unique_ptr<KvReceiver>>(const std::string& bind_host, int port,
                                                            std::span<const engine::KvRegion>)>
      receiver;
};
void RegisterKvTransport(const std::string& kind, KvTransportFactory factory);
// The staging "tcp" uses for device regions.
void SetKvDeviceStaging(std::shared_ptr<KvDeviceStaging> staging);

}  // namespace pdserve::kvtransfer
