// The decode side of the device transport; see device_receiver.h.
#include "kvtransfer/device/device_receiver.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/base/logging.h"
#include "engine/cuda/base/cuda_status.h"
#include "kvtransfer/device/kv_copy.cuh"
#include "kvtransfer/handshake.h"
#include "kvtransfer/kv_blocks.h"

namespace pdserve::kvtransfer::device {

using internal::v1::KvPairRequest;
using internal::v1::KvPairResponse;
using PairStream = grpc::ServerReaderWriter<KvPairResponse, KvPairRequest>;

// One prefill worker's stream. Fields below `sender` are guarded by the
// receiver's mu_; the handler thread sets the others up before the pair is
// shared.
struct ReceiverPair {
  // The stream's context lives only while the handler runs: the handler
  // clears it under context_mu before it returns, so a FailPair from another
  // thread (the receiver's destructor, the watchdog) never cancels a freed call.
  absl::Mutex context_mu;
  grpc::ServerContext* context ABSL_GUARDED_BY(context_mu) = nullptr;
  std::string sender;
  std::unique_ptr<OpQueue> ops;  // taken out (under mu_) when the handler ends
  std::unique_ptr<OrderedWriter<KvPairResponse>> writer;
  bool ipc = false;
  std::unique_ptr<ImportedRegions> source;  // ipc: the sender's regions here
  std::byte* staging = nullptr;             // nccl: one message's rows
  size_t staging_bytes = 0;
  ncclComm_t comm = nullptr;  // null once aborted
  absl::Status failure;
  bool closed = false;  // the writer is gone: no more Acks
};

// One Expect()ed transfer. Fields below `timeout` are guarded by the
// receiver's mu_; sink calls by sink_mu.
struct RecvTransfer {
  TransferId id = 0;
  TransferSpec spec;
  std::vector<int32_t> blocks;  // destination, from token 0
  std::shared_ptr<ReceiveSink> sink;
  absl::Time deadline;
  absl::Duration timeout;
  std::shared_ptr<ReceiverPair> pair;  // the claiming sender's pair
  bool handshake_acked = false;
  std::vector<int> announced;  // per layer: tokens of chunks enqueued
  std::vector<int> received;   // per layer: tokens landed
  int layers_received = 0;     // layers with every token landed
  int pending = 0;             // operations on the pair's queue
  bool finished = false;       // Finish came
  int32_t first_token = 0;
  absl::Status failure;
  bool completing = false;  // taken by one completer
  bool completed = false;   // OnComplete returned
  absl::Mutex sink_mu;
  bool sink_done ABSL_GUARDED_BY(sink_mu) = false;

  absl::Status TimeoutError() const {
    return absl::DeadlineExceededError(
        absl::StrCat("kv transfer ", id, " not complete within ", absl::FormatDuration(timeout),
                     " (", layers_received, " of ", spec.num_layers, " layers received)"));
  }
};

absl::StatusOr<std::unique_ptr<DeviceKvReceiver>> DeviceKvReceiver::Create(
    const std::string& bind_host, int port, std::span<const engine::KvRegion> regions,
    DeviceTransportOptions options, const std::string& advertise_host) {
  absl::StatusOr<internal::v1::KvDevice> device = CheckSetup(regions, options);
  if (!device.ok()) return device.status();
  auto receiver = std::make_unique<DeviceKvReceiver>(Private{}, regions, std::move(options),
                                                     std::move(*device));
  absl::StatusOr<GrpcServerHandle> server =
      StartGrpcServer(bind_host, port, {receiver.get()}, InternalServerCredentials());
  if (!server.ok()) return server.status();
  receiver->server_ = std::move(server->server);
  receiver->endpoint_ = absl::StrCat(
      "nccl://", JoinHostPort(advertise_host.empty() ? bind_host : advertise_host, server->port));
  return receiver;
}

DeviceKvReceiver::DeviceKvReceiver(Private, std::span<const engine::KvRegion> regions,
                                   DeviceTransportOptions options, internal::v1::KvDevice device)
    : regions_(regions),
      options_(std::move(options)),
      device_(std::move(device)),
      watchdog_([this] { Watchdog(); }) {}

DeviceKvReceiver::~DeviceKvReceiver() {
  std::set<std::shared_ptr<ReceiverPair>> pairs;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    pairs = pairs_;
  }
  watchdog_.join();
  const absl::Status why = absl::CancelledError("kv receiver shutting down");
  for (const auto& pair : pairs) FailPair(pair, why);
  // Handlers return once their pair drained.
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  std::vector<std::shared_ptr<RecvTransfer>> left;
  {
    absl::MutexLock l(&mu_);
    for (auto& [id, t] : transfers_) {
      if (t->failure.ok()) t->failure = why;
      left.push_back(t);
    }
  }
  for (const auto& t : left) MaybeComplete(t);
}

