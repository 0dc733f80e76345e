// The emulated device's hazard detector (emu/src/racecheck.cc): data races that the fixed fiber
// schedule would serialize into one quiet answer are reported as kernel faults naming the .cu
// line of both accesses. Each hazard kernel here is wrong on purpose; each race-free one must
// run without a report. Emulated device only (a GPU just computes one of the possible answers).
// RacecheckOff.* runs alone with TUTTI_EMU_RACECHECK=0 (emu_racecheck_test_emu_racecheck_off).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int* scratch() {
  static int* p = [] {
    int* q = nullptr;
    cudaMalloc(&q, 1024 * sizeof(int));
    return q;
  }();
  return p;
}

// The .cu line of this file that holds `marker` (a comment at the end of the line).
std::string line_of(const char* marker) {
  // Markers are unique strings below; __LINE__ would tie the test to its own layout.
  static const std::string source = [] {
    std::string text;
    if (std::FILE* f = std::fopen(__FILE__, "r")) {
      char buf[4096];
      for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
      std::fclose(f);
    }
    return text;
  }();
  const std::string needle = std::string("// ") + marker + "\n";
  const auto pos = source.find(needle);
  if (pos == std::string::npos) return "marker " + std::string(marker) + " not found";
  return "tests/emu/emu_racecheck_test.cu:" +
         std::to_string(1 + std::count(source.begin(), source.begin() + pos, '\n'));
}

// Runs `launch`, expects the next synchronization to fail with a report holding every one of
// `needles`, and clears the fault.
template <typename Launch>
void expect_hazard(Launch launch, const std::vector<std::string>& needles) {
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  launch(scratch());
  const cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaErrorLaunchFailure);
  const std::string report = cudaGetErrorString(err);
  for (const auto& n : needles) EXPECT_NE(report.find(n), std::string::npos) << "missing '" << n << "' in: " << report;
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
}

template <typename Launch>
void expect_no_hazard(Launch launch) {
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  launch(scratch());
  const cudaError_t err = cudaDeviceSynchronize();
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
}

// ---- shared memory ----

// Reverses 64 values through shared memory without the barrier between the writes and the
// reads: thread 31 reads tile[32] before thread 32 writes it (a read, then a write).
__global__ void reverse_without_barrier(int* out) {
  __shared__ int tile[64];
  tile[threadIdx.x] = static_cast<int>(threadIdx.x);  // shared-write
  out[threadIdx.x] = tile[63 - threadIdx.x];          // shared-read
}

TEST(Racecheck, SharedReadThenWriteInOneInterval) {
  expect_hazard([](int* out) { reverse_without_barrier<<<1, 64>>>(out); },
                {"reverse_without_barrier", "block (0,0,0): thread (32,0,0)", "shared-memory hazard: write of 4 bytes",
                 line_of("shared-write"), "thread (31,0,0) (warp 0, lane 31) read it at", line_of("shared-read")});
}

