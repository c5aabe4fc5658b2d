// The prefill side of the device transport; see device_sender.h.
//
// A transfer's life on its pair (all under the pair's mutex):
//   Begin    registers it and sends its handshake (KvTransferHeader);
//   Send     per chunk: (nccl) wait for the layer's event, gather, ncclSend,
//            an operation on the queue, the chunk announced; (ipc) wait for
//            the event, an operation whose completion announces the chunk;
//   Finish   sends the first token; `done` runs once no operation of the
//            transfer is pending and the receiver's final Ack came (or the
//            transfer failed);
//   Abort    sends the reason; returns once the same holds.
// The receiver's Acks arrive on the reader thread: a refused handshake or a
// failed transfer makes later Sends fail fast; operations already announced
// still run (the receiver posts their receives into scratch), so the two
// sides never disagree on the order.
#include "kvtransfer/device/device_sender.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/grpc_util.h"
#include "engine/cuda/base/cuda_status.h"
#include "kvtransfer/device/kv_copy.cuh"
#include "kvtransfer/handshake.h"
#include "kvtransfer/kv_blocks.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve::kvtransfer::device {

using internal::v1::KvPairRequest;
using internal::v1::KvPairResponse;

// One transfer on a pair. Fields are guarded by the pair's mutex.
struct SendTransfer {
  TransferId id = 0;
  TransferSpec spec;
  std::vector<int> next_token;  // per layer: tokens queued so far
  int pending = 0;              // operations on the queue not yet completed
  absl::Status failure;         // refusal, abort, pair failure; OK while healthy
  bool abort_requested = false;
  bool finish_requested = false;
  std::function<void(absl::Status)> done;
  bool handshake_acked = false;  // the receiver answered the handshake
  bool receiver_done = false;    // the receiver's final Ack came
  absl::Status receiver_status;
  bool completed = false;  // done has been (or is being) called
};

class SenderPair {
 public:
  SenderPair(std::string endpoint, std::span<const engine::KvRegion> regions,
             const DeviceTransportOptions& options, internal::v1::KvDevice local,
             DeviceBufferPool* buffers)
      : endpoint_(std::move(endpoint)),
        regions_(regions),
        options_(options),
        local_(std::move(local)),
        buffers_(buffers) {}
  ~SenderPair() { Join(); }

  // Control stream, Welcome, communicator; once, before any other call.
  absl::Status Connect();
  std::string data_plane() {
    absl::MutexLock l(&mu_);
    return data_plane_;
  }
  absl::Status failure() {
    absl::MutexLock l(&mu_);
    return failure_;
  }

  absl::StatusOr<std::shared_ptr<SendTransfer>> Begin(TransferId id, const TransferSpec& spec);
  absl::Status Send(const std::shared_ptr<SendTransfer>& t, const LayerChunk& chunk);
  void Finish(const std::shared_ptr<SendTransfer>& t, int32_t first_token,
              std::function<void(absl::Status)> done);
  void Abort(const std::shared_ptr<SendTransfer>& t, const absl::Status& why);

  // Watchdog: the communicator's error, or an operation stalled too long.
  void Check(absl::Time now);
  // Fails the pair and every transfer on it (each completes once its
  // operations drained); the first reason wins. Idempotent.
  void Fail(const absl::Status& why);
  // Cancels the stream and waits for the pair's threads. After Fail.
  void Join();

