// HTTP/1.x request parsing for common/http_server.h, as pure functions over
// bytes (no I/O): where a request head ends, what it says, and a decoder for
// chunked request bodies. Errors carry the HTTP status to answer with
// (HttpStatusOfParseError).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::http {

struct RequestHead {
  std::string method;     // as sent ("GET", "POST", ...)
  std::string target;     // the request target as sent
  std::string path;       // the target up to '?'
  std::string query;      // after '?', without it; "" when none
  int minor_version = 1;  // HTTP/1.<minor_version>
  // In order; names lower-cased, values without surrounding blanks.
  std::vector<std::pair<std::string, std::string>> headers;
  // Derived from the above:
  bool keep_alive = true;        // HTTP/1.1 unless "Connection: close"; 1.0 only with keep-alive
  bool chunked = false;          // Transfer-Encoding: chunked
  int64_t content_length = 0;    // 0 when absent (and when chunked)
  bool expect_continue = false;  // "Expect: 100-continue"

  // The value of the first header named `lower_name`; nullptr when absent.
  const std::string* Find(absl::string_view lower_name) const;
};

// The offset just past the blank line that ends the head at the start of
// `buffer` (CRLF CRLF, or bare LF LF as lenient servers accept); 0 while it
// is incomplete. Blank lines before a request line are skipped by ParseHead.
size_t FindHeadEnd(absl::string_view buffer);

// Parses a complete head (as delimited by FindHeadEnd). Errors:
// INVALID_ARGUMENT (400) for a malformed request line or header, a bad or
// conflicting Content-Length; UNIMPLEMENTED (501) for a transfer coding other
// than chunked; FAILED_PRECONDITION (505) for a version other than HTTP/1.x.
absl::StatusOr<RequestHead> ParseHead(absl::string_view head);

// The HTTP status a parse error answers: 400, 413 (OUT_OF_RANGE: a body over
// the limit), 431 (RESOURCE_EXHAUSTED: a head over the limit), 501, 505.
int HttpStatusOfParseError(const absl::Status& status);

// Decodes a chunked request body incrementally (RFC 9112 7.1): chunk sizes
// in hex with optional extensions, data, CRLF, a last chunk of size 0 and
// optional trailers (discarded).
class ChunkedBodyDecoder {
 public:
  explicit ChunkedBodyDecoder(int64_t max_body_bytes) : max_body_bytes_(max_body_bytes) {}

  // Consumes bytes from the front of `in` (how many: *consumed) and appends
  // the data to `body`. True once the body is complete (what follows in `in`
  // belongs to the next request); false when it needs more bytes. Errors:
  // INVALID_ARGUMENT (malformed), OUT_OF_RANGE (body over max_body_bytes).
  absl::StatusOr<bool> Feed(absl::string_view in, size_t* consumed, std::string* body);

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer, kDone };
  const int64_t max_body_bytes_;
  State state_ = State::kSize;
  std::string line_;        // the size or trailer line read so far
  uint64_t remaining_ = 0;  // data bytes left in the current chunk
};

}  // namespace pdserve::http
