// TransferSpec: how both sides build it, the agreement check a receiver runs
// on a sender's announced spec, validation, and failure reasons.
// Transport-independent.
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
  if (layout != expected.layout) return Mismatch("layout", Quoted(layout), Quoted(expected.layout));
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
      "TransferSpec{model_fingerprint=%s dtype=%s layout=%s num_layers=%d num_kv_heads=%d "
      "head_dim=%d num_tokens=%d bytes_per_element=%d layer_bytes=%d}",
      Hex(model_fingerprint), Quoted(dtype), Quoted(layout), num_layers, num_kv_heads, head_dim,
      num_tokens, bytes_per_element, LayerBytes());
}

TransferSpec TransferSpecFor(const engine::ModelRunner& runner, int num_tokens) {
  TransferSpec spec;
  spec.model_fingerprint = runner.fingerprint();
  spec.dtype = std::string(engine::KvDtypeName(runner.kv_dtype()));
  spec.layout = std::string(engine::kKvLayoutPagedNhd);
  spec.bytes_per_element = engine::KvDtypeBytes(runner.kv_dtype());
  spec.num_layers = runner.config().num_layers;
  spec.num_kv_heads = runner.config().num_kv_heads;
  spec.head_dim = runner.config().head_dim;
  spec.num_tokens = num_tokens;
  return spec;
}

absl::Status ValidateSpec(const TransferSpec& spec) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid kv transfer spec (", why, "): ", spec.DebugString()));
  };
  if (spec.num_layers <= 0 || spec.num_kv_heads <= 0 || spec.head_dim <= 0 ||
      spec.num_tokens <= 0 || spec.bytes_per_element <= 0) {
    return bad("every dimension must be positive");
  }
  if (spec.dtype.empty() || spec.dtype.size() > 32) return bad("dtype must be 1..32 chars");
  if (spec.layout.empty() || spec.layout.size() > 32) return bad("layout must be 1..32 chars");
  int want_bytes = 0;
  if (spec.dtype == "f32") want_bytes = 4;
  if (spec.dtype == "f16" || spec.dtype == "bf16") want_bytes = 2;
  if (want_bytes != 0 && spec.bytes_per_element != want_bytes) {
    return bad(absl::StrCat(spec.dtype, " has ", want_bytes, " bytes per element"));
  }
  // Overflow-safe: each factor is < 2^31, so check stepwise against the cap.
  uint64_t bytes = 2;
  for (int f : {spec.num_tokens, spec.num_kv_heads, spec.head_dim, spec.bytes_per_element}) {
    bytes *= static_cast<uint64_t>(f);
    if (bytes > kMaxLayerBytes) {
      return bad(absl::StrCat("layer exceeds ", kMaxLayerBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRegionsMatch(std::span<const engine::KvRegion> regions,
                               const TransferSpec& spec) {
  if (static_cast<int>(regions.size()) < spec.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv regions for ", regions.size(), " layers cannot hold a transfer of ", spec.num_layers));
  }
  for (const engine::KvRegion& r : regions.first(spec.num_layers)) {
    if (r.num_kv_heads != spec.num_kv_heads || r.head_dim != spec.head_dim ||
        engine::KvDtypeBytes(r.dtype) != spec.bytes_per_element ||
        engine::KvDtypeName(r.dtype) != spec.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv region of layer ", r.layer, " (", r.num_kv_heads, " heads x ",
                       r.head_dim, " ", std::string(engine::KvDtypeName(r.dtype)),
                       ") does not hold this transfer: ", spec.DebugString()));
    }
  }
  return absl::OkStatus();
}

std::string_view KvFailureReason(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
      return "refused";
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kAborted:
      return "aborted";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    case absl::StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return "invalid";
    default:
      return "internal";
  }
}

}  // namespace pdserve::kvtransfer
