// Process-level helpers for the thin mains: shutdown signals, the log level
// flag and the drain wait. Abseil only (common/ready_file.h: the ready file).
#pragma once

#include <functional>
#include <string>

#include "absl/time/time.h"

namespace pdserve {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts
// afterwards. Call first thing in main, before any thread exists.
void BlockShutdownSignals();
// Waits until SIGINT or SIGTERM arrives; returns the signal number.
int WaitForShutdownSignal();

// Sets the minimum log level from a --log_level value. False (with a message
// on stderr) for an unknown level.
bool SetLogLevelFlag(const std::string& name);

// Drain: polls `idle` every 20 ms until it holds or `timeout` has passed.
// Returns the last answer of `idle`.
bool WaitUntilIdle(absl::Duration timeout, const std::function<bool()>& idle);

}  // namespace pdserve
