// Wire format of the TCP kv transport: frame encoding, validation and frame
// I/O. Layout and flow are documented in wire.h.
#include "kvtransfer/tcp/wire.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pdserve::kvtransfer::tcp {
namespace {

void PutU64(uint64_t v, std::byte* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
}

uint64_t GetU64(const std::byte* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{std::to_integer<uint8_t>(in[i])} << (8 * i);
  return v;
}

std::span<const std::byte> AsBytes(absl::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

}  // namespace

std::string SanitizeUtf8(absl::string_view s, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool valid = len != 0 && i + len <= s.size();
    for (size_t k = 1; valid && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      valid = (cc & 0xC0) == 0x80;
      cp = (cp << 6) | (cc & 0x3F);
    }
    constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    valid = valid && cp >= kMinForLength[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!valid) len = 1;
    if (out.size() + len > max_bytes) break;
    if (valid) {
      out.append(s.data() + i, len);
    } else {
      out.push_back('?');
    }
    i += len;
  }
  return out;
}

void PutU32(uint32_t v, std::byte* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
}

uint32_t GetU32(const std::byte* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{std::to_integer<uint8_t>(in[i])} << (8 * i);
  return v;
}

absl::string_view FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHeader:
      return "HEADER";
    case FrameType::kAck:
      return "ACK";
    case FrameType::kLayer:
      return "LAYER";
    case FrameType::kFinish:
      return "FINISH";
    case FrameType::kAbort:
      return "ABORT";
    case FrameType::kLayerRange:
      return "LAYER_RANGE";
  }
  return "UNKNOWN";
}

std::array<std::byte, kFrameHeaderBytes> EncodeFrameHeader(FrameType type, uint64_t length) {
  std::array<std::byte, kFrameHeaderBytes> out;
  PutU32(static_cast<uint32_t>(type), out.data());
  PutU64(length, out.data() + 4);
  return out;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(std::span<const std::byte, kFrameHeaderBytes> bytes) {
  const uint32_t raw_type = GetU32(bytes.data());
  const uint64_t length = GetU64(bytes.data() + 4);
  uint64_t min_length = 0;
  uint64_t max_length = kMaxControlPayloadBytes;
  switch (raw_type) {
    case static_cast<uint32_t>(FrameType::kHeader):
    case static_cast<uint32_t>(FrameType::kAck):
    case static_cast<uint32_t>(FrameType::kAbort):
      break;
    case static_cast<uint32_t>(FrameType::kLayer):
      min_length = kLayerIndexBytes;
      max_length = kLayerIndexBytes + kMaxLayerBytes;
      break;
    case static_cast<uint32_t>(FrameType::kLayerRange):
      min_length = kRangePrefixBytes;
      max_length = kRangePrefixBytes + kMaxLayerBytes;
      break;
    case static_cast<uint32_t>(FrameType::kFinish):
      min_length = max_length = kFinishPayloadBytes;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown kv frame type ", raw_type));
  }
  const FrameHeader header{static_cast<FrameType>(raw_type), length};
  if (length < min_length || length > max_length) {
    return absl::InvalidArgumentError(absl::StrCat(FrameTypeName(header.type), " frame length ",
                                                   length, " outside [", min_length, ", ",
                                                   max_length, "]"));
  }
  return header;
}

absl::Status WriteFrame(Connection& conn, FrameType type, std::span<const std::byte> payload,
                        absl::Time deadline) {
  const auto header = EncodeFrameHeader(type, payload.size());
  const std::span<const std::byte> parts[] = {header, payload};
  return conn.WriteAll(parts, deadline);
}

absl::Status WriteLayerFrame(Connection& conn, int layer, std::span<const std::byte> payload,
                             absl::Time deadline) {
  const std::span<const std::byte> rows[] = {payload};
  return WriteChunkFrame(conn, layer, 0, 1, 1, rows, deadline);
}

absl::Status WriteChunkFrame(Connection& conn, int layer, int token_begin, int num_tokens,
                             int total_tokens, std::span<const std::span<const std::byte>> rows,
                             absl::Time deadline) {
  size_t bytes = 0;
  for (std::span<const std::byte> r : rows) bytes += r.size();
  const bool whole = token_begin == 0 && num_tokens == total_tokens;
  std::array<std::byte, kRangePrefixBytes> prefix;
  PutU32(static_cast<uint32_t>(layer), prefix.data());
  PutU32(static_cast<uint32_t>(token_begin), prefix.data() + 4);
  PutU32(static_cast<uint32_t>(num_tokens), prefix.data() + 8);
  const std::span<const std::byte> prefix_bytes =
      std::span<const std::byte>(prefix).first(whole ? kLayerIndexBytes : kRangePrefixBytes);
  const auto header = EncodeFrameHeader(whole ? FrameType::kLayer : FrameType::kLayerRange,
                                        prefix_bytes.size() + bytes);
  std::vector<std::span<const std::byte>> parts;
  parts.reserve(rows.size() + 2);
  parts.push_back(header);
  parts.push_back(prefix_bytes);
  parts.insert(parts.end(), rows.begin(), rows.end());
  return conn.WriteAll(parts, deadline);
}

absl::Status WriteFinishFrame(Connection& conn, int32_t first_token, absl::Time deadline) {
  std::array<std::byte, kFinishPayloadBytes> token;
  PutU32(static_cast<uint32_t>(first_token), token.data());
  return WriteFrame(conn, FrameType::kFinish, token, deadline);
}

absl::Status WriteAckFrame(Connection& conn, const absl::Status& status, absl::Time deadline) {
  internal::v1::KvTransferAck ack;
  ack.set_ok(status.ok());
  if (!status.ok()) {
    // Proto3 strings must be UTF-8; keep the frame well under the control cap.
    ack.set_error(SanitizeUtf8(status.message(), kMaxControlPayloadBytes / 2));
  }
  const std::string bytes = ack.SerializeAsString();
  return WriteFrame(conn, FrameType::kAck, AsBytes(bytes), deadline);
}

absl::StatusOr<FrameHeader> ReadFrameHeader(Connection& conn, absl::Time deadline) {
  std::array<std::byte, kFrameHeaderBytes> bytes;
  absl::Status s = conn.ReadExact(bytes, deadline);
  if (!s.ok()) return s;
  return DecodeFrameHeader(bytes);
}

absl::StatusOr<std::string> ReadControlPayload(Connection& conn, const FrameHeader& header,
                                               absl::Time deadline) {
  if (header.length > kMaxControlPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(FrameTypeName(header.type), " frame too long: ", header.length));
  }
  std::string payload(header.length, '\0');
  absl::Status s = conn.ReadExact(
      std::as_writable_bytes(std::span<char>(payload.data(), payload.size())), deadline);
  if (!s.ok()) return s;
  return payload;
}

absl::StatusOr<internal::v1::KvTransferAck> ReadAckFrame(Connection& conn, absl::Time deadline) {
  absl::StatusOr<FrameHeader> header = ReadFrameHeader(conn, deadline);
  if (!header.ok()) return header.status();
  if (header->type != FrameType::kAck) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected an ACK frame, got ", FrameTypeName(header->type)));
  }
  absl::StatusOr<std::string> payload = ReadControlPayload(conn, *header, deadline);
  if (!payload.ok()) return payload.status();
  internal::v1::KvTransferAck ack;
  if (!ack.ParseFromString(*payload)) return absl::InvalidArgumentError("malformed ACK frame");
  return ack;
}

}  // namespace pdserve::kvtransfer::tcp
