#include "router/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
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

bool KvCompatible(const WorkerDesc& prefill, const WorkerDesc& decode) {
  return prefill.model_fingerprint == decode.model_fingerprint &&
         prefill.kv_dtype == decode.kv_dtype && prefill.kv_layout == decode.kv_layout;
}

std::string_view WorkerHealthName(WorkerHealth health) {
  switch (health) {
    case WorkerHealth::kLive:
      return "live";
    case WorkerHealth::kGone:
      return "gone";
    case WorkerHealth::kDisconnected:
      return "disconnected";
    case WorkerHealth::kUnhealthy:
      return "unhealthy";
    case WorkerHealth::kHung:
      return "hung";
  }
  return "unknown";
}

namespace {

// The first field where `desc` differs from the router's model, as a
// refusal naming it (the values only where they are readable names).
absl::Status CheckAgainstReference(const WorkerDesc& desc, const ModelReference& ref) {
  auto refuse = [&](absl::string_view field, absl::string_view detail) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", desc.id, " refused: ", field,
                                                      " differs from the router's model (", detail,
                                                      ")"));
  };
  if (ref.config_fingerprint != 0 && desc.config_fingerprint != ref.config_fingerprint) {
    return refuse("config", desc.config_fingerprint == 0
                                ? "the worker reported none"
                                : "config.json: another architecture, shape or vocabulary");
  }
  if (ref.checkpoint_fingerprint != 0 &&
      desc.checkpoint_fingerprint != ref.checkpoint_fingerprint) {
    return refuse("weights", desc.checkpoint_fingerprint == 0
                                 ? "the worker reported none"
                                 : "the same config with other weights");
  }
  if (!ref.weight_dtype.empty() && desc.weight_dtype != ref.weight_dtype) {
    return refuse("weight_dtype",
                  absl::StrCat("worker ", desc.weight_dtype, ", router ", ref.weight_dtype));
  }
  if (!ref.kv_dtype.empty() && desc.kv_dtype != ref.kv_dtype) {
    return refuse("kv_dtype", absl::StrCat("worker ", desc.kv_dtype, " (", desc.backend,
                                           "), router ", ref.kv_dtype));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WorkerRegistry::Register(const WorkerDesc& desc, const LoadReport& load,
                                      absl::Time now) {
  if (desc.id.empty()) return absl::InvalidArgumentError("worker_id is empty");
  if (desc.address.empty()) return absl::InvalidArgumentError("address is empty");
  if (desc.role == Role::kDecode && desc.kv_endpoint.empty()) {
    return absl::InvalidArgumentError("a decode worker needs a kv_endpoint");
  }
  if (absl::Status s = CheckAgainstReference(desc, options_.reference); !s.ok()) {
    PDSERVE_LOG(WARNING) << s.message();
    return s;
  }
  absl::MutexLock lock(&mu_);
  NoteHeardLocked(now);
  ExpireLocked(now);
  Entry& e = workers_[desc.id];
  const bool is_new = e.desc.id.empty();
  if (is_new) {
    e.incarnation = next_incarnation_++;
    e.last_progress = now;
  }
  e.desc = desc;
  e.disconnected = false;
  TakeReportLocked(e, load, now);
  if (is_new) {
    PDSERVE_LOG(INFO) << "worker " << desc.id << " joined ("
                      << (desc.role == Role::kPrefill ? "prefill" : "decode") << ", "
                      << desc.address << ", " << desc.backend << ", KV " << desc.kv_dtype << ")";
  }
  return absl::OkStatus();
}

void WorkerRegistry::TakeReportLocked(Entry& e, const LoadReport& load, absl::Time now) {
  if (!load.has_work || load.progress != e.load.progress || !e.load.has_work) {
    e.last_progress = now;
  }
  if (load.unhealthy_reason != e.load.unhealthy_reason) {
    if (load.unhealthy_reason.empty()) {
      PDSERVE_LOG(INFO) << "worker " << e.desc.id << " reports it is healthy again";
    } else {
      PDSERVE_LOG(WARNING) << "worker " << e.desc.id
                           << " reports it cannot serve: " << load.unhealthy_reason;
    }
  }
  e.load = load;
  e.last_seen = now;
  e.finished_requests_since_report = 0;
  e.finished_tokens_since_report = 0;
  e.started_tokens_since_report = 0;
  UpdatePrefixesLocked(e, &load.cached_block_hashes, now);
}

bool WorkerRegistry::Heartbeat(const std::string& id, const LoadReport& load, absl::Time now) {
  absl::MutexLock lock(&mu_);
  NoteHeardLocked(now);
  ExpireLocked(now);
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  if (it->second.disconnected) PDSERVE_LOG(INFO) << "worker " << id << " is heard from again";
  it->second.disconnected = false;
  TakeReportLocked(it->second, load, now);
  return true;
}

void WorkerRegistry::Deregister(const std::string& id) {
  absl::MutexLock lock(&mu_);
  if (workers_.erase(id) > 0) PDSERVE_LOG(INFO) << "worker " << id << " left";
}

void WorkerRegistry::ReportDisconnected(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.disconnected) return;
  it->second.disconnected = true;
  PDSERVE_LOG(WARNING) << "worker " << id
                       << ": connection lost; not offered until heard from again";
}

