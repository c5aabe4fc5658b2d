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

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  // Index into `workers` of the prefill worker for a prompt, or none.
  virtual std::optional<size_t> PickPrefill(std::span<const WorkerView> workers,
                                            int prompt_tokens) const = 0;
  // Index of the decode worker for a sequence needing `kv_tokens` of KV, or none.
  virtual std::optional<size_t> PickDecode(std::span<const WorkerView> workers,
                                           int kv_tokens) const = 0;
};

// Least loaded. Prefill: fewest prompt tokens queued (the larger of the
// worker's report and this router's outstanding tokens). Decode: fewest
// sequences (likewise), among workers whose reported free blocks fit the
// request, falling back to all of them (the worker has the final word).
class LeastLoadedPolicy final : public RoutingPolicy {
 public:
  std::optional<size_t> PickPrefill(std::span<const WorkerView> workers, int prompt_tokens) const override;
  std::optional<size_t> PickDecode(std::span<const WorkerView> workers, int kv_tokens) const override;
};

// "least_loaded"; INVALID_ARGUMENT for an unknown name.
absl::StatusOr<std::unique_ptr<RoutingPolicy>> CreateRoutingPolicy(const std::string& name);

}  // namespace pdserve::router
