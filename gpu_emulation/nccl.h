// CPU emulation of NCCL's point-to-point subset (nccl.h names) over
// loopback TCP, for the KV transfer between a prefill and a decode worker:
// unique ids, (non-blocking) communicator init, ncclSend / ncclRecv,
// groups, async errors, abort and destroy. Rules kept from NCCL:
//   * sends and receives between two ranks match in issue order (the n-th
//     ncclSend from a to b with the n-th ncclRecv at b from a), with equal
//     sizes (a mismatch is an error, where NCCL's behaviour is undefined);
//   * a send completes only once the peer's receive runs (rendezvous), so a
//     peer that never posts its receive blocks the sender's stream until
//     the communicator is aborted, and two ranks that both send before they
//     receive deadlock unless the calls are grouped
//     (ncclGroupStart/ncclGroupEnd), as on NCCL;
//   * operations run on the given CUDA stream, in order with its other
//     work; buffers must be device memory;
//   * a non-blocking communicator (config.blocking = 0) returns ncclInProgress
//     from init; ncclCommGetAsyncError says when it is ready;
//   * ncclCommAbort unblocks every pending operation of the communicator
//     (they complete without moving data) and frees it; the peer's
//     communicator then reports ncclRemoteError once it depends on the
//     aborted side. ncclCommDestroy waits for pending operations first.
// Not emulated: collectives, sends to oneself, several communicators per
// unique id, and NCCL's refusal of two ranks on one GPU.
#pragma once

#include <climits>
#include <cstddef>

#include "gpu_emulation/cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION_CODE 22809
#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR nullptr

namespace pdserve::gpuemu {
struct NcclComm;
}
using ncclComm_t = pdserve::gpuemu::NcclComm*;

struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8,
};

enum ncclDataType_t {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12,
};

// NCCL 2.28's config; only `blocking` is read by the emulation.
struct ncclConfig_t {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
};

#define NCCL_CONFIG_INITIALIZER                                                                    \
  {                                                                                                \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_INT,                    \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT \
  }

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
