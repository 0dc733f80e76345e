// The mpi backend's data paths (see mpi_backend.cc): MPI calls on the tensors' memory, halves
// reduced in fp32, GPU tensors staged through pinned host memory.
#include <algorithm>
#include <climits>
#include <cstring>

#include "comm/mpi_engine.h"
#include "core/gpu_runtime.h"
#include "core/mpi_check.h"

namespace tutti::detail::mpi_engine {
namespace {

constexpr std::int64_t kHalfChunk = std::int64_t{1} << 22;  // elements per fp32 round of halves
constexpr std::int64_t kMaxMpiCount = INT_MAX;

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f16: return MPI_UINT16_T;  // moved as bits; reductions go through fp32
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::avg: return MPI_SUM;  // then divided
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

int as_count(std::int64_t n, const char* what) {
  TUTTI_CHECK_ARG(n <= kMaxMpiCount, what, ": ", n, " elements per rank exceed what one MPI call can move (",
                  kMaxMpiCount, "); split the tensor");
  return static_cast<int>(n);
}

void half_to_float(DType d, const std::uint16_t* in, float* out, std::int64_t n) {
  if (d == DType::f16) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = half_bits_to_float(in[i]);
  } else {
    // bf16 is the top half of an fp32: exact by a shift.
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t bits = static_cast<std::uint32_t>(in[i]) << 16;
      std::memcpy(&out[i], &bits, sizeof bits);
    }
  }
}

void float_to_half(DType d, const float* in, std::uint16_t* out, std::int64_t n) {
  if (d == DType::f16) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_half_bits(in[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
  }
}

void divide(float* x, std::int64_t n, int by) {
  const float d = static_cast<float>(by);
  for (std::int64_t i = 0; i < n; ++i) x[i] /= d;
}

const char* byte_ptr(const Tensor& t) { return static_cast<const char*>(t.data()); }

bool overlap(const char* a, std::size_t a_bytes, const char* b, std::size_t b_bytes) {
  return a_bytes > 0 && b_bytes > 0 && a < b + b_bytes && b < a + a_bytes;
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return false;
  return overlap(byte_ptr(a), a.nbytes(), byte_ptr(b), b.nbytes());
}

}  // namespace

void Engine::run_host(const Communicator::Collective& c) {
  switch (c.info.kind) {
    case CollectiveKind::allreduce: return allreduce(c.input, c.output, c.info.op);
    case CollectiveKind::reduce_scatter: return reduce_scatter(c.input, c.output, c.info.op);
    case CollectiveKind::allgather: return allgather(c.input, c.output);
    case CollectiveKind::broadcast: return broadcast(c.input, c.output, c.info.root);
    case CollectiveKind::barrier: TUTTI_MPI_CHECK(MPI_Barrier(comm)); return;
    case CollectiveKind::sendrecv: return sendrecv(c.input, c.output, c.info);
  }
}

