// Emulated NCCL point-to-point over loopback TCP; see nccl.h for the rules.
//
// Bootstrap: ncclGetUniqueId opens a rendezvous listener (a detached
// thread, alive until every rank has registered or ten minutes passed) and
// puts its port and a nonce in the id. Each rank registers its own data
// listener's port and receives everyone's; rank r then connects to every
// higher rank and accepts the lower ones: one TCP connection per pair.
//
// Wire, per connection and direction: frames of (type, seq, bytes).
//   HEADER(seq, bytes)  the sender announces its seq-th message to this peer
//   CLEAR(seq)          the receiver's seq-th receive has been posted
//   DATA(seq, bytes)    the payload, read straight into the posted buffer
// seq numbers are taken when ncclSend/ncclRecv are called, so matching
// follows issue order whatever the streams do.
#include "gpu_emulation/nccl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpu_emulation/internal.h"

namespace pdserve::gpuemu {
namespace {

constexpr char kIdMagic[16] = "pdserve-ncclemu";
constexpr auto kRendezvousTimeout = std::chrono::minutes(10);
constexpr auto kConnectTimeout = std::chrono::minutes(2);

using Clock = std::chrono::steady_clock;

struct IdBody {
  char magic[16];
  uint16_t port;
  uint64_t nonce;
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES);

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

// A listening socket on 127.0.0.1 with a kernel-chosen port; -1 on error.
int Listen(uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a = Loopback(0);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int Connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a = Loopback(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  NoDelay(fd);
  return fd;
}

// accept() on `listen_fd` until `deadline` or *stop; -1 on failure.
int AcceptUntil(int listen_fd, Clock::time_point deadline, const bool* stop, std::mutex* mu) {
  while (Clock::now() < deadline) {
    if (stop != nullptr) {
      std::lock_guard<std::mutex> lock(*mu);
      if (*stop) return -1;
    }
    pollfd p{listen_fd, POLLIN, 0};
    const int r = poll(&p, 1, 100);
    if (r < 0 && errno != EINTR) return -1;
    if (r > 0) {
      const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) NoDelay(fd);
      return fd;
    }
  }
  return -1;
}

// Registration a rank sends to the rendezvous.
struct Hello {
  uint64_t nonce;
  int32_t nranks;
  int32_t rank;
  uint16_t port;
};

// The rendezvous: collects every rank's data port, then sends the table to
// each. Owns listen_fd.
void Rendezvous(int listen_fd, uint64_t nonce) {
  const Clock::time_point deadline = Clock::now() + kRendezvousTimeout;
  std::map<int, std::pair<int, uint16_t>> ranks;  // rank -> (fd, port)
  int nranks = -1;
  bool failed = false;
  while (!failed && (nranks < 0 || static_cast<int>(ranks.size()) < nranks)) {
    const int fd = AcceptUntil(listen_fd, deadline, nullptr, nullptr);
    if (fd < 0) break;
    Hello h;
    if (!ReadAll(fd, &h, sizeof h) || h.nonce != nonce || h.nranks < 1 ||
        (nranks >= 0 && h.nranks != nranks) || h.rank < 0 || h.rank >= h.nranks ||
        ranks.count(h.rank) > 0) {
      close(fd);
      continue;  // a stray or inconsistent registration: that rank times out
    }
    nranks = h.nranks;
    ranks[h.rank] = {fd, h.port};
  }
  std::vector<uint16_t> table(static_cast<size_t>(std::max(nranks, 0)));
  for (auto& [rank, entry] : ranks) table[rank] = entry.second;
  const bool complete = nranks > 0 && static_cast<int>(ranks.size()) == nranks;
  for (auto& [rank, entry] : ranks) {
    if (complete) WriteAll(entry.first, table.data(), table.size() * sizeof(uint16_t));
    close(entry.first);
  }
  close(listen_fd);
}

enum FrameType : uint8_t { kHeader = 1, kClear = 2, kData = 3 };
constexpr size_t kFrameBytes = 17;

bool WriteFrame(int fd, FrameType type, uint64_t seq, uint64_t bytes) {
  unsigned char f[kFrameBytes];
  f[0] = type;
  std::memcpy(f + 1, &seq, 8);
  std::memcpy(f + 9, &bytes, 8);
  return WriteAll(fd, f, sizeof f);
}

size_t TypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

struct Peer {
  int fd = -1;
  std::mutex write_mu;  // one frame at a time on fd
  // Guarded by CommState::mu:
  uint64_t next_send = 0, next_recv = 0;                  // seq of the next issued op
  std::map<uint64_t, uint64_t> announced;                 // incoming message seq -> bytes
  std::set<uint64_t> cleared;                             // our sends the peer is ready for
  std::map<uint64_t, std::pair<void*, uint64_t>> posted;  // our receives
  std::set<uint64_t> delivered;
  bool closed = false;
  std::thread reader;
};

}  // namespace

struct CommState {
  int nranks = 0;
  int rank = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Peer>> peers;   // [nranks]; null for this rank
  bool ready = false;                         // guarded by mu
  ncclResult_t init_result = ncclInProgress;  // guarded by mu
  bool aborted = false;                       // guarded by mu
  ncclResult_t async_error = ncclSuccess;     // guarded by mu
  std::string last_error;                     // guarded by mu
  int pending = 0;                            // issued, not completed (guarded by mu)
  int listen_fd = -1;                         // during init (guarded by mu)
  int root_fd = -1;                           // during init (guarded by mu)
  std::thread init_thread;                    // non-blocking init

