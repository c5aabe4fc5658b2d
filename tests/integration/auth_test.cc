// The authenticated control plane end to end: a cluster with a cluster token
// and TLS on the router's client port. Unauthenticated registry calls change
// nothing, a KV handshake without the credential is refused, a worker with the
// wrong token stays unregistered and NOT_SERVING, clients need TLS,
// processes in the middle of a token rotation serve together, and mutual TLS
// on the internal ports keeps out peers without the cluster's certificate.
#include "common/auth.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "engine/runner_factory.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"
#include "pdserve/internal/v1/kv_transfer.pb.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/local_cluster.h"
#include "tools/model_writer.h"

namespace pdserve::testing {
namespace {

constexpr char kToken[] = "0123456789abcdef-test-cluster-token";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class AuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_dir_ = new std::string(::testing::TempDir() + "/pdserve_auth_test");
    std::filesystem::remove_all(*work_dir_);
    std::filesystem::create_directories(*work_dir_);
    const std::string& w = *work_dir_;
    WriteAll(w + "/token", absl::StrCat(kToken, "\n"));
    WriteAll(w + "/wrong_token", "not-the-cluster-token\n");
    // A self-signed certificate for 127.0.0.1 (it is its own CA).
    const std::string openssl =
        absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 ",
                     "-addext subjectAltName=IP:127.0.0.1 -keyout ", w, "/key.pem -out ", w,
                     "/cert.pem > ", w, "/openssl.log 2>&1");
    ASSERT_EQ(std::system(openssl.c_str()), 0) << ReadAll(w + "/openssl.log");

    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = 256;
    ASSERT_TRUE(engine::WriteRandomModel(config, /*seed=*/11, "f32", w + "/model").ok());
    const std::string token_flag = "--cluster_token_file=" + w + "/token";
    cluster_ = new LocalCluster(
        ClusterOptions{.model_dir = w + "/model",
                       .work_dir = w,
                       .router_flags = {token_flag, "--tls_cert_file=" + w + "/cert.pem",
                                        "--tls_key_file=" + w + "/key.pem", "--http_port=-1"},
                       .prefill_flags = {token_flag},
                       .decode_flags = {token_flag}});
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  static std::unique_ptr<v1::Generation::Stub> TlsClient() {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ReadAll(*work_dir_ + "/cert.pem");
    return v1::Generation::NewStub(
        MakeClientChannel(cluster_->router_address(), grpc::SslCredentials(tls)));
  }

  static std::unique_ptr<internal::v1::Registry::Stub> RegistryStub() {
    return internal::v1::Registry::NewStub(MakeChannel(cluster_->router_internal_address()));
  }

  static double PoolSize(const std::string& pool) {
    auto text = HttpGet(cluster_->router_metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? MetricValue(*text, absl::StrCat("pdserve_pool_workers{pool=\"", pool, "\"}"))
                     : -1;
  }

  static grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& address,
                                                                     const std::string& service) {
    auto stub = grpc::health::v1::Health::NewStub(MakeChannel(address));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status s = stub->Check(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.status();
  }

  static std::string* work_dir_;
  static LocalCluster* cluster_;
};

std::string* AuthTest::work_dir_ = nullptr;
LocalCluster* AuthTest::cluster_ = nullptr;

TEST_F(AuthTest, TlsClientGeneratesAndPlaintextClientFails) {
  StreamResult ok = RunGenerate(*TlsClient(), TokenRequest({1, 2, 3, 4, 5}, 6));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 6u);

  auto plain = v1::Generation::NewStub(
      MakeClientChannel(cluster_->router_address(), grpc::InsecureChannelCredentials()));
  StreamResult refused = RunGenerate(*plain, TokenRequest({1, 2, 3}, 2), absl::Seconds(5));
  EXPECT_FALSE(refused.status.ok());
  EXPECT_TRUE(refused.tokens.empty());
}

