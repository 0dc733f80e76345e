// CUDA's documented semantics, checked on whatever runs this: built by nvcc it runs on a GPU
// (cuda_semantics_test, skipped without one), translated it runs on the emulated device
// (cuda_semantics_test_emu). The expected values are computed here on the host from the CUDA
// C++ Programming Guide's definitions, so a GPU run is the check that the emulation and the
// definitions written here agree with the hardware.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "tutti/core/dtype.h"

namespace {

#define CHECK_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define REQUIRE_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device visible"

// Device buffer of n T, freed at scope exit; to_host() copies it back.
template <typename T>
struct Buffer {
  T* ptr = nullptr;
  std::size_t n;
  explicit Buffer(std::size_t count, int fill = 0) : n(count) {
    EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr, fill, n * sizeof(T)), cudaSuccess);
  }
  ~Buffer() { cudaFree(ptr); }
  std::vector<T> to_host() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// ---- warps: lanes numbered x-fastest ----

// Each thread writes the linear id of lane 0 of its warp and of the next lane (blocks of whole
// warps).
__global__ void warp_layout_kernel(int* leader, int* next) {
  const int linear = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
  leader[linear] = __shfl_sync(0xffffffffu, linear, 0);
  next[linear] = __shfl_sync(0xffffffffu, linear, (linear + 1) % 32);
}

TEST(CudaSemantics, WarpsAreFormedWithXVaryingFastest) {
  REQUIRE_DEVICE();
  for (const dim3 block : {dim3(64), dim3(16, 4), dim3(8, 4, 2), dim3(4, 8, 2)}) {
    const int n = static_cast<int>(block.x * block.y * block.z);
    Buffer<int> leader(n, 0xff), next(n, 0xff);
    warp_layout_kernel<<<1, block>>>(leader.ptr, next.ptr);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    const auto l = leader.to_host(), nx = next.to_host();
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(l[i], (i / 32) * 32) << "block " << block.x << "x" << block.y << "x" << block.z << " thread " << i;
      EXPECT_EQ(nx[i], (i / 32) * 32 + (i % 32 + 1) % 32) << "thread " << i;
    }
  }
}

// ---- shuffles, with widths ----

__global__ void shuffle_kernel(int width, int* idx, int* up, int* down, int* xr) {
  const int lane = threadIdx.x % 32;
  const int v = 100 + lane;
  idx[lane] = __shfl_sync(0xffffffffu, v, lane + 3, width);
  up[lane] = __shfl_up_sync(0xffffffffu, v, 3, width);
  down[lane] = __shfl_down_sync(0xffffffffu, v, 3, width);
  xr[lane] = __shfl_xor_sync(0xffffffffu, v, 5, width);
}

