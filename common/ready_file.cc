// The ready file: see ready_file.h.
#include "common/ready_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "nlohmann/json.hpp"

namespace pdserve {

absl::Status WriteReadyFile(const std::string& path,
                            const std::map<std::string, std::string>& fields) {
  nlohmann::json j(fields);
  std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    out << j.dump() << "\n";
    if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

void AnnounceReady(const std::string& path, const std::string& grpc_address, int metrics_port,
                   std::map<std::string, std::string> extra) {
  if (path.empty()) return;
  extra["grpc_address"] = grpc_address;
  extra["metrics_port"] = absl::StrCat(metrics_port);
  extra["pid"] = absl::StrCat(getpid());
  if (absl::Status s = WriteReadyFile(path, extra); !s.ok()) PDSERVE_LOG(ERROR) << s;
}

}  // namespace pdserve
