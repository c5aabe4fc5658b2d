// Pure checks of the kv transport's agreement and wire format: TransferSpec
// matching, spec validation, endpoint parsing, frame header encoding and
// UTF-8 sanitising. No sockets.
#include "kvtransfer/tcp/wire.h"

#include <array>
#include <cstring>
#include <set>
#include <string>
#include <string_view>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/transport.h"
#include "test_util.h"

namespace pdserve::kvtransfer {
namespace {

using ::testing::HasSubstr;
using testing::SmallSpec;

TEST(TransferSpecTest, MatchingSpecsAreOk) {
  EXPECT_TRUE(SmallSpec().CheckMatches(SmallSpec()).ok());
}

TEST(TransferSpecTest, MismatchNamesFirstDifferingField) {
  const TransferSpec expected = SmallSpec();
  struct Case {
    std::function<void(TransferSpec&)> change;
    std::string want;
  };
  const Case cases[] = {
      {[](TransferSpec& s) { s.model_fingerprint = 0xff; },
       "model_fingerprint 0x00000000000000ff != expected 0x1234abcd5678ef00"},
      {[](TransferSpec& s) { s.dtype = "bf16"; }, "dtype 'bf16' != expected 'f32'"},
      {[](TransferSpec& s) { s.layout = "paged_hnd"; },
       "layout 'paged_hnd' != expected 'paged_nhd'"},
      {[](TransferSpec& s) { s.num_layers = 5; }, "num_layers 5 != expected 4"},
      {[](TransferSpec& s) { s.num_kv_heads = 4; }, "num_kv_heads 4 != expected 2"},
      {[](TransferSpec& s) { s.head_dim = 16; }, "head_dim 16 != expected 8"},
      {[](TransferSpec& s) { s.num_tokens = 9; }, "num_tokens 9 != expected 8"},
      // Several fields differ: the first in declaration order is named.
      {[](TransferSpec& s) {
         s.num_tokens = 1;
         s.dtype = "f16";
       },
       "dtype 'f16'"},
  };
  for (const Case& c : cases) {
    TransferSpec got = expected;
    c.change(got);
    const absl::Status s = got.CheckMatches(expected);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.want;
    EXPECT_THAT(std::string(s.message()), HasSubstr("kv transfer spec mismatch: " + c.want));
  }
}

TEST(TransferSpecTest, DebugStringShowsEveryField) {
  const std::string s = SmallSpec().DebugString();
  for (const char* part :
       {"0x1234abcd5678ef00", "'f32'", "num_layers=4", "num_kv_heads=2", "head_dim=8",
        "num_tokens=8", "bytes_per_element=4", "layer_bytes=1024"}) {
    EXPECT_THAT(s, HasSubstr(part));
  }
}

TEST(ValidateSpecTest, AcceptsGoodRejectsBad) {
  EXPECT_TRUE(ValidateSpec(SmallSpec()).ok());
  TransferSpec zero_layers = SmallSpec(0);
  EXPECT_EQ(ValidateSpec(zero_layers).code(), absl::StatusCode::kInvalidArgument);
  TransferSpec bad_width = SmallSpec();
  bad_width.dtype = "bf16";  // 2 bytes, but bytes_per_element says 4
  EXPECT_EQ(ValidateSpec(bad_width).code(), absl::StatusCode::kInvalidArgument);
  TransferSpec huge = SmallSpec();
  huge.num_tokens = 1 << 30;
  huge.num_kv_heads = 1 << 10;
  EXPECT_EQ(ValidateSpec(huge).code(), absl::StatusCode::kInvalidArgument);
  TransferSpec custom = SmallSpec();
  custom.dtype = "q8_0";  // unknown dtypes pass with any element size
  custom.bytes_per_element = 1;
  EXPECT_TRUE(ValidateSpec(custom).ok());
}

TEST(HeaderTest, RoundTripsSpec) {
  const TransferSpec spec = SmallSpec();
  const internal::v1::KvTransferHeader h = MakeHeader(42, spec);
  EXPECT_EQ(h.transfer_id(), 42u);
  EXPECT_EQ(h.layout(), "paged_nhd");
  EXPECT_TRUE(SpecFromHeader(h, spec.bytes_per_element).CheckMatches(spec).ok());
}

TEST(EndpointTest, ParsesIpv4NamesAndBracketedIpv6) {
  auto v4 = tcp::ParseTcpEndpoint("tcp://127.0.0.1:40123");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 40123);
  auto name = tcp::ParseTcpEndpoint("tcp://decode-0.decode:9000");
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(name->host, "decode-0.decode");
  auto v6 = tcp::ParseTcpEndpoint("tcp://[::1]:1");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 1);
}