void Engine::allreduce(const Tensor& in, const Tensor& out, ReduceOp op) {
  const std::int64_t n = out.numel();
  const DType dt = out.dtype();
  if (is_half(dt)) {
    const std::int64_t chunk = std::min(n, kHalfChunk);
    if (static_cast<std::int64_t>(f32_a.size()) < chunk) f32_a.resize(static_cast<std::size_t>(chunk));
    const auto* src = static_cast<const std::uint16_t*>(in.data());
    auto* dst = static_cast<std::uint16_t*>(out.data());
    for (std::int64_t off = 0; off < n || (n == 0 && off == 0); off += chunk) {
      const std::int64_t m = std::min(chunk, n - off);
      half_to_float(dt, src + off, f32_a.data(), m);
      if (band != nullptr) {
        allreduce_in_band(*band, rank, size, f32_a.data(), f32_a.data(), m, DType::f32, op, scratch);
      } else {
        TUTTI_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, f32_a.data(), static_cast<int>(m), MPI_FLOAT, mpi_op(op), comm));
      }
      if (op == ReduceOp::avg) divide(f32_a.data(), m, size);
      float_to_half(dt, f32_a.data(), dst + off, m);
      if (n == 0) break;
    }
    return;
  }
  // The hot path of small collectives: the pointers and sizes are read once.
  const std::int64_t es = static_cast<std::int64_t>(size_of(dt));
  char* const out_ptr = static_cast<char*>(out.data());
  const char* const in_ptr = byte_ptr(in);
  const std::size_t bytes = static_cast<std::size_t>(n * es);
  const bool in_place = in_ptr == out_ptr;
  if (band != nullptr) {
    const bool apart = in_place || !overlap(in_ptr, bytes, out_ptr, bytes);
    if (!apart) std::memmove(out_ptr, in_ptr, bytes);
    allreduce_in_band(*band, rank, size, apart ? in_ptr : out_ptr, out_ptr, n, dt, op, scratch);
    if (op == ReduceOp::avg) divide(static_cast<float*>(out.data()), n, size);
    return;
  }
  const bool overlapping = !in_place && overlap(in_ptr, bytes, out_ptr, bytes);
  if (overlapping) std::memmove(out_ptr, in_ptr, bytes);
  const bool use_in_place = in_place || overlapping;
  const MPI_Datatype type = mpi_type(dt);
  const std::int64_t chunk = kMaxMpiCount / 2;
  for (std::int64_t off = 0; off < n || (n == 0 && off == 0); off += chunk) {
    const std::int64_t m = std::min(chunk, n - off);
    char* o = out_ptr + off * es;
    const void* i = use_in_place ? MPI_IN_PLACE : in_ptr + off * es;
    TUTTI_MPI_CHECK(MPI_Allreduce(i, o, static_cast<int>(m), type, mpi_op(op), comm));
    if (n == 0) break;
  }
  if (op == ReduceOp::avg) divide(static_cast<float*>(out.data()), n, size);  // f32 (ints refused)
}

void Engine::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  const std::int64_t n = out.numel();
  const int count = as_count(n, "reduce_scatter");
  const DType dt = out.dtype();
  if (is_half(dt)) {
    const std::int64_t total = in.numel();
    if (static_cast<std::int64_t>(f32_a.size()) < total) f32_a.resize(static_cast<std::size_t>(total));
    if (static_cast<std::int64_t>(f32_b.size()) < n) f32_b.resize(static_cast<std::size_t>(n));
    half_to_float(dt, static_cast<const std::uint16_t*>(in.data()), f32_a.data(), total);
    TUTTI_MPI_CHECK(MPI_Reduce_scatter_block(f32_a.data(), f32_b.data(), count, MPI_FLOAT, mpi_op(op), comm));
    if (op == ReduceOp::avg) divide(f32_b.data(), n, size);
    float_to_half(dt, f32_b.data(), static_cast<std::uint16_t*>(out.data()), n);
    return;
  }
  if (overlap(in, out)) {
    // In place (ZeRO's reducer, every bucket of every step): MPI may not read and write the same
    // buffer; reduce into the engine's scratch, kept between calls.
    if (scratch.size() < static_cast<std::size_t>(out.nbytes())) scratch.resize(static_cast<std::size_t>(out.nbytes()));
    TUTTI_MPI_CHECK(MPI_Reduce_scatter_block(in.data(), scratch.data(), count, mpi_type(dt), mpi_op(op), comm));
    std::memcpy(out.data(), scratch.data(), out.nbytes());
  } else {
    TUTTI_MPI_CHECK(MPI_Reduce_scatter_block(in.data(), out.data(), count, mpi_type(dt), mpi_op(op), comm));
  }
  if (op == ReduceOp::avg) divide(static_cast<float*>(out.data()), n, size);
}

void Engine::allgather(const Tensor& in, const Tensor& out) {
  const int count = as_count(in.numel(), "allgather");
  const MPI_Datatype type = mpi_type(in.dtype());
  const char* my_chunk = byte_ptr(out) + static_cast<std::size_t>(rank) * in.nbytes();
  if (in.nbytes() > 0 && byte_ptr(in) == my_chunk) {
    TUTTI_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, count, type, out.data(), count, type, comm));
  } else if (overlap(in, out)) {
    const std::vector<char> copy(byte_ptr(in), byte_ptr(in) + in.nbytes());
    TUTTI_MPI_CHECK(MPI_Allgather(copy.data(), count, type, out.data(), count, type, comm));
  } else {
    TUTTI_MPI_CHECK(MPI_Allgather(in.data(), count, type, out.data(), count, type, comm));
  }
}

