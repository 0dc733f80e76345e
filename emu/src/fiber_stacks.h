// Stacks for the fibers that run the emulated device's CUDA threads (scheduler.cc): mmap'ed
// with a guard page below, and kept for reuse.
//
// Each host thread keeps its own free list (no lock on the hot path); a thread that ends hands
// its stacks to a process-wide list that new threads draw from. Why: every emulated stream is
// a host thread, and programs (and the tests) make streams as they go; mapping, guarding and
// first touching a fresh stack per CUDA thread of each new stream took a fifth of the CPU time
// of the emulated DDP tests.
#pragma once

#include <boost/context/stack_context.hpp>
#include <cstddef>
#include <vector>

namespace tutti::emu {

// The stack size of every fiber: TUTTI_EMU_STACK_KB, else 64 KiB (512 KiB under ASan).
std::size_t stack_bytes();

class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool();  // hands the stacks to the process-wide list

  // A stack from this thread's list, else from what ended threads left, else a new mapping.
  boost::context::stack_context take();
  void give(boost::context::stack_context s) { free_.push_back(s); }

 private:
  std::vector<boost::context::stack_context> free_;
};

}  // namespace tutti::emu
