#include "router/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "engine/kvcache/kv_cache_manager.h"

namespace pdserve::router {

const std::vector<uint64_t>& PrefillQuery::LookupHashes(int block_size) const {
  for (const auto& [size, hashes] : hashes_) {
    if (size == block_size) return hashes;
  }
  std::vector<uint64_t> hashes;
  if (block_size > 0 && !prompt_.empty()) {
    hashes = engine::BlockHashDigests(prompt_.first(prompt_.size() - 1), block_size);
  }
  hashes_.emplace_back(block_size, std::move(hashes));
  return hashes_.back().second;
}

int CachedPrefixTokens(const WorkerView& worker, const PrefillQuery& query) {
  const int block_size = worker.desc.kv_block_size;
  if (worker.cached_prefixes->empty() || block_size <= 0) return 0;
  const std::vector<uint64_t>& hashes = query.LookupHashes(block_size);
  for (int i = static_cast<int>(hashes.size()) - 1; i >= 0; --i) {
    if (engine::IsDigestPosition(i) && worker.cached_prefixes->contains(hashes[i])) {
      return (i + 1) * block_size;
    }
  }
  return 0;
}

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
  e.failing = false;
  e.finished_requests_since_report = 0;
  e.finished_tokens_since_report = 0;
  UpdatePrefixesLocked(e, &load.cached_block_hashes, now);
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
  if (it->second.failing) PDSERVE_LOG(INFO) << "worker " << id << " is heard from again";
  it->second.failing = false;
  it->second.finished_requests_since_report = 0;
  it->second.finished_tokens_since_report = 0;
  UpdatePrefixesLocked(it->second, &load.cached_block_hashes, now);
  return true;
}

void WorkerRegistry::Deregister(const std::string& id) {
  absl::MutexLock lock(&mu_);
  if (workers_.erase(id) > 0) PDSERVE_LOG(INFO) << "worker " << id << " left";
}

void WorkerRegistry::ReportFailure(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.failing) return;
  it->second.failing = true;
  PDSERVE_LOG(WARNING) << "worker " << id << " failed a call; not offered until heard from again";
}

std::vector<WorkerView> WorkerRegistry::Live(Role role, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  std::vector<WorkerView> out;
  for (const auto& [id, e] : workers_) {
    if (e.desc.role != role || e.load.draining || e.failing) continue;
    // A report taken before work this router saw finish still counts it.
    LoadReport load = e.load;
    load.queued_prompt_tokens =
        std::max<int64_t>(0, load.queued_prompt_tokens - e.finished_tokens_since_report);
    load.queued_requests = std::max(0, load.queued_requests - e.finished_requests_since_report);
    load.running_sequences = std::max(0, load.running_sequences - e.finished_requests_since_report);
    out.push_back(WorkerView{e.desc, std::move(load), e.outstanding_requests, e.outstanding_tokens,
                             e.prefixes});
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

OutstandingWork WorkerRegistry::StartPrefill(const WorkerView& worker, const PrefillQuery& query,
                                             absl::Time now) {
  const int64_t uncached = query.prompt_tokens() - CachedPrefixTokens(worker, query);
  OutstandingWork work = StartWork(worker.desc.id, uncached);
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker.desc.id);
  if (it == workers_.end()) return work;
  Entry& e = it->second;
  const std::vector<uint64_t>& hashes = query.LookupHashes(e.desc.kv_block_size);
  bool added = false;
  for (int i = 0; i < static_cast<int>(hashes.size()); ++i) {
    if (!engine::IsDigestPosition(i) || e.reported.contains(hashes[i])) continue;
    added |= e.routed.insert_or_assign(hashes[i], now).second;
  }
  if (added) UpdatePrefixesLocked(e, nullptr, now);
  return work;
}

void WorkerRegistry::UpdatePrefixesLocked(Entry& e, const std::vector<uint64_t>* digest,
                                          absl::Time now) {
  bool changed = false;
  if (digest != nullptr) {
    PrefixHashSet reported(digest->begin(), digest->end());
    changed = reported != e.reported;
    e.reported = std::move(reported);
  }
  changed |= std::erase_if(e.routed, [&](const auto& r) {
               return e.reported.contains(r.first) || now - r.second > ttl_;
             }) > 0;
  if (!changed && digest != nullptr) return;
  auto all = std::make_shared<PrefixHashSet>(e.reported);
  for (const auto& [hash, when] : e.routed) all->insert(hash);
  e.prefixes = std::move(all);
}

void WorkerRegistry::FinishWork(const std::string& id, uint64_t incarnation, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.incarnation != incarnation) return;
  it->second.outstanding_requests -= 1;
  it->second.outstanding_tokens -= tokens;
  it->second.finished_requests_since_report += 1;
  it->second.finished_tokens_since_report += tokens;
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
  if (last_activity_ != absl::InfinitePast() && now - last_activity_ > ttl_ && !workers_.empty()) {
    PDSERVE_LOG(WARNING) << "the router was not running for "
                         << absl::FormatDuration(now - last_activity_) << "; every worker gets "
                         << absl::FormatDuration(ttl_) << " to be heard before it expires";
    for (auto& [id, e] : workers_) e.last_seen = std::max(e.last_seen, now);
  }
  last_activity_ = std::max(last_activity_, now);
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