  // Records an error (the first one wins). Needs mu.
  void Fail(ncclResult_t e, const std::string& why) {
    if (async_error == ncclSuccess) {
      async_error = e;
      last_error = why;
    }
  }
};

struct NcclComm {
  std::shared_ptr<CommState> state;
};

namespace {

void ReaderLoop(const std::shared_ptr<CommState>& s, int peer) {
  Peer& p = *s->peers[peer];
  unsigned char f[kFrameBytes];
  bool ok = true;
  while (ok && ReadAll(p.fd, f, sizeof f)) {
    uint64_t seq, bytes;
    std::memcpy(&seq, f + 1, 8);
    std::memcpy(&bytes, f + 9, 8);
    std::unique_lock<std::mutex> lock(s->mu);
    switch (f[0]) {
      case kHeader:
        p.announced[seq] = bytes;
        break;
      case kClear:
        p.cleared.insert(seq);
        break;
      case kData: {
        auto it = p.posted.find(seq);
        if (it == p.posted.end() || it->second.second != bytes) {
          s->Fail(ncclInternalError, "data for a receive that was not cleared");
          ok = false;
          break;
        }
        void* buf = it->second.first;
        lock.unlock();
        ok = ReadAll(p.fd, buf, bytes);
        lock.lock();
        if (ok) p.delivered.insert(seq);
        break;
      }
      default:
        s->Fail(ncclInternalError, "bad frame from rank " + std::to_string(peer));
        ok = false;
    }
    s->cv.notify_all();
  }
  std::lock_guard<std::mutex> lock(s->mu);
  p.closed = true;
  if (!s->aborted && (!p.posted.empty() || !p.announced.empty())) {
    s->Fail(ncclRemoteError, "rank " + std::to_string(peer) + " went away with messages pending");
  }
  s->cv.notify_all();
}

// Connects this rank to the others (see the file comment).
ncclResult_t Bootstrap(const std::shared_ptr<CommState>& s, const IdBody& id) {
  const Clock::time_point deadline = Clock::now() + kConnectTimeout;
  uint16_t my_port = 0;
  const int listen_fd = Listen(&my_port);
  if (listen_fd < 0) return ncclSystemError;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->listen_fd = listen_fd;
  }
  const int root = Connect(id.port);
  if (root < 0) return ncclSystemError;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->root_fd = root;  // abort shuts it down while we wait for the others
    if (s->aborted) shutdown(root, SHUT_RDWR);
  }
  std::vector<uint16_t> table(static_cast<size_t>(s->nranks));
  const Hello hello{id.nonce, s->nranks, s->rank, my_port};
  const bool registered = WriteAll(root, &hello, sizeof hello) &&
                          ReadAll(root, table.data(), table.size() * sizeof(uint16_t));
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->root_fd = -1;
    close(root);
  }
  if (!registered) return ncclSystemError;
  for (int peer = s->rank + 1; peer < s->nranks; ++peer) {
    const int fd = Connect(table[peer]);
    const uint64_t intro[2] = {id.nonce, static_cast<uint64_t>(s->rank)};
    if (fd < 0 || !WriteAll(fd, intro, sizeof intro)) return ncclSystemError;
    s->peers[peer]->fd = fd;
  }
  for (int accepted = 0; accepted < s->rank;) {
    const int fd = AcceptUntil(listen_fd, deadline, &s->aborted, &s->mu);
    if (fd < 0) return ncclSystemError;
    uint64_t intro[2];
    if (!ReadAll(fd, intro, sizeof intro) || intro[0] != id.nonce ||
        intro[1] >= static_cast<uint64_t>(s->rank) || s->peers[intro[1]]->fd >= 0) {
      close(fd);
      continue;
    }
    s->peers[intro[1]]->fd = fd;
    ++accepted;
  }
  return ncclSuccess;
}

