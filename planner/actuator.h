// What carries out the planner's decisions: Kubernetes (the scale
// subresource of each pool's Deployment, kubernetes_actuator.h) or a local
// cluster (deploy/local/cluster.sh, local_actuator.h). Scaling down always
// drains: a removed worker stops taking requests and finishes those it
// holds before it exits, so no request fails because the planner acted.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/observation.h"

namespace pdserve::planner {

class Actuator {
 public:
  virtual ~Actuator() = default;
  // Each pool's replica count as set now (draining workers not counted).
  virtual absl::StatusOr<PerPool<int>> Current() = 0;
  // Sets `pool` to `replicas`.
  virtual absl::Status Scale(Pool pool, int replicas) = 0;
  virtual std::string Describe() const = 0;
};

}  // namespace pdserve::planner
