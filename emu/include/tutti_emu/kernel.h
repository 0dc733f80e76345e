// The device side of the emulated CUDA device: what a kernel sees (threadIdx, blockIdx, ...),
// block and warp synchronization, warp functions, atomics, shared memory, and the launch
// that the build-time translation (emu/translate.py) puts where the sources write <<<...>>>.
//
// Execution model. A launch is an operation on its stream; when the stream's host thread
// reaches it, the blocks of the grid run one after another, and the threads of a block run as
// fibers on that host thread, switched only at synchronization points: __syncthreads and its
// variants, every warp function (__shfl*_sync, __ballot_sync, __any/__all_sync, __syncwarp).
// A thread runs until it reaches one; a warp function completes when every lane of its mask
// has reached it, a __syncthreads when every thread that has not exited has. Threads form
// warps of 32 lanes numbered with x varying fastest (linear id x + y·Dx + z·Dx·Dy), as CUDA
// does. Shared memory is per block and filled with 0xff bytes (nan for floats) when the block
// starts, so a read before the barrier that should precede it sees garbage, every time.
//
// Faults (compute-sanitizer's synccheck, as errors): a warp function whose mask names a lane
// that has exited, does not exist or is waiting elsewhere, a calling lane not in its mask,
// lanes of one mask calling different warp functions, a __syncthreads reached by the live
// threads at different places, and any state where no thread can go on. A fault ends the
// kernel, is printed to stderr with the kernel, block, thread and source line, and makes the
// device return cudaErrorLaunchFailure from then on, as a real kernel fault does.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tutti::emu {

// What a CUDA thread sees of itself; the scheduler points tls_context at the running thread's.
struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
// Initial-exec TLS: threadIdx and friends are one load, not a __tls_get_addr call.
#define TUTTI_EMU_TLS __attribute__((tls_model("initial-exec")))
extern TUTTI_EMU_TLS thread_local const ThreadContext* tls_context;
inline const ThreadContext& context() { return *tls_context; }

// ---- synchronization (implemented by the scheduler, emu/src/scheduler.cc) ----
enum class BlockReduce : int { none, any, all, count };
// Waits until every live thread of the block has arrived; returns the reduction of `predicate`
// over them (0 for BlockReduce::none).
int syncthreads(BlockReduce reduce, int predicate, std::source_location where);

enum class WarpOp : int { shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all, sync };
// Waits until every lane of `mask` has called the same warp function; returns this lane's
// result: the shuffled value, the ballot, the vote, or 0.
std::uint64_t warp_collective(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width,
                              std::source_location where);
// Lanes of the calling thread's warp that have not exited.
unsigned active_mask();

// Per-block storage of one __shared__ declaration (site: a unique address per declaration and
// template instantiation); 0xff-filled at the first call in each block.
void* shared_variable(const void* site, std::size_t size, std::size_t align, std::source_location where);
// The launch's dynamic shared memory (extern __shared__), 0xff-filled per block.
void* dynamic_shared_memory();

template <typename T>
T& block_shared(const void* site, std::source_location where = std::source_location::current()) {
  static_assert(std::is_trivially_destructible_v<T>, "a __shared__ variable must have a trivial destructor");
  constexpr std::size_t align = alignof(T) < 16 ? 16 : alignof(T);
  return *static_cast<T*>(shared_variable(site, sizeof(T), align, where));
}
template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_memory());
}

// ---- launches ----
struct LaunchConfig {
  dim3 grid, block;
  std::size_t shared_bytes;
  cudaStream_t stream;
  LaunchConfig(dim3 g, dim3 b, std::size_t s = 0, cudaStream_t st = nullptr)
      : grid(g), block(b), shared_bytes(s), stream(st) {}
};

// One launch's kernel and arguments; run_thread() runs the kernel for the current thread with
// its own copy of the arguments (kernel parameters are per-thread values in CUDA too).
class KernelBody {
 public:
  virtual ~KernelBody() = default;
  virtual void run_thread() const = 0;
};

template <typename F, typename Tuple>
class KernelClosure final : public KernelBody {
 public:
  KernelClosure(F f, Tuple args) : f_(std::move(f)), args_(std::move(args)) {}
  void run_thread() const override { std::apply(f_, args_); }

 private:
  F f_;
  Tuple args_;
};

// Checks the configuration against CUDA's limits (an invalid one sets the calling thread's last
// error, as a real launch does, and runs nothing) and queues the kernel on config.stream.
void launch(const LaunchConfig& config, const char* name, const char* file, int line, std::unique_ptr<KernelBody> body);

