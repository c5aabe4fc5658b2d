#include "router/worker_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace pdserve::router {

absl::Status WorkerRegistry::Register(const WorkerDesc& desc, const LoadReport& load,
                                      absl::Time now) {
  if (desc.id.empty()) return absl::InvalidArgumentError("worker_id is empty");
  if (desc.address.empty()) return absl::InvalidArgumentError("address is empty");
  if (desc.role == Role::kDecode && desc.kv_endpoint.empty()) {
    return absl::InvalidArgumentError("a decode worker needs a kv_endpoint");
  }
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  for (const auto& [id, e] : workers_) {
    if (id != desc.id && e.desc.model_fingerprint != desc.model_fingerprint) {
      return absl::FailedPreconditionError(
          absl::StrFormat("model fingerprint %016x differs from worker %s's %016x: all workers "
                          "must serve the same model",
                          desc.model_fingerprint, id, e.desc.model_fingerprint));
    }
  }
  Entry& e = workers_[desc.id];
  const bool is_new = e.desc.id.empty();
  if (is_new) e.incarnation = next_incarnation_++;
  e.desc = desc;
  e.load = load;
  e.last_seen = now;
  if (is_new) {
    PDSERVE_LOG(INFO) << "worker " << desc.id << " joined ("
                      << (desc.role == Role::kPrefill ? "prefill" : "decode") << ", "
                      << desc.address << ")";
  }
  return absl::OkStatus();
}

bool WorkerRegistry::Heartbeat(const std::string& id, const LoadReport& load, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  it->second.load = load;
  it->second.last_seen = now;
  return true;
}

void WorkerRegistry::Deregister(const std::string& id) {
  absl::MutexLock lock(&mu_);
  if (workers_.erase(id) > 0) PDSERVE_LOG(INFO) << "worker " << id << " left";
}

std::vector<WorkerView> WorkerRegistry::Live(Role role, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  std::vector<WorkerView> out;
  for (const auto& [id, e] : workers_) {
    if (e.desc.role != role || e.load.draining) continue;
    out.push_back(WorkerView{e.desc, e.load, e.outstanding_requests, e.outstanding_tokens});
  }
  return out;
}

int WorkerRegistry::CountLive(Role role, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  int n = 0;
  for (const auto& [id, e] : workers_) n += e.desc.role == role;
  return n;
}

OutstandingWork WorkerRegistry::StartWork(const std::string& id, int64_t prompt_tokens) {
  OutstandingWork work;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return work;
  it->second.outstanding_requests += 1;
  it->second.outstanding_tokens += prompt_tokens;
  work.registry_ = this;
  work.id_ = id;
  work.incarnation_ = it->second.incarnation;
  work.tokens_ = prompt_tokens;
  return work;
}

void WorkerRegistry::FinishWork(const std::string& id, uint64_t incarnation, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.incarnation != incarnation) return;
  it->second.outstanding_requests -= 1;
  it->second.outstanding_tokens -= tokens;
}

OutstandingWork& OutstandingWork::operator=(OutstandingWork&& other) noexcept {
  if (this != &other) {
    Release();
    registry_ = std::exchange(other.registry_, nullptr);
    id_ = std::move(other.id_);
    incarnation_ = other.incarnation_;
    tokens_ = other.tokens_;
  }
  return *this;
}

void OutstandingWork::Release() {
  if (registry_ == nullptr) return;
  std::exchange(registry_, nullptr)->FinishWork(id_, incarnation_, tokens_);
}

void WorkerRegistry::ExpireLocked(absl::Time now) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (now - it->second.last_seen > ttl_) {
      PDSERVE_LOG(WARNING) << "worker " << it->first << " missed its heartbeats for "
                           << absl::FormatDuration(now - it->second.last_seen) << "; dropped";
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace pdserve::router
