// Wire format of the TCP kv transport. A connection carries one transfer at
// a time; after a transfer's final ACK{ok} it may carry the next HEADER
// (senders pool connections per receiver). Any failure closes it.
//
// Frame:  [u32 LE type][u64 LE payload length][payload]
//   HEADER      1  sender->receiver  serialized internal.v1.KvTransferHeader
//   ACK         2  receiver->sender  serialized internal.v1.KvTransferAck
//   LAYER       3  sender->receiver  [u32 LE layer index][TransferSpec::LayerBytes() bytes:
//                                     K[T,H,D] then V[T,H,D], token-major]
//   FINISH      4  sender->receiver  [i32 LE first token]
//   ABORT       5  sender->receiver  utf-8 error message
//   LAYER_RANGE 6  sender->receiver  [u32 LE layer][u32 LE first token][u32 LE tokens n]
//                                     [K[n,H,D] then V[n,H,D]]
// LAYER is LAYER_RANGE for all T tokens of a layer. The payload is the rows
// themselves, whatever the block layout of either side: each side gathers
// or scatters them from or to its own blocks.
//
// Flow, per transfer:
//   sender   HEADER
//   receiver ACK{ok} | ACK{ok=false, error} and close   (transfer id expected? spec matches?)
//   sender   LAYER / LAYER_RANGE frames (layers in any order; a layer's token
//            ranges in order, contiguous, each token once), then FINISH
//   receiver ACK{ok} | ACK{ok=false, error}              (all tokens, sink accepted them)
// The sender may send ABORT in place of any frame after HEADER; the receiver
// fails the transfer with its message. A receiver that fails mid-transfer
// sends ACK{ok=false} early and closes; senders watch for it between frames.
//
// Every frame is validated on read: unknown type, a length above the type's
// cap, a layer index out of range, a token range that does not continue the
// layer's, or a payload of the wrong size fails the transfer with
// INVALID_ARGUMENT; nothing is allocated from an unchecked length.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/transport.h"
#include "pdserve/internal/v1/kv_transfer.pb.h"

namespace pdserve::kvtransfer::tcp {

enum class FrameType : uint32_t {
  kHeader = 1,
  kAck = 2,
  kLayer = 3,
  kFinish = 4,
  kAbort = 5,
  kLayerRange = 6,
};

inline constexpr size_t kFrameHeaderBytes = 12;
// HEADER, ACK and ABORT payloads are at most this long.
inline constexpr uint64_t kMaxControlPayloadBytes = 64 * 1024;
inline constexpr size_t kLayerIndexBytes = 4;
// LAYER_RANGE's prefix: layer, first token, token count.
inline constexpr size_t kRangePrefixBytes = 12;
inline constexpr size_t kFinishPayloadBytes = 4;

struct FrameHeader {
  FrameType type;
  uint64_t length;  // payload bytes after the 12-byte frame header
};

absl::string_view FrameTypeName(FrameType type);
std::array<std::byte, kFrameHeaderBytes> EncodeFrameHeader(FrameType type, uint64_t length);
// INVALID_ARGUMENT for an unknown type or a length outside the type's bounds
// (LAYER, LAYER_RANGE: prefix + at most kMaxLayerBytes; FINISH: exactly 4).
absl::StatusOr<FrameHeader> DecodeFrameHeader(std::span<const std::byte, kFrameHeaderBytes> bytes);

// `s` cut to at most `max_bytes`, with bytes that are not valid UTF-8
// replaced by '?': peer-supplied text is safe to put in a proto3 string.
std::string SanitizeUtf8(absl::string_view s, size_t max_bytes);

void PutU32(uint32_t v, std::byte* out);
uint32_t GetU32(const std::byte* in);

// ---- Frame I/O on a connection (one reader, one writer thread) ----

absl::Status WriteFrame(Connection& conn, FrameType type, std::span<const std::byte> payload,
                        absl::Time deadline);
// A whole layer as one LAYER frame (K then V in `payload`).
absl::Status WriteLayerFrame(Connection& conn, int layer, std::span<const std::byte> payload,
                             absl::Time deadline);
// Tokens [token_begin, token_begin + num_tokens) of `layer`, whose rows are
// `rows` in the wire order (K rows, then V rows): LAYER when they are all
// `total_tokens` of the layer, else LAYER_RANGE.
absl::Status WriteChunkFrame(Connection& conn, int layer, int token_begin, int num_tokens,
                             int total_tokens, std::span<const std::span<const std::byte>> rows,
                             absl::Time deadline);
absl::Status WriteFinishFrame(Connection& conn, int32_t first_token, absl::Time deadline);
// ACK{ok} for an OK status, else ACK{ok=false, error=status.message()}.
absl::Status WriteAckFrame(Connection& conn, const absl::Status& status, absl::Time deadline);

absl::StatusOr<FrameHeader> ReadFrameHeader(Connection& conn, absl::Time deadline);
// The payload of a HEADER, ACK or ABORT frame whose header was just read.
absl::StatusOr<std::string> ReadControlPayload(Connection& conn, const FrameHeader& header,
                                               absl::Time deadline);
// Reads one frame that must be an ACK. A clean EOF before it is UNAVAILABLE.
absl::StatusOr<internal::v1::KvTransferAck> ReadAckFrame(Connection& conn, absl::Time deadline);

}  // namespace pdserve::kvtransfer::tcp
