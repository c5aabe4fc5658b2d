// Process-level helpers for the thin mains: shutdown signals and the ready
// file through which launchers and tests learn the ports a process bound.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"

namespace pdserve {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts
// afterwards. Call first thing in main, before any thread exists.
void BlockShutdownSignals();
// Waits until SIGINT or SIGTERM arrives; returns the signal number.
int WaitForShutdownSignal();

// Writes `fields` as a JSON object to `path` atomically (temp file + rename).
absl::Status WriteReadyFile(const std::string& path, const std::map<std::string, std::string>& fields);

}  // namespace pdserve
