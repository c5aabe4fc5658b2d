#include "router/routing_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace pdserve::router {
namespace {

int64_t QueuedPrefillTokens(const WorkerView& w) {
  return std::max(w.load.queued_prompt_tokens, w.outstanding_tokens);
}

// The worker minimising `cost`, ties to fewer queued requests, then to the first.
template <typename Cost>
std::optional<size_t> PickPrefillBy(std::span<const WorkerView> workers, Cost cost) {
  std::optional<size_t> best;
  std::tuple<int64_t, int> best_key;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerView& w = workers[i];
    const std::tuple<int64_t, int> key{cost(w),
                                       std::max(w.load.queued_requests, w.outstanding_requests)};
    if (!best || key < best_key) {
      best = i;
      best_key = key;
    }
  }
  return best;
}

}  // namespace

int64_t DecodeAdmissionTokens(const WorkerView& worker, const DecodeQuery& query) {
  const int64_t whole = int64_t{query.prompt_tokens} + std::max(query.max_tokens, 1) - 1;
  if (worker.desc.kv_headroom_tokens < 0) return whole;
  return std::min(whole, int64_t{query.prompt_tokens} + worker.desc.kv_headroom_tokens);
}

std::optional<size_t> LeastLoadedPolicy::PickPrefill(std::span<const WorkerView> workers,
                                                     const PrefillQuery&) const {
  return PickPrefillBy(workers, QueuedPrefillTokens);
}

std::optional<size_t> PrefixAwarePolicy::PickPrefill(std::span<const WorkerView> workers,
                                                     const PrefillQuery& query) const {
  return PickPrefillBy(workers, [&query](const WorkerView& w) {
    return QueuedPrefillTokens(w) + query.prompt_tokens() - CachedPrefixTokens(w, query);
  });
}

std::optional<size_t> LeastLoadedPolicy::PickDecode(std::span<const WorkerView> workers,
                                                    const DecodeQuery& query) const {
  auto fits = [&query](const WorkerView& w) {
    return int64_t{w.load.free_kv_blocks} * w.desc.kv_block_size >= DecodeAdmissionTokens(w, query);
  };
  auto pick = [&](bool require_fit) -> std::optional<size_t> {
    std::optional<size_t> best;
    std::tuple<int, int> best_key;
    for (size_t i = 0; i < workers.size(); ++i) {
      const WorkerView& w = workers[i];
      if (require_fit && !fits(w)) continue;
      const std::tuple<int, int> key{std::max(w.load.running_sequences, w.outstanding_requests),
                                     -w.load.free_kv_blocks};
      if (!best || key < best_key) {
        best = i;
        best_key = key;
      }
    }
    return best;
  };
  // Reports lag: when none seems to fit, ask the least loaded anyway.
  if (auto fit = pick(true)) return fit;
  return pick(false);
}

absl::StatusOr<std::unique_ptr<RoutingPolicy>> CreateRoutingPolicy(const std::string& name) {
  if (name == "prefix_aware") return std::make_unique<PrefixAwarePolicy>();
  if (name == "least_loaded") return std::make_unique<LeastLoadedPolicy>();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown routing policy '", name, "' (prefix_aware, least_loaded)"));
}

}  // namespace pdserve::router
