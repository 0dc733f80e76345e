// NCCL of the emulated CUDA device: the collectives tutti issues, queued on the caller's stream
// like NCCL's kernels and carried out there by MPI (non-blocking calls polled so that
// ncclCommAbort can free a stream stuck in a collective). Buffers are the emulated device's
// host memory. f16 and bf16 are reduced in fp32 and rounded once (NCCL rounds at every ring
// step). A communicator is an MPI communicator split off MPI_COMM_WORLD by the unique id, so
// ncclCommInitRank is collective over every rank of MPI_COMM_WORLD, and MPI must be initialized
// with MPI_THREAD_MULTIPLE (streams are host threads).
#pragma once

#include <cstddef>

#include "cuda_runtime.h"

#define NCCL_MAJOR 0
#define NCCL_MINOR 0
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE 0
#define NCCL_UNIQUE_ID_BYTES 128

typedef struct ncclComm* ncclComm_t;
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

enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

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
};

ncclResult_t ncclGetVersion(int* version);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, std::size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, std::size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
// Point to point. Between ncclGroupStart and ncclGroupEnd they are only collected; ncclGroupEnd
// queues those of each stream as one operation that posts all of them before waiting for any
// (so a rank may send to and receive from its peers in one group, and to itself).
ncclResult_t ncclSend(const void* sendbuff, std::size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, std::size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
