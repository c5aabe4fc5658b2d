// Shared pieces of the device transport; see device_common.h.
#include "kvtransfer/device/device_common.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/cuda/base/cuda_status.h"

namespace pdserve::kvtransfer::device {
namespace {

constexpr absl::string_view kScheme = "nccl://";
// How often a pending communicator is polled.
constexpr absl::Duration kPollInterval = absl::Microseconds(200);

std::string HostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  if (!id.empty()) return std::string(absl::StripAsciiWhitespace(id));
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// The allocation holding `p` (cudaIpcGetMemHandle wants its base).
absl::Status AllocationOf(void* p, void** base) {
#if defined(PDSERVE_GPU_EMULATION)
  size_t size = 0;
  if (!gpuemu::AllocationRange(p, base, &size)) {
    return absl::InvalidArgumentError("kv region is not in a device allocation");
  }
  return absl::OkStatus();
#else
  // cuMemGetAddressRange_v2 through the runtime, without linking the driver.
  using GetRange = int (*)(unsigned long long*, size_t*, unsigned long long);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                                cudaEnableDefault, &found));
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    return absl::UnimplementedError("cuMemGetAddressRange is not available");
  }
  unsigned long long b = 0;
  size_t size = 0;
  if (reinterpret_cast<GetRange>(fn)(&b, &size, reinterpret_cast<unsigned long long>(p)) != 0) {
    return absl::InvalidArgumentError("kv region is not in a device allocation");
  }
  *base = reinterpret_cast<void*>(b);
  return absl::OkStatus();
#endif
}

absl::Status Export(std::byte* p, std::string* handle, int64_t* offset) {
  void* base = nullptr;
  if (absl::Status s = AllocationOf(p, &base); !s.ok()) return s;
  cudaIpcMemHandle_t h;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, base));
  handle->assign(h.reserved, sizeof h.reserved);
  *offset = p - static_cast<std::byte*>(base);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<internal::v1::KvDevice> CheckSetup(std::span<const engine::KvRegion> regions,
                                                  const DeviceTransportOptions& options) {
  for (const engine::KvRegion& r : regions) {
    if (r.memory != engine::MemoryKind::kDevice) {
      return absl::InvalidArgumentError(
          "the nccl kv transport needs KV regions in device memory (this backend keeps them in "
          "host memory: use --kv_transport=tcp)");
    }
  }
  if (options.max_chunk_bytes == 0 || options.stall_timeout <= absl::ZeroDuration() ||
      options.watchdog_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("bad DeviceTransportOptions");
  }
  return LocalDevice(options.device);
}

absl::StatusOr<std::string> ControlAddressOf(absl::string_view endpoint) {
  if (!absl::StartsWith(endpoint, kScheme) || endpoint.size() == kScheme.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad kv endpoint '", endpoint, "' (want nccl://host:port)"));
  }
  return std::string(endpoint.substr(kScheme.size()));
}

absl::StatusOr<internal::v1::KvDevice> LocalDevice(int device) {
  char bus[64] = {};
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
  internal::v1::KvDevice out;
  out.set_host_id(HostId());
  out.set_pci_bus_id(absl::AsciiStrToLower(bus));
  out.set_pid(getpid());
  return out;
}

bool SameDevice(const internal::v1::KvDevice& a, const internal::v1::KvDevice& b) {
  return !a.host_id().empty() && a.host_id() == b.host_id() && a.pci_bus_id() == b.pci_bus_id();
}

absl::StatusOr<std::vector<internal::v1::KvIpcRegion>> ExportRegions(
    std::span<const engine::KvRegion> regions) {
  std::vector<internal::v1::KvIpcRegion> out;
  for (const engine::KvRegion& r : regions) {
    if (r.memory != engine::MemoryKind::kDevice) {
      return absl::InvalidArgumentError("kv regions in host memory cannot be shared with IPC");
    }
    internal::v1::KvIpcRegion e;
    int64_t k_offset = 0, v_offset = 0;
    // Without an exportable handle the region still serves a receiver in
    // this process, by address.
    if (Export(r.k_base, e.mutable_k_handle(), &k_offset).ok() &&
        Export(r.v_base, e.mutable_v_handle(), &v_offset).ok()) {
      e.set_k_offset(k_offset);
      e.set_v_offset(v_offset);
    } else {
      e.clear_k_handle();
      e.clear_v_handle();
      cudaGetLastError();  // the failed export is not the device's error
    }
    e.set_k_address(reinterpret_cast<uintptr_t>(r.k_base));
    e.set_v_address(reinterpret_cast<uintptr_t>(r.v_base));
    e.set_block_stride_bytes(r.block_stride_bytes);
    e.set_num_blocks(r.num_blocks);
    e.set_block_size(r.block_size);
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ImportedRegions>> ImportedRegions::Open(
    const google::protobuf::RepeatedPtrField<internal::v1::KvIpcRegion>& regions,
    bool same_process) {
  std::unique_ptr<ImportedRegions> out(new ImportedRegions());
  for (const internal::v1::KvIpcRegion& r : regions) {
    out->block_stride_.push_back(r.block_stride_bytes());
    out->block_size_.push_back(r.block_size());
    if (r.block_size() <= 0 || r.block_stride_bytes() <= 0) {
      return absl::InvalidArgumentError("the sender's KV regions have no blocks");
    }
    if (same_process) {
      out->k_.push_back(reinterpret_cast<std::byte*>(r.k_address()));
      out->v_.push_back(reinterpret_cast<std::byte*>(r.v_address()));
      continue;
    }
    for (const auto& [handle, offset, bases] :
         {std::tuple{&r.k_handle(), r.k_offset(), &out->k_},
          std::tuple{&r.v_handle(), r.v_offset(), &out->v_}}) {
      cudaIpcMemHandle_t h;
      if (handle->size() != sizeof h.reserved) {
        return absl::FailedPreconditionError("the sender exported no IPC handle for its KV");
      }
      handle->copy(h.reserved, sizeof h.reserved);
      void* mapped = nullptr;
      PDSERVE_CUDA_RETURN_IF_ERROR(
          cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess));
      out->opened_.push_back(mapped);
      bases->push_back(static_cast<std::byte*>(mapped) + offset);
    }
  }
  return out;
}

ImportedRegions::~ImportedRegions() {
  for (void* p : opened_) cudaIpcCloseMemHandle(p);
}

absl::Status AwaitComm(ncclComm_t comm, ncclResult_t issued, absl::string_view what,
                       absl::Time deadline) {
  ncclResult_t state = issued;
  while (state == ncclInProgress) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": NCCL still in progress"));
    }
    absl::SleepFor(kPollInterval);
    if (ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) state = r;
  }
  if (state == ncclSuccess) return absl::OkStatus();
  return cuda::NcclStatus(state, absl::StrCat(what, " (", ncclGetLastError(comm), ")"));
}

