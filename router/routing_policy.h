// Routing policies choose a worker from a pool's live members. Pure
// functions of the views handed in; pluggable by name.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "router/worker_registry.h"

namespace pdserve::router {

// A sequence to place on a decode worker.
struct DecodeQuery {
  int prompt_tokens = 0;
  int max_tokens = 0;
};

// KV tokens `worker` reserves when it admits `query`: the prompt plus its
// registered headroom (lazy growth), or the whole request
// (prompt + max_tokens - 1) when it reserves whole requests.
int64_t DecodeAdmissionTokens(const WorkerView& worker, const DecodeQuery& query);

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  // Index into `workers` of the prefill worker for a prompt, or none.
  virtual std::optional<size_t> PickPrefill(std::span<const WorkerView> workers,
                                            const PrefillQuery& query) const = 0;
  // Index of the decode worker for a sequence, or none.
  virtual std::optional<size_t> PickDecode(std::span<const WorkerView> workers,
                                           const DecodeQuery& query) const = 0;
};

// Least loaded. Prefill: fewest prompt tokens queued (the larger of the
// worker's report and this router's outstanding tokens). Decode: fewest
// sequences (likewise), among workers whose reported free blocks fit what
// they reserve at admission (DecodeAdmissionTokens), falling back to all of
// them (the worker has the final word).
class LeastLoadedPolicy : public RoutingPolicy {
 public:
  std::optional<size_t> PickPrefill(std::span<const WorkerView> workers,
                                    const PrefillQuery& query) const override;
  std::optional<size_t> PickDecode(std::span<const WorkerView> workers,
                                   const DecodeQuery& query) const override;
};

// Prefix aware (prefill; decode as LeastLoadedPolicy). The prompt goes to
// the prefill worker with the least work ahead of its first token: prompt
// tokens queued there (as least-loaded counts them) plus this prompt's
// tokens that worker does not hold cached (CachedPrefixTokens). With no
// cached prefix anywhere this is least-loaded; a worker holding the prefix
// wins until its queue exceeds the others' by more than the cached tokens,
// so an overloaded holder sheds load and a second worker caches the prefix.
class PrefixAwarePolicy final : public LeastLoadedPolicy {
 public:
  std::optional<size_t> PickPrefill(std::span<const WorkerView> workers,
                                    const PrefillQuery& query) const override;
};

// "prefix_aware" or "least_loaded"; INVALID_ARGUMENT for an unknown name.
absl::StatusOr<std::unique_ptr<RoutingPolicy>> CreateRoutingPolicy(const std::string& name);

}  // namespace pdserve::router
