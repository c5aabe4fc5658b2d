// Pieces shared by both ends of the device transport (device_sender.h,
// device_receiver.h): options, endpoints, which GPU a process is on, CUDA
// IPC export of KV regions, an ordered queue of device operations completed
// by a thread of its own (what the watchdog measures), and an ordered writer
// of control messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/cuda/base/cuda_compat.h"
#include "engine/cuda/base/nccl_compat.h"
#include "engine/runtime/model_runner.h"
#include "pdserve/internal/v1/kv_transfer.pb.h"

namespace pdserve::kvtransfer::device {

struct DeviceTransportOptions {
  int device = 0;  // CUDA device ordinal of the KV regions
  // Largest NCCL message; a bigger chunk is sent as several. The receiver
  // stages one message at a time.
  size_t max_chunk_bytes = size_t{16} << 20;
  // Receivers refuse senders asking for more staging than this.
  size_t max_staging_bytes = size_t{256} << 20;
  // A data-plane operation that makes no progress for this long (a peer
  // that never posts its receive, a dead link) fails its pair: the
  // communicator is aborted and only the transfers on it fail.
  absl::Duration stall_timeout = absl::Seconds(30);
  // How often the watchdog checks communicators, stalls and deadlines.
  absl::Duration watchdog_interval = absl::Milliseconds(20);
  // Pair set-up: control stream, Welcome, communicator init on both ranks.
  absl::Duration connect_timeout = absl::Seconds(30);
  // After Abort, how long the sender waits for the receiver to stop reading
  // before it fails the whole pair.
  absl::Duration abort_grace = absl::Seconds(2);
  // Pairs on one GPU copy through CUDA IPC (NCCL before 2.30 refuses two
  // ranks on one device). False forces NCCL.
  bool allow_ipc = true;
};

// INVALID_ARGUMENT for regions outside device memory or bad options;
// otherwise this process's device (LocalDevice).
absl::StatusOr<internal::v1::KvDevice> CheckSetup(std::span<const engine::KvRegion> regions,
                                                  const DeviceTransportOptions& options);

// "nccl://host:port" -> "host:port" (the receiver's gRPC control address).
absl::StatusOr<std::string> ControlAddressOf(absl::string_view endpoint);

// The GPU this process computes on: the host (its boot id), the device's
// PCI bus id and this process's id.
absl::StatusOr<internal::v1::KvDevice> LocalDevice(int device);
// NCCL's test for two ranks on one GPU.
bool SameDevice(const internal::v1::KvDevice& a, const internal::v1::KvDevice& b);

// `regions` as the sender announces them for CUDA IPC (handles of the
// allocations holding them, offsets, and the addresses for a receiver in
// the same process).
absl::StatusOr<std::vector<internal::v1::KvIpcRegion>> ExportRegions(
    std::span<const engine::KvRegion> regions);

// A sender's regions as a receiver reaches them: in the same process by
// address, else through opened IPC handles (closed by the destructor).
class ImportedRegions {
 public:
  static absl::StatusOr<std::unique_ptr<ImportedRegions>> Open(
      const google::protobuf::RepeatedPtrField<internal::v1::KvIpcRegion>& regions,
      bool same_process);
  ~ImportedRegions();
  // K and V bases of `layer` in this process.
  std::byte* k(int layer) const { return k_[layer]; }
  std::byte* v(int layer) const { return v_[layer]; }
  int64_t block_stride(int layer) const { return block_stride_[layer]; }
  int block_size(int layer) const { return block_size_[layer]; }
  int num_layers() const { return static_cast<int>(k_.size()); }

 private:
  ImportedRegions() = default;
  std::vector<std::byte*> k_, v_;
  std::vector<int64_t> block_stride_;
  std::vector<int> block_size_;
  std::vector<void*> opened_;  // cudaIpcOpenMemHandle mappings
};

// A non-blocking NCCL communicator of two ranks: init, then poll until it is
// ready (or failed, or `deadline`). Aborts it on failure.
absl::StatusOr<ncclComm_t> InitComm(const ncclUniqueId& id, int rank, absl::Time deadline);
// Waits out ncclInProgress after an operation on a non-blocking
// communicator (NCCL may answer any call with it).
absl::Status AwaitComm(ncclComm_t comm, ncclResult_t issued, absl::string_view what,
                       absl::Time deadline);

// Device buffers kept for reuse. cudaFree synchronises the whole device, so
// freeing a pair's staging while another pair's stream waits on a stuck
// peer would hang until the watchdog (possibly the caller) unblocks it: the
// transports give buffers back here instead and free them all at the end,
// once no stream can be stuck. Thread-safe.
class DeviceBufferPool {
 public:
  DeviceBufferPool() = default;
  ~DeviceBufferPool();
  DeviceBufferPool(const DeviceBufferPool&) = delete;
  DeviceBufferPool& operator=(const DeviceBufferPool&) = delete;

  // A buffer of at least `bytes` (reused, or from cudaMalloc).
  absl::StatusOr<std::byte*> Take(size_t bytes);
  void Give(std::byte* p, size_t bytes);

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::byte*, size_t>> free_ ABSL_GUARDED_BY(mu_);
};

// A CUDA stream (non-blocking) and the operations enqueued on it, completed
// in enqueue order by a thread of its own: Push() records an event after the
// work enqueued so far, and its callback runs on that thread once the event
// completed (with the stream's error, if any). OldestWait() tells the
// watchdog how long the oldest unfinished operation has been at the head of
// the queue. Thread-safe.
class OpQueue {
 public:
  static absl::StatusOr<std::unique_ptr<OpQueue>> Create(int device);
  ~OpQueue();  // Close(), then waits for the thread (and so for every operation)

  cudaStream_t stream() const { return stream_; }
  // FAILED_PRECONDITION after Close().
  absl::Status Push(std::function<void(absl::Status)> done);
  absl::Duration OldestWait(absl::Time now);
  // No more Push; the thread ends once the queue is empty.
  void Close();

 private:
  struct Op {
    cudaEvent_t event;
    std::function<void(absl::Status)> done;
  };
  OpQueue(int device, cudaStream_t stream);
  void Run();

  const int device_;
  const cudaStream_t stream_;
  absl::Mutex mu_;
  std::deque<Op> ops_ ABSL_GUARDED_BY(mu_);
  absl::Time head_since_ ABSL_GUARDED_BY(mu_);  // when ops_.front() became the head
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last
};

// Writes messages in Push order from a thread of its own, so that callers
// (the engine thread among them) never wait on the network. After a failed
// write it drops everything. Thread-safe.
template <typename Message>
class OrderedWriter {
 public:
  explicit OrderedWriter(std::function<bool(const Message&)> write)
      : write_(std::move(write)), thread_([this] { Run(); }) {}
  ~OrderedWriter() {
    Close();
    thread_.join();
  }
  void Push(Message m) {
    absl::MutexLock l(&mu_);
    if (!closed_) queue_.push_back(std::move(m));
  }
  // Writes what is queued, then stops.
  void Close() {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }

 private:
  void Run() {
    bool healthy = true;
    while (true) {
      Message m;
      {
        absl::MutexLock l(&mu_);
        const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return closed_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        m = std::move(queue_.front());
        queue_.pop_front();
      }
      if (healthy) healthy = write_(m);
    }
  }

  const std::function<bool(const Message&)> write_;
  absl::Mutex mu_;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last
};

}  // namespace pdserve::kvtransfer::device
