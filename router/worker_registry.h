// The router's view of the worker pools: who is registered, their last
// reported load, and what this router has sent them that their reports may
// not show yet (outstanding work; prompt prefixes routed to a prefill worker
// since its last digest). Time is an input (no clock reads), so expiry is
// tested without sleeping. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pdserve::router {

enum class Role { kPrefill, kDecode };

struct WorkerDesc {
  std::string id;
  Role role = Role::kPrefill;
  std::string address;      // gRPC host:port
  std::string kv_endpoint;  // decode only
  uint64_t model_fingerprint = 0;
  int kv_block_size = 0;  // tokens per KV block
  std::string metrics_address;
  // Decode: KV tokens reserved beyond the prompt at admission (lazy
  // growth); negative: whole requests are reserved.
  int kv_headroom_tokens = -1;
};

struct LoadReport {
  int64_t queued_prompt_tokens = 0;  // prefill
  int queued_requests = 0;           // prefill
  int running_sequences = 0;         // decode
  int free_kv_blocks = 0;            // decode
  int total_kv_blocks = 0;           // decode
  bool draining = false;
  // Prefill: digest of the cached KV blocks (engine/kvcache:
  // KvCacheManager::CachedHashDigest).
  std::vector<uint64_t> cached_block_hashes;
};

using PrefixHashSet = std::unordered_set<uint64_t>;

// A live worker as routing policies see it.
struct WorkerView {
  WorkerDesc desc;
  LoadReport load;
  int outstanding_requests = 0;    // sent by this router, not yet finished
  int64_t outstanding_tokens = 0;  // prompt tokens (not cached there) of outstanding prefills
  // Prefill: block hashes (digest positions) the worker is believed to
  // cache: its last digest plus what this router sent it since. Never null.
  std::shared_ptr<const PrefixHashSet> cached_prefixes = std::make_shared<PrefixHashSet>();
};

// A prompt to place on a prefill worker. Hashes its blocks the way workers
// do (engine/kvcache BlockHashDigests, with each worker's registered block size),
// once per block size. Not thread-safe; the prompt must outlive it.
class PrefillQuery {
 public:
  explicit PrefillQuery(std::span<const int32_t> prompt) : prompt_(prompt) {}
  std::span<const int32_t> prompt() const { return prompt_; }
  int prompt_tokens() const { return static_cast<int>(prompt_.size()); }
  // Chained hashes of the full blocks a worker looks up at admission (those
  // before the prompt's last token). Empty for block_size <= 0.
  const std::vector<uint64_t>& LookupHashes(int block_size) const;

 private:
  std::span<const int32_t> prompt_;
  mutable std::vector<std::pair<int, std::vector<uint64_t>>> hashes_;  // by block size
};

// Prompt tokens `worker` is believed to hold cached for `query`: the deepest
// digest position where the prompt's chained hash is among its cached
// prefixes (a lower bound, short by at most seven blocks).
int CachedPrefixTokens(const WorkerView& worker, const PrefillQuery& query);

class WorkerRegistry;

// Work this router sent to a worker, counted in the worker's outstanding
// requests and prompt tokens until the handle is released or destroyed. The
// count is tied to the worker's incarnation: a worker that was dropped and
// registered again starts from zero, and work sent to its earlier
// incarnation does not drive the new count below zero. Movable; the registry
// must outlive it.
class OutstandingWork {
 public:
  OutstandingWork() = default;
  OutstandingWork(OutstandingWork&& other) noexcept { *this = std::move(other); }
  OutstandingWork& operator=(OutstandingWork&& other) noexcept;
  ~OutstandingWork() { Release(); }
  void Release();

 private:
  friend class WorkerRegistry;
  WorkerRegistry* registry_ = nullptr;
  std::string id_;
  uint64_t incarnation_ = 0;
  int64_t tokens_ = 0;
};

class WorkerRegistry {
 public:
  // A worker silent for longer than `ttl` is dropped. Every call that takes
  // `now` is registry activity; the router calls it at least every few
  // hundred milliseconds (heartbeats, its pool watcher). When the previous
  // activity is more than `ttl` before `now`, the router itself was not
  // running (stopped, starved): workers' heartbeats could not be heard, so
  // each worker gets one `ttl` from `now` before it can expire, rather than
  // the whole pool expiring at once.
  explicit WorkerRegistry(absl::Duration ttl) : ttl_(ttl) {}

  // Adds or replaces a worker. FAILED_PRECONDITION if its model fingerprint
  // differs from the live workers' (mixing models would corrupt KV).
  absl::Status Register(const WorkerDesc& desc, const LoadReport& load, absl::Time now);
  // False if the worker is unknown (expired or never registered).
  bool Heartbeat(const std::string& id, const LoadReport& load, absl::Time now);
  void Deregister(const std::string& id);
  // A call to worker `id` failed as if the worker were gone (connection
  // refused or reset, no answer within the stall timeout): Live leaves it
  // out until it is heard from again (heartbeat or registration), so
  // requests stop going to a dead or stopped worker before its ttl ends.
  void ReportFailure(const std::string& id);

  // Live, non-draining workers of `role` not reported failing since they
  // were last heard; expired workers are dropped first.
  std::vector<WorkerView> Live(Role role, absl::Time now);
  // Live workers of `role`, draining ones included.
  int CountLive(Role role, absl::Time now);

  // Router-side accounting between heartbeats: one request of
  // `prompt_tokens` sent to worker `id` (an empty handle if it is unknown).
  OutstandingWork StartWork(const std::string& id, int64_t prompt_tokens);
  // A prompt sent to prefill worker `worker` (as Live returned it): counts
  // its tokens not cached there as outstanding, and notes its prefix as
  // cached there until the worker's digest shows it or `ttl` passes.
  OutstandingWork StartPrefill(const WorkerView& worker, const PrefillQuery& query, absl::Time now);

 private:
  struct Entry {
    WorkerDesc desc;
    LoadReport load;
    absl::Time last_seen;
    int outstanding_requests = 0;
    int64_t outstanding_tokens = 0;
    uint64_t incarnation = 0;  // distinct for every (re-)registration after a drop
    bool failing = false;      // ReportFailure since it was last heard
    // Work this router saw finish since the last load report: the report
    // may still count it as queued or running, and views discount it.
    int finished_requests_since_report = 0;
    int64_t finished_tokens_since_report = 0;
    // Prefill: the last digest, the prefixes routed here since (hash -> when
    // last routed), and their union as handed to views.
    PrefixHashSet reported;
    std::unordered_map<uint64_t, absl::Time> routed;
    std::shared_ptr<const PrefixHashSet> prefixes = std::make_shared<PrefixHashSet>();
  };
  friend class OutstandingWork;
  void FinishWork(const std::string& id, uint64_t incarnation, int64_t tokens);
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a new digest, drops routed notes it confirms or that are older
  // than ttl_, and rebuilds the union when anything changed.
  void UpdatePrefixesLocked(Entry& e, const std::vector<uint64_t>* digest, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration ttl_;
  absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);  // ordered: deterministic ties
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace pdserve::router