__global__ void reverse_with_barrier(int* out) {
  __shared__ int tile[64];
  tile[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = tile[63 - threadIdx.x];
}

TEST(Racecheck, SharedAccessesAcrossABarrierAreOrdered) {
  expect_no_hazard([](int* out) { reverse_with_barrier<<<1, 64>>>(out); });
}

// Thread 1 of each pair reads what thread 0 wrote with no barrier: a write, then a read.
__global__ void broadcast_without_barrier(int* out) {
  __shared__ int value;
  if (threadIdx.x % 64 == 0) value = 7;   // broadcast-write
  if (threadIdx.x == 40) out[0] = value;  // broadcast-read
}

TEST(Racecheck, SharedWriteThenReadInOneInterval) {
  expect_hazard([](int* out) { broadcast_without_barrier<<<1, 64>>>(out); },
                {"thread (40,0,0)", "read of 4 bytes", line_of("broadcast-read"),
                 "thread (0,0,0) (warp 0, lane 0) wrote it at", line_of("broadcast-write")});
}

__global__ void two_writers(int* out) {
  __shared__ int slot;
  slot = static_cast<int>(threadIdx.x);  // two-writers
  __syncthreads();
  out[0] = slot;
}

TEST(Racecheck, SharedWriteThenWriteInOneInterval) {
  expect_hazard(
      [](int* out) { two_writers<<<1, 64>>>(out); },
      {"thread (1,0,0)", "write of 4 bytes", "thread (0,0,0) (warp 0, lane 0) wrote it at", line_of("two-writers")});
}

// Warp-synchronous code: lane 0 writes, the other lanes read. __syncwarp orders them; a shuffle
// does not (CUDA: shuffles imply no memory ordering; racecheck reports this too).
template <int kOrdering>  // 0: nothing, 1: __syncwarp, 2: a shuffle
__global__ void warp_broadcast(int* out) {
  __shared__ int value[2];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) value[warp] = warp + 1;  // warp-write
  if (kOrdering == 1) __syncwarp();
  if (kOrdering == 2) out[64 + threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
  out[threadIdx.x] = value[warp];  // warp-read
}

TEST(Racecheck, SyncwarpOrdersLanesOfAWarp) {
  expect_no_hazard([](int* out) { warp_broadcast<1><<<1, 64>>>(out); });
  expect_hazard(
      [](int* out) { warp_broadcast<0><<<1, 64>>>(out); },
      {"thread (1,0,0)", line_of("warp-read"), "thread (0,0,0) (warp 0, lane 0) wrote it at", line_of("warp-write")});
  expect_hazard([](int* out) { warp_broadcast<2><<<1, 64>>>(out); }, {line_of("warp-read"), line_of("warp-write")});
}

// A __syncwarp orders only the lanes it names: lanes 0-15 synchronize, lane 16 reads.
__global__ void half_warp_sync(int* out) {
  __shared__ int value;
  if (threadIdx.x == 0) value = 5;
  if (threadIdx.x < 16) __syncwarp(0x0000ffffu);
  out[threadIdx.x] = value;  // half-warp-read
}

TEST(Racecheck, SyncwarpOrdersOnlyTheLanesOfItsMask) {
  expect_hazard([](int* out) { half_warp_sync<<<1, 32>>>(out); }, {"thread (16,0,0)", line_of("half-warp-read")});
}

// The same thread reading and writing its own location, and a block-wide tree reduction with a
// barrier at every step: no hazard.
__global__ void tree_sum(int* out) {
  __shared__ int partial[256];
  partial[threadIdx.x] = static_cast<int>(threadIdx.x);
  partial[threadIdx.x] += 1;
  __syncthreads();
  for (int stride = 128; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = partial[0];
}

TEST(Racecheck, BarrierPerStepReductionIsClean) {
  expect_no_hazard([](int* out) { tree_sum<<<1, 256>>>(out); });
  int sum = 0;
  ASSERT_EQ(cudaMemcpy(&sum, scratch(), sizeof sum, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(sum, 255 * 256 / 2 + 256);
}

// Dynamic shared memory through a pointer helper is seen too.
__device__ void store_through(int* p, int v) { *p = v; }  // helper-write

__global__ void dynamic_shared_race(int* out) {
  extern __shared__ int dynamic[];
  store_through(dynamic + threadIdx.x / 2, static_cast<int>(threadIdx.x));
  __syncthreads();
  out[threadIdx.x] = dynamic[threadIdx.x / 2];
}

TEST(Racecheck, DynamicSharedMemoryThroughAHelper) {
  expect_hazard([](int* out) { dynamic_shared_race<<<1, 32, 64 * sizeof(int)>>>(out); },
                {"thread (1,0,0)", "wrote it at " + line_of("helper-write")});
}

// A block's counter zeroed by thread 0 and incremented atomically by every warp's lane 0: without
// the barrier between, another warp's atomicAdd may come before the zeroing on a GPU. Atomics
// conflict with plain accesses, not with each other.
template <bool kBarrier>
__global__ void count_per_block(int* out) {
  __shared__ unsigned int hits;
  if (threadIdx.x == 0) hits = 0;  // zero-hits
  if (kBarrier) __syncthreads();
  if (threadIdx.x % 32 == 0) atomicAdd(&hits, 1u);
  __syncthreads();
  if (threadIdx.x == 0) out[0] = static_cast<int>(hits);
}

TEST(Racecheck, AtomicsConflictWithPlainAccessesOnly) {
  expect_hazard([](int* out) { count_per_block<false><<<1, 64>>>(out); },
                {"thread (32,0,0)", "shared-memory hazard: atomic of 4 bytes",
                 "thread (0,0,0) (warp 0, lane 0) wrote it at", line_of("zero-hits")});
  expect_no_hazard([](int* out) { count_per_block<true><<<1, 128>>>(out); });
  int hits = 0;
  ASSERT_EQ(cudaMemcpy(&hits, scratch(), sizeof hits, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(hits, 4);
}

// ---- global memory within one launch ----

// Every block writes out[threadIdx.x]: blocks of one launch are not ordered.
__global__ void every_block_writes(int* out) {
  out[threadIdx.x] = static_cast<int>(blockIdx.x);  // global-write
}

TEST(Racecheck, GlobalWriteFromTwoBlocks) {
  expect_hazard(
      [](int* out) { every_block_writes<<<2, 32>>>(out); },
      {"every_block_writes", "block (1,0,0): thread (0,0,0)", "global-memory hazard between blocks: write of 4 bytes",
       line_of("global-write"), "block (0,0,0) wrote it at"});
}

// Block b reads what block b - 1 wrote (a stencil over a buffer updated in place).
__global__ void in_place_stencil(int* data) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int left = i > 0 ? data[i - 1] : 0;  // stencil-read
  data[i] = left + 1;                        // stencil-write
}

TEST(Racecheck, GlobalWriteThenReadFromAnotherBlock) {
  expect_hazard([](int* out) { in_place_stencil<<<4, 32>>>(out); },
                {"block (1,0,0): thread (0,0,0)", "read of 4 bytes", line_of("stencil-read"),
                 "block (0,0,0) wrote it at", line_of("stencil-write")});
}

// Reading what another block read and writing only its own elements is fine, as are atomics on
// one address from every block, and a block's own write then read.
__global__ void clean_global(int* data) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  data[256 + i] = data[600] + i;  // everyone reads data[600]; each writes its own element
  data[256 + i] += data[256 + i];
  atomicAdd(&data[0], 1);
}

TEST(Racecheck, SharedReadsOwnWritesAndAtomicsAreClean) {
  ASSERT_EQ(cudaMemset(scratch(), 0, 1024 * sizeof(int)), cudaSuccess);
  expect_no_hazard([](int* out) { clean_global<<<4, 64>>>(out); });
  int count = 0;
  ASSERT_EQ(cudaMemcpy(&count, scratch(), sizeof count, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(count, 256);
}

// Every block reads a weight, as kernels read their parameters, and the last block then
// overwrites it with the store that wrote the other outputs: blocks after the second find the
// line already read by others and only read it, and the store's instruction and array are known
// (the detector's shortcuts), yet the write must still meet block 0's read.
__global__ void readers_then_writer(int* data) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int weight = data[600];  // shared-weight-read
  const bool last = blockIdx.x == gridDim.x - 1 && threadIdx.x == 0;
  data[last ? 600 : 256 + i] = weight;  // weight-overwrite
}

TEST(Racecheck, WriteAfterManyBlocksReadIsReported) {
  expect_hazard([](int* out) { readers_then_writer<<<4, 32>>>(out); },
                {"block (3,0,0): thread (0,0,0)", "write of 4 bytes", line_of("weight-overwrite"),
                 "block (0,0,0) read it at", line_of("shared-weight-read")});
}

// Neighbouring 2-byte elements written by different blocks do not conflict (per-byte masks).
__global__ void halves(unsigned short* out) { out[blockIdx.x] = static_cast<unsigned short>(blockIdx.x); }

TEST(Racecheck, NeighbouringBytesFromDifferentBlocksAreClean) {
  expect_no_hazard([](int* out) { halves<<<8, 1>>>(reinterpret_cast<unsigned short*>(out)); });
}

// Two launches writing the same address are ordered by the stream.
TEST(Racecheck, SeparateLaunchesAreOrdered) {
  expect_no_hazard([](int* out) {
    every_block_writes<<<1, 32>>>(out);
    every_block_writes<<<1, 32>>>(out);
  });
}

// ---- the knob ----

TEST(RacecheckOff, HazardsRunUnreportedWithTheDetectorOff) {
  const char* knob = std::getenv("TUTTI_EMU_RACECHECK");
  ASSERT_TRUE(knob != nullptr && std::string(knob) == "0") << "run with TUTTI_EMU_RACECHECK=0";
  expect_no_hazard([](int* out) { reverse_without_barrier<<<1, 64>>>(out); });
  expect_no_hazard([](int* out) { every_block_writes<<<2, 32>>>(out); });
}

}  // namespace