absl::Status DeviceKvReceiver::Expect(TransferId id, const TransferSpec& spec,
                                      std::vector<int32_t> block_table,
                                      std::shared_ptr<ReceiveSink> sink, absl::Duration timeout) {
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  if (absl::Status s = CheckRegionsMatch(regions_, spec); !s.ok()) return s;
  if (absl::Status s = CheckBlockTable(regions_[0], block_table, spec.num_tokens); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Expect: ", s.message()));
  }
  if (sink == nullptr) return absl::InvalidArgumentError("Expect: null sink");
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Expect: timeout must be positive, got ", absl::FormatDuration(timeout)));
  }
  auto t = std::make_shared<RecvTransfer>();
  t->id = id;
  t->spec = spec;
  t->blocks = std::move(block_table);
  t->sink = std::move(sink);
  t->timeout = timeout;
  t->deadline = absl::Now() + timeout;
  t->announced.assign(spec.num_layers, 0);
  t->received.assign(spec.num_layers, 0);
  absl::MutexLock l(&mu_);
  if (stopping_) return absl::FailedPreconditionError("kv receiver is shutting down");
  if (!transfers_.try_emplace(id, std::move(t)).second) {
    return absl::AlreadyExistsError(absl::StrCat("kv transfer ", id, " is already expected"));
  }
  return absl::OkStatus();
}

void DeviceKvReceiver::Cancel(TransferId id) {
  std::shared_ptr<RecvTransfer> t;
  {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(id);
    if (it == transfers_.end()) return;
    t = it->second;
    FailLocked(
        *t, absl::CancelledError(absl::StrCat("kv transfer ", id, " cancelled by the receiver")));
  }
  MaybeComplete(t);
  absl::MutexLock l(&mu_);
  const auto done = [&t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return t->completed; };
  mu_.Await(absl::Condition(&done));
}

int DeviceKvReceiver::live_pairs() {
  absl::MutexLock l(&mu_);
  return static_cast<int>(pairs_.size());
}

void DeviceKvReceiver::SendAckLocked(ReceiverPair& pair, TransferId id, bool done,
                                     const absl::Status& status) {
  if (pair.closed) return;
  KvPairResponse m;
  m.mutable_ack()->set_transfer_id(id);
  m.mutable_ack()->set_done(done);
  m.mutable_ack()->set_ok(status.ok());
  if (!status.ok()) m.mutable_ack()->set_error(std::string(status.message()));
  pair.writer->Push(std::move(m));
}

void DeviceKvReceiver::FailLocked(RecvTransfer& t, const absl::Status& why) {
  if (!t.failure.ok() || t.completing) return;
  t.failure = why;
  // The sender stops queueing; its chunks already announced still run.
  if (t.pair != nullptr && t.handshake_acked) SendAckLocked(*t.pair, t.id, false, why);
}

void DeviceKvReceiver::MaybeComplete(const std::shared_ptr<RecvTransfer>& t) {
  absl::StatusOr<int32_t> result = absl::UnknownError("unset");
  {
    absl::MutexLock l(&mu_);
    if (t->completing || t->pending > 0) return;
    if (!t->failure.ok()) {
      result = t->failure;
    } else if (t->finished && t->layers_received == t->spec.num_layers) {
      result = t->first_token;
    } else {
      return;
    }
    t->completing = true;
    auto it = transfers_.find(t->id);
    if (it != transfers_.end() && it->second == t) transfers_.erase(it);
  }
  {
    absl::MutexLock l(&t->sink_mu);
    t->sink_done = true;
    t->sink->OnComplete(result);
  }
  absl::MutexLock l(&mu_);
  t->completed = true;
  if (t->pair != nullptr) SendAckLocked(*t->pair, t->id, true, result.status());
}

