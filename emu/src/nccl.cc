// NCCL on the emulated device, over MPI (see emu/include/nccl.h for the contract).
#include "nccl.h"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "runtime.h"

namespace tutti::emu {
namespace {

// What queued collectives share with the handle: it outlives an abort or destroy while a
// collective still runs.
struct CommState {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::atomic<bool> aborted{false};
  std::mutex mutex;
  ncclResult_t async_error = ncclSuccess;
  std::string last_error;

  void fail(ncclResult_t r, const std::string& why) {
    std::lock_guard l(mutex);
    if (async_error == ncclSuccess) {
      async_error = r;
      last_error = why;
    }
  }
};

}  // namespace
}  // namespace tutti::emu

struct ncclComm {
  std::shared_ptr<tutti::emu::CommState> state;
};

namespace tutti::emu {
namespace {

thread_local std::string init_error;  // ncclGetLastError(nullptr)

bool is_half(ncclDataType_t t) { return t == ncclFloat16 || t == ncclBfloat16; }

std::size_t size_of(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

// The MPI type a buffer travels as (halves travel widened to fp32).
MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat16:
    case ncclBfloat16:
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
    case ncclAvg: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// A buffer as it travels: halves widened to fp32 in a copy, everything else in place.
struct Wire {
  ncclDataType_t type;
  std::size_t count;
  void* device;
  std::vector<float> wide;

  Wire(ncclDataType_t t, std::size_t n, const void* p, bool load) : type(t), count(n), device(const_cast<void*>(p)) {
    if (!is_half(t)) return;
    wide.resize(n);
    if (!load) return;
    for (std::size_t i = 0; i < n; ++i) {
      wide[i] = t == ncclFloat16 ? static_cast<float>(static_cast<const __half*>(p)[i])
                                 : static_cast<float>(static_cast<const __nv_bfloat16*>(p)[i]);
    }
  }
  void* data() { return is_half(type) ? static_cast<void*>(wide.data()) : device; }
  // Divides by `n` (ncclAvg) and writes halves back, rounding once.
  void finish(int divide_by) {
    if (divide_by > 1) {
      if (is_half(type) || type == ncclFloat32) {
        float* f = is_half(type) ? wide.data() : static_cast<float*>(device);
        for (std::size_t i = 0; i < count; ++i) f[i] /= static_cast<float>(divide_by);
      } else if (type == ncclFloat64) {
        auto* d = static_cast<double*>(device);
        for (std::size_t i = 0; i < count; ++i) d[i] /= divide_by;
      }
    }
    if (!is_half(type)) return;
    for (std::size_t i = 0; i < count; ++i) {
      if (type == ncclFloat16) {
        static_cast<__half*>(device)[i] = __half(wide[i]);
      } else {
        static_cast<__nv_bfloat16*>(device)[i] = __nv_bfloat16(wide[i]);
      }
    }
  }
};

// Waits for `request`, giving up when the communicator is aborted.
void complete(CommState& c, MPI_Request& request, int mpi_result, const char* what) {
  if (mpi_result != MPI_SUCCESS) {
    c.fail(ncclSystemError, std::string(what) + ": MPI error " + std::to_string(mpi_result));
    return;
  }
  for (int spins = 0;; ++spins) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      c.fail(ncclSystemError, std::string(what) + ": MPI_Test failed");
      return;
    }
    if (done) return;
    if (c.aborted.load()) {
      c.fail(ncclInvalidUsage, std::string(what) + " abandoned: the communicator was aborted");
      return;  // the request is left behind, as the aborted comm is
    }
    if (spins < 100) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// A send or receive of ncclSend/ncclRecv, collected while a group is open.
struct P2p {
  bool send;
  void* buffer;
  int bytes;
  int peer;
  std::shared_ptr<CommState> comm;
  std::shared_ptr<Stream> stream;
};

thread_local int group_depth = 0;     // ncclGroupStart minus ncclGroupEnd on this thread
thread_local std::vector<P2p> group;  // what the open group collected

constexpr int kTagP2p = 7;

// Posts every transfer, then waits for each: a send never waits for a receive of its group.
void run_p2p(const std::vector<P2p>& ops) {
  std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
  std::vector<int> results(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2p& o = ops[i];
    results[i] = o.send ? MPI_Isend(o.buffer, o.bytes, MPI_BYTE, o.peer, kTagP2p, o.comm->mpi, &requests[i])
                        : MPI_Irecv(o.buffer, o.bytes, MPI_BYTE, o.peer, kTagP2p, o.comm->mpi, &requests[i]);
  }
  for (std::size_t i = 0; i < ops.size(); ++i) {
    complete(*ops[i].comm, requests[i], results[i], ops[i].send ? "ncclSend" : "ncclRecv");
  }
}

// Queues `ops` as one operation per stream.
void launch_p2p(std::vector<P2p> ops) {
  while (!ops.empty()) {
    const std::shared_ptr<Stream> stream = ops.front().stream;
    std::vector<P2p> mine;
    std::vector<P2p> rest;
    for (P2p& o : ops) (o.stream == stream ? mine : rest).push_back(std::move(o));
    enqueue(stream, [mine = std::move(mine)] { run_p2p(mine); });
    ops = std::move(rest);
  }
}

ncclResult_t check_call(ncclComm_t comm, ncclDataType_t type, cudaStream_t stream, std::shared_ptr<Stream>& s) {
  if (comm == nullptr || !comm->state) return ncclInvalidArgument;
  if (size_of(type) == 0) return ncclInvalidArgument;
  if (comm->state->aborted.load()) return ncclInvalidUsage;
  if (sticky_error() != cudaSuccess) return ncclUnhandledCudaError;
  s = stream_of(stream);
  return s ? ncclSuccess : ncclInvalidArgument;
}

}  // namespace
}  // namespace tutti::emu

using namespace tutti::emu;

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclNumResults: break;
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm == nullptr || !comm->state) return init_error.c_str();
  std::lock_guard l(comm->state->mutex);
  return comm->state->last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<unsigned> counter{0};
  std::memset(id->internal, 0, sizeof id->internal);
  const long pid = static_cast<long>(getpid());
  const long long t = std::chrono::steady_clock::now().time_since_epoch().count();
  std::snprintf(id->internal, sizeof id->internal, "tutti-emu-nccl:%ld:%lld:%u", pid, t, counter++);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int initialized = 0, thread_level = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    init_error = "the emulated NCCL runs over MPI, and MPI is not initialized";
    return ncclSystemError;
  }
  MPI_Query_thread(&thread_level);
  if (thread_level < MPI_THREAD_MULTIPLE) {
    init_error = "the emulated NCCL needs MPI_THREAD_MULTIPLE (its streams are host threads)";
    return ncclSystemError;
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  // The communicator of everyone who brought this id: FNV-1a of the id is the split color.
  std::uint32_t color = 2166136261u;
  for (char ch : id.internal) color = (color ^ static_cast<unsigned char>(ch)) * 16777619u;
  auto state = std::make_shared<CommState>();
  if (MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(color & 0x7fffffff), rank, &state->mpi) != MPI_SUCCESS) {
    init_error = "MPI_Comm_split of MPI_COMM_WORLD failed";
    return ncclSystemError;
  }
  MPI_Comm_set_errhandler(state->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(state->mpi, &state->rank);
  MPI_Comm_size(state->mpi, &state->size);
  if (state->size != nranks || state->rank != rank) {
    init_error = "ncclCommInitRank: " + std::to_string(state->size) + " ranks brought this id, expected " +
                 std::to_string(nranks);
    MPI_Comm_free(&state->mpi);
    return ncclInvalidUsage;
  }
  *comm = new ncclComm{std::move(state)};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  // Queued collectives keep the state (and its MPI communicator) alive; it is freed with the
  // last of them only if MPI is still up.
  auto state = std::move(comm->state);
  delete comm;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && state.use_count() == 1 && state->mpi != MPI_COMM_NULL) MPI_Comm_free(&state->mpi);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  comm->state->aborted.store(true);
  comm->state->fail(ncclInvalidUsage, "the communicator was aborted");
  delete comm;  // a collective still running gives up at its next poll
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || !comm->state) return ncclInvalidArgument;
  std::lock_guard l(comm->state->mutex);
  *async_error = comm->state->async_error;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (comm == nullptr) return ncclInvalidArgument;
  *count = comm->state->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth == 0 && !group.empty()) {
    std::vector<P2p> ops = std::move(group);
    group.clear();
    launch_p2p(std::move(ops));
  }
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<Stream> s;
  if (const ncclResult_t r = check_call(comm, datatype, stream, s); r != ncclSuccess) return r;
  auto c = comm->state;
  enqueue(s, [=] {
    // In place, the input is what recvbuff holds.
    const bool in_place = sendbuff == recvbuff;
    Wire out(datatype, count, recvbuff, in_place);
    Wire in(datatype, in_place ? 0 : count, sendbuff, !in_place);
    const void* send = in_place ? MPI_IN_PLACE : in.data();
    MPI_Request request;
    const int rc =
        MPI_Iallreduce(send, out.data(), static_cast<int>(count), mpi_type(datatype), mpi_op(op), c->mpi, &request);
    complete(*c, request, rc, "ncclAllReduce");
    out.finish(op == ncclAvg ? c->size : 1);
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, std::size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<Stream> s;
  if (const ncclResult_t r = check_call(comm, datatype, stream, s); r != ncclSuccess) return r;
  auto c = comm->state;
  enqueue(s, [=] {
    const std::size_t total = recvcount * static_cast<std::size_t>(c->size);
    Wire in(datatype, total, sendbuff, true);
    // NCCL allows the in-place form, recvbuff = sendbuff + rank * recvcount; MPI forbids
    // overlapping send and receive buffers, so such an output is received into a copy first.
    const std::size_t es = size_of(datatype);
    const char* send_lo = static_cast<const char*>(sendbuff);
    const char* recv_lo = static_cast<const char*>(recvbuff);
    const bool overlapping = !is_half(datatype) && recv_lo < send_lo + total * es && send_lo < recv_lo + recvcount * es;
    std::vector<char> scratch(overlapping ? recvcount * es : 0);
    Wire out(datatype, recvcount, overlapping ? static_cast<void*>(scratch.data()) : recvbuff, false);
    MPI_Request request;
    const int rc = MPI_Ireduce_scatter_block(in.data(), out.data(), static_cast<int>(recvcount), mpi_type(datatype),
                                             mpi_op(op), c->mpi, &request);
    complete(*c, request, rc, "ncclReduceScatter");
    out.finish(op == ncclAvg ? c->size : 1);
    if (overlapping) std::memcpy(recvbuff, scratch.data(), scratch.size());
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, std::size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<Stream> s;
  if (const ncclResult_t r = check_call(comm, datatype, stream, s); r != ncclSuccess) return r;
  auto c = comm->state;
  enqueue(s, [=] {
    // Moved as bytes: a gather needs no arithmetic, so halves need no widening.
    const std::size_t bytes = sendcount * size_of(datatype);
    const bool in_place = static_cast<const char*>(sendbuff) == static_cast<char*>(recvbuff) + c->rank * bytes;
    MPI_Request request;
    const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : sendbuff, static_cast<int>(bytes), MPI_BYTE, recvbuff,
                                  static_cast<int>(bytes), MPI_BYTE, c->mpi, &request);
    complete(*c, request, rc, "ncclAllGather");
  });
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<Stream> s;
  if (const ncclResult_t r = check_call(comm, datatype, stream, s); r != ncclSuccess) return r;
  auto c = comm->state;
  if (root < 0 || root >= c->size) return ncclInvalidArgument;
  enqueue(s, [=] {
    const std::size_t bytes = count * size_of(datatype);
    if (c->rank == root && sendbuff != recvbuff) std::memcpy(recvbuff, sendbuff, bytes);
    MPI_Request request;
    const int rc = MPI_Ibcast(recvbuff, static_cast<int>(bytes), MPI_BYTE, root, c->mpi, &request);
    complete(*c, request, rc, "ncclBroadcast");
  });
  return ncclSuccess;
}

namespace {
ncclResult_t point_to_point(bool send, const void* buffer, std::size_t count, ncclDataType_t datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<Stream> s;
  if (const ncclResult_t r = check_call(comm, datatype, stream, s); r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->state->size) return ncclInvalidArgument;
  const std::size_t bytes = count * size_of(datatype);
  if (bytes > static_cast<std::size_t>(INT_MAX)) return ncclInvalidArgument;
  P2p op{send, const_cast<void*>(buffer), static_cast<int>(bytes), peer, comm->state, std::move(s)};
  if (group_depth > 0) {
    group.push_back(std::move(op));
  } else {
    launch_p2p({std::move(op)});
  }
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclSend(const void* sendbuff, std::size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point(true, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, std::size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point(false, recvbuff, count, datatype, peer, comm, stream);
}