 private:
  void ReadLoop();
  void OnAck(const KvPairResponse::Ack& ack);
  // One operation of `t` finished with `status`.
  void OnOpDone(const std::shared_ptr<SendTransfer>& t, const absl::Status& status);
  // If `t` is finished, marks it completed and returns the call of its
  // `done` (to run without the lock); else an empty function.
  std::function<void()> TakeCompletionLocked(SendTransfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Write(KvPairRequest m) { writer_->Push(std::move(m)); }
  std::string Where(TransferId id) const {
    return absl::StrCat("kv transfer ", id, " to ", endpoint_);
  }
  // Enqueues one chunk's operation; `event` (may be null) orders it after
  // the layer's compute.
  absl::Status EnqueueChunk(const std::shared_ptr<SendTransfer>& t, const LayerChunk& chunk,
                            int begin, int count, bool wait_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string endpoint_;
  const std::span<const engine::KvRegion> regions_;
  const DeviceTransportOptions options_;
  const internal::v1::KvDevice local_;
  DeviceBufferPool* const buffers_;  // where the staging comes from and goes back

  // Set up by Connect(), before any other thread exists; const afterwards.
  std::unique_ptr<internal::v1::KvControl::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<KvPairRequest, KvPairResponse>> stream_;
  std::unique_ptr<OrderedWriter<KvPairRequest>> writer_;
  std::unique_ptr<OpQueue> ops_;
  std::thread reader_;

  absl::Mutex mu_;
  bool welcomed_ ABSL_GUARDED_BY(mu_) = false;
  std::string data_plane_ ABSL_GUARDED_BY(mu_);
  bool comm_answered_ ABSL_GUARDED_BY(mu_) = false;  // the receiver's CommReady came
  absl::Status comm_status_ ABSL_GUARDED_BY(mu_);
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::byte* staging_ ABSL_GUARDED_BY(mu_) = nullptr;  // nccl: one message's rows
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::map<TransferId, std::shared_ptr<SendTransfer>> transfers_ ABSL_GUARDED_BY(mu_);
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status SenderPair::Connect() {
  absl::StatusOr<std::string> address = ControlAddressOf(endpoint_);
  if (!address.ok()) return address.status();
  absl::StatusOr<std::unique_ptr<OpQueue>> ops = OpQueue::Create(options_.device);
  if (!ops.ok()) return ops.status();
  ops_ = std::move(*ops);
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  stub_ = internal::v1::KvControl::NewStub(MakeChannel(*address));
  stream_ = stub_->Pair(&context_);
  writer_ = std::make_unique<OrderedWriter<KvPairRequest>>(
      [this](const KvPairRequest& m) { return stream_->Write(m); });
  reader_ = std::thread([this] { ReadLoop(); });

  KvPairRequest hello;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  hello.mutable_hello()->set_sender(absl::StrCat(host, ":", getpid()));
  *hello.mutable_hello()->mutable_device() = local_;
  hello.mutable_hello()->set_max_chunk_bytes(options_.max_chunk_bytes);
  if (options_.allow_ipc) {
    absl::StatusOr<std::vector<internal::v1::KvIpcRegion>> exported = ExportRegions(regions_);
    if (exported.ok()) {
      for (auto& r : *exported) *hello.mutable_hello()->add_regions() = std::move(r);
    }
  }
  Write(std::move(hello));

  const auto where = [this](absl::string_view what) {
    return absl::StrCat("kv pair to ", endpoint_, ": ", what);
  };
  {
    absl::MutexLock l(&mu_);
    const auto welcomed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return welcomed_ || !failure_.ok();
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&welcomed), deadline)) {
      return absl::DeadlineExceededError(where("no answer to Hello"));
    }
    if (!failure_.ok()) return failure_;
    if (data_plane_ == "ipc") return absl::OkStatus();
    if (data_plane_ != "nccl") {
      return absl::FailedPreconditionError(
          where(absl::StrCat("unknown data plane '", data_plane_, "'")));
    }
  }
  ncclUniqueId id;
  if (absl::Status s = cuda::NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) {
    return s;
  }
  KvPairRequest init;
  init.mutable_comm_init()->set_nccl_unique_id(std::string(id.internal, sizeof id.internal));
  Write(std::move(init));
  absl::StatusOr<ncclComm_t> comm = InitComm(id, /*rank=*/0, deadline);
  if (!comm.ok()) return comm.status();
  absl::StatusOr<std::byte*> staging = buffers_->Take(options_.max_chunk_bytes);
  if (!staging.ok()) {
    ncclCommAbort(*comm);
    return staging.status();
  }
  absl::MutexLock l(&mu_);
  comm_ = *comm;
  staging_ = *staging;
  const auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return comm_answered_ || !failure_.ok();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&answered), deadline)) {
    return absl::DeadlineExceededError(where("the receiver's communicator is not ready"));
  }
  if (!failure_.ok()) return failure_;
  return comm_status_;
}

