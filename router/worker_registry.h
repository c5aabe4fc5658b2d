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
  // Config and weights as served (a lossy weight storage included): what
  // the KV handshake compares, so a prefill and a decode worker pair only
  // when theirs are equal (KvCompatible).
  uint64_t model_fingerprint = 0;
  int kv_block_size = 0;  // tokens per KV block
  std::string metrics_address;
  // Decode: KV tokens reserved beyond the prompt at admission (lazy
  // growth); negative: whole requests are reserved.
  int kv_headroom_tokens = -1;
  // What registration compares with the router's own model
  // (ModelReference); zero or empty: not reported.
  uint64_t config_fingerprint = 0;      // config.json alone
  uint64_t checkpoint_fingerprint = 0;  // config + weights as stored
  std::string weight_dtype;             // served weight storage: "bf16", "int8", ...
  std::string kv_dtype;                 // "f32", "bf16", "f16"
  std::string kv_layout;                // "paged_nhd"
  std::string backend;                  // "cpu", "cuda"
};

// A prefill and a decode worker can hand KV to each other: the same model
// as served and the same KV element type and layout (what the KV handshake
// checks; block sizes may differ, the transfer maps blocks).
bool KvCompatible(const WorkerDesc& prefill, const WorkerDesc& decode);

// The router's own model, the reference every registering worker is
// compared with (never another worker: a wrong worker that registers first
// cannot lock the right ones out). Zero or empty fields are not checked.
struct ModelReference {
  uint64_t config_fingerprint = 0;
  uint64_t checkpoint_fingerprint = 0;
  std::string weight_dtype;  // the router's --weight_dtype, when given
  std::string kv_dtype;      // the router's --kv_dtype, when given
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
  // Progress: a count that moves while the engine works (steps, and layers
  // within a prefill step) and whether the engine has work it could step
  // now. With work, a count that stops moving for the hang timeout marks
  // the worker hung.
  uint64_t progress = 0;
  bool has_work = false;
  // Non-empty: the worker says it cannot serve, and why.
  std::string unhealthy_reason;
  // Capacity (zero: unknown). Prefill: tokens per step, prompts queued at
  // most, prompt tokens computed per second lately; decode: sequences held
  // at most.
  int max_batch_tokens = 0;
  int max_queued_requests = 0;
  int max_sequences = 0;
  double tokens_per_second = 0;
};

// Whether a registered worker may be given work, judged from what the
// worker itself says and does (heartbeats, progress, connection), never
// from how long one request waited.
enum class WorkerHealth {
  kLive,
  kGone,          // not registered (expired, left, or a new incarnation since)
  kDisconnected,  // a call found its connection broken; until heard from again
  kUnhealthy,     // the worker reports it cannot serve
  kHung,          // heartbeats arrive, but with work its steps stopped moving
};
std::string_view WorkerHealthName(WorkerHealth health);

struct Judgement {
  WorkerHealth health = WorkerHealth::kLive;
  std::string why;  // for logs and the client's error when not live
};

struct RegistryOptions {
  // A worker silent for longer than this is dropped.
  absl::Duration ttl = absl::Seconds(3);
  // A worker with work whose reported step count has not moved for longer
  // than this is hung. Zero: never judged hung.
  absl::Duration hang_timeout = absl::ZeroDuration();
  ModelReference reference;
};

using PrefixHashSet = std::unordered_set<uint64_t>;

// A live worker as routing policies see it.
struct WorkerView {
  WorkerDesc desc;
  LoadReport load;
  uint64_t incarnation = 0;      // WorkerRegistry::Judge tells whether it is still this one
  int outstanding_requests = 0;  // sent by this router, not yet finished
  // Prefill: prompt tokens (not cached there) of outstanding prefills;
  // decode: KV tokens of outstanding reservations.
  int64_t outstanding_tokens = 0;
  // Tokens of work this router started there since the worker's last load
  // report (which cannot show them yet).
  int64_t tokens_since_report = 0;
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
  // each worker gets one `ttl` from `now` before it can expire (and one
  // hang timeout before it can be judged hung), rather than the whole pool
  // expiring at once. Likewise while no worker at all is heard (the
  // router's heartbeat intake starved while other calls ran, or the whole
  // machine starved): a silent worker expires after one ttl only when
  // another worker was heard at least half a ttl after it, else after two.
  explicit WorkerRegistry(absl::Duration ttl) : WorkerRegistry(RegistryOptions{.ttl = ttl}) {}
  explicit WorkerRegistry(RegistryOptions options) : options_(std::move(options)) {}

  // Adds or replaces a worker. INVALID_ARGUMENT for a malformed
  // description; FAILED_PRECONDITION naming the first field (config,
  // weights, weight_dtype, kv_dtype) where the worker differs from the
  // router's reference model.
  absl::Status Register(const WorkerDesc& desc, const LoadReport& load, absl::Time now);
  // False if the worker is unknown (expired or never registered).
  bool Heartbeat(const std::string& id, const LoadReport& load, absl::Time now);
  void Deregister(const std::string& id);
  // A call to worker `id` found its connection broken (refused, reset, the
  // channel no longer connected): Live leaves it out until it is heard from
  // again (heartbeat or registration), so requests stop going to a dead
  // worker before its ttl ends. Never for a refusal, a slow answer or a
  // request's deadline.
  void ReportDisconnected(const std::string& id);

  // Whether worker `id`, as it was when a view of incarnation `incarnation`
  // was taken, may still be given work (kLive), and why not.
  Judgement Judge(const std::string& id, uint64_t incarnation, absl::Time now);
  // Every registered worker's incarnation and judgement at `now` (one lock
  // for a whole round of checks).
  struct WorkerState {
    uint64_t incarnation = 0;
    Judgement judgement;
  };
  std::unordered_map<std::string, WorkerState> JudgeAll(absl::Time now);

  // Live (WorkerHealth::kLive), non-draining workers of `role`; expired
  // workers are dropped first.
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
    // Last time the reported step count moved, or the worker had no work.
    absl::Time last_progress;
    int outstanding_requests = 0;
    int64_t outstanding_tokens = 0;
    uint64_t incarnation = 0;   // distinct for every (re-)registration after a drop
    bool disconnected = false;  // ReportDisconnected since it was last heard
    // Work this router saw finish since the last load report: the report
    // may still count it as queued or running, and views discount it.
    int finished_requests_since_report = 0;
    int64_t finished_tokens_since_report = 0;
    int64_t started_tokens_since_report = 0;
    // Prefill: the last digest, the prefixes routed here since (hash -> when
    // last routed), and their union as handed to views.
    PrefixHashSet reported;
    std::unordered_map<uint64_t, absl::Time> routed;
    std::shared_ptr<const PrefixHashSet> prefixes = std::make_shared<PrefixHashSet>();
  };
  friend class OutstandingWork;
  void FinishWork(const std::string& id, uint64_t incarnation, int64_t tokens);
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat or registration arrived at `now` (before ExpireLocked).
  void NoteHeardLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's health apart from expiry (ExpireLocked first).
  Judgement HealthLocked(const Entry& e, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes a load report: progress tracking, then the report itself.
  void TakeReportLocked(Entry& e, const LoadReport& load, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a new digest, drops routed notes it confirms or that are older
  // than ttl_, and rebuilds the union when anything changed.
  void UpdatePrefixesLocked(Entry& e, const std::vector<uint64_t>* digest, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegistryOptions options_;
  absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);  // ordered: deterministic ties
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The newest heartbeat or registration, and when they resumed after a
  // gap of over half a ttl (ExpireLocked).
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time intake_resumed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace pdserve::router
