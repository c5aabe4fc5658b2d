// Structured details carried on an absl::Status through the front end, as
// status payloads: which request field an INVALID_ARGUMENT is about (the
// OpenAI adapter returns it as the error's `param`), and why a request was
// refused (the `reason` label of pdserve_requests_rejected_total).
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pdserve::frontend {

// INVALID_ARGUMENT "<field><detail>" with `field` attached, e.g.
// FieldError("sampling.stop", ": at most 16 strings").
absl::Status FieldError(absl::string_view field, absl::string_view detail);
// The field attached by FieldError (or WithField); "" when none.
std::string ErrorField(const absl::Status& status);
// `status` with `field` attached.
absl::Status WithField(absl::Status status, absl::string_view field);

// `status` marked as a refusal with `reason` (a short snake_case label:
// "no_decode_worker", "capacity", ...).
absl::Status WithRejectReason(absl::Status status, absl::string_view reason);
// The label attached by WithRejectReason; "" when none.
std::string RejectReason(const absl::Status& status);
// `status` with a hint for the client: when to try again (the gRPC adapter
// sends it as `retry-after` trailing metadata in whole seconds, the HTTP
// adapter as a Retry-After header).
absl::Status WithRetryAfter(absl::Status status, absl::Duration after);
// The hint attached by WithRetryAfter; nullopt when none.
std::optional<absl::Duration> RetryAfter(const absl::Status& status);
// The hint in whole seconds, rounded up, at least 1 ("" when none): the
// value of a Retry-After header.
std::string RetryAfterSeconds(const absl::Status& status);

// The label of a refusal with no reason attached, by its code:
// invalid_argument, resource_exhausted, unavailable, else other.
std::string RejectReasonForCode(absl::StatusCode code);

}  // namespace pdserve::frontend