void Init(const std::shared_ptr<CommState>& s, const IdBody& id) {
  const ncclResult_t r = Bootstrap(s, id);
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->listen_fd >= 0) close(s->listen_fd);
  s->listen_fd = -1;
  if (r == ncclSuccess && !s->aborted) {
    for (int peer = 0; peer < s->nranks; ++peer) {
      if (peer != s->rank) s->peers[peer]->reader = std::thread(ReaderLoop, s, peer);
    }
    s->ready = true;
  }
  s->init_result = s->aborted ? ncclSystemError : r;
  if (s->init_result != ncclSuccess) s->last_error = "communicator init failed";
  s->cv.notify_all();
}

// ---- operations ----

struct Op {
  bool send;
  std::shared_ptr<CommState> state;
  int peer;
  uint64_t seq;
  void* buf;
  uint64_t bytes;
  cudaStream_t stream;
};

void Finish(CommState& s, bool ok, ncclResult_t error, const std::string& why) {
  std::lock_guard<std::mutex> lock(s.mu);
  if (!ok && !s.aborted) s.Fail(error, why);
  --s.pending;
  s.cv.notify_all();
}

void RunSend(const Op& op) {
  CommState& s = *op.state;
  Peer& p = *s.peers[op.peer];
  const std::string what =
      "send #" + std::to_string(op.seq) + " to rank " + std::to_string(op.peer);
  bool gone;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    gone = s.aborted || p.closed;
  }
  if (gone) return Finish(s, false, ncclRemoteError, what + ": connection closed");
  bool ok;
  {
    std::lock_guard<std::mutex> lock(p.write_mu);
    ok = WriteFrame(p.fd, kHeader, op.seq, op.bytes);
  }
  if (!ok) return Finish(s, false, ncclRemoteError, what + ": write failed");
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return p.cleared.count(op.seq) > 0 || p.closed || s.aborted; });
    if (p.cleared.erase(op.seq) == 0) {
      lock.unlock();
      return Finish(s, false, ncclRemoteError, what + ": the peer never received it");
    }
  }
  {
    std::lock_guard<std::mutex> lock(p.write_mu);
    ok = WriteFrame(p.fd, kData, op.seq, op.bytes) && WriteAll(p.fd, op.buf, op.bytes);
  }
  Finish(s, ok, ncclRemoteError, what + ": write failed");
}

