#include "common/auth.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

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

using Tokens = std::vector<std::string>;

TEST(AuthTest, LoadsTheTokenFileBeforeTheEnvironment) {
  setenv(kClusterTokenEnv, "from-env\n", 1);
  auto from_file = LoadClusterTokens(TempFile("token", "from-file \n\n"));
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(*from_file, Tokens{"from-file"});
  auto from_env = LoadClusterTokens("");
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(*from_env, Tokens{"from-env"});
  unsetenv(kClusterTokenEnv);
  auto none = LoadClusterTokens("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(AuthTest, ATokenFileMayHoldSeveralTokensOnePerLine) {
  auto tokens = LoadClusterTokens(TempFile("rotation", "\n  new-token \r\n\nold-token\n"));
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (Tokens{"new-token", "old-token"}));
}

TEST(AuthTest, AnEmptyOrMissingTokenFileIsAnError) {
  EXPECT_EQ(LoadClusterTokens(TempFile("empty", " \n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadClusterTokens(::testing::TempDir() + "/no/such/token").status().code(),
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

// During a rotation a process sends the first token and accepts each one:
// peers still on the old token and peers already on the new one both pass.
TEST(AuthTest, KvDigestOfAnyAcceptedTokenPasses) {
  std::string old_digest, new_digest;
  SetClusterToken("old-token");
  old_digest = KvHandshakeDigest();
  SetClusterToken("new-token");
  new_digest = KvHandshakeDigest();
  SetClusterToken("third-token");
  const std::string other_digest = KvHandshakeDigest();
  SetClusterTokens({"new-token", "old-token"});
  EXPECT_EQ(ClusterToken(), "new-token");
  EXPECT_EQ(KvHandshakeDigest(), new_digest);
  EXPECT_TRUE(CheckKvHandshakeDigest(new_digest).ok());
  EXPECT_TRUE(CheckKvHandshakeDigest(old_digest).ok());
  EXPECT_EQ(CheckKvHandshakeDigest(other_digest).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckKvHandshakeDigest("").code(), absl::StatusCode::kUnauthenticated);
  SetClusterToken("");
  EXPECT_EQ(ClusterToken(), "");
}

TEST(AuthTest, UnpredictableIdsAreStablePerKeyAndDistinct) {
  const UnpredictableIds a, b;
  std::set<uint64_t> seen;
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(a.Id(i), a.Id(i));
    EXPECT_NE(a.Id(i), 0u);
    seen.insert(a.Id(i));
  }
  EXPECT_EQ(seen.size(), 1000u);
  // Another instance's key gives other ids for the same counters, and ids do
  // not step by a constant (as a counter plus a salt would).
  int same = 0;
  for (uint64_t i = 0; i < 100; ++i) same += a.Id(i) == b.Id(i);
  EXPECT_EQ(same, 0);
  EXPECT_NE(a.Id(2) - a.Id(1), a.Id(3) - a.Id(2));
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

TEST(AuthTest, ServicesAcceptEveryTokenOfARotation) {
  SetClusterTokens({"new-token", "old-token"});
  CheckingRegistry service;
  auto server = StartGrpcServer("127.0.0.1", 0, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = JoinHostPort("127.0.0.1", server->port);
  auto internal = internal::v1::Registry::NewStub(MakeChannel(address));
  EXPECT_EQ(Call(*internal, nullptr), grpc::StatusCode::OK);  // sends new-token
  auto plain = internal::v1::Registry::NewStub(
      MakeClientChannel(address, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(Call(*plain, "Bearer new-token"), grpc::StatusCode::OK);
  EXPECT_EQ(Call(*plain, "Bearer old-token"), grpc::StatusCode::OK);
  EXPECT_EQ(Call(*plain, "Bearer other-token"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*plain, "Bearer new-tokenold-token"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*plain, nullptr), grpc::StatusCode::UNAUTHENTICATED);
  server->server->Shutdown();
  SetClusterToken("");
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