void SenderPair::ReadLoop() {
  KvPairResponse m;
  while (stream_->Read(&m)) {
    switch (m.msg_case()) {
      case KvPairResponse::kWelcome: {
        absl::MutexLock l(&mu_);
        welcomed_ = true;
        data_plane_ = m.welcome().data_plane();
        break;
      }
      case KvPairResponse::kCommReady: {
        absl::MutexLock l(&mu_);
        comm_answered_ = true;
        comm_status_ = m.comm_ready().ok()
                           ? absl::OkStatus()
                           : absl::UnavailableError(absl::StrCat("kv receiver ", endpoint_, ": ",
                                                                 m.comm_ready().error()));
        break;
      }
      case KvPairResponse::kAck:
        OnAck(m.ack());
        break;
      case KvPairResponse::MSG_NOT_SET:
        break;
    }
  }
  const grpc::Status finished = stream_->Finish();
  Fail(absl::UnavailableError(
      absl::StrCat("kv control stream to ", endpoint_, " closed: ", finished.error_message())));
}

void SenderPair::OnAck(const KvPairResponse::Ack& ack) {
  std::function<void()> complete;
  {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(ack.transfer_id());
    if (it == transfers_.end()) return;
    SendTransfer& t = *it->second;
    if (!ack.done()) {
      // The handshake's answer, or (after it) the receiver failing the transfer early.
      if (!ack.ok() && t.failure.ok()) {
        t.failure =
            t.handshake_acked
                ? absl::AbortedError(absl::StrCat("kv receiver ", endpoint_, " failed transfer ",
                                                  t.id, ": ", ack.error()))
                : absl::FailedPreconditionError(absl::StrCat(
                      "kv receiver ", endpoint_, " refused transfer ", t.id, ": ", ack.error()));
      }
      t.handshake_acked = true;
      return;
    }
    t.receiver_done = true;
    t.receiver_status =
        ack.ok() ? absl::OkStatus()
                 : absl::AbortedError(absl::StrCat("kv receiver ", endpoint_, " failed transfer ",
                                                   t.id, ": ", ack.error()));
    if (!ack.ok() && t.failure.ok()) t.failure = t.receiver_status;
    complete = TakeCompletionLocked(t);
  }
  if (complete) complete();
}

std::function<void()> SenderPair::TakeCompletionLocked(SendTransfer& t) {
  if (t.completed || t.pending > 0 || !t.finish_requested) return {};
  const bool ipc = data_plane_ == "ipc";
  // The receiver's final Ack says it reads (ipc) and expects nothing more;
  // without it only a failure ends the transfer.
  if (!t.receiver_done && (t.failure.ok() || (ipc && failure_.ok()))) return {};
  t.completed = true;
  transfers_.erase(t.id);
  absl::Status result = !t.failure.ok() ? t.failure : t.receiver_status;
  return [done = std::move(t.done), result = std::move(result)] {
    if (done) done(result);
  };
}

absl::StatusOr<std::shared_ptr<SendTransfer>> SenderPair::Begin(TransferId id,
                                                                const TransferSpec& spec) {
  auto t = std::make_shared<SendTransfer>();
  t->id = id;
  t->spec = spec;
  t->next_token.assign(spec.num_layers, 0);
  absl::MutexLock l(&mu_);
  if (!failure_.ok()) return failure_;
  if (!transfers_.emplace(id, t).second) {
    return absl::AlreadyExistsError(absl::StrCat(Where(id), ": already in flight"));
  }
  KvPairRequest begin;
  *begin.mutable_begin() = MakeHeader(id, spec);
  Write(std::move(begin));
  return t;
}