void RunRecv(const Op& op) {
  CommState& s = *op.state;
  Peer& p = *s.peers[op.peer];
  const std::string what =
      "receive #" + std::to_string(op.seq) + " from rank " + std::to_string(op.peer);
  std::unique_lock<std::mutex> lock(s.mu);
  p.posted[op.seq] = {op.buf, op.bytes};
  s.cv.wait(lock, [&] { return p.announced.count(op.seq) > 0 || p.closed || s.aborted; });
  auto it = p.announced.find(op.seq);
  if (it == p.announced.end() || s.aborted) {
    p.posted.erase(op.seq);
    lock.unlock();
    return Finish(s, false, ncclRemoteError, what + ": the peer never sent it");
  }
  if (it->second != op.bytes) {
    const std::string why = what + ": " + std::to_string(op.bytes) + " bytes posted, " +
                            std::to_string(it->second) + " sent";
    p.posted.erase(op.seq);
    lock.unlock();
    return Finish(s, false, ncclInvalidUsage, why);
  }
  p.announced.erase(it);
  lock.unlock();
  bool ok;
  {
    std::lock_guard<std::mutex> wlock(p.write_mu);
    ok = WriteFrame(p.fd, kClear, op.seq, op.bytes);
  }
  lock.lock();
  if (ok) s.cv.wait(lock, [&] { return p.delivered.count(op.seq) > 0 || p.closed || s.aborted; });
  ok = ok && p.delivered.erase(op.seq) > 0;
  p.posted.erase(op.seq);
  lock.unlock();
  Finish(s, ok, ncclRemoteError, what + ": connection lost");
}

void RunOps(const std::vector<Op>& ops) {
  if (ops.size() == 1) {
    ops[0].send ? RunSend(ops[0]) : RunRecv(ops[0]);
    return;
  }
  // A group progresses all its operations at once.
  std::vector<std::thread> threads;
  for (const Op& op : ops) threads.emplace_back([&op] { op.send ? RunSend(op) : RunRecv(op); });
  for (std::thread& t : threads) t.join();
}

// Enqueues a group's operations as one unit on the first operation's stream,
// ordered after (and before) the other streams' work, as NCCL orders a
// group across its streams.
ncclResult_t Enqueue(std::vector<Op> ops) {
  if (ops.empty()) return ncclSuccess;
  const cudaStream_t main = ops[0].stream;
  std::set<cudaStream_t> others;
  for (const Op& op : ops) {
    if (op.stream != main) others.insert(op.stream);
  }
  std::vector<cudaEvent_t> events;
  const auto join = [&](cudaStream_t from, cudaStream_t to) {
    cudaEvent_t e;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return false;
    events.push_back(e);
    return cudaEventRecord(e, from) == cudaSuccess && cudaStreamWaitEvent(to, e, 0) == cudaSuccess;
  };
  bool ok = true;
  for (cudaStream_t other : others) ok = ok && join(other, main);
  auto shared = std::make_shared<std::vector<Op>>(ops);
  ok = ok && Submit(main, {[shared] { RunOps(*shared); }, false}) == cudaSuccess;
  for (cudaStream_t other : others) ok = ok && join(main, other);
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  if (!ok) {
    for (const Op& op : ops) Finish(*op.state, false, ncclUnhandledCudaError, "enqueue failed");
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group_ops;

ncclResult_t Issue(bool send, void* buf, size_t count, ncclDataType_t type, int peer,
                   ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr) return ncclInvalidArgument;
  const std::shared_ptr<CommState>& s = comm->state;
  const size_t elem = TypeBytes(type);
  if (elem == 0) return ncclInvalidArgument;
  const uint64_t bytes = uint64_t{count} * elem;
  Op op{send, s, peer, 0, buf, bytes, stream};
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (!s->ready || s->aborted) return ncclInvalidUsage;
    if (peer < 0 || peer >= s->nranks || peer == s->rank) return ncclInvalidArgument;
    if (bytes > 0 && (buf == nullptr || !DeviceRange(buf, bytes))) return ncclInvalidArgument;
    Peer& p = *s->peers[peer];
    op.seq = send ? p.next_send++ : p.next_recv++;
    ++s->pending;
  }
  if (t_group_depth > 0) {
    t_group_ops.push_back(std::move(op));
    return ncclSuccess;
  }
  return Enqueue({std::move(op)});
}