TEST_F(AuthTest, RegistryRefusesCallsWithoutTheTokenAndChangesNothing) {
  ASSERT_EQ(PoolSize("prefill"), 1);
  ASSERT_EQ(PoolSize("decode"), 1);
  auto stub = RegistryStub();
  const std::string real_prefill_id =
      absl::StrCat("prefill-", cluster_->prefill()[0]->grpc_address);
  for (const char* credential : {"", "Bearer wrong-token", "Bearer ", "0123456789abcdef"}) {
    SCOPED_TRACE(credential);
    internal::v1::RegisterRequest reg;
    reg.mutable_worker()->set_worker_id("fake-prefill");
    reg.mutable_worker()->set_role(internal::v1::WORKER_ROLE_PREFILL);
    reg.mutable_worker()->set_address("127.0.0.1:1");
    internal::v1::RegisterResponse reg_resp;
    grpc::ClientContext reg_ctx;
    if (*credential != '\0') reg_ctx.AddMetadata("authorization", credential);
    EXPECT_EQ(stub->Register(&reg_ctx, reg, &reg_resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);

    internal::v1::DeregisterRequest dereg;
    dereg.set_worker_id(real_prefill_id);
    internal::v1::DeregisterResponse dereg_resp;
    grpc::ClientContext dereg_ctx;
    if (*credential != '\0') dereg_ctx.AddMetadata("authorization", credential);
    EXPECT_EQ(stub->Deregister(&dereg_ctx, dereg, &dereg_resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // The registry is not on the client port at all.
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = ReadAll(*work_dir_ + "/cert.pem");
  auto on_client_port = internal::v1::Registry::NewStub(
      MakeClientChannel(cluster_->router_address(), grpc::SslCredentials(tls)));
  internal::v1::DeregisterRequest dereg;
  dereg.set_worker_id(real_prefill_id);
  internal::v1::DeregisterResponse dereg_resp;
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  EXPECT_EQ(on_client_port->Deregister(&ctx, dereg, &dereg_resp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  // Longer than a pool-gauge refresh (250 ms): the pools are as they were.
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_EQ(PoolSize("prefill"), 1);
  EXPECT_EQ(PoolSize("decode"), 1);
  StreamResult still = RunGenerate(*TlsClient(), TokenRequest({7, 8, 9}, 3));
  EXPECT_TRUE(still.status.ok()) << still.status.error_message();
}

TEST_F(AuthTest, WorkersRefuseCallsWithoutTheToken) {
  auto prefill =
      internal::v1::PrefillWorker::NewStub(MakeChannel(cluster_->prefill()[0]->grpc_address));
  internal::v1::PrefillJob job;
  job.add_prompt_token_ids(1);
  job.mutable_kv_target()->set_endpoint(cluster_->decode()[0]->ready["kv_endpoint"]);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer wrong-token");
  auto prefill_reader = prefill->Prefill(&ctx, job);
  internal::v1::PrefillEvent prefill_event;
  EXPECT_FALSE(prefill_reader->Read(&prefill_event));
  EXPECT_EQ(prefill_reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);

  auto decode =
      internal::v1::DecodeWorker::NewStub(MakeChannel(cluster_->decode()[0]->grpc_address));
  internal::v1::DecodeJob djob;
  djob.add_prompt_token_ids(1);
  grpc::ClientContext dctx;
  auto reader = decode->Decode(&dctx, djob);
  internal::v1::DecodeEvent event;
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(AuthTest, KvHandshakeWithoutTheCredentialIsRefused) {
  const std::string endpoint = cluster_->decode()[0]->ready["kv_endpoint"];
  ASSERT_FALSE(endpoint.empty());
  auto to = kvtransfer::tcp::ParseTcpEndpoint(endpoint);
  ASSERT_TRUE(to.ok()) << to.status();
  for (const std::string& credential : {std::string(), std::string(32, 'x')}) {
    auto conn = kvtransfer::tcp::Connection::Connect(*to, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(conn.ok()) << conn.status();
    internal::v1::KvTransferHeader header;
    header.set_transfer_id(1);
    header.set_cluster_credential(credential);
    const std::string bytes = header.SerializeAsString();
    ASSERT_TRUE(kvtransfer::tcp::WriteFrame(**conn, kvtransfer::tcp::FrameType::kHeader,
                                            std::as_bytes(std::span<const char>(bytes)),
                                            absl::Now() + absl::Seconds(5))
                    .ok());
    auto ack = kvtransfer::tcp::ReadAckFrame(**conn, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(ack.ok()) << ack.status();
    EXPECT_FALSE(ack->ok());
    EXPECT_NE(ack->error().find("cluster credential"), std::string::npos) << ack->error();
  }
  // Real transfers still work.
  StreamResult ok = RunGenerate(*TlsClient(), TokenRequest({4, 5, 6}, 4));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST_F(AuthTest, WorkerWithTheWrongTokenIsNotRegisteredAndNotServing) {
  absl::Status s = cluster_->AddPrefill({"--cluster_token_file=" + *work_dir_ + "/wrong_token"});
  ASSERT_TRUE(s.ok()) << s;
  const std::string address = cluster_->prefill().back()->grpc_address;
  // Several registration attempts (one each 250 ms) all refused.
  absl::SleepFor(absl::Seconds(1.5));
  EXPECT_EQ(PoolSize("prefill"), 1);
  using Status = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(Health(address, ""), Status::NOT_SERVING);
  EXPECT_EQ(Health(address, kLivenessService), Status::SERVING);
  // The registered workers are ready.
  EXPECT_EQ(Health(cluster_->prefill()[0]->grpc_address, ""), Status::SERVING);
  EXPECT_EQ(Health(cluster_->decode()[0]->grpc_address, ""), Status::SERVING);
  EXPECT_NE(cluster_->prefill().back()->proc.ReadLog().find("cluster credential"),
            std::string::npos);
}

// Starts `cluster` and streams 6 tokens through its plaintext client port.
void StartAndGenerate(LocalCluster& cluster) {
  absl::Status s = cluster.Start();
  ASSERT_TRUE(s.ok()) << s;
  auto client = v1::Generation::NewStub(
      MakeClientChannel(cluster.router_address(), grpc::InsecureChannelCredentials()));
  StreamResult run = RunGenerate(*client, TokenRequest({1, 2, 3, 4, 5}, 6));
  ASSERT_TRUE(run.status.ok()) << run.status.error_message();
  EXPECT_EQ(run.tokens.size(), 6u);
}

// Mid-rotation (the second of its three rollouts, docs/operations.md): the
// router and the decode worker send the new token, the prefill worker still
// sends the old one, each accepts both. Registration, the router's calls
// and the prefill's KV handshake to the decode worker all pass.
TEST_F(AuthTest, ProcessesMidRotationServeTogether) {
  const std::string w = *work_dir_ + "/rotation";
  std::filesystem::create_directories(w);
  WriteAll(w + "/new_first", absl::StrCat("rotated-token-0123456789\n", kToken, "\n"));
  WriteAll(w + "/old_first", absl::StrCat(kToken, "\nrotated-token-0123456789\n"));
  LocalCluster mixed(
      ClusterOptions{.model_dir = *work_dir_ + "/model",
                     .work_dir = w,
                     .router_flags = {"--cluster_token_file=" + w + "/new_first", "--http_port=-1"},
                     .prefill_flags = {"--cluster_token_file=" + w + "/old_first"},
                     .decode_flags = {"--cluster_token_file=" + w + "/new_first"}});
  StartAndGenerate(mixed);
}

// Writes, under `dir`, a CA (`ca.pem`) and a certificate for the internal
// server name signed by it (`node.pem`, `node.key`), usable as server and
// client certificate. Returns false (with the log) when openssl fails.
bool MakeInternalCertificates(const std::string& dir, std::string* log) {
  std::filesystem::create_directories(dir);
  WriteAll(dir + "/ext.cnf",
           "subjectAltName=DNS:pdserve-internal\nextendedKeyUsage=serverAuth,clientAuth\n");
  const std::string cmd = absl::StrCat(
      "cd ", dir, " && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca ",
      "-keyout ca.key -out ca.pem && openssl req -newkey rsa:2048 -nodes ",
      "-subj /CN=pdserve-internal -keyout node.key -out node.csr && openssl x509 -req ",
      "-in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile ext.cnf ",
      "-out node.pem");
  const int rc = std::system((cmd + " > " + dir + "/openssl.log 2>&1").c_str());
  *log = ReadAll(dir + "/openssl.log");
  return rc == 0;
}

std::vector<std::string> InternalTlsFlags(const std::string& dir) {
  return {"--internal_tls_cert_file=" + dir + "/node.pem",
          "--internal_tls_key_file=" + dir + "/node.key",
          "--internal_tls_ca_file=" + dir + "/ca.pem"};
}

// A health check of `address` over `credentials` (target name
// pdserve-internal): the call's status.
grpc::Status HealthCall(const std::string& address,
                        std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("pdserve-internal");
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(address, std::move(credentials), args));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return stub->Check(&ctx, {}, &resp);
}

// Mutual TLS on the internal ports: the cluster serves, the workers' ports
// refuse plaintext and TLS without a client certificate of the cluster's
// CA, and a worker whose certificate another CA signed is never registered.
TEST_F(AuthTest, InternalPortsOverMutualTls) {
  const std::string w = *work_dir_ + "/internal_tls";
  std::string log;
  ASSERT_TRUE(MakeInternalCertificates(w + "/pki", &log)) << log;
  ASSERT_TRUE(MakeInternalCertificates(w + "/other_pki", &log)) << log;
  std::vector<std::string> flags = InternalTlsFlags(w + "/pki");
  flags.push_back("--cluster_token_file=" + *work_dir_ + "/token");
  std::vector<std::string> router_flags = flags;
  router_flags.push_back("--http_port=-1");
  LocalCluster cluster(ClusterOptions{.model_dir = *work_dir_ + "/model",
                                      .work_dir = w,
                                      .router_flags = router_flags,
                                      .prefill_flags = flags,
                                      .decode_flags = flags});
  StartAndGenerate(cluster);
  if (::testing::Test::HasFatalFailure()) return;

  const std::string worker = cluster.prefill()[0]->grpc_address;
  EXPECT_FALSE(HealthCall(worker, grpc::InsecureChannelCredentials()).ok());
  grpc::SslCredentialsOptions no_client_cert;
  no_client_cert.pem_root_certs = ReadAll(w + "/pki/ca.pem");
  EXPECT_FALSE(HealthCall(worker, grpc::SslCredentials(no_client_cert)).ok());
  grpc::SslCredentialsOptions member = no_client_cert;
  member.pem_private_key = ReadAll(w + "/pki/node.key");
  member.pem_cert_chain = ReadAll(w + "/pki/node.pem");
  const grpc::Status ok = HealthCall(worker, grpc::SslCredentials(member));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  grpc::SslCredentialsOptions stranger = member;
  stranger.pem_private_key = ReadAll(w + "/other_pki/node.key");
  stranger.pem_cert_chain = ReadAll(w + "/other_pki/node.pem");
  EXPECT_FALSE(HealthCall(worker, grpc::SslCredentials(stranger)).ok());
  // The router's registry port refuses plaintext too.
  EXPECT_FALSE(
      HealthCall(cluster.router_internal_address(), grpc::InsecureChannelCredentials()).ok());

  // A worker with the right token but another CA's certificate.
  std::vector<std::string> stranger_flags = InternalTlsFlags(w + "/other_pki");
  stranger_flags.push_back("--cluster_token_file=" + *work_dir_ + "/token");
  ASSERT_TRUE(cluster.AddPrefill(stranger_flags).ok());
  absl::SleepFor(absl::Seconds(1.5));
  auto metrics = HttpGet(cluster.router_metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(MetricValue(*metrics, "pdserve_pool_workers{pool=\"prefill\"}"), 1);

  // HTTP probes on the metrics port, for where gRPC probes cannot speak TLS:
  // the registered worker is ready, the stranger is alive but not ready.
  const auto probe = [](int port, const char* path) {
    httplib::Client client("127.0.0.1", port);
    auto res = client.Get(path);
    return res ? res->status : -1;
  };
  EXPECT_EQ(probe(cluster.prefill()[0]->metrics_port, "/readyz"), 200);
  EXPECT_EQ(probe(cluster.prefill().back()->metrics_port, "/livez"), 200);
  EXPECT_EQ(probe(cluster.prefill().back()->metrics_port, "/readyz"), 503);
}

TEST(InternalTlsFlagsTest, AllThreeFilesOrNone) {
  EXPECT_FALSE(LoadInternalTls("", "", "", "pdserve-internal")->enabled());
  EXPECT_EQ(LoadInternalTls("cert.pem", "", "", "pdserve-internal").status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string missing = ::testing::TempDir() + "/no/such.pem";
  EXPECT_EQ(LoadInternalTls(missing, missing, missing, "pdserve-internal").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::testing