absl::StatusOr<ncclComm_t> InitComm(const ncclUniqueId& id, int rank, absl::Time deadline) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t issued = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
  if (issued != ncclSuccess && issued != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return cuda::NcclStatus(issued, "ncclCommInitRankConfig");
  }
  if (absl::Status s = AwaitComm(comm, issued, "NCCL communicator init", deadline); !s.ok()) {
    ncclCommAbort(comm);
    return s;
  }
  return comm;
}

// ---- DeviceBufferPool ----

DeviceBufferPool::~DeviceBufferPool() {
  for (auto& [p, bytes] : free_) cudaFree(p);
}

absl::StatusOr<std::byte*> DeviceBufferPool::Take(size_t bytes) {
  {
    absl::MutexLock l(&mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes) {
        std::byte* p = it->first;
        free_.erase(it);
        return p;
      }
    }
  }
  std::byte* p = nullptr;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
  return p;
}

void DeviceBufferPool::Give(std::byte* p, size_t bytes) {
  absl::MutexLock l(&mu_);
  free_.emplace_back(p, bytes);
}

// ---- OpQueue ----

absl::StatusOr<std::unique_ptr<OpQueue>> OpQueue::Create(int device) {
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<OpQueue>(new OpQueue(device, stream));
}

OpQueue::OpQueue(int device, cudaStream_t stream)
    : device_(device), stream_(stream), thread_([this] { Run(); }) {}

OpQueue::~OpQueue() {
  Close();
  thread_.join();
  cudaStreamDestroy(stream_);
}

absl::Status OpQueue::Push(std::function<void(absl::Status)> done) {
  cudaEvent_t event = nullptr;
  PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  if (const cudaError_t e = cudaEventRecord(event, stream_); e != cudaSuccess) {
    cudaEventDestroy(event);
    return cuda::CudaStatus(e, "cudaEventRecord");
  }
  absl::MutexLock l(&mu_);
  if (closed_) {
    cudaEventDestroy(event);
    return absl::FailedPreconditionError("device operation queue closed");
  }
  if (ops_.empty()) head_since_ = absl::Now();
  ops_.push_back({event, std::move(done)});
  return absl::OkStatus();
}

absl::Duration OpQueue::OldestWait(absl::Time now) {
  absl::MutexLock l(&mu_);
  return ops_.empty() ? absl::ZeroDuration() : now - head_since_;
}

void OpQueue::Close() {
  absl::MutexLock l(&mu_);
  closed_ = true;
}

void OpQueue::Run() {
  cudaSetDevice(device_);
  while (true) {
    cudaEvent_t event;
    {
      absl::MutexLock l(&mu_);
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || !ops_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (ops_.empty()) return;
      event = ops_.front().event;
    }
    // Returns once the work before the event ran (an aborted NCCL operation
    // completes too, so this never waits past the watchdog).
    const absl::Status status = cuda::CudaStatus(cudaEventSynchronize(event), "kv transfer stream");
    cudaEventDestroy(event);
    std::function<void(absl::Status)> done;
    {
      absl::MutexLock l(&mu_);
      done = std::move(ops_.front().done);
      ops_.pop_front();
      head_since_ = absl::Now();
    }
    done(status);
  }
}

}  // namespace pdserve::kvtransfer::device