Judgement WorkerRegistry::HealthLocked(const Entry& e, absl::Time now) const {
  if (e.disconnected) {
    return {WorkerHealth::kDisconnected, absl::StrCat("worker ", e.desc.id, ": connection lost")};
  }
  if (!e.load.unhealthy_reason.empty()) {
    return {
        WorkerHealth::kUnhealthy,
        absl::StrCat("worker ", e.desc.id, " reports it cannot serve: ", e.load.unhealthy_reason)};
  }
  if (options_.hang_timeout > absl::ZeroDuration() && e.load.has_work &&
      now - e.last_progress > options_.hang_timeout) {
    return {WorkerHealth::kHung,
            absl::StrCat("worker ", e.desc.id, " is hung: it has work and completed no step for ",
                         absl::FormatDuration(now - e.last_progress))};
  }
  return {WorkerHealth::kLive, ""};
}

Judgement WorkerRegistry::Judge(const std::string& id, uint64_t incarnation, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = workers_.find(id);
  if (it == workers_.end() || (incarnation != 0 && it->second.incarnation != incarnation)) {
    return {WorkerHealth::kGone,
            absl::StrCat("worker ", id, " left the pool (heartbeats stopped, or it restarted)")};
  }
  return HealthLocked(it->second, now);
}

std::unordered_map<std::string, WorkerRegistry::WorkerState> WorkerRegistry::JudgeAll(
    absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  std::unordered_map<std::string, WorkerState> out;
  for (const auto& [id, e] : workers_) out[id] = {e.incarnation, HealthLocked(e, now)};
  return out;
}

std::vector<WorkerView> WorkerRegistry::Live(Role role, absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  std::vector<WorkerView> out;
  for (const auto& [id, e] : workers_) {
    if (e.desc.role != role || e.load.draining) continue;
    if (HealthLocked(e, now).health != WorkerHealth::kLive) continue;
    // A report taken before work this router saw finish still counts it.
    LoadReport load = e.load;
    load.queued_prompt_tokens =
        std::max<int64_t>(0, load.queued_prompt_tokens - e.finished_tokens_since_report);
    load.queued_requests = std::max(0, load.queued_requests - e.finished_requests_since_report);
    load.running_sequences = std::max(0, load.running_sequences - e.finished_requests_since_report);
    if (role == Role::kDecode && e.desc.kv_block_size > 0) {
      // Reservations this router saw end since the report freed their KV.
      load.free_kv_blocks = static_cast<int>(std::min<int64_t>(
          load.total_kv_blocks,
          load.free_kv_blocks + e.finished_tokens_since_report / e.desc.kv_block_size));
    }
    out.push_back(WorkerView{.desc = e.desc,
                             .load = std::move(load),
                             .incarnation = e.incarnation,
                             .outstanding_requests = e.outstanding_requests,
                             .outstanding_tokens = e.outstanding_tokens,
                             .tokens_since_report = e.started_tokens_since_report,
                             .cached_prefixes = e.prefixes});
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
  it->second.started_tokens_since_report += prompt_tokens;
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
               return e.reported.contains(r.first) || now - r.second > options_.ttl;
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

void WorkerRegistry::NoteHeardLocked(absl::Time now) {
  if (now - last_heard_ > options_.ttl / 2) intake_resumed_ = now;
  last_heard_ = std::max(last_heard_, now);
}

void WorkerRegistry::ExpireLocked(absl::Time now) {
  if (last_activity_ != absl::InfinitePast() && now - last_activity_ > options_.ttl &&
      !workers_.empty()) {
    PDSERVE_LOG(WARNING) << "the router was not running for "
                         << absl::FormatDuration(now - last_activity_) << "; every worker gets "
                         << absl::FormatDuration(options_.ttl) << " to be heard before it expires";
    for (auto& [id, e] : workers_) {
      e.last_seen = std::max(e.last_seen, now);
      e.last_progress = std::max(e.last_progress, now);
    }
  }
  last_activity_ = std::max(last_activity_, now);
  // A worker's silence counts only while others are heard: another worker
  // heard at least half a ttl after this one's last heartbeat, with the
  // intake running for half a ttl since its last gap (heartbeats held up
  // together arrive together, and the first must not expire the rest).
  // Otherwise the router's intake, or the whole machine, is what stalled,
  // and a worker gets up to twice the ttl.
  const bool intake_running = now - intake_resumed_ >= options_.ttl / 2;
  for (auto it = workers_.begin(); it != workers_.end();) {
    const absl::Duration silent = now - it->second.last_seen;
    const bool others_heard =
        intake_running && last_heard_ - it->second.last_seen >= options_.ttl / 2;
    if (silent > options_.ttl && (others_heard || silent > 2 * options_.ttl)) {
      PDSERVE_LOG(WARNING) << "worker " << it->first << " missed its heartbeats for "
                           << absl::FormatDuration(now - it->second.last_seen) << "; dropped";
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace pdserve::router
