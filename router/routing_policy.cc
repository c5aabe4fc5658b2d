#include "router/routing_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace pdserve::router {

std::optional<size_t> LeastLoadedPolicy::PickPrefill(std::span<const WorkerView> workers,
                                                     int prompt_tokens) const {
  std::optional<size_t> best;
  std::tuple<int64_t, int> best_key;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerView& w = workers[i];
    const std::tuple<int64_t, int> key{
        std::max(w.load.queued_prompt_tokens, w.outstanding_tokens),
        std::max(w.load.queued_requests, w.outstanding_requests)};
    if (!best || key < best_key) {
      best = i;
      best_key = key;
    }
  }
  return best;
}

std::optional<size_t> LeastLoadedPolicy::PickDecode(std::span<const WorkerView> workers,
                                                    int kv_tokens) const {
  auto fits = [kv_tokens](const WorkerView& w) {
    return int64_t{w.load.free_kv_blocks} * w.desc.kv_block_size >= kv_tokens;
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
  if (name == "least_loaded") return std::make_unique<LeastLoadedPolicy>();
  return absl::InvalidArgumentError(absl::StrCat("unknown routing policy '", name, "'"));
}

}  // namespace pdserve::router
