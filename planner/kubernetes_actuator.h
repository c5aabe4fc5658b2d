// Scales the prefill and decode Deployments through the Kubernetes API
// server's scale subresource:
//   GET   /apis/apps/v1/namespaces/NS/deployments/NAME/scale     (spec.replicas)
//   PATCH /apis/apps/v1/namespaces/NS/deployments/NAME/scale     {"spec":{"replicas":N}}
// (application/merge-patch+json), with the pod's ServiceAccount token. The
// Role it needs (deploy/k8s/planner/rbac.yaml) allows get and patch on
// deployments/scale of those two Deployments only. A scale-down deletes
// pods, which drain (preStop, then SIGTERM: the worker finishes its
// requests within its grace period).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "planner/actuator.h"
#include "planner/http_client.h"

namespace pdserve::planner {

struct KubernetesOptions {
  // https://host:port of the API server; "" = in-cluster
  // (https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
  std::string api_server;
  std::string namespace_;  // "" = the pod's own (serviceaccount/namespace file)
  PerPool<std::string> deployments{"pdserve-prefill", "pdserve-decode"};
  // Read before every call: projected tokens are rotated by the kubelet.
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  absl::Duration timeout = absl::Seconds(10);
};

class KubernetesActuator final : public Actuator {
 public:
  // Resolves the in-cluster defaults; fails when they cannot be.
  static absl::StatusOr<std::unique_ptr<KubernetesActuator>> Create(KubernetesOptions options);

  absl::StatusOr<PerPool<int>> Current() override;
  absl::Status Scale(Pool pool, int replicas) override;
  std::string Describe() const override;

 private:
  explicit KubernetesActuator(KubernetesOptions options) : options_(std::move(options)) {}
  std::string ScalePath(Pool pool) const;
  absl::StatusOr<HttpOptions> Http() const;
  absl::StatusOr<int> ReadReplicas(Pool pool, const std::string& method, const std::string& body);

  KubernetesOptions options_;
};

}  // namespace pdserve::planner