absl::Status SenderPair::EnqueueChunk(const std::shared_ptr<SendTransfer>& t,
                                      const LayerChunk& chunk, int begin, int count,
                                      bool wait_event) {
  const engine::KvRegion& region = regions_[chunk.layer];
  const int64_t row = region.token_bytes();
  if (wait_event && chunk.ready_event != nullptr) {
    PDSERVE_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(ops_->stream(), static_cast<cudaEvent_t>(chunk.ready_event), 0));
  }
  KvPairRequest m;
  KvPairRequest::Chunk* c = m.mutable_chunk();
  c->set_transfer_id(t->id);
  c->set_layer(chunk.layer);
  c->set_token_begin(begin);
  c->set_num_tokens(count);
  c->set_bytes(static_cast<uint64_t>(2 * row * count));
  const bool nccl = data_plane_ == "nccl";
  if (nccl) {
    const KvRows source{.k = region.k_base,
                        .v = region.v_base,
                        .block_stride = region.block_stride_bytes,
                        .block_size = region.block_size,
                        .blocks = chunk.block_table,
                        .first_token = begin};
    const KvRows staged{.k = staging_, .v = staging_ + row * count};
    PDSERVE_CUDA_RETURN_IF_ERROR(CopyKvRows(source, staged, count, row, ops_->stream()));
    const ncclResult_t sent =
        ncclSend(staging_, c->bytes(), ncclUint8, /*peer=*/1, comm_, ops_->stream());
    if (absl::Status s = AwaitComm(comm_, sent, Where(t->id) + ": ncclSend",
                                   absl::Now() + options_.stall_timeout);
        !s.ok()) {
      return s;
    }
  } else {
    const std::span<const int32_t> blocks =
        BlocksCovering(chunk.block_table, region.block_size, begin, count);
    c->mutable_source_blocks()->Assign(blocks.begin(), blocks.end());
    c->set_source_first_slot(begin % region.block_size);
  }
  // nccl: announced now, in enqueue order (the receiver posts the receive);
  // ipc: announced once the layer is computed, by the completion.
  std::shared_ptr<KvPairRequest> announce;
  if (nccl) {
    Write(m);
  } else {
    announce = std::make_shared<KvPairRequest>(std::move(m));
  }
  if (absl::Status s = ops_->Push([this, t, announce](absl::Status status) {
        if (announce != nullptr && status.ok()) Write(std::move(*announce));
        OnOpDone(t, status);
      });
      !s.ok()) {
    return s;
  }
  ++t->pending;
  return absl::OkStatus();
}

absl::Status SenderPair::Send(const std::shared_ptr<SendTransfer>& t, const LayerChunk& chunk) {
  const TransferSpec& spec = t->spec;
  const int end = chunk.token_begin + chunk.num_tokens;
  if (chunk.layer < 0 || chunk.layer >= spec.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(Where(t->id), ": layer ", chunk.layer,
                                                   " out of range [0, ", spec.num_layers, ")"));
  }
  if (chunk.num_tokens <= 0 || chunk.token_begin < 0 || end > spec.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(Where(t->id), ": layer ", chunk.layer,
                                                   " tokens [", chunk.token_begin, ", ", end,
                                                   ") outside [0, ", spec.num_tokens, ")"));
  }
  if (absl::Status s = CheckBlockTable(regions_[chunk.layer], chunk.block_table, end); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(t->id), ": layer ", chunk.layer, ": ", s.message()));
  }
  cudaSetDevice(options_.device);
  absl::Status failed;
  {
    absl::MutexLock l(&mu_);
    if (!t->failure.ok()) return t->failure;
    if (!failure_.ok()) return failure_;
    if (t->finish_requested || t->abort_requested) {
      return absl::FailedPreconditionError(absl::StrCat(Where(t->id), ": SendLayer after Finish"));
    }
    if (t->next_token[chunk.layer] == spec.num_tokens) {
      return absl::AlreadyExistsError(
          absl::StrCat(Where(t->id), ": layer ", chunk.layer, " already sent"));
    }
    if (chunk.token_begin != t->next_token[chunk.layer]) {
      return absl::InvalidArgumentError(absl::StrCat(Where(t->id), ": layer ", chunk.layer,
                                                     " chunk starts at token ", chunk.token_begin,
                                                     ", expected ", t->next_token[chunk.layer]));
    }
    t->next_token[chunk.layer] = end;
    // NCCL messages of at most max_chunk_bytes.
    const int per_message =
        std::max<int>(1, static_cast<int>(options_.max_chunk_bytes / (2 * spec.TokenBytes())));
    for (int begin = chunk.token_begin; begin < end && failed.ok(); begin += per_message) {
      failed = EnqueueChunk(t, chunk, begin, std::min(per_message, end - begin),
                            begin == chunk.token_begin);
    }
  }
  if (!failed.ok()) {
    // The stream may now hold half a chunk: the order is lost, and with it the pair.
    Fail(failed);
    return failed;
  }
  return absl::OkStatus();
}

