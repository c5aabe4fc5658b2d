// Process-level helpers for the thin mains: shutdown signals and the ready
// file through which launchers and tests learn the ports a process bound.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pdserve {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts
// afterwards. Call first thing in main, before any thread exists.
void BlockShutdownSignals();
// Waits until SIGINT or SIGTERM arrives; returns the signal number.
int WaitForShutdownSignal();

// Writes `fields` as a JSON object to `path` atomically (temp file + rename).
absl::Status WriteReadyFile(const std::string& path,
                            const std::map<std::string, std::string>& fields);

// The ready file of a serving process: grpc_address, metrics_port, pid and
// `extra` fields. Does nothing when `path` is empty; a failure is logged.
void AnnounceReady(const std::string& path, const std::string& grpc_address, int metrics_port,
                   std::map<std::string, std::string> extra = {});

// Sets the minimum log level from a --log_level value. False (with a message
// on stderr) for an unknown level.
bool SetLogLevelFlag(const std::string& name);

// Drain: polls `idle` every 20 ms until it holds or `timeout` has passed.
// Returns the last answer of `idle`.
bool WaitUntilIdle(absl::Duration timeout, const std::function<bool()>& idle);

}  // namespace pdserve