void Engine::broadcast(const Tensor& in, const Tensor& out, int root) {
  if (rank == root && in.data() != out.data()) std::memmove(out.data(), in.data(), out.nbytes());
  const std::int64_t n = out.numel();
  const std::size_t es = size_of(out.dtype());
  const std::int64_t chunk = kMaxMpiCount / 2;
  for (std::int64_t off = 0; off < n || (n == 0 && off == 0); off += chunk) {
    const std::int64_t m = std::min(chunk, n - off);
    TUTTI_MPI_CHECK(MPI_Bcast(static_cast<char*>(out.data()) + off * static_cast<std::int64_t>(es), static_cast<int>(m),
                              mpi_type(out.dtype()), root, comm));
    if (n == 0) break;
  }
}

// Moves bits, no conversion. The tag is the sequence number (mod the smallest tag bound MPI
// guarantees), so that a message left unmatched by inconsistent peers cannot be taken by a
// later sendrecv. A message shorter than the output (a count that differs below the agreement's
// threshold) fails here; a longer one fails in MPI (MPI_ERR_TRUNCATE).
void Engine::sendrecv(const Tensor& in, const Tensor& out, const CollectiveInfo& info) {
  const int count = as_count(out.numel(), "sendrecv");
  if (info.send_to == rank) {
    std::memcpy(out.data(), in.data(), out.nbytes());
    return;
  }
  const MPI_Datatype type = mpi_type(out.dtype());
  const int tag = static_cast<int>(info.seq % 32768);
  MPI_Status status;
  TUTTI_MPI_CHECK(MPI_Sendrecv(in.data(), count, type, info.send_to, tag, out.data(), count, type, info.recv_from, tag,
                               comm, &status));
  int received = 0;
  TUTTI_MPI_CHECK(MPI_Get_count(&status, type, &received));
  TUTTI_CHECK_ARG(received == count, "sendrecv: rank ", rank, " received ", received, " elements from rank ",
                  info.recv_from, " but expected ", count, " (every rank must pass the same count)");
}

// GPU tensors: one pinned host buffer holds host twins of input and output. Where the two
// overlap (the in-place forms) the twins overlap the same way, so the CPU path sees the same
// aliasing as the caller's tensors.
void Engine::run_staged(Op& op) {
  const auto& c = op.c;
  if (c.info.kind == CollectiveKind::barrier) return run_host(c);
  if (op.input_ready) op.input_ready->synchronize();
  if (!staging.device().is_cuda()) staging = Stream::create(c.output.device(), /*high_priority=*/true);

  const Tensor& in = c.input;
  const Tensor& out = c.output;
  const char* lo = byte_ptr(out);
  const char* hi = byte_ptr(out) + out.nbytes();
  const bool shared = in.defined() && (overlap(in, out) || in.data() == out.data());
  if (shared) {
    lo = std::min(lo, byte_ptr(in));
    hi = std::max(hi, byte_ptr(in) + in.nbytes());
  }
  const std::size_t span = static_cast<std::size_t>(hi - lo);
  const std::size_t in_bytes = (in.defined() && !shared) ? in.nbytes() : 0;
  const std::size_t need = span + in_bytes + 64;
  if (!pinned || pinned->nbytes() < need) pinned = Storage::allocate(need, Device::cpu(), /*pinned=*/true);
  char* base = static_cast<char*>(pinned->data());
  auto twin = [&](const Tensor& t, char* at) { return Tensor::wrap(at, t.shape(), t.dtype(), Device::cpu()); };

  Tensor host_out = twin(out, base + (byte_ptr(out) - lo));
  Tensor host_in;
  if (shared) {
    host_in = twin(in, base + (byte_ptr(in) - lo));
    gpu::memcpy_async(base, lo, span, staging.native());
  } else if (in.defined()) {
    char* at = base + ((span + 63) / 64) * 64;
    host_in = twin(in, at);
    gpu::memcpy_async(at, in.data(), in.nbytes(), staging.native());
  }
  staging.synchronize();
  run_host(Communicator::Collective{c.info, host_in, host_out, Stream()});
  gpu::memcpy_async(out.data(), host_out.data(), out.nbytes(), staging.native());
  staging.synchronize();
}

}  // namespace tutti::detail::mpi_engine
