// The emulated device's hazard detector (TUTTI_EMU_RACECHECK, on by default): what the
// scheduler tells it. See racecheck.cc for what it checks and how it sees the accesses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_runtime.h"

namespace tutti::emu::racecheck {

// Whether the detector runs (settings().racecheck); the calls below are for when it does.
bool enabled();

// A launch of `grid` starts on the calling host thread: a new epoch for the global-memory check.
void begin_launch(const dim3& grid);

// A block starts on the calling host thread.
struct BlockInfo {
  const std::byte* shared = nullptr;  // the block's shared memory arena
  std::size_t shared_bytes = 0;
  int threads = 0;
  dim3 block_dim, grid_dim;
  uint3 block_idx;
  // Where a hazard is recorded (the first one wins; the scheduler ends the kernel when it sees
  // it), and how to name the running thread in the report.
  std::string* fault = nullptr;
  std::string (*describe_running_thread)() = nullptr;
};
void begin_block(const BlockInfo& block);

// The fiber of thread `linear` (its stack is [stack_lo, stack_hi)) runs from now until leave().
void enter(int linear, std::uintptr_t stack_lo, std::uintptr_t stack_hi);
void leave();

// A __syncthreads (or variant) released the block: a new barrier interval.
void barrier();
// A __syncwarp of `mask` completed in warp `warp`: its lanes' earlier accesses are ordered
// before their later ones.
void warp_synced(int warp, unsigned mask);

// An atomic of kernel code on `size` bytes at `p` (the instruction's return address `pc`): on
// shared memory checked against plain accesses (atomics do not conflict with each other); on
// global memory not recorded.
void atomic_access(const volatile void* p, std::size_t size, const void* pc);

// For reports: "kernels/cuda/x.cu:77" for the instruction that called a hook, given the hook's
// return address ("(a line not recorded)" for null). Slow (addr2line); cached.
std::string source_line(const void* return_address);

}  // namespace tutti::emu::racecheck
