// See fiber_stacks.h.
#include "fiber_stacks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <new>

#include "asan.h"
#include "runtime.h"

namespace tutti::emu {
namespace {

namespace bctx = boost::context;

std::size_t page() {
  static const std::size_t p = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// The stacks of host threads that ended. Never destroyed: threads may end after static
// destructors ran.
struct SharedStacks {
  std::mutex mutex;
  std::vector<bctx::stack_context> free;
};

SharedStacks& shared_stacks() {
  static auto& s = *new SharedStacks;
  return s;
}

}  // namespace

std::size_t stack_bytes() {
  const std::size_t configured = settings().fiber_stack_bytes;
  if (configured > 0) return configured;
  return TUTTI_EMU_ASAN ? 512 * 1024 : 64 * 1024;  // ASan's frames and reports need room
}

StackPool::~StackPool() {
  SharedStacks& shared = shared_stacks();
  std::lock_guard lock(shared.mutex);
  shared.free.insert(shared.free.end(), free_.begin(), free_.end());
}

bctx::stack_context StackPool::take() {
  if (free_.empty()) {
    // Takes all that ended threads left: the block that asked needs one per CUDA thread.
    SharedStacks& shared = shared_stacks();
    std::lock_guard lock(shared.mutex);
    free_.swap(shared.free);
  }
  bctx::stack_context s;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    const std::size_t size = stack_bytes();
    void* base =
        mmap(nullptr, size + page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc();
    mprotect(base, page(), PROT_NONE);  // a thread that overflows its stack faults at once
    s.size = size;
    s.sp = static_cast<char*>(base) + page() + size;
  }
#if TUTTI_EMU_ASAN
  // Frames of an earlier fiber on this stack may have left poisoned redzones behind.
  ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(s.sp) - s.size, s.size);
#endif
  return s;
}

}  // namespace tutti::emu
