// Transport selection by kind and by endpoint scheme.
#include "kvtransfer/transport_factory.h"

#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"

namespace pdserve::kvtransfer {
namespace {

// Registered transports beyond "tcp", and tcp's device staging.
struct Registry {
  absl::Mutex mu;
  std::map<std::string, KvTransportFactory> factories ABSL_GUARDED_BY(mu);
  std::shared_ptr<KvDeviceStaging> staging ABSL_GUARDED_BY(mu);
};
Registry& GetRegistry() {
  static Registry* registry = new Registry();  // process lifetime
  return *registry;
}

absl::Status NotBuiltIn(absl::string_view kind) {
  Registry& r = GetRegistry();
  std::vector<std::string> kinds = {"tcp"};
  {
    absl::MutexLock l(&r.mu);
    for (const auto& [name, factory] : r.factories) kinds.push_back(name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("kv transport '", kind,
                   "' is not built in this binary (built in: ", absl::StrJoin(kinds, ", "), ")"));
}

std::shared_ptr<KvDeviceStaging> Staging() {
  Registry& r = GetRegistry();
  absl::MutexLock l(&r.mu);
  return r.staging;
}

// The registered factory for `kind`, or null.
std::unique_ptr<KvTransportFactory> Lookup(const std::string& kind) {
  Registry& r = GetRegistry();
  absl::MutexLock l(&r.mu);
  auto it = r.factories.find(kind);
  if (it == r.factories.end()) return nullptr;
  return std::make_unique<KvTransportFactory>(it->second);
}

// Routes Open() to one sender per kind, created on first use.
class SchemeRoutingSender final : public KvSender {
 public:
  explicit SchemeRoutingSender(std::span<const engine::KvRegion> regions) : regions_(regions) {}

  absl::StatusOr<std::unique_ptr<SendSession>> Open(const std::string& endpoint, TransferId id,
                                                    const TransferSpec& spec) override {
    absl::StatusOr<std::string> kind = TransportKindOf(endpoint);
    if (!kind.ok()) return kind.status();
    KvSender* sender = nullptr;
    {
      absl::MutexLock l(&mu_);
      std::unique_ptr<KvSender>& slot = senders_[*kind];
      if (slot == nullptr) {
        absl::StatusOr<std::unique_ptr<KvSender>> created = CreateKvSender(*kind, regions_);
        if (!created.ok()) {
          senders_.erase(*kind);
          return created.status();
        }
        slot = std::move(*created);
      }
      sender = slot.get();  // never removed while *this lives
    }
    return sender->Open(endpoint, id, spec);
  }

 private:
  const std::span<const engine::KvRegion> regions_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<KvSender>> senders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateKvReceiver(
    const std::string& kind, const std::string& bind_host, int port,
    std::span<const engine::KvRegion> regions) {
  if (kind == "tcp") {
    TcpReceiverOptions options;
    options.device_staging = Staging();
    return TcpKvReceiver::Create(bind_host, port, regions, std::move(options));
  }
  if (std::unique_ptr<KvTransportFactory> f = Lookup(kind); f != nullptr) {
    return f->receiver(bind_host, port, regions);
  }
  return NotBuiltIn(kind);
}

absl::StatusOr<std::unique_ptr<KvSender>> CreateKvSender(
    const std::string& kind, std::span<const engine::KvRegion> regions) {
  if (kind == "tcp") {
    TcpSenderOptions options;
    options.device_staging = Staging();
    return TcpKvSender::Create(regions, std::move(options));
  }
  if (std::unique_ptr<KvTransportFactory> f = Lookup(kind); f != nullptr) {
    return f->sender(regions);
  }
  return NotBuiltIn(kind);
}

absl::StatusOr<std::string> TransportKindOf(absl::string_view endpoint) {
  const size_t sep = endpoint.find("://");
  if (sep == absl::string_view::npos || sep == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv endpoint '", endpoint, "' has no scheme (want e.g. tcp://host:port)"));
  }
  return std::string(endpoint.substr(0, sep));
}

std::unique_ptr<KvSender> CreateKvSenderForAnyEndpoint(std::span<const engine::KvRegion> regions) {
  return std::make_unique<SchemeRoutingSender>(regions);
}

void RegisterKvTransport(const std::string& kind, KvTransportFactory factory) {
  Registry& r = GetRegistry();
  absl::MutexLock l(&r.mu);
  r.factories[kind] = std::move(factory);
}

void SetKvDeviceStaging(std::shared_ptr<KvDeviceStaging> staging) {
  Registry& r = GetRegistry();
  absl::MutexLock l(&r.mu);
  r.staging = std::move(staging);
}

}  // namespace pdserve::kvtransfer