void DeviceKvReceiver::FailPair(const std::shared_ptr<ReceiverPair>& pair,
                                const absl::Status& why) {
  ncclComm_t comm;
  std::vector<std::shared_ptr<RecvTransfer>> mine;
  {
    absl::MutexLock l(&mu_);
    if (!pair->failure.ok()) return;
    pair->failure = why;
    comm = pair->comm;
    pair->comm = nullptr;
    for (auto& [id, t] : transfers_) {
      if (t->pair == pair) {
        FailLocked(*t, why);
        mine.push_back(t);
      }
    }
  }
  if (mine.empty()) {
    PDSERVE_LOG(INFO) << "kv pair with " << pair->sender << " closed: " << why;
  } else {
    PDSERVE_LOG(WARNING) << "kv pair with " << pair->sender << " failed: " << why;
  }
  if (comm != nullptr) ncclCommAbort(comm);  // pending receives complete without data
  {
    absl::MutexLock l(&pair->context_mu);
    if (pair->context != nullptr) pair->context->TryCancel();
  }
  for (const auto& t : mine) MaybeComplete(t);
}

grpc::Status DeviceKvReceiver::Pair(grpc::ServerContext* context, PairStream* stream) {
  if (grpc::Status auth = CheckClusterCredential(*context); !auth.ok()) return auth;
  KvPairRequest first;
  if (!stream->Read(&first) || !first.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a kv pair starts with Hello");
  }
  auto pair = std::make_shared<ReceiverPair>();
  {
    absl::MutexLock l(&pair->context_mu);
    pair->context = context;
  }
  pair->sender = first.hello().sender();
  pair->writer = std::make_unique<OrderedWriter<KvPairResponse>>(
      [stream](const KvPairResponse& m) { return stream->Write(m); });
  const grpc::Status status = RunPair(pair, first.hello(), stream);
  // Whatever ended the pair, its transfers fail and its operations drain
  // before the stream handler returns.
  FailPair(pair, status.ok() ? absl::UnavailableError(
                                   absl::StrCat("kv control stream from ", pair->sender, " closed"))
                             : FromGrpcStatus(status));
  std::unique_ptr<OpQueue> ops;
  {
    absl::MutexLock l(&mu_);
    pairs_.erase(pair);
    ops = std::move(pair->ops);  // the watchdog reads it under mu_
  }
  ops.reset();  // waits for the pair's operations (and their completions) to finish
  {
    absl::MutexLock l(&mu_);
    pair->closed = true;
  }
  pair->writer.reset();
  if (pair->staging != nullptr) staging_.Give(pair->staging, pair->staging_bytes);
  {
    absl::MutexLock l(&pair->context_mu);
    pair->context = nullptr;  // gRPC frees the call once this handler returns
  }
  return status;
}