// What `kernel<<<config>>>(args...)` becomes: `body` is a lambda that calls the kernel with its
// arguments, so template arguments are deduced exactly as in the original call.
template <typename F, typename... Args>
void launch_kernel(const LaunchConfig& config, const char* name, const char* file, int line, F body, Args&&... args) {
  using Tuple = std::tuple<std::decay_t<Args>...>;
  launch(config, name, file, line,
         std::make_unique<KernelClosure<F, Tuple>>(std::move(body), Tuple(std::forward<Args>(args)...)));
}

template <typename T>
std::uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp functions move values of up to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T from_bits(std::uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

}  // namespace tutti::emu

// ---- the built-in variables ----
#define threadIdx (::tutti::emu::context().thread_idx)
#define blockIdx (::tutti::emu::context().block_idx)
#define blockDim (::tutti::emu::context().block_dim)
#define gridDim (::tutti::emu::context().grid_dim)
inline constexpr int warpSize = 32;

// ---- block synchronization ----
inline void __syncthreads(std::source_location where = std::source_location::current()) {
  ::tutti::emu::syncthreads(::tutti::emu::BlockReduce::none, 0, where);
}
inline int __syncthreads_or(int predicate, std::source_location where = std::source_location::current()) {
  return ::tutti::emu::syncthreads(::tutti::emu::BlockReduce::any, predicate, where);
}
inline int __syncthreads_and(int predicate, std::source_location where = std::source_location::current()) {
  return ::tutti::emu::syncthreads(::tutti::emu::BlockReduce::all, predicate, where);
}
inline int __syncthreads_count(int predicate, std::source_location where = std::source_location::current()) {
  return ::tutti::emu::syncthreads(::tutti::emu::BlockReduce::count, predicate, where);
}

// ---- warp functions ----
inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location where = std::source_location::current()) {
  ::tutti::emu::warp_collective(::tutti::emu::WarpOp::sync, mask, 0, 0, 32, where);
}
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
              std::source_location where = std::source_location::current()) {
  return ::tutti::emu::from_bits<T>(::tutti::emu::warp_collective(::tutti::emu::WarpOp::shfl_idx, mask,
                                                                  ::tutti::emu::to_bits(var), src_lane, width, where));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                 std::source_location where = std::source_location::current()) {
  return ::tutti::emu::from_bits<T>(::tutti::emu::warp_collective(
      ::tutti::emu::WarpOp::shfl_up, mask, ::tutti::emu::to_bits(var), static_cast<int>(delta), width, where));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                   std::source_location where = std::source_location::current()) {
  return ::tutti::emu::from_bits<T>(::tutti::emu::warp_collective(
      ::tutti::emu::WarpOp::shfl_down, mask, ::tutti::emu::to_bits(var), static_cast<int>(delta), width, where));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                  std::source_location where = std::source_location::current()) {
  return ::tutti::emu::from_bits<T>(::tutti::emu::warp_collective(::tutti::emu::WarpOp::shfl_xor, mask,
                                                                  ::tutti::emu::to_bits(var), lane_mask, width, where));
}
inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location where = std::source_location::current()) {
  return static_cast<unsigned>(
      ::tutti::emu::warp_collective(::tutti::emu::WarpOp::ballot, mask, predicate != 0, 0, 32, where));
}
inline int __any_sync(unsigned mask, int predicate, std::source_location where = std::source_location::current()) {
  return static_cast<int>(::tutti::emu::warp_collective(::tutti::emu::WarpOp::any, mask, predicate != 0, 0, 32, where));
}
inline int __all_sync(unsigned mask, int predicate, std::source_location where = std::source_location::current()) {
  return static_cast<int>(::tutti::emu::warp_collective(::tutti::emu::WarpOp::all, mask, predicate != 0, 0, 32, where));
}
inline unsigned __activemask() { return ::tutti::emu::active_mask(); }

// ---- atomics: real atomics, since kernels on different streams run on different host threads ----
template <typename T>
T atomicAdd(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}
template <typename T>
T atomicSub(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).fetch_sub(value);
}
template <typename T>
T atomicExch(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).exchange(value);
}
template <typename T>
T atomicCAS(T* address, std::type_identity_t<T> compare, std::type_identity_t<T> value) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value);
  return compare;
}
template <typename T>
T atomicMax(T* address, std::type_identity_t<T> value) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (old < value && !a.compare_exchange_weak(old, value)) {
  }
  return old;
}
template <typename T>
T atomicMin(T* address, std::type_identity_t<T> value) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (value < old && !a.compare_exchange_weak(old, value)) {
  }
  return old;
}
template <typename T>
T atomicAnd(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).fetch_and(value);
}
template <typename T>
T atomicOr(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).fetch_or(value);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
