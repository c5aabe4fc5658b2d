// The Kubernetes actuator against a fake API server on loopback: it serves
// the scale subresource of two Deployments as the API server does (GET and
// merge-PATCH of autoscaling/v1 Scale objects), checks the bearer token,
// and refuses what a Role without the right verbs would (403).
#include "planner/kubernetes_actuator.h"

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace pdserve::planner {
namespace {

class FakeApiServer {
 public:
  FakeApiServer() {
    const std::string pattern =
        R"(/apis/apps/v1/namespaces/([a-z0-9-]+)/deployments/([a-z0-9-]+)/scale)";
    server_.Get(pattern, [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, /*patch=*/false);
    });
    server_.Patch(pattern, [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, /*patch=*/true);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 5000 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~FakeApiServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }

  std::mutex mu;
  std::map<std::string, int> replicas = {{"pdserve-prefill", 1}, {"pdserve-decode", 2}};
  bool allow_patch = true;
  std::vector<std::string> requests;  // "METHOD path content-type body"

 private:
  void Status(httplib::Response& res, int code, const std::string& reason,
              const std::string& message) {
    res.status = code;
    res.set_content(nlohmann::json{{"kind", "Status"},
                                   {"apiVersion", "v1"},
                                   {"status", "Failure"},
                                   {"reason", reason},
                                   {"message", message},
                                   {"code", code}}
                        .dump(),
                    "application/json");
  }
  void Handle(const httplib::Request& req, httplib::Response& res, bool patch) {
    std::lock_guard<std::mutex> lock(mu);
    requests.push_back(absl::StrCat(req.method, " ", req.path, " ",
                                    req.get_header_value("Content-Type"), " ", req.body));
    if (req.get_header_value("Authorization") != "Bearer sa-token") {
      return Status(res, 401, "Unauthorized", "Unauthorized");
    }
    const std::string ns = req.matches[1], name = req.matches[2];
    if (ns != "pdserve" || !replicas.count(name)) {
      return Status(res, 404, "NotFound",
                    absl::StrCat("deployments.apps \"", name, "\" not found"));
    }
    if (patch) {
      if (!allow_patch) {
        return Status(
            res, 403, "Forbidden",
            absl::StrCat("deployments.apps \"", name,
                         "\" is forbidden: User \"system:serviceaccount:pdserve:"
                         "pdserve-planner\" cannot patch resource \"deployments/scale\""));
      }
      if (req.get_header_value("Content-Type") != "application/merge-patch+json") {
        return Status(res, 415, "UnsupportedMediaType", "bad content type");
      }
      nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
      if (!body.is_object() || !body["spec"]["replicas"].is_number_integer()) {
        return Status(res, 422, "Invalid", "spec.replicas: Invalid value");
      }
      replicas[name] = body["spec"]["replicas"].get<int>();
    }
    nlohmann::json scale = {{"kind", "Scale"},
                            {"apiVersion", "autoscaling/v1"},
                            {"metadata", {{"name", name}, {"namespace", ns}}},
                            {"spec", nlohmann::json::object()},
                            {"status", {{"replicas", replicas[name]}}}};
    if (replicas[name] != 0) scale["spec"]["replicas"] = replicas[name];
    res.set_content(scale.dump(), "application/json");
  }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

std::string TokenFile(const std::string& token) {
  const std::string path = ::testing::TempDir() + "/planner_sa_token";
  std::ofstream(path) << token << "\n";
  return path;
}

TEST(KubernetesActuatorTest, ReadsAndPatchesTheScaleSubresource) {
  FakeApiServer api;
  auto actuator = KubernetesActuator::Create(
      {.api_server = api.url(), .namespace_ = "pdserve", .token_file = TokenFile("sa-token")});
  ASSERT_TRUE(actuator.ok()) << actuator.status();
  absl::StatusOr<PerPool<int>> now = (*actuator)->Current();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->prefill, 1);
  EXPECT_EQ(now->decode, 2);

  ASSERT_TRUE((*actuator)->Scale(Pool::kPrefill, 3).ok());
  ASSERT_TRUE((*actuator)->Scale(Pool::kDecode, 1).ok());
  {
    std::lock_guard<std::mutex> lock(api.mu);
    EXPECT_EQ(api.replicas["pdserve-prefill"], 3);
    EXPECT_EQ(api.replicas["pdserve-decode"], 1);
    EXPECT_EQ(api.requests.back(),
              "PATCH /apis/apps/v1/namespaces/pdserve/deployments/pdserve-decode/scale "
              "application/merge-patch+json {\"spec\":{\"replicas\":1}}");
  }
  now = (*actuator)->Current();
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->prefill, 3);
  EXPECT_EQ(now->decode, 1);
}

TEST(KubernetesActuatorTest, ApiErrorsAreStatusesThatNameTheCause) {
  FakeApiServer api;
  auto wrong_token = KubernetesActuator::Create(
      {.api_server = api.url(), .namespace_ = "pdserve", .token_file = TokenFile("stale")});
  ASSERT_TRUE(wrong_token.ok());
  EXPECT_EQ((*wrong_token)->Current().status().code(), absl::StatusCode::kUnauthenticated);

  auto actuator = KubernetesActuator::Create(
      {.api_server = api.url(), .namespace_ = "pdserve", .token_file = TokenFile("sa-token")});
  ASSERT_TRUE(actuator.ok());
  {
    std::lock_guard<std::mutex> lock(api.mu);
    api.allow_patch = false;
  }
  absl::Status denied = (*actuator)->Scale(Pool::kDecode, 4);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.message().find("cannot patch resource \"deployments/scale\""), std::string::npos)
      << denied;

  auto missing = KubernetesActuator::Create({.api_server = api.url(),
                                             .namespace_ = "pdserve",
                                             .deployments = {"nope", "pdserve-decode"},
                                             .token_file = TokenFile("sa-token")});
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ((*missing)->Current().status().code(), absl::StatusCode::kNotFound);

  // Nothing listening: unavailable, naming the URL.
  auto down = KubernetesActuator::Create({.api_server = "http://127.0.0.1:1",
                                          .namespace_ = "pdserve",
                                          .token_file = TokenFile("sa-token"),
                                          .timeout = absl::Seconds(2)});
  ASSERT_TRUE(down.ok());
  absl::Status s = (*down)->Scale(Pool::kPrefill, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("127.0.0.1:1"), std::string::npos) << s;
}

TEST(KubernetesActuatorTest, InClusterDefaultsNeedAPod) {
  unsetenv("KUBERNETES_SERVICE_HOST");
  auto actuator = KubernetesActuator::Create({});
  EXPECT_EQ(actuator.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pdserve::planner