grpc::Status DeviceKvReceiver::RunPair(const std::shared_ptr<ReceiverPair>& pair,
                                       const KvPairRequest::Hello& hello, PairStream* stream) {
  cudaSetDevice(options_.device);
  absl::StatusOr<std::unique_ptr<OpQueue>> ops = OpQueue::Create(options_.device);
  if (!ops.ok()) return ToGrpcStatus(ops.status());
  pair->ops = std::move(*ops);
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  // Same GPU: copy from the sender's blocks (NCCL refuses two ranks on one
  // device); in one process by address, else through its IPC handles.
  if (options_.allow_ipc && SameDevice(device_, hello.device()) &&
      hello.regions_size() >= static_cast<int>(regions_.size())) {
    absl::StatusOr<std::unique_ptr<ImportedRegions>> source =
        ImportedRegions::Open(hello.regions(), hello.device().pid() == device_.pid());
    if (source.ok()) {
      pair->ipc = true;
      pair->source = std::move(*source);
    } else {
      PDSERVE_LOG(WARNING) << "kv pair with " << pair->sender
                           << " on this GPU cannot use CUDA IPC: " << source.status();
    }
  }
  KvPairResponse welcome;
  welcome.mutable_welcome()->set_data_plane(pair->ipc ? "ipc" : "nccl");
  *welcome.mutable_welcome()->mutable_device() = device_;
  welcome.mutable_welcome()->set_receiver(endpoint_);
  pair->writer->Push(std::move(welcome));

  if (!pair->ipc) {
    KvPairRequest init;
    if (!stream->Read(&init) || !init.has_comm_init() ||
        init.comm_init().nccl_unique_id().size() != sizeof(ncclUniqueId::internal)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected CommInit after Welcome");
    }
    absl::Status ready;
    if (hello.max_chunk_bytes() == 0 || hello.max_chunk_bytes() > options_.max_staging_bytes) {
      ready = absl::ResourceExhaustedError(absl::StrCat("chunks of ", hello.max_chunk_bytes(),
                                                        " bytes exceed the staging limit of ",
                                                        options_.max_staging_bytes));
    } else if (absl::StatusOr<std::byte*> staging = staging_.Take(hello.max_chunk_bytes());
               staging.ok()) {
      pair->staging = *staging;
      pair->staging_bytes = hello.max_chunk_bytes();
    } else {
      ready = staging.status();
    }
    if (ready.ok()) {
      ncclUniqueId id;
      init.comm_init().nccl_unique_id().copy(id.internal, sizeof id.internal);
      absl::StatusOr<ncclComm_t> comm = InitComm(id, /*rank=*/1, deadline);
      if (comm.ok()) {
        absl::MutexLock l(&mu_);
        pair->comm = *comm;
      }
      ready = comm.status();
    }
    KvPairResponse answer;
    answer.mutable_comm_ready()->set_ok(ready.ok());
    answer.mutable_comm_ready()->set_error(std::string(ready.message()));
    pair->writer->Push(std::move(answer));
    if (!ready.ok()) return ToGrpcStatus(ready);
  }
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kv receiver shutting down");
    pairs_.insert(pair);
  }
  KvPairRequest m;
  while (stream->Read(&m)) {
    switch (m.msg_case()) {
      case KvPairRequest::kBegin:
        OnBegin(pair, m.begin());
        break;
      case KvPairRequest::kChunk:
        if (!OnChunk(pair, m.chunk())) return grpc::Status::OK;
        break;
      case KvPairRequest::kFinish:
      case KvPairRequest::kAbort: {
        const TransferId id = m.has_finish() ? m.finish().transfer_id() : m.abort().transfer_id();
        std::shared_ptr<RecvTransfer> t;
        {
          absl::MutexLock l(&mu_);
          auto it = transfers_.find(id);
          if (it == transfers_.end() || it->second->pair != pair) break;
          t = it->second;
          if (m.has_finish()) {
            t->finished = true;
            t->first_token = m.finish().first_token();
          } else {
            FailLocked(*t, absl::AbortedError(absl::StrCat("kv sender aborted transfer ", id, ": ",
                                                           m.abort().reason())));
          }
        }
        MaybeComplete(t);
        break;
      }
      case KvPairRequest::kHello:
      case KvPairRequest::kCommInit:
      case KvPairRequest::MSG_NOT_SET:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "unexpected message on a kv pair stream");
    }
  }
  return grpc::Status::OK;
}

void DeviceKvReceiver::OnBegin(const std::shared_ptr<ReceiverPair>& pair,
                               const internal::v1::KvTransferHeader& header) {
  const TransferId id = header.transfer_id();
  std::shared_ptr<RecvTransfer> refused;
  absl::Status refusal;
  {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(id);
    if (absl::Status auth = CheckPeerCredential(header); !auth.ok()) {
      // Before the id: an unauthenticated peer cannot fail a real transfer.
      refusal = auth;
    } else if (it == transfers_.end()) {
      refusal =
          absl::NotFoundError(absl::StrCat("unknown transfer id ", id, " at kv receiver ",
                                           endpoint_, " (not expected, expired or cancelled)"));
    } else if (it->second->pair != nullptr) {
      refusal = absl::AlreadyExistsError(absl::StrCat("kv transfer ", id, " already has a sender"));
    } else if (absl::Status s = CheckHeader(header, it->second->spec); !s.ok()) {
      // The right transfer with the wrong shape can never succeed: it fails here too.
      refusal = absl::Status(
          s.code(), absl::StrCat("kv transfer ", id, " from ", pair->sender, ": ", s.message()));
      refused = it->second;
      FailLocked(*refused, refusal);
    } else if (!it->second->failure.ok()) {
      refusal = it->second->failure;
    } else {
      it->second->pair = pair;
      it->second->handshake_acked = true;
      SendAckLocked(*pair, id, false, absl::OkStatus());
      return;
    }
    SendAckLocked(*pair, id, false, refusal);
    SendAckLocked(*pair, id, true, refusal);
  }
  if (refused != nullptr) MaybeComplete(refused);
}

