#include "frontend/errors.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pdserve::frontend {
namespace {
constexpr char kFieldUrl[] = "type.pdserve.dev/field";
constexpr char kRejectUrl[] = "type.pdserve.dev/reject_reason";
constexpr char kRetryAfterUrl[] = "type.pdserve.dev/retry_after_ms";

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

absl::Status WithRetryAfter(absl::Status status, absl::Duration after) {
  if (!status.ok()) {
    status.SetPayload(
        kRetryAfterUrl,
        absl::Cord(absl::StrCat(std::max<int64_t>(0, absl::ToInt64Milliseconds(after)))));
  }
  return status;
}

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  const std::string ms = Payload(status, kRetryAfterUrl);
  int64_t value = 0;
  if (ms.empty() || !absl::SimpleAtoi(ms, &value)) return std::nullopt;
  return absl::Milliseconds(value);
}

std::string RetryAfterSeconds(const absl::Status& status) {
  const std::optional<absl::Duration> after = RetryAfter(status);
  if (!after.has_value()) return "";
  return absl::StrCat(
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(*after, absl::Seconds(1)))));
}

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
