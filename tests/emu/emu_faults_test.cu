// The bugs the emulated CUDA device must report, as compute-sanitizer's synccheck would, rather
// than hang or compute garbage quietly: each kernel here is wrong on purpose. A fault makes the
// device return cudaErrorLaunchFailure with a report naming the kernel, the thread, the call and
// its .cu line; cudaDeviceReset clears it for the next test. Emulated device only.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

// Runs `launch` (given 1024 ints of device memory to write), then expects the next
// synchronization to fail with a report holding every one of `needles`, and clears the fault.
template <typename Launch>
void expect_fault(Launch launch, const std::vector<std::string>& needles) {
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  static int* scratch = [] {
    int* p = nullptr;
    cudaMalloc(&p, 1024 * sizeof(int));
    return p;
  }();
  launch(scratch);  // valid launches: the fault comes from running them (asynchronously)
  const cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaErrorLaunchFailure);
  const std::string report = cudaGetErrorString(err);
  for (const auto& n : needles) EXPECT_NE(report.find(n), std::string::npos) << "missing '" << n << "' in: " << report;
  // Sticky until reset, like a real fault.
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 16), cudaSuccess);
  cudaFree(p);
}

__global__ void shuffle_after_exit_kernel(int* out) {
  if (threadIdx.x >= 20) return;  // part of the warp leaves
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

TEST(EmuFaults, FullMaskShuffleWithExitedLanes) {
  expect_fault([](int* out) { shuffle_after_exit_kernel<<<1, 32>>>(out); },
               {"shuffle_after_exit_kernel", "__shfl_xor_sync(mask 0xffffffff)", "emu_faults_test.cu:", "has exited"});
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 64) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

TEST(EmuFaults, SyncthreadsAtDifferentPlaces) {
  expect_fault([](int* out) { divergent_barrier_kernel<<<2, 128>>>(out); },
               {"divergent __syncthreads", "block (0,0,0)"});
}

__global__ void partial_warp_kernel(int* out) {
  float v = static_cast<float>(threadIdx.x);
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x == 0) out[0] = static_cast<int>(v);
}

TEST(EmuFaults, FullMaskInAPartialWarp) {
  expect_fault([](int* out) { partial_warp_kernel<<<1, 48>>>(out); }, {"does not exist", "the block has 48 threads"});
}

__global__ void lane_outside_mask_kernel(int* out) {
  // Lanes 0-15 read lane (lane + 8), which for lanes 8-15 lies outside the mask.
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 8, 32);
}

TEST(EmuFaults, ShuffleReadsALaneOutsideTheMask) {
  expect_fault([](int* out) { lane_outside_mask_kernel<<<1, 32>>>(out); }, {"not in the mask"});
}

__global__ void caller_not_in_mask_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 0);  // lanes 16-31 call with a mask without them
}

TEST(EmuFaults, CallingLaneNotInItsMask) {
  expect_fault([](int* out) { caller_not_in_mask_kernel<<<1, 32>>>(out); }, {"the calling lane 16 is not in the mask"});
}

__global__ void barrier_vs_shuffle_kernel(int* out) {
  if (threadIdx.x % 32 < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  } else {
    __syncthreads();
  }
}

TEST(EmuFaults, WarpFunctionWhileLanesWaitAtABarrier) {
  expect_fault([](int* out) { barrier_vs_shuffle_kernel<<<1, 64>>>(out); }, {"__syncthreads"});
}

__global__ void deadlock_kernel(int* out) {
  // Lane 0 waits for lane 1 in a two-lane shuffle; lane 1 completes a one-lane shuffle of its
  // own and exits. Nothing can release lane 0.
  if (threadIdx.x == 0) out[0] = __shfl_sync(0x3u, 1, 1);
  if (threadIdx.x == 1) out[1] = __shfl_sync(0x2u, 2, 1);
}

TEST(EmuFaults, DeadlockIsReportedNotAHang) {
  expect_fault([](int* out) { deadlock_kernel<<<1, 2>>>(out); }, {"deadlock", "__shfl_sync(mask 0x00000003)"});
}

__global__ void too_much_shared_kernel(int* out) {
  __shared__ float big[16 * 1024];  // 64 KiB: CUDA's static limit is 48 KiB
  big[threadIdx.x] = 1.0f;
  out[threadIdx.x] = static_cast<int>(big[threadIdx.x]);
}

TEST(EmuFaults, StaticSharedMemoryOverTheLimit) {
  expect_fault([](int* out) { too_much_shared_kernel<<<1, 32>>>(out); }, {"exceed 48 KiB"});
}

// Not a fault but what catches this bug when the hazard detector is off (TUTTI_EMU_RACECHECK=0;
// with it on, the detector reports it: emu_racecheck_test.cu): a read of a shared tile before the
// barrier that should precede it sees 0xff bytes (the emulator fills shared memory with them at
// each block's start and runs threads in order), so the bug shows on every run. Runs in
// emu_faults_test_emu_racecheck_off.
__global__ void missing_barrier_kernel(int* out) {
  __shared__ int tile[64];
  tile[threadIdx.x] = static_cast<int>(threadIdx.x);
  // __syncthreads() belongs here.
  out[threadIdx.x] = tile[(threadIdx.x + 1) % 64];
}

TEST(EmuFaultsRacecheckOff, MissingBarrierReadsPoisonEveryTime) {
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  for (int run = 0; run < 3; ++run) {
    missing_barrier_kernel<<<4, 64>>>(out);
    std::vector<int> host(64);
    ASSERT_EQ(cudaMemcpy(host.data(), out, sizeof(int) * 64, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(host[0], -1) << "thread 0 read thread 1's slot before thread 1 ran";
    EXPECT_EQ(host[63], 0) << "thread 63 read thread 0's slot after thread 0 ran";
  }
  cudaFree(out);
}

TEST(EmuFaults, CopiesOutsideAnAllocationAreRefused) {
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  char* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 100), cudaSuccess);
  std::vector<char> host(200);
  EXPECT_EQ(cudaMemcpy(host.data(), p, 101, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(p + 50, 0, 51), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(p, host.data(), 100, cudaMemcpyDeviceToHost), cudaErrorInvalidValue) << "wrong direction";
  EXPECT_EQ(cudaMemcpy(host.data(), p, 100, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue) << "double free";
}

}  // namespace
