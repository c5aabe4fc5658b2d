#include "frontend/errors.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace pdserve::frontend {
namespace {
constexpr char kFieldUrl[] = "type.pdserve.dev/field";
constexpr char kRejectUrl[] = "type.pdserve.dev/reject_reason";

std::string Payload(const absl::Status& status, absl::string_view url) {
  absl::optional<absl::Cord> payload = status.GetPayload(url);
  return payload.has_value() ? std::string(*payload) : std::string();
}
}  // namespace

absl::Status FieldError(absl::string_view field, absl::string_view detail) {
  return WithField(absl::InvalidArgumentError(absl::StrCat(field, detail)), field);
}

std::string ErrorField(const absl::Status& status) { return Payload(status, kFieldUrl); }

absl::Status WithField(absl::Status status, absl::string_view field) {
  if (!status.ok()) status.SetPayload(kFieldUrl, absl::Cord(field));
  return status;
}

absl::Status WithRejectReason(absl::Status status, absl::string_view reason) {
  if (!status.ok()) status.SetPayload(kRejectUrl, absl::Cord(reason));
  return status;
}

std::string RejectReason(const absl::Status& status) { return Payload(status, kRejectUrl); }

std::string RejectReasonForCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
      return "invalid_argument";
    case absl::StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    default:
      return "other";
  }
}

}  // namespace pdserve::frontend
