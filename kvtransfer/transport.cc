// TransferSpec: the agreement check a receiver runs on a sender's announced
// spec, and its one-line debug form. Transport-independent.
#include "kvtransfer/transport.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace pdserve::kvtransfer {
namespace {

absl::Status Mismatch(absl::string_view field, absl::string_view got, absl::string_view want) {
  return absl::FailedPreconditionError(
      absl::StrCat("kv transfer spec mismatch: ", field, " ", got, " != expected ", want));
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%016x", v); }
std::string Quoted(absl::string_view s) { return absl::StrCat("'", s, "'"); }

}  // namespace

absl::Status TransferSpec::CheckMatches(const TransferSpec& expected) const {
  if (model_fingerprint != expected.model_fingerprint) {
    return Mismatch("model_fingerprint", Hex(model_fingerprint), Hex(expected.model_fingerprint));
  }
  if (dtype != expected.dtype) return Mismatch("dtype", Quoted(dtype), Quoted(expected.dtype));
  struct IntField {
    absl::string_view name;
    int got;
    int want;
  };
  const IntField fields[] = {
      {"num_layers", num_layers, expected.num_layers},
      {"num_kv_heads", num_kv_heads, expected.num_kv_heads},
      {"head_dim", head_dim, expected.head_dim},
      {"num_tokens", num_tokens, expected.num_tokens},
      {"bytes_per_element", bytes_per_element, expected.bytes_per_element},
  };
  for (const IntField& f : fields) {
    if (f.got != f.want) return Mismatch(f.name, absl::StrCat(f.got), absl::StrCat(f.want));
  }
  return absl::OkStatus();
}

std::string TransferSpec::DebugString() const {
  return absl::StrFormat(
      "TransferSpec{model_fingerprint=%s dtype=%s num_layers=%d num_kv_heads=%d head_dim=%d "
      "num_tokens=%d bytes_per_element=%d layer_bytes=%d}",
      Hex(model_fingerprint), Quoted(dtype), num_layers, num_kv_heads, head_dim, num_tokens,
      bytes_per_element, LayerBytes());
}

}  // namespace pdserve::kvtransfer
