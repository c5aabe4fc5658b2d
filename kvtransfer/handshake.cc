// The transfer handshake; see handshake.h.
#include "kvtransfer/handshake.h"

#include "common/auth.h"
#include "kvtransfer/tcp/wire.h"

namespace pdserve::kvtransfer {

internal::v1::KvTransferHeader MakeHeader(TransferId id, const TransferSpec& spec) {
  internal::v1::KvTransferHeader h;
  h.set_transfer_id(id);
  h.set_model_fingerprint(spec.model_fingerprint);
  h.set_dtype(spec.dtype);
  h.set_num_layers(spec.num_layers);
  h.set_num_kv_heads(spec.num_kv_heads);
  h.set_head_dim(spec.head_dim);
  h.set_num_tokens(spec.num_tokens);
  h.set_layout(spec.layout);
  h.set_cluster_credential(KvHandshakeDigest());
  return h;
}

TransferSpec SpecFromHeader(const internal::v1::KvTransferHeader& header, int bytes_per_element) {
  TransferSpec spec;
  spec.model_fingerprint = header.model_fingerprint();
  spec.dtype = header.dtype();
  spec.layout = header.layout();
  spec.num_layers = header.num_layers();
  spec.num_kv_heads = header.num_kv_heads();
  spec.head_dim = header.head_dim();
  spec.num_tokens = header.num_tokens();
  spec.bytes_per_element = bytes_per_element;
  return spec;
}

absl::Status CheckHeader(const internal::v1::KvTransferHeader& header,
                         const TransferSpec& expected) {
  TransferSpec announced = SpecFromHeader(header, expected.bytes_per_element);
  announced.dtype = tcp::SanitizeUtf8(announced.dtype, 64);
  announced.layout = tcp::SanitizeUtf8(announced.layout, 64);
  return announced.CheckMatches(expected);
}

absl::Status CheckPeerCredential(const internal::v1::KvTransferHeader& header) {
  return CheckKvHandshakeDigest(header.cluster_credential());
}

}  // namespace pdserve::kvtransfer