bool DeviceKvReceiver::OnChunk(const std::shared_ptr<ReceiverPair>& pair,
                               const KvPairRequest::Chunk& chunk) {
  const TransferId id = chunk.transfer_id();
  std::shared_ptr<RecvTransfer> t;
  std::shared_ptr<RecvTransfer> failed;
  bool valid = false;
  absl::Status enqueue;
  {
    absl::MutexLock l(&mu_);
    auto it = transfers_.find(id);
    if (it != transfers_.end() && it->second->pair == pair && !it->second->completing) {
      RecvTransfer& r = *it->second;
      const int layer = chunk.layer(), begin = chunk.token_begin(), count = chunk.num_tokens();
      const uint64_t want = 2 * r.spec.TokenBytes() * static_cast<uint64_t>(count);
      absl::Status bad;
      if (layer < 0 || layer >= r.spec.num_layers) {
        bad = absl::InvalidArgumentError(absl::StrCat("layer index ", layer, " out of range"));
      } else if (count <= 0 || begin != r.announced[layer] || count > r.spec.num_tokens - begin) {
        bad = absl::InvalidArgumentError(absl::StrCat("layer ", layer, " tokens [", begin, ", +",
                                                      count, ") do not continue its ",
                                                      r.announced[layer], " tokens"));
      } else if (!pair->ipc && chunk.bytes() != want) {
        bad = absl::InvalidArgumentError(
            absl::StrCat("chunk of ", chunk.bytes(), " bytes, expected ", want));
      }
      if (!bad.ok()) {
        FailLocked(r, absl::Status(bad.code(), absl::StrCat("kv transfer ", id, " from ",
                                                            pair->sender, ": ", bad.message())));
        failed = it->second;
      } else if (r.failure.ok()) {
        valid = true;
        r.announced[layer] += count;
        ++r.pending;
        t = it->second;
      }
    }
    if (!pair->failure.ok()) return false;
    cudaSetDevice(options_.device);
    const cudaStream_t stream = pair->ops->stream();
    const engine::KvRegion* dst = valid ? &regions_[chunk.layer()] : nullptr;
    const int64_t row = dst != nullptr ? dst->token_bytes() : 0;
    const KvRows into = dst != nullptr ? KvRows{.k = dst->k_base,
                                                .v = dst->v_base,
                                                .block_stride = dst->block_stride_bytes,
                                                .block_size = dst->block_size,
                                                .blocks = t->blocks,
                                                .first_token = chunk.token_begin()}
                                       : KvRows{};
    if (!pair->ipc) {
      // Every announced message is received, kept or not: the order is shared.
      if (chunk.bytes() > pair->staging_bytes) {
        enqueue = absl::InvalidArgumentError(absl::StrCat(
            "chunk of ", chunk.bytes(), " bytes exceeds the staging of ", pair->staging_bytes));
      } else {
        const ncclResult_t posted = ncclRecv(pair->staging, chunk.bytes(), ncclUint8,
                                             /*peer=*/0, pair->comm, stream);
        enqueue = AwaitComm(pair->comm, posted, "ncclRecv", absl::Now() + options_.stall_timeout);
      }
      if (enqueue.ok() && valid) {
        const KvRows staged{.k = pair->staging, .v = pair->staging + row * chunk.num_tokens()};
        enqueue = cuda::CudaStatus(CopyKvRows(staged, into, chunk.num_tokens(), row, stream),
                                   "kv scatter");
      }
    } else if (valid) {
      const std::span<const int32_t> blocks(chunk.source_blocks().data(),
                                            chunk.source_blocks().size());
      const KvRows from{.k = pair->source->k(chunk.layer()),
                        .v = pair->source->v(chunk.layer()),
                        .block_stride = pair->source->block_stride(chunk.layer()),
                        .block_size = pair->source->block_size(chunk.layer()),
                        .blocks = blocks,
                        .first_token = chunk.source_first_slot()};
      enqueue =
          cuda::CudaStatus(CopyKvRows(from, into, chunk.num_tokens(), row, stream), "kv ipc copy");
    }
    if (enqueue.ok() && valid) {
      const int layer = chunk.layer(), begin = chunk.token_begin(), count = chunk.num_tokens();
      enqueue = pair->ops->Push([this, t, layer, begin, count](absl::Status status) {
        OnOpDone(t, layer, begin, count, status);
      });
    }
    if (!enqueue.ok() && valid) --t->pending;  // nothing of it runs
  }
  if (failed != nullptr) MaybeComplete(failed);
  if (!enqueue.ok()) {
    FailPair(pair, absl::Status(enqueue.code(), absl::StrCat("kv pair with ", pair->sender, ": ",
                                                             enqueue.message())));
    return false;
  }
  return true;
}

