// Transport selection by kind and by endpoint scheme.
#include "kvtransfer/transport_factory.h"

#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"

namespace pdserve::kvtransfer {
namespace {

constexpr absl::string_view kBuiltIn = "tcp";

absl::Status NotBuiltIn(absl::string_view kind) {
  return absl::InvalidArgumentError(absl::StrCat(
      "kv transport '", kind, "' is not built in this binary (built in: ", kBuiltIn, ")"));
}

// Routes Open() to one sender per kind, created on first use.
class SchemeRoutingSender final : public KvSender {
 public:
  absl::StatusOr<std::unique_ptr<SendSession>> Open(const std::string& endpoint, TransferId id,
                                                    const TransferSpec& spec) override {
    absl::StatusOr<std::string> kind = TransportKindOf(endpoint);
    if (!kind.ok()) return kind.status();
    KvSender* sender = nullptr;
    {
      absl::MutexLock l(&mu_);
      std::unique_ptr<KvSender>& slot = senders_[*kind];
      if (slot == nullptr) {
        absl::StatusOr<std::unique_ptr<KvSender>> created = CreateKvSender(*kind);
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
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<KvSender>> senders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateKvReceiver(const std::string& kind,
                                                             const std::string& bind_host,
                                                             int port) {
  if (kind == "tcp") return TcpKvReceiver::Create(bind_host, port);
  return NotBuiltIn(kind);
}

absl::StatusOr<std::unique_ptr<KvSender>> CreateKvSender(const std::string& kind) {
  if (kind == "tcp") return TcpKvSender::Create();
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

std::unique_ptr<KvSender> CreateKvSenderForAnyEndpoint() {
  return std::make_unique<SchemeRoutingSender>();
}

}  // namespace pdserve::kvtransfer
