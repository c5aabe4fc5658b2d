#include "common/auth.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/grpc_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve {
namespace {

// Sets the process token for one test and clears it after.
class ScopedToken {
 public:
  explicit ScopedToken(std::string token) { SetClusterToken(std::move(token)); }
  ~ScopedToken() { SetClusterToken(""); }
};

std::string TempFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/auth_test_" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(AuthTest, TokensEqualComparesWholeTokens) {
  EXPECT_TRUE(TokensEqual("secret", "secret"));
  EXPECT_FALSE(TokensEqual("secret", "secreT"));
  EXPECT_FALSE(TokensEqual("secret", "secret2"));
  EXPECT_FALSE(TokensEqual("secret", ""));
  EXPECT_TRUE(TokensEqual("", ""));
}

TEST(AuthTest, LoadsTheTokenFileBeforeTheEnvironment) {
  setenv(kClusterTokenEnv, "from-env\n", 1);
  auto from_file = LoadClusterToken(TempFile("token", "from-file \n\n"));
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(*from_file, "from-file");
  auto from_env = LoadClusterToken("");
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(*from_env, "from-env");
  unsetenv(kClusterTokenEnv);
  auto none = LoadClusterToken("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
}

TEST(AuthTest, AnEmptyOrMissingTokenFileIsAnError) {
  EXPECT_EQ(LoadClusterToken(TempFile("empty", " \n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadClusterToken(::testing::TempDir() + "/no/such/token").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AuthTest, KvDigestMatchesOnlyTheSameToken) {
  std::string digest;
  {
    ScopedToken token("kv-secret");
    digest = KvHandshakeDigest();
    EXPECT_EQ(digest.size(), 32u);
    EXPECT_EQ(digest.find("kv-secret"), std::string::npos);
    EXPECT_TRUE(CheckKvHandshakeDigest(digest).ok());
    EXPECT_EQ(CheckKvHandshakeDigest("").code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(CheckKvHandshakeDigest(digest.substr(1)).code(), absl::StatusCode::kUnauthenticated);
  }
  {
    ScopedToken token("other-secret");
    EXPECT_EQ(CheckKvHandshakeDigest(digest).code(), absl::StatusCode::kUnauthenticated);
  }
  // No token: open.
  EXPECT_EQ(KvHandshakeDigest(), "");
  EXPECT_TRUE(CheckKvHandshakeDigest("").ok());
}

TEST(AuthTest, LoopbackHosts) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.1.2.3"));
}

// A registry whose Deregister only checks the caller.
class CheckingRegistry final : public internal::v1::Registry::Service {
 public:
  grpc::Status Deregister(grpc::ServerContext* context, const internal::v1::DeregisterRequest*,
                          internal::v1::DeregisterResponse*) override {
    return CheckClusterCredential(*context);
  }
};

grpc::StatusCode Call(internal::v1::Registry::Stub& stub, const char* authorization) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (authorization != nullptr) ctx.AddMetadata("authorization", authorization);
  internal::v1::DeregisterResponse resp;
  return stub.Deregister(&ctx, {}, &resp).error_code();
}

TEST(AuthTest, ServicesAcceptOnlyTheBearerToken) {
  ScopedToken token("grpc-secret");
  CheckingRegistry service;
  auto server = StartGrpcServer("127.0.0.1", 0, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = JoinHostPort("127.0.0.1", server->port);
  // MakeChannel carries the process token.
  auto internal = internal::v1::Registry::NewStub(MakeChannel(address));
  EXPECT_EQ(Call(*internal, nullptr), grpc::StatusCode::OK);
  auto plain = internal::v1::Registry::NewStub(
      MakeClientChannel(address, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(Call(*plain, nullptr), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*plain, "Bearer wrong"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*plain, "grpc-secret"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*plain, "Bearer grpc-secre"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*plain, "Bearer grpc-secret"), grpc::StatusCode::OK);
  server->server->Shutdown();
}

TEST(AuthTest, NoTokenLeavesServicesOpen) {
  CheckingRegistry service;
  auto server = StartGrpcServer("127.0.0.1", 0, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto plain = internal::v1::Registry::NewStub(MakeClientChannel(
      JoinHostPort("127.0.0.1", server->port), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(Call(*plain, nullptr), grpc::StatusCode::OK);
  server->server->Shutdown();
}

TEST(AuthTest, TlsNeedsCertificateAndKey) {
  EXPECT_TRUE(ServerTlsCredentials("", "").ok());
  EXPECT_EQ(ServerTlsCredentials("cert.pem", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ServerTlsCredentials(::testing::TempDir() + "/none.pem", ::testing::TempDir() + "/none.key")
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
