#include "planner/kubernetes_actuator.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pdserve::planner {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

// The API server's answer as a status: its Status object's message when it has one.
absl::Status ApiError(int http_status, const std::string& body, const std::string& what) {
  std::string message = body.substr(0, 300);
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    message = j["message"].get<std::string>();
  }
  const std::string text = absl::StrCat(what, ": HTTP ", http_status, ": ", message);
  switch (http_status) {
    case 401:
      return absl::UnauthenticatedError(text);
    case 403:
      return absl::PermissionDeniedError(text);
    case 404:
      return absl::NotFoundError(text);
    case 409:
      return absl::AbortedError(text);
    case 422:
    case 400:
      return absl::InvalidArgumentError(text);
    default:
      return absl::UnavailableError(text);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<KubernetesActuator>> KubernetesActuator::Create(
    KubernetesOptions options) {
  if (options.api_server.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (host == nullptr || port == nullptr) {
      return absl::FailedPreconditionError(
          "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST unset): pass --kube_api_server");
    }
    const std::string h = host;
    options.api_server = absl::StrCat("https://", h.find(':') != std::string::npos ? "[" : "", h,
                                      h.find(':') != std::string::npos ? "]" : "", ":", port);
  }
  if (options.namespace_.empty()) {
    absl::StatusOr<std::string> ns =
        ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace");
    if (!ns.ok()) return ns.status();
    options.namespace_ = *ns;
  }
  while (!options.api_server.empty() && options.api_server.back() == '/') {
    options.api_server.pop_back();
  }
  return std::unique_ptr<KubernetesActuator>(new KubernetesActuator(std::move(options)));
}

std::string KubernetesActuator::ScalePath(Pool pool) const {
  return absl::StrCat(options_.api_server, "/apis/apps/v1/namespaces/", options_.namespace_,
                      "/deployments/", options_.deployments[pool], "/scale");
}

std::string KubernetesActuator::Describe() const {
  return absl::StrCat("Kubernetes ", options_.api_server, " namespace ", options_.namespace_,
                      ": deployments ", options_.deployments.prefill, ", ",
                      options_.deployments.decode);
}

absl::StatusOr<HttpOptions> KubernetesActuator::Http() const {
  HttpOptions http{.timeout = options_.timeout};
  if (!options_.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile(options_.token_file);
    if (!token.ok()) return token.status();
    http.bearer_token = *token;
  }
  if (options_.api_server.rfind("https://", 0) == 0) http.ca_file = options_.ca_file;
  return http;
}

absl::StatusOr<int> KubernetesActuator::ReadReplicas(Pool pool, const std::string& method,
                                                     const std::string& body) {
  absl::StatusOr<HttpOptions> http = Http();
  if (!http.ok()) return http.status();
  const std::string what =
      absl::StrCat(method, " deployments/", options_.deployments[pool], "/scale");
  absl::StatusOr<HttpResponse> r =
      HttpRequest(method, ScalePath(pool), body, "application/merge-patch+json", *http);
  if (!r.ok()) return r.status();
  if (r->status != 200) return ApiError(r->status, r->body, what);
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("kind", "") != "Scale" || !j.contains("spec") ||
      !j["spec"].is_object()) {
    return absl::InternalError(absl::StrCat(what, ": the answer is not a Scale object"));
  }
  // spec.replicas is omitted when 0.
  const nlohmann::json& replicas = j["spec"].value("replicas", nlohmann::json(0));
  if (!replicas.is_number_integer()) {
    return absl::InternalError(absl::StrCat(what, ": spec.replicas is not an integer"));
  }
  return replicas.get<int>();
}

absl::StatusOr<PerPool<int>> KubernetesActuator::Current() {
  PerPool<int> out;
  for (Pool pool : kPools) {
    absl::StatusOr<int> n = ReadReplicas(pool, "GET", "");
    if (!n.ok()) return n.status();
    out[pool] = *n;
  }
  return out;
}

absl::Status KubernetesActuator::Scale(Pool pool, int replicas) {
  if (replicas < 0) return absl::InvalidArgumentError("replicas must be >= 0");
  const nlohmann::json patch = {{"spec", {{"replicas", replicas}}}};
  absl::StatusOr<int> n = ReadReplicas(pool, "PATCH", patch.dump());
  if (!n.ok()) return n.status();
  if (*n != replicas) {
    return absl::InternalError(absl::StrCat("deployments/", options_.deployments[pool],
                                            "/scale answered replicas ", *n, ", asked ", replicas));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::planner