void DeviceKvReceiver::OnOpDone(const std::shared_ptr<RecvTransfer>& t, int layer, int begin,
                                int count, const absl::Status& status) {
  bool deliver = false;
  {
    absl::MutexLock l(&mu_);
    if (!status.ok()) FailLocked(*t, status);
    deliver = t->failure.ok();
  }
  absl::Status accepted;
  if (deliver) {
    absl::MutexLock l(&t->sink_mu);
    if (!t->sink_done) accepted = t->sink->OnLayer(layer, begin, count);
  }
  {
    absl::MutexLock l(&mu_);
    --t->pending;
    if (!accepted.ok()) {
      FailLocked(*t, absl::Status(accepted.code(),
                                  absl::StrCat("kv transfer ", t->id, ": kv sink rejected layer ",
                                               layer, ": ", accepted.message())));
    } else if (deliver) {
      t->received[layer] += count;
      if (t->received[layer] == t->spec.num_tokens) ++t->layers_received;
    }
  }
  MaybeComplete(t);
}

void DeviceKvReceiver::Watchdog() {
  while (true) {
    std::vector<std::shared_ptr<ReceiverPair>> pairs;
    std::vector<std::shared_ptr<RecvTransfer>> expired;
    const absl::Time now = absl::Now();
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.watchdog_interval);
      if (stopping_) return;
      pairs.assign(pairs_.begin(), pairs_.end());
      for (auto& [id, t] : transfers_) {
        if (t->deadline <= now && !t->completing) {
          FailLocked(*t, t->TimeoutError());
          expired.push_back(t);
        }
      }
    }
    for (const auto& t : expired) MaybeComplete(t);
    for (const auto& pair : pairs) {
      absl::Status comm_error;
      {
        // Under the lock: FailPair frees the communicator.
        absl::MutexLock l(&mu_);
        ncclResult_t state = ncclSuccess;
        if (pair->comm != nullptr && ncclCommGetAsyncError(pair->comm, &state) == ncclSuccess &&
            state != ncclSuccess && state != ncclInProgress) {
          comm_error = absl::UnavailableError(
              absl::StrCat("kv pair with ", pair->sender, ": NCCL communicator error: ",
                           ncclGetErrorString(state), " (", ncclGetLastError(pair->comm), ")"));
        }
      }
      if (!comm_error.ok()) {
        FailPair(pair, comm_error);
        continue;
      }
      absl::Duration waited;
      {
        absl::MutexLock l(&mu_);
        if (pair->ops == nullptr) continue;  // its handler is winding it down
        waited = pair->ops->OldestWait(now);
      }
      if (waited > options_.stall_timeout) {
        FailPair(pair, absl::DeadlineExceededError(absl::StrCat(
                           "kv pair with ", pair->sender, ": a transfer made no progress for ",
                           absl::FormatDuration(waited), "; communicator aborted")));
      }
    }
  }
}

}  // namespace pdserve::kvtransfer::device
