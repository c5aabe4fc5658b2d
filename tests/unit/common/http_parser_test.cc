// HTTP/1.x request parsing (common/http_parser.h): heads, framing rules and
// chunked bodies, fed whole and byte by byte.
#include "common/http_parser.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::http {
namespace {

using ::testing::HasSubstr;

TEST(HttpParserTest, FindsTheEndOfTheHead) {
  const std::string head = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(FindHeadEnd(head), head.size());
  EXPECT_EQ(FindHeadEnd(head + "body"), head.size());
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\nHost: x\n\n"), 24u);  // bare LF
  for (size_t i = 0; i < head.size(); ++i) {
    EXPECT_EQ(FindHeadEnd(head.substr(0, i)), 0u) << i;
  }
  // Blank lines before a request line are skipped, not an empty head.
  EXPECT_EQ(FindHeadEnd("\r\n\r\nGET / HTTP/1.1\r\n\r\n"), 22u);
}

TEST(HttpParserTest, ParsesRequestLineHeadersAndFraming) {
  auto head = ParseHead(
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type:  application/json \r\n"
      "Content-Length: 12\r\nX-Two: 1\r\nX-Two: 2\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->method, "POST");
  EXPECT_EQ(head->target, "/v1/completions?x=1");
  EXPECT_EQ(head->path, "/v1/completions");
  EXPECT_EQ(head->query, "x=1");
  EXPECT_EQ(head->minor_version, 1);
  EXPECT_EQ(head->content_length, 12);
  EXPECT_FALSE(head->chunked);
  EXPECT_TRUE(head->keep_alive);
  ASSERT_NE(head->Find("content-type"), nullptr);
  EXPECT_EQ(*head->Find("content-type"), "application/json");
  EXPECT_EQ(*head->Find("x-two"), "1");  // the first of repeated headers
  EXPECT_EQ(head->Find("missing"), nullptr);
}

TEST(HttpParserTest, KeepAliveFollowsVersionAndConnection) {
  EXPECT_TRUE(ParseHead("GET / HTTP/1.1\r\n\r\n")->keep_alive);
  EXPECT_FALSE(ParseHead("GET / HTTP/1.1\r\nConnection: close\r\n\r\n")->keep_alive);
  EXPECT_FALSE(ParseHead("GET / HTTP/1.1\r\nConnection: Upgrade, Close\r\n\r\n")->keep_alive);
  EXPECT_FALSE(ParseHead("GET / HTTP/1.0\r\n\r\n")->keep_alive);
  EXPECT_TRUE(ParseHead("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")->keep_alive);
  EXPECT_TRUE(ParseHead("POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n")->expect_continue);
  auto chunked = ParseHead("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n");
  ASSERT_TRUE(chunked.ok());
  EXPECT_TRUE(chunked->chunked);
}

TEST(HttpParserTest, RefusesWhatCannotBeFramedOrRead) {
  struct Case {
    const char* head;
    int status;
    const char* message;
  };
  const Case cases[] = {
      {"GET /\r\n\r\n", 400, "request line"},
      {"GET / HTTP/1.1 extra\r\n\r\n", 400, "request line"},
      {"G@T / HTTP/1.1\r\n\r\n", 400, "request line"},
      {"GET / FTP/1.1\r\n\r\n", 400, "HTTP version"},
      {"GET / HTTP/2.0\r\n\r\n", 505, "HTTP/2.0"},
      {"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400, "header line"},
      {"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, "header line"},
      {"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400, "folding"},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400, "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "conflicting"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "gzip"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "gzip"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400, "both"},
  };
  for (const Case& c : cases) {
    auto head = ParseHead(c.head);
    ASSERT_FALSE(head.ok()) << c.head;
    EXPECT_EQ(HttpStatusOfParseError(head.status()), c.status) << c.head;
    EXPECT_THAT(std::string(head.status().message()), HasSubstr(c.message)) << c.head;
  }
  EXPECT_EQ(HttpStatusOfParseError(absl::OutOfRangeError("big")), 413);
  EXPECT_EQ(HttpStatusOfParseError(absl::ResourceExhaustedError("head")), 431);
}

// Feeds `wire` to a decoder `step` bytes at a time; returns the body and how
// many bytes of `wire` it consumed once complete.
absl::StatusOr<std::pair<std::string, size_t>> DecodeChunked(const std::string& wire, size_t step,
                                                             int64_t max_body = 1 << 20) {
  ChunkedBodyDecoder decoder(max_body);
  std::string body;
  std::string pending;
  size_t fed = 0;
  size_t used = 0;
  while (fed < wire.size()) {
    const size_t n = std::min(step, wire.size() - fed);
    pending.append(wire, fed, n);
    fed += n;
    size_t consumed = 0;
    absl::StatusOr<bool> done = decoder.Feed(pending, &consumed, &body);
    if (!done.ok()) return done.status();
    used += consumed;
    pending.erase(0, consumed);
    if (*done) return std::make_pair(body, used);
  }
  return absl::DataLossError("incomplete");
}

TEST(HttpParserTest, DecodesChunkedBodiesFedInAnyPieces) {
  const std::string wire =
      "5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nTrailer: x\r\n\r\nGET /next HTTP/1.1\r\n";
  const size_t body_end = wire.find("GET");
  for (size_t step : {1u, 2u, 3u, 7u, 1000u}) {
    auto decoded = DecodeChunked(wire, step);
    ASSERT_TRUE(decoded.ok()) << step << ": " << decoded.status();
    EXPECT_EQ(decoded->first, "hello, world") << step;
    EXPECT_EQ(decoded->second, body_end) << step;  // the next request is left alone
  }
  auto upper = DecodeChunked("A\r\n0123456789\r\n0\r\n\r\n", 4);
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(upper->first, "0123456789");
}

TEST(HttpParserTest, RefusesMalformedAndOversizedChunkedBodies) {
  EXPECT_EQ(DecodeChunked("zz\r\nab\r\n0\r\n\r\n", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeChunked("2\r\nabX\r\n0\r\n\r\n", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeChunked("ffffffffffffffffff\r\n", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeChunked(std::string(5000, '1'), 100).status().code(),
            absl::StatusCode::kInvalidArgument);  // a size line without end
  auto big = DecodeChunked("8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n", 5, /*max_body=*/10);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kOutOfRange) << big.status();
}

}  // namespace
}  // namespace pdserve::http
