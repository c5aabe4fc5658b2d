// NCCL for project code: the real nccl.h, or gpu_emulation's loopback
// emulation in PDSERVE_GPU_EMULATION builds; and NCCL results as
// absl::Status:
//   ncclSystemError, ncclRemoteError -> UNAVAILABLE (the peer or the network)
//   ncclInProgress                   -> FAILED_PRECONDITION (not ready yet)
//   anything else                    -> INTERNAL
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#if defined(PDSERVE_GPU_EMULATION)
#include "gpu_emulation/nccl.h"
#else
#include <nccl.h>
#endif

namespace pdserve::cuda {

inline absl::Status NcclStatus(ncclResult_t result, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result));
  switch (result) {
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    case ncclInProgress:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace pdserve::cuda
