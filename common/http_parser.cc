#include "common/http_parser.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pdserve::http {
namespace {

// A chunk-size or trailer line longer than this is malformed.
constexpr size_t kMaxChunkLineBytes = 4096;

bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool IsToken(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar);
}

absl::string_view StripBlanks(absl::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// True if the comma-separated list `value` holds `token` (case-insensitive).
bool ListHas(absl::string_view value, absl::string_view token) {
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    if (absl::EqualsIgnoreCase(StripBlanks(item), token)) return true;
  }
  return false;
}

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed HTTP request: ", what));
}

}  // namespace

const std::string* RequestHead::Find(absl::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return &value;
  }
  return nullptr;
}

size_t FindHeadEnd(absl::string_view buffer) {
  // Skip empty lines before the request line (RFC 9112 2.2).
  size_t start = 0;
  while (start < buffer.size() && (buffer[start] == '\r' || buffer[start] == '\n')) ++start;
  for (size_t i = start; i < buffer.size(); ++i) {
    if (buffer[i] != '\n') continue;
    // "\n\n" or "\n\r\n" ends the head.
    if (i + 1 < buffer.size() && buffer[i + 1] == '\n') return i + 2;
    if (i + 2 < buffer.size() && buffer[i + 1] == '\r' && buffer[i + 2] == '\n') return i + 3;
  }
  return 0;
}

absl::StatusOr<RequestHead> ParseHead(absl::string_view head) {
  while (!head.empty() && (head.front() == '\r' || head.front() == '\n')) head.remove_prefix(1);
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  while (!lines.empty() && StripBlanks(lines.back()).empty()) lines.pop_back();
  if (lines.empty()) return Malformed("no request line");

  RequestHead out;
  absl::string_view request_line = absl::StripSuffix(lines[0], "\r");
  std::vector<absl::string_view> parts = absl::StrSplit(request_line, ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || parts[1].empty()) {
    return Malformed("request line is not \"METHOD target HTTP/1.x\"");
  }
  if (!absl::StartsWith(parts[2], "HTTP/")) return Malformed("no HTTP version");
  if (parts[2] == "HTTP/1.1") {
    out.minor_version = 1;
  } else if (parts[2] == "HTTP/1.0") {
    out.minor_version = 0;
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("HTTP version ", parts[2].substr(0, 16), " is not supported (HTTP/1.x only)"));
  }
  for (char c : parts[1]) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return Malformed("bad request target");
  }
  out.method = std::string(parts[0]);
  out.target = std::string(parts[1]);
  const size_t q = out.target.find('?');
  out.path = out.target.substr(0, q);
  if (q != std::string::npos) out.query = out.target.substr(q + 1);

  bool has_length = false;
  std::string transfer_encoding;
  std::string connection;
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::string_view line = absl::StripSuffix(lines[i], "\r");
    if (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
      return Malformed("obsolete header line folding");
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return Malformed("bad header line");
    }
    std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    std::string value(StripBlanks(line.substr(colon + 1)));
    if (name == "content-length") {
      int64_t n = 0;
      if (!absl::SimpleAtoi(value, &n) || n < 0 ||
          value.find_first_not_of("0123456789") != std::string::npos) {
        return Malformed("bad Content-Length");
      }
      if (has_length && n != out.content_length) return Malformed("conflicting Content-Length");
      has_length = true;
      out.content_length = n;
    } else if (name == "transfer-encoding") {
      absl::StrAppend(&transfer_encoding, transfer_encoding.empty() ? "" : ",", value);
    } else if (name == "connection") {
      absl::StrAppend(&connection, connection.empty() ? "" : ",", value);
    } else if (name == "expect") {
      out.expect_continue = absl::EqualsIgnoreCase(value, "100-continue");
    }
    out.headers.emplace_back(std::move(name), std::move(value));
  }
  if (!transfer_encoding.empty()) {
    // Only "chunked" alone: a request with another coding cannot be framed.
    if (!absl::EqualsIgnoreCase(StripBlanks(transfer_encoding), "chunked")) {
      return absl::UnimplementedError(absl::StrCat(
          "Transfer-Encoding \"", transfer_encoding.substr(0, 64), "\" is not supported"));
    }
    if (has_length) return Malformed("both Transfer-Encoding and Content-Length");
    out.chunked = true;
  }
  out.keep_alive =
      out.minor_version == 1 ? !ListHas(connection, "close") : ListHas(connection, "keep-alive");
  return out;
}

int HttpStatusOfParseError(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOutOfRange:
      return 413;
    case absl::StatusCode::kResourceExhausted:
      return 431;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kFailedPrecondition:
      return 505;
    default:
      return 400;
  }
}

absl::StatusOr<bool> ChunkedBodyDecoder::Feed(absl::string_view in, size_t* consumed,
                                              std::string* body) {
  size_t pos = 0;
  // Reads a line into line_; true once its LF arrived (line_ then excludes CRLF).
  auto read_line = [&]() -> absl::StatusOr<bool> {
    const size_t lf = in.find('\n', pos);
    const size_t end = lf == absl::string_view::npos ? in.size() : lf;
    line_.append(in.data() + pos, end - pos);
    pos = lf == absl::string_view::npos ? in.size() : lf + 1;
    if (line_.size() > kMaxChunkLineBytes) return Malformed("chunk line too long");
    if (lf == absl::string_view::npos) return false;
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    return true;
  };
  while (state_ != State::kDone) {
    if (pos == in.size()) break;
    switch (state_) {
      case State::kSize: {
        absl::StatusOr<bool> done = read_line();
        if (!done.ok()) return done.status();
        if (!*done) break;
        absl::string_view size = line_;
        size = size.substr(0, size.find(';'));  // chunk extensions are ignored
        size = StripBlanks(size);
        uint64_t n = 0;
        if (size.empty() || size.size() > 15 || !absl::SimpleHexAtoi(size, &n) ||
            size.find_first_not_of("0123456789abcdefABCDEF") != absl::string_view::npos) {
          return Malformed("bad chunk size");
        }
        line_.clear();
        if (n == 0) {
          state_ = State::kTrailer;
        } else {
          if (static_cast<int64_t>(body->size() + n) > max_body_bytes_) {
            return absl::OutOfRangeError(
                absl::StrCat("request body larger than ", max_body_bytes_, " bytes"));
          }
          remaining_ = n;
          state_ = State::kData;
        }
        break;
      }
      case State::kData: {
        const size_t take = std::min<uint64_t>(remaining_, in.size() - pos);
        body->append(in.data() + pos, take);
        pos += take;
        remaining_ -= take;
        if (remaining_ == 0) state_ = State::kDataEnd;
        break;
      }
      case State::kDataEnd: {
        absl::StatusOr<bool> done = read_line();
        if (!done.ok()) return done.status();
        if (!*done) break;
        if (!line_.empty()) return Malformed("chunk data not followed by CRLF");
        state_ = State::kSize;
        break;
      }
      case State::kTrailer: {
        absl::StatusOr<bool> done = read_line();
        if (!done.ok()) return done.status();
        if (!*done) break;
        const bool last = line_.empty();
        line_.clear();
        if (last) state_ = State::kDone;
        break;
      }
      case State::kDone:
        break;
    }
  }
  *consumed = pos;
  return state_ == State::kDone;
}

}  // namespace pdserve::http