// Closes the sockets (waking readers) and joins the communicator's threads.
void Shutdown(CommState& s) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& p : s.peers) {
      if (p && p->fd >= 0) shutdown(p->fd, SHUT_RDWR);
    }
    s.cv.notify_all();
  }
  if (s.init_thread.joinable()) s.init_thread.join();
  for (auto& p : s.peers) {
    if (!p) continue;
    if (p->reader.joinable()) p->reader.join();
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
  }
}

}  // namespace
}  // namespace pdserve::gpuemu

using pdserve::gpuemu::CommState;
using pdserve::gpuemu::IdBody;

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return ncclInvalidArgument;
  IdBody id{};
  std::memcpy(id.magic, pdserve::gpuemu::kIdMagic, sizeof id.magic);
  const int fd = pdserve::gpuemu::Listen(&id.port);
  if (fd < 0) return ncclSystemError;
  std::random_device rd;
  id.nonce = (uint64_t{rd()} << 32) ^ rd();
  std::thread(pdserve::gpuemu::Rendezvous, fd, id.nonce).detach();
  std::memset(unique_id, 0, sizeof *unique_id);
  std::memcpy(unique_id->internal, &id, sizeof id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  IdBody id;
  std::memcpy(&id, comm_id.internal, sizeof id);
  if (std::memcmp(id.magic, pdserve::gpuemu::kIdMagic, sizeof id.magic) != 0) {
    return ncclInvalidArgument;
  }
  auto s = std::make_shared<CommState>();
  s->nranks = nranks;
  s->rank = rank;
  for (int r = 0; r < nranks; ++r) {
    s->peers.push_back(r == rank ? nullptr : std::make_unique<pdserve::gpuemu::Peer>());
  }
  *comm = new pdserve::gpuemu::NcclComm{s};
  const bool blocking = config == nullptr || config->blocking != 0;
  if (!blocking) {
    s->init_thread = std::thread(pdserve::gpuemu::Init, s, id);
    return ncclInProgress;
  }
  pdserve::gpuemu::Init(s, id);
  std::lock_guard<std::mutex> lock(s->mu);
  return s->init_result;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, comm_id, rank, nullptr);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  CommState& s = *comm->state;
  {
    // Like ncclCommFinalize: pending operations complete first.
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.pending == 0 || s.aborted; });
  }
  pdserve::gpuemu::Shutdown(s);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  CommState& s = *comm->state;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.aborted = true;
    if (s.listen_fd >= 0) shutdown(s.listen_fd, SHUT_RDWR);
    if (s.root_fd >= 0) shutdown(s.root_fd, SHUT_RDWR);
  }
  // Operations still queued on streams hold the state and fail at once.
  pdserve::gpuemu::Shutdown(s);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) return ncclInvalidArgument;
  CommState& s = *comm->state;
  std::lock_guard<std::mutex> lock(s.mu);
  *async_error = s.ready ? s.async_error : s.init_result;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->state->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->state->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string copy;
  copy.clear();
  if (comm != nullptr) {
    std::lock_guard<std::mutex> lock(comm->state->mu);
    copy = comm->state->last_error;
  }
  return copy.c_str();
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return pdserve::gpuemu::Issue(true, const_cast<void*>(sendbuff), count, datatype, peer, comm,
                                stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return pdserve::gpuemu::Issue(false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++pdserve::gpuemu::t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (pdserve::gpuemu::t_group_depth == 0) return ncclInvalidUsage;
  if (--pdserve::gpuemu::t_group_depth > 0) return ncclSuccess;
  std::vector<pdserve::gpuemu::Op> ops = std::move(pdserve::gpuemu::t_group_ops);
  pdserve::gpuemu::t_group_ops.clear();
  return pdserve::gpuemu::Enqueue(std::move(ops));
}