void SenderPair::OnOpDone(const std::shared_ptr<SendTransfer>& t, const absl::Status& status) {
  if (!status.ok()) Fail(status);
  std::function<void()> complete;
  {
    absl::MutexLock l(&mu_);
    --t->pending;
    complete = TakeCompletionLocked(*t);
  }
  if (complete) complete();
}

void SenderPair::Finish(const std::shared_ptr<SendTransfer>& t, int32_t first_token,
                        std::function<void(absl::Status)> done) {
  std::function<void()> complete;
  absl::Status inline_status;
  {
    absl::MutexLock l(&mu_);
    if (t->finish_requested) {
      inline_status =
          absl::FailedPreconditionError(absl::StrCat(Where(t->id), ": Finish called twice"));
    } else {
      t->finish_requested = true;
      t->done = std::move(done);
      if (t->failure.ok()) {
        KvPairRequest m;
        m.mutable_finish()->set_transfer_id(t->id);
        m.mutable_finish()->set_first_token(first_token);
        Write(std::move(m));
      }
      complete = TakeCompletionLocked(*t);
    }
  }
  if (!inline_status.ok()) {
    if (done) done(inline_status);
    return;
  }
  if (complete) complete();
}

void SenderPair::Abort(const std::shared_ptr<SendTransfer>& t, const absl::Status& why) {
  {
    absl::MutexLock l(&mu_);
    if (t->completed || t->abort_requested) return;
    t->abort_requested = true;
    if (t->failure.ok()) {
      t->failure = why.ok()
                       ? absl::CancelledError(absl::StrCat(Where(t->id), ": aborted by the sender"))
                       : why;
    }
    KvPairRequest m;
    m.mutable_abort()->set_transfer_id(t->id);
    m.mutable_abort()->set_reason(std::string(t->failure.message()));
    Write(std::move(m));
    // Finish may follow: `done` must still run, so the transfer stays.
    const bool ipc = data_plane_ == "ipc";
    const auto released = [this, &t, ipc]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return t->pending == 0 && (!ipc || t->receiver_done || !failure_.ok());
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&released), options_.abort_grace)) return;
  }
  // The receiver did not let go in time: give up the pair (its operations
  // then drain, and this returns once they have).
  Fail(absl::DeadlineExceededError(absl::StrCat(Where(t->id), ": the receiver did not stop within ",
                                                absl::FormatDuration(options_.abort_grace),
                                                " of an abort")));
  absl::MutexLock l(&mu_);
  const auto drained = [&t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return t->pending == 0; };
  mu_.Await(absl::Condition(&drained));
}