TEST(CudaSemantics, ShufflesFollowTheProgrammingGuide) {
  REQUIRE_DEVICE();
  for (int width : {32, 16, 8, 4, 2}) {
    Buffer<int> idx(32), up(32), down(32), xr(32);
    shuffle_kernel<<<1, 32>>>(width, idx.ptr, up.ptr, down.ptr, xr.ptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    const auto a = idx.to_host(), b = up.to_host(), c = down.to_host(), d = xr.to_host();
    for (int lane = 0; lane < 32; ++lane) {
      const int start = lane / width * width;  // the lane's segment of `width` lanes
      EXPECT_EQ(a[lane], 100 + start + (lane + 3) % width) << "shfl width " << width << " lane " << lane;
      EXPECT_EQ(b[lane], 100 + (lane - 3 >= start ? lane - 3 : lane)) << "shfl_up width " << width << " lane " << lane;
      EXPECT_EQ(c[lane], 100 + (lane + 3 < start + width ? lane + 3 : lane))
          << "shfl_down width " << width << " lane " << lane;
      const int x = lane ^ 5;  // a later segment returns the caller's own value
      EXPECT_EQ(d[lane], 100 + (x < start + width ? x : lane)) << "shfl_xor width " << width << " lane " << lane;
    }
  }
}

// 64-bit values and floats travel whole.
__global__ void shuffle_types_kernel(long long* wide, double* real) {
  const int lane = threadIdx.x;
  wide[lane] = __shfl_xor_sync(0xffffffffu, (1LL << 40) + lane, 1);
  real[lane] = __shfl_down_sync(0xffffffffu, 0.5 + lane, 1);
}

TEST(CudaSemantics, ShufflesMoveEightByteValues) {
  REQUIRE_DEVICE();
  Buffer<long long> wide(32);
  Buffer<double> real(32);
  shuffle_types_kernel<<<1, 32>>>(wide.ptr, real.ptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto w = wide.to_host();
  const auto r = real.to_host();
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(w[lane], (1LL << 40) + (lane ^ 1));
    EXPECT_EQ(r[lane], 0.5 + (lane < 31 ? lane + 1 : lane));
  }
}

// ---- votes, with partial masks ----

__global__ void vote_kernel(unsigned* ballot, int* any, int* all, unsigned* half_ballot) {
  const int lane = threadIdx.x;
  const int pred = lane % 3 == 0;
  ballot[lane] = __ballot_sync(0xffffffffu, pred);
  any[lane] = __any_sync(0xffffffffu, lane == 17);
  all[lane] = __all_sync(0xffffffffu, lane < 32) + 2 * __all_sync(0xffffffffu, lane < 31);
  if (lane < 16) half_ballot[lane] = __ballot_sync(0x0000ffffu, lane >= 8);
}

TEST(CudaSemantics, VotesCoverTheLanesOfTheMask) {
  REQUIRE_DEVICE();
  Buffer<unsigned> ballot(32), half(16);
  Buffer<int> any(32), all(32);
  vote_kernel<<<1, 32>>>(ballot.ptr, any.ptr, all.ptr, half.ptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  unsigned expected = 0;
  for (int l = 0; l < 32; l += 3) expected |= 1u << l;
  for (unsigned v : ballot.to_host()) EXPECT_EQ(v, expected);
  for (int v : any.to_host()) EXPECT_EQ(v, 1);
  for (int v : all.to_host()) EXPECT_EQ(v, 1);  // all lanes < 32: true; all lanes < 31: false
  for (unsigned v : half.to_host()) EXPECT_EQ(v, 0x0000ff00u);
}

// ---- __syncwarp orders the lanes it names ----

__global__ void syncwarp_kernel(int* out) {
  __shared__ int slot[64];
  __shared__ int pairs[64];
  const int t = threadIdx.x;
  slot[t] = 3 * t;
  __syncwarp();
  out[t] = slot[t ^ 1];  // written by the neighbouring lane before it reached __syncwarp
  if (t % 32 < 16) {
    pairs[t] = 5 * t;
    __syncwarp(0x0000ffffu);  // only the lanes that took the branch
    out[64 + t] = pairs[t ^ 2];
  }
}

TEST(CudaSemantics, SyncwarpOrdersTheLanesOfItsMask) {
  REQUIRE_DEVICE();
  Buffer<int> out(128);
  syncwarp_kernel<<<1, 64>>>(out.ptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto v = out.to_host();
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(v[t], 3 * (t ^ 1)) << t;
    if (t % 32 < 16) EXPECT_EQ(v[64 + t], 5 * (t ^ 2)) << t;
  }
}

// ---- the multiprocessor count (on the emulated device, TUTTI_EMU_SM_COUNT) ----

TEST(CudaSemantics, MultiprocessorCount) {
  REQUIRE_DEVICE();
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  EXPECT_GT(sms, 0);
  if (const char* emulated = std::getenv("TUTTI_EMU_SM_COUNT")) EXPECT_EQ(sms, std::atoi(emulated));
}

// ---- block barriers and their reductions ----

__global__ void barrier_vote_kernel(int* out) {
  const int t = threadIdx.x;
  out[0 * blockDim.x + t] = __syncthreads_count(t % 5 == 0);
  out[1 * blockDim.x + t] = __syncthreads_or(t == 77);
  out[2 * blockDim.x + t] = __syncthreads_and(t < 1000);
  out[3 * blockDim.x + t] = __syncthreads_and(t != 5);
}

TEST(CudaSemantics, SyncthreadsReductions) {
  REQUIRE_DEVICE();
  const int n = 200;
  Buffer<int> out(4 * n);
  barrier_vote_kernel<<<1, n>>>(out.ptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto v = out.to_host();
  for (int t = 0; t < n; ++t) {
    EXPECT_EQ(v[t], 40);
    EXPECT_NE(v[n + t], 0);
    EXPECT_NE(v[2 * n + t], 0);
    EXPECT_EQ(v[3 * n + t], 0);
  }
}

// ---- shared memory: static and dynamic, one copy per block ----

__global__ void shared_reverse_kernel(const int* in, int* out, int* block_seen) {
  __shared__ int tag;
  extern __shared__ int tile[];
  const int t = threadIdx.x, n = blockDim.x;
  if (t == 0) tag = blockIdx.x;
  tile[t] = in[blockIdx.x * n + t];
  __syncthreads();
  out[blockIdx.x * n + t] = tile[n - 1 - t];
  if (t == n - 1) block_seen[blockIdx.x] = tag;
}

TEST(CudaSemantics, SharedMemoryIsPerBlock) {
  REQUIRE_DEVICE();
  const int blocks = 5, n = 96;
  std::vector<int> host(blocks * n);
  std::iota(host.begin(), host.end(), 7);
  Buffer<int> in(host.size()), out(host.size()), seen(blocks);
  CHECK_CUDA(cudaMemcpy(in.ptr, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
  shared_reverse_kernel<<<blocks, n, n * sizeof(int)>>>(in.ptr, out.ptr, seen.ptr);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto o = out.to_host(), s = seen.to_host();
  for (int b = 0; b < blocks; ++b) {
    EXPECT_EQ(s[b], b);
    for (int t = 0; t < n; ++t) EXPECT_EQ(o[b * n + t], host[b * n + n - 1 - t]);
  }
}

// ---- threads that return stay finished; the others go on through barriers ----

__global__ void early_exit_kernel(int* out, int live) {
  __shared__ int sum;
  const int t = threadIdx.x;
  if (t >= live) return;
  if (t == 0) sum = 0;
  __syncthreads();
  atomicAdd(&sum, t);
  __syncthreads();
  if (t == 0) out[0] = sum;
  out[1 + t] = 1;
}

TEST(CudaSemantics, ThreadsThatReturnStayFinished) {
  REQUIRE_DEVICE();
  const int live = 40, n = 128;
  Buffer<int> out(1 + n);
  early_exit_kernel<<<1, n>>>(out.ptr, live);
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto v = out.to_host();
  EXPECT_EQ(v[0], live * (live - 1) / 2);
  for (int t = 0; t < n; ++t) EXPECT_EQ(v[1 + t], t < live ? 1 : 0) << t;
}

// ---- atomics over a grid ----

__global__ void atomics_kernel(int* i, unsigned* u, unsigned long long* ull, float* f, double* d, int* mx, int* mn,
                               int* cas_winners, int* cas_flag) {
  const int id = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(i, 1);
  atomicAdd(u, 2u);
  atomicAdd(ull, 1ull << 33);
  atomicAdd(f, 1.0f);
  atomicAdd(d, 0.25);
  atomicMax(mx, (id * 7919) % 10007);
  atomicMin(mn, (id * 7919) % 10007 - 5000);
  if (atomicCAS(cas_flag, 0, id + 1) == 0) atomicAdd(cas_winners, 1);
}

TEST(CudaSemantics, AtomicsAreExact) {
  REQUIRE_DEVICE();
  const int blocks = 24, n = 128, total = blocks * n;
  Buffer<int> i(1), mx(1), mn(1), winners(1), flag(1);
  Buffer<unsigned> u(1);
  Buffer<unsigned long long> ull(1);
  Buffer<float> f(1);
  Buffer<double> d(1);
  const int big = 1 << 30;
  CHECK_CUDA(cudaMemcpy(mn.ptr, &big, sizeof big, cudaMemcpyHostToDevice));
  atomics_kernel<<<blocks, n>>>(i.ptr, u.ptr, ull.ptr, f.ptr, d.ptr, mx.ptr, mn.ptr, winners.ptr, flag.ptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  int want_max = 0, want_min = big;
  for (int id = 0; id < total; ++id) {
    want_max = std::max(want_max, (id * 7919) % 10007);
    want_min = std::min(want_min, (id * 7919) % 10007 - 5000);
  }
  EXPECT_EQ(i.to_host()[0], total);
  EXPECT_EQ(u.to_host()[0], 2u * total);
  EXPECT_EQ(ull.to_host()[0], static_cast<unsigned long long>(total) << 33);
  EXPECT_EQ(f.to_host()[0], static_cast<float>(total));
  EXPECT_EQ(d.to_host()[0], 0.25 * total);
  EXPECT_EQ(mx.to_host()[0], want_max);
  EXPECT_EQ(mn.to_host()[0], want_min);
  EXPECT_EQ(winners.to_host()[0], 1);
  EXPECT_GT(flag.to_host()[0], 0);
}

// ---- half and bfloat16: round to nearest even, as tutti's host conversions ----

__global__ void to_half_kernel(const float* in, unsigned short* h, unsigned short* b, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    h[i] = __half_as_ushort(__float2half_rn(in[i]));
    b[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  }
}

__global__ void from_half_kernel(float* h, float* b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  h[i] = __half2float(__ushort_as_half(static_cast<unsigned short>(i)));
  b[i] = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(i)));
}

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; }

TEST(CudaSemantics, HalfConversionsRoundToNearestEven) {
  REQUIRE_DEVICE();
  // Every half and bfloat16 bit pattern to float, exactly.
  Buffer<float> h(65536), b(65536);
  from_half_kernel<<<256, 256>>>(h.ptr, b.ptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto hv = h.to_host(), bv = b.to_host();
  for (int i = 0; i < 65536; ++i) {
    ASSERT_TRUE(same_value(hv[i], tutti::half_bits_to_float(static_cast<std::uint16_t>(i)))) << "half bits " << i;
    ASSERT_TRUE(same_value(bv[i], tutti::bf16_bits_to_float(static_cast<std::uint16_t>(i)))) << "bf16 bits " << i;
  }
  // Floats to half and bfloat16: ties, subnormals, overflow, infinities, and random bit patterns.
  std::vector<float> in = {0.0f,
                           -0.0f,
                           1.0f,
                           1.00048828125f,
                           1.00146484375f,
                           65504.0f,
                           65519.0f,
                           65520.0f,
                           1e9f,
                           -1e9f,
                           5.96046448e-8f,
                           2.98023224e-8f,
                           2.98023225e-8f,
                           6.1035156e-5f,
                           1.0f + 1.0f / 256,
                           1.0f + 3.0f / 256,
                           3.4e38f,
                           INFINITY,
                           -INFINITY};
  std::mt19937 rng(7);
  while (in.size() < 200000) {
    const std::uint32_t bits = static_cast<std::uint32_t>(rng());
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isnan(f)) in.push_back(f);
  }
  Buffer<float> src(in.size());
  Buffer<unsigned short> half(in.size()), bf(in.size());
  CHECK_CUDA(cudaMemcpy(src.ptr, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
  to_half_kernel<<<64, 256>>>(src.ptr, half.ptr, bf.ptr, static_cast<int>(in.size()));
  CHECK_CUDA(cudaDeviceSynchronize());
  const auto hb = half.to_host(), bb = bf.to_host();
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(hb[i], tutti::float_to_half_bits(in[i])) << "float " << in[i];
    ASSERT_EQ(bb[i], tutti::float_to_bf16_bits(in[i])) << "float " << in[i];
  }
}

// ---- launch limits CUDA rejects ----

__global__ void empty_kernel() {}

TEST(CudaSemantics, InvalidLaunchesAreRejected) {
  REQUIRE_DEVICE();
  (void)cudaGetLastError();
  empty_kernel<<<1, 1025>>>();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  empty_kernel<<<1, dim3(1, 1, 65)>>>();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  empty_kernel<<<dim3(1, 65536), 1>>>();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  empty_kernel<<<0, 32>>>();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // More dynamic shared memory than the default 48 KiB without opting in.
  empty_kernel<<<1, 32, 64 * 1024>>>();
  EXPECT_NE(cudaGetLastError(), cudaSuccess);
  // The errors were not sticky: a good launch works.
  empty_kernel<<<1, 32>>>();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- streams run asynchronously; events are the dependencies ----

// A host function that holds its stream until the host opens the gate.
void CUDART_CB wait_for_gate(void* gate) {
  auto* open = static_cast<std::atomic<bool>*>(gate);
  while (!open->load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

__global__ void fill_kernel(int* p, int n, int value) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

TEST(CudaSemantics, StreamsOrderOnlyThroughEvents) {
  REQUIRE_DEVICE();
  const int n = 1 << 16;
  cudaStream_t producer, consumer;
  CHECK_CUDA(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  Buffer<int> data(n, 0);
  int* host = nullptr;
  CHECK_CUDA(cudaMallocHost(&host, n * sizeof(int)));
  std::atomic<bool> gate{false};
  cudaEvent_t written;
  CHECK_CUDA(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));

  // Without a wait, the consumer's copy runs while the producer is held: it sees the old data.
  CHECK_CUDA(cudaLaunchHostFunc(producer, wait_for_gate, &gate));
  fill_kernel<<<8, 256, 0, producer>>>(data.ptr, n, 7);
  CHECK_CUDA(cudaEventRecord(written, producer));
  CHECK_CUDA(cudaMemcpyAsync(host, data.ptr, n * sizeof(int), cudaMemcpyDeviceToHost, consumer));
  CHECK_CUDA(cudaStreamSynchronize(consumer));
  EXPECT_EQ(host[0], 0);
  EXPECT_EQ(host[n - 1], 0);
  EXPECT_EQ(cudaEventQuery(written), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(producer), cudaErrorNotReady);

  // With the event, the consumer waits for the producer: the copy sees the kernel's writes.
  CHECK_CUDA(cudaStreamWaitEvent(consumer, written, 0));
  CHECK_CUDA(cudaMemcpyAsync(host, data.ptr, n * sizeof(int), cudaMemcpyDeviceToHost, consumer));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cudaStreamQuery(consumer), cudaErrorNotReady);  // still held by the producer
  gate = true;
  CHECK_CUDA(cudaStreamSynchronize(consumer));
  EXPECT_EQ(host[0], 7);
  EXPECT_EQ(host[n - 1], 7);
  EXPECT_EQ(cudaEventQuery(written), cudaSuccess);

  CHECK_CUDA(cudaEventDestroy(written));
  CHECK_CUDA(cudaFreeHost(host));
  CHECK_CUDA(cudaStreamDestroy(producer));
  CHECK_CUDA(cudaStreamDestroy(consumer));
}

TEST(CudaSemantics, LegacyDefaultStreamWaitsForBlockingStreamsOnly) {
  REQUIRE_DEVICE();
  for (const bool blocking : {true, false}) {
    Buffer<int> data(16, 0);  // before the gate: cudaMemset is on the legacy stream
    cudaStream_t held;
    CHECK_CUDA(cudaStreamCreateWithFlags(&held, blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    std::atomic<bool> gate{false};
    CHECK_CUDA(cudaLaunchHostFunc(held, wait_for_gate, &gate));
    fill_kernel<<<1, 16, 0, 0>>>(data.ptr, 16, 3);  // the legacy default stream
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(cudaStreamQuery(0), blocking ? cudaErrorNotReady : cudaSuccess)
        << (blocking ? "blocking" : "non-blocking");
    gate = true;
    CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(data.to_host()[15], 3);
    CHECK_CUDA(cudaStreamDestroy(held));
  }
}

TEST(CudaSemantics, EventsMeasureElapsedTime) {
  REQUIRE_DEVICE();
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  Buffer<int> data(1 << 20);
  CHECK_CUDA(cudaEventRecord(start, 0));
  fill_kernel<<<64, 256>>>(data.ptr, 1 << 20, 1);
  CHECK_CUDA(cudaEventRecord(stop, 0));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = -1;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  EXPECT_GE(ms, 0.0f);
  EXPECT_LT(ms, 60000.0f);
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
}

}  // namespace
