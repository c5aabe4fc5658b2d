// Test helper: waiting for a condition that no event signals, by polling it
// under a generous deadline. Tests must pass on a busy machine: they wait
// for what they expect and never bound how long it takes (a timing belongs
// in a benchmark); the deadline only turns a hang into a failure.
#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pdserve::testing {

// Long enough for anything a test waits for on a loaded 2-core machine.
inline constexpr absl::Duration kGenerousDeadline = absl::Minutes(1);

// Calls `done` every `interval` until it returns true (then true) or
// `timeout` has passed (then false).
template <typename Predicate>
bool PollUntil(Predicate&& done, absl::Duration timeout = kGenerousDeadline,
               absl::Duration interval = absl::Milliseconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(interval);
  }
  return true;
}

}  // namespace pdserve::testing