void SenderPair::Check(absl::Time now) {
  absl::Status comm_error;
  {
    // Under the lock: Fail frees the communicator.
    absl::MutexLock l(&mu_);
    if (!failure_.ok()) return;
    ncclResult_t state = ncclSuccess;
    if (comm_ != nullptr && ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
        state != ncclSuccess && state != ncclInProgress) {
      comm_error = absl::UnavailableError(absl::StrCat(
          "kv pair to ", endpoint_, ": NCCL communicator error: ", ncclGetErrorString(state), " (",
          ncclGetLastError(comm_), ")"));
    }
  }
  if (!comm_error.ok()) {
    Fail(comm_error);
    return;
  }
  const absl::Duration waited = ops_->OldestWait(now);
  if (waited > options_.stall_timeout) {
    Fail(absl::DeadlineExceededError(absl::StrCat(
        "kv pair to ", endpoint_, ": a transfer made no progress for ",
        absl::FormatDuration(waited), " (the receiver never posted its receive, or the link ",
        "is down); communicator aborted")));
  }
}

void SenderPair::Fail(const absl::Status& why) {
  ncclComm_t comm;
  std::vector<std::function<void()>> completions;
  size_t transfers_in_flight = 0;
  {
    absl::MutexLock l(&mu_);
    if (!failure_.ok()) return;
    failure_ = why;
    comm = comm_;
    comm_ = nullptr;
    for (auto& [id, t] : transfers_) {
      if (t->failure.ok()) t->failure = why;
    }
    std::vector<std::shared_ptr<SendTransfer>> all;
    for (auto& [id, t] : transfers_) all.push_back(t);
    transfers_in_flight = all.size();
    for (auto& t : all) {
      if (auto c = TakeCompletionLocked(*t)) completions.push_back(std::move(c));
    }
  }
  // A pair closing with nothing in flight is routine; one that takes
  // transfers down with it is not.
  if (completions.empty() && transfers_in_flight == 0) {
    PDSERVE_LOG(INFO) << "kv pair to " << endpoint_ << " closed: " << why;
  } else {
    PDSERVE_LOG(WARNING) << "kv pair to " << endpoint_ << " failed: " << why;
  }
  // Pending operations complete (without data) once the communicator is
  // gone, so the queue drains and the transfers complete.
  if (comm != nullptr) ncclCommAbort(comm);
  context_.TryCancel();
  for (auto& c : completions) c();
}

void SenderPair::Join() {
  {
    absl::MutexLock l(&mu_);
    if (joined_) return;
    joined_ = true;
  }
  Fail(absl::UnavailableError(absl::StrCat("kv pair to ", endpoint_, " closed")));
  if (reader_.joinable()) reader_.join();
  if (ops_ != nullptr) ops_.reset();  // waits for the queue to drain
  writer_.reset();
  absl::MutexLock l(&mu_);
  if (staging_ != nullptr) buffers_->Give(staging_, options_.max_chunk_bytes);
  staging_ = nullptr;
}

// ---- Sessions ----

namespace {

class DeviceSendSession final : public SendSession {
 public:
  DeviceSendSession(std::shared_ptr<SenderPair> pair, std::shared_ptr<SendTransfer> t)
      : pair_(std::move(pair)), t_(std::move(t)) {}
  ~DeviceSendSession() override {
    if (!finished_) {
      pair_->Abort(t_,
                   absl::CancelledError(absl::StrCat("kv sender dropped the transfer (kv transfer ",
                                                     t_->id, ", no Finish)")));
      pair_->Finish(t_, 0, nullptr);  // lets the transfer complete and leave the pair
    }
  }
  bool OrdersOnDeviceEvents() const override { return true; }
  absl::Status SendLayer(const LayerChunk& chunk) override { return pair_->Send(t_, chunk); }
  void Finish(int32_t first_token, std::function<void(absl::Status)> done) override {
    finished_ = true;
    pair_->Finish(t_, first_token, std::move(done));
  }
  void Abort(const absl::Status& why) override { pair_->Abort(t_, why); }

 private:
  const std::shared_ptr<SenderPair> pair_;
  const std::shared_ptr<SendTransfer> t_;
  bool finished_ = false;
};

}  // namespace

// ---- DeviceKvSender ----

absl::StatusOr<std::unique_ptr<DeviceKvSender>> DeviceKvSender::Create(
    std::span<const engine::KvRegion> regions, DeviceTransportOptions options) {
  absl::StatusOr<internal::v1::KvDevice> device = CheckSetup(regions, options);
  if (!device.ok()) return device.status();
  return std::make_unique<DeviceKvSender>(Private{}, regions, std::move(options),
                                          std::move(*device));
}

