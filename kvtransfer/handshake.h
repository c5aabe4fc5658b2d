// The handshake every transport's control channel carries: the sender's
// TransferSpec as a KvTransferHeader, checked by the receiver against the
// spec it expects for the transfer id.
#pragma once

#include "absl/status/status.h"
#include "kvtransfer/transport.h"
#include "pdserve/internal/v1/kv_transfer.pb.h"

namespace pdserve::kvtransfer {

internal::v1::KvTransferHeader MakeHeader(TransferId id, const TransferSpec& spec);
// The spec `header` announces. The header carries no element size (the dtype
// implies it), so `bytes_per_element` comes from the receiver's expectation.
TransferSpec SpecFromHeader(const internal::v1::KvTransferHeader& header, int bytes_per_element);
// OK, or FAILED_PRECONDITION naming the first field where the announced
// spec differs from `expected` (peer text sanitised for messages).
absl::Status CheckHeader(const internal::v1::KvTransferHeader& header,
                         const TransferSpec& expected);
// OK when the header carries the process's cluster credential (or the process
// has none); UNAUTHENTICATED otherwise. Checked before anything else, so an
// unauthenticated peer cannot fail or claim a real transfer.
absl::Status CheckPeerCredential(const internal::v1::KvTransferHeader& header);

}  // namespace pdserve::kvtransfer