TEST(EndpointTest, RejectsMalformed) {
  for (const char* bad :
       {"", "127.0.0.1:80", "http://h:80", "tcp://", "tcp://h", "tcp://h:", "tcp://:80",
        "tcp://h:0", "tcp://h:65536", "tcp://h:8x", "tcp://h:-1", "tcp://::1:80", "tcp://[::1]",
        "tcp://[::1:80", "tcp://[]:80", "tcp://h:80/path", "tcp://h:+80"}) {
    auto r = tcp::ParseTcpEndpoint(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(EndpointTest, FormatsIpv6WithBrackets) {
  EXPECT_EQ(tcp::FormatTcpEndpoint("127.0.0.1", 5), "tcp://127.0.0.1:5");
  EXPECT_EQ(tcp::FormatTcpEndpoint("::1", 5), "tcp://[::1]:5");
}

TEST(FrameHeaderTest, EncodesLittleEndian) {
  const auto bytes = tcp::EncodeFrameHeader(tcp::FrameType::kLayer, 0x0102030405060708ULL);
  const uint8_t want[] = {3, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1};
  for (size_t i = 0; i < bytes.size(); ++i) {
    EXPECT_EQ(std::to_integer<uint8_t>(bytes[i]), want[i]) << i;
  }
}

TEST(FrameHeaderTest, DecodeValidatesTypeAndLength) {
  auto ok = tcp::DecodeFrameHeader(tcp::EncodeFrameHeader(tcp::FrameType::kLayer, 100));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->type, tcp::FrameType::kLayer);
  EXPECT_EQ(ok->length, 100u);

  auto unknown = tcp::DecodeFrameHeader(tcp::EncodeFrameHeader(static_cast<tcp::FrameType>(99), 0));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown kv frame type 99"));

  const std::pair<tcp::FrameType, uint64_t> bad_lengths[] = {
      {tcp::FrameType::kLayer, 3},
      {tcp::FrameType::kLayer, tcp::kLayerIndexBytes + kMaxLayerBytes + 1},
      {tcp::FrameType::kLayerRange, tcp::kRangePrefixBytes - 1},
      {tcp::FrameType::kLayerRange, tcp::kRangePrefixBytes + kMaxLayerBytes + 1},
      {tcp::FrameType::kLayer, ~uint64_t{0}},
      {tcp::FrameType::kFinish, 5},
      {tcp::FrameType::kHeader, tcp::kMaxControlPayloadBytes + 1},
      {tcp::FrameType::kAbort, uint64_t{1} << 40},
  };
  for (const auto& [type, length] : bad_lengths) {
    auto r = tcp::DecodeFrameHeader(tcp::EncodeFrameHeader(type, length));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << tcp::FrameTypeName(type) << " " << length;
  }
}

TEST(FailureReasonTest, EveryStatusMapsToAnInitialisedLabel) {
  const std::set<std::string_view> labels(std::begin(kKvFailureReasons),
                                          std::end(kKvFailureReasons));
  for (int code = 1; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), "x");
    EXPECT_EQ(labels.count(KvFailureReason(s)), 1u) << s;
  }
  EXPECT_EQ(KvFailureReason(absl::FailedPreconditionError("spec mismatch")), "refused");
  EXPECT_EQ(KvFailureReason(absl::DeadlineExceededError("stalled")), "timeout");
  EXPECT_EQ(KvFailureReason(absl::UnavailableError("peer went away")), "unavailable");
}

TEST(SanitizeUtf8Test, KeepsValidReplacesInvalidAndTruncates) {
  EXPECT_EQ(tcp::SanitizeUtf8("plain ascii", 100), "plain ascii");
  EXPECT_EQ(tcp::SanitizeUtf8("caf\xc3\xa9", 100), "caf\xc3\xa9");
  EXPECT_EQ(tcp::SanitizeUtf8("a\xff"
                              "b",
                              100),
            "a?b");
  EXPECT_EQ(tcp::SanitizeUtf8("\xc0\xaf", 100), "??");        // overlong '/'
  EXPECT_EQ(tcp::SanitizeUtf8("\xed\xa0\x80", 100), "???");   // surrogate
  EXPECT_EQ(tcp::SanitizeUtf8("caf\xc3\xa9", 4), "caf");      // no split code point
  EXPECT_EQ(tcp::SanitizeUtf8("abc\xe2\x82", 100), "abc??");  // cut sequence
}

}  // namespace
}  // namespace pdserve::kvtransfer
