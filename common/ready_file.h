// The ready file through which launchers and tests learn the ports a
// serving process bound (every service's --ready_file).
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"

namespace pdserve {

// Writes `fields` as a JSON object to `path` atomically (temp file + rename).
absl::Status WriteReadyFile(const std::string& path,
                            const std::map<std::string, std::string>& fields);

// The ready file of a serving process: grpc_address, metrics_port, pid and
// `extra` fields. Does nothing when `path` is empty; a failure is logged.
void AnnounceReady(const std::string& path, const std::string& grpc_address, int metrics_port,
                   std::map<std::string, std::string> extra = {});

}  // namespace pdserve