DeviceKvSender::DeviceKvSender(Private, std::span<const engine::KvRegion> regions,
                               DeviceTransportOptions options, internal::v1::KvDevice device)
    : regions_(regions),
      options_(std::move(options)),
      device_(std::move(device)),
      watchdog_([this] { Watchdog(); }) {}

DeviceKvSender::~DeviceKvSender() {
  std::vector<std::shared_ptr<SenderPair>> pairs;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    for (auto& [endpoint, pair] : pairs_) pairs.push_back(pair);
    pairs_.clear();
    pairs.insert(pairs.end(), retired_.begin(), retired_.end());
    retired_.clear();
  }
  watchdog_.join();
  for (auto& pair : pairs) pair->Fail(absl::UnavailableError("kv sender shutting down"));
  for (auto& pair : pairs) pair->Join();
}

void DeviceKvSender::Watchdog() {
  while (true) {
    std::vector<std::shared_ptr<SenderPair>> live, dead;
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.watchdog_interval);
      if (stopping_) return;
      for (auto it = pairs_.begin(); it != pairs_.end();) {
        if (it->second->failure().ok()) {
          live.push_back(it->second);
          ++it;
        } else {
          retired_.push_back(it->second);  // the next Open reconnects
          it = pairs_.erase(it);
        }
      }
      dead.swap(retired_);
    }
    const absl::Time now = absl::Now();
    for (auto& pair : live) pair->Check(now);
    for (auto& pair : dead) pair->Join();
  }
}

absl::StatusOr<std::shared_ptr<SenderPair>> DeviceKvSender::PairTo(const std::string& endpoint) {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("kv sender shutting down");
    auto it = pairs_.find(endpoint);
    if (it != pairs_.end() && it->second->failure().ok()) return it->second;
  }
  // Connect outside the lock: several first Opens to one endpoint may each
  // connect; the first to finish is kept.
  auto pair = std::make_shared<SenderPair>(endpoint, regions_, options_, device_, &staging_);
  if (absl::Status s = pair->Connect(); !s.ok()) {
    pair->Fail(s);
    absl::MutexLock l(&mu_);
    retired_.push_back(pair);
    return absl::Status(s.code(), absl::StrCat("kv pair to ", endpoint, ": ", s.message()));
  }
  absl::MutexLock l(&mu_);
  auto [it, inserted] = pairs_.emplace(endpoint, pair);
  if (!inserted) {
    if (it->second->failure().ok()) {
      retired_.push_back(pair);
      return it->second;
    }
    retired_.push_back(it->second);
    it->second = pair;
  }
  return pair;
}

absl::StatusOr<std::unique_ptr<SendSession>> DeviceKvSender::Open(const std::string& endpoint,
                                                                  TransferId id,
                                                                  const TransferSpec& spec) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  if (absl::Status s = CheckRegionsMatch(regions_, spec); !s.ok()) return s;
  if (absl::StatusOr<std::string> a = ControlAddressOf(endpoint); !a.ok()) return a.status();
  absl::StatusOr<std::shared_ptr<SenderPair>> pair = PairTo(endpoint);
  if (!pair.ok()) return pair.status();
  absl::StatusOr<std::shared_ptr<SendTransfer>> t = (*pair)->Begin(id, spec);
  if (!t.ok()) return t.status();
  return std::unique_ptr<SendSession>(new DeviceSendSession(std::move(*pair), std::move(*t)));
}

std::string DeviceKvSender::DataPlaneTo(const std::string& endpoint) {
  std::shared_ptr<SenderPair> pair;
  {
    absl::MutexLock l(&mu_);
    auto it = pairs_.find(endpoint);
    if (it == pairs_.end()) return "";
    pair = it->second;
  }
  return pair->data_plane();
}

}  // namespace pdserve::kvtransfer::device
