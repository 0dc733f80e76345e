// Kernel execution of the emulated CUDA device: the blocks of a grid one after another on the
// stream's host thread, the threads of a block as fibers (fiber_switch.h) switched only at
// synchronization points, with CUDA's warp and barrier semantics checked as they happen.
// The model and the faults are described in emu/include/tutti_emu/kernel.h.
//
// Scheduling: a block runs in rounds. Each round resumes, in linear thread order, every thread
// that can run; a thread runs until it waits (a barrier, a warp function) or exits. The last
// lane to reach a warp function computes every lane's result and releases them; the last live
// thread to reach a barrier (or the exit of the last one not there) releases the barrier. A
// round in which no thread could run while some are alive is a deadlock, and a fault.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "asan.h"
#include "fiber_stacks.h"
#include "fiber_switch.h"
#include "racecheck.h"
#include "runtime.h"

namespace tutti::emu {

TUTTI_EMU_TLS thread_local const ThreadContext* tls_context = nullptr;

namespace {

constexpr int kWarp = 32;
constexpr std::size_t kStaticSharedLimit = 48 * 1024;  // without cudaFuncSetAttribute opt-in
constexpr std::size_t kSharedArena = 228 * 1024;       // sm_90's most, static + dynamic
constexpr std::size_t kRedzone = 32;                   // between shared variables (ASan)

// ---- fiber stacks (fiber_stacks.h) ----

// The host thread's pool, reached through an initial-exec pointer (set at each launch): a
// thread_local with a destructor is reached through __tls_get_addr, twice per CUDA thread.
thread_local StackPool stack_pool;
TUTTI_EMU_TLS thread_local StackPool* tls_stack_pool = nullptr;

// ---- ASan's fiber annotations (no-ops without ASan) ----
struct FakeStack {
  void* save = nullptr;
};
inline void start_switch(FakeStack* fake, const void* bottom, std::size_t size) {
#if TUTTI_EMU_ASAN
  __sanitizer_start_switch_fiber(fake ? &fake->save : nullptr, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}
inline void finish_switch(FakeStack* fake, const void** bottom_old, std::size_t* size_old) {
#if TUTTI_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake ? fake->save : nullptr, bottom_old, size_old);
#else
  (void)fake, (void)bottom_old, (void)size_old;
#endif
}

// ---- the state of a block ----

enum class State { runnable, at_barrier, at_warp, done };

// Thrown inside a fiber to unwind it when its kernel is abandoned after a fault.
struct Cancelled {};

struct Thread {
  ThreadContext context{};
  int linear = 0, warp = 0, lane = 0;
  State state = State::runnable;
  fcontext_t suspended = nullptr;  // where it resumes; null once it ended (or before its block)
  fcontext_t scheduler = nullptr;  // while running: the way back
  boost::context::stack_context stack{};
  FakeStack fake;
  std::source_location where;  // where it waits
  // A barrier: the reduction asked for, the predicate brought, the result received.
  BlockReduce reduce = BlockReduce::none;
  int predicate = 0, barrier_result = 0;
  // A warp function: what the lane brought, and its result.
  WarpOp op = WarpOp::sync;
  unsigned mask = 0;
  std::uint64_t value = 0, result = 0;
  int arg = 0, width = kWarp;
};

// The lanes of one warp in each state, as bit masks (lane l is bit l).
struct Warp {
  unsigned exists = 0, exited = 0, at_barrier = 0, at_warp = 0;
};

struct Block {
  const KernelLaunch* launch = nullptr;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  int live = 0, at_barrier = 0;
  bool cancelled = false;
  bool race = false;  // the hazard detector watches this block
  std::string fault;  // set by the thread that found it; the scheduler then ends the kernel
  // Shared memory: the arena, what static variables took of it, and the dynamic part.
  std::vector<std::byte> arena = std::vector<std::byte>(kSharedArena + 64);
  std::byte* base = nullptr;  // arena, 64-byte aligned
  std::vector<std::pair<const void*, std::size_t>> shared_sites;
  std::size_t shared_used = 0;   // arena offset past the last static variable (and redzone)
  std::size_t static_bytes = 0;  // what the static variables take, as CUDA counts it
  std::size_t dynamic_bytes = 0;
  // The scheduler's stack, for ASan's annotations.
  const void* scheduler_bottom = nullptr;
  std::size_t scheduler_size = 0;
  FakeStack scheduler_fake;
};

TUTTI_EMU_TLS thread_local Block* tls_block = nullptr;
TUTTI_EMU_TLS thread_local Thread* tls_thread = nullptr;

// Every change of a thread's state goes through here, so the warps' masks stay true.
void set_state(Block& b, Thread& t, State s) {
  Warp& w = b.warps[static_cast<std::size_t>(t.warp)];
  const unsigned bit = 1u << t.lane;
  w.exited &= ~bit, w.at_barrier &= ~bit, w.at_warp &= ~bit;
  if (s == State::done) w.exited |= bit;
  if (s == State::at_barrier) w.at_barrier |= bit;
  if (s == State::at_warp) w.at_warp |= bit;
  t.state = s;
}

int lowest_lane(unsigned mask) { return __builtin_ctz(mask); }

std::string site(const std::source_location& w) { return short_path(w.file_name()) + ":" + std::to_string(w.line()); }

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::shfl_idx: return "__shfl_sync";
    case WarpOp::shfl_up: return "__shfl_up_sync";
    case WarpOp::shfl_down: return "__shfl_down_sync";
    case WarpOp::shfl_xor: return "__shfl_xor_sync";
    case WarpOp::ballot: return "__ballot_sync";
    case WarpOp::any: return "__any_sync";
    case WarpOp::all: return "__all_sync";
    case WarpOp::sync: return "__syncwarp";
  }
  return "?";
}

std::string who(const Thread& t) {
  return "thread " + dims(t.context.thread_idx) + " (warp " + std::to_string(t.warp) + ", lane " +
         std::to_string(t.lane) + ")";
}

// What a waiting thread waits in, for reports.
std::string waiting_in(const Thread& t) {
  if (t.state == State::at_barrier) return "__syncthreads at " + site(t.where);
  if (t.state == State::at_warp) return std::string(op_name(t.op)) + "(mask " + hex(t.mask) + ") at " + site(t.where);
  if (t.state == State::done) return "exited";
  return "running";
}

// ---- switching ----

void suspend(Thread& t) {
  Block& b = *tls_block;
  start_switch(&t.fake, b.scheduler_bottom, b.scheduler_size);
  t.scheduler = jump_to(t.scheduler, nullptr).fctx;
  finish_switch(&t.fake, nullptr, nullptr);
  if (b.cancelled) throw Cancelled{};
}

// A fault found by the running thread: recorded; the thread waits to be unwound.
[[noreturn]] void fault(Thread& t, const std::string& what) {
  Block& b = *tls_block;
  if (b.fault.empty()) b.fault = who(t) + ": " + what;
  set_state(b, t, State::at_warp);  // not runnable: the scheduler sees the fault first
  for (;;) suspend(t);              // throws Cancelled when the kernel is abandoned
}

// A CUDA thread's fiber, from its first resume to its end: it never returns, and its last jump
// goes back to the scheduler, which then takes its stack back (resume).
[[noreturn]] void thread_main(transfer_t from) {
  Thread& t = *static_cast<Thread*>(from.data);
  t.scheduler = from.fctx;
  Block& b = *tls_block;
  finish_switch(nullptr, &b.scheduler_bottom, &b.scheduler_size);
  try {
    if (!b.cancelled) b.launch->body->run_thread();  // a thread never started is not run to unwind it
  } catch (const Cancelled&) {
  } catch (const std::exception& e) {
    if (b.fault.empty()) b.fault = who(t) + ": exception in kernel code: " + e.what();
  } catch (...) {
    if (b.fault.empty()) b.fault = who(t) + ": exception in kernel code (not a std::exception)";
  }
  set_state(b, t, State::done);
  start_switch(nullptr, b.scheduler_bottom, b.scheduler_size);  // this fiber ends
  jump_to(t.scheduler, nullptr);
  __builtin_unreachable();
}

void resume(Block& b, Thread& t) {
  tls_thread = &t;
  tls_context = &t.context;
  const auto stack_hi = reinterpret_cast<std::uintptr_t>(t.stack.sp);
  if (b.race) racecheck::enter(t.linear, stack_hi - t.stack.size, stack_hi);
  start_switch(&b.scheduler_fake, static_cast<char*>(t.stack.sp) - t.stack.size, t.stack.size);
  t.suspended = jump_to(t.suspended, &t).fctx;
  finish_switch(&b.scheduler_fake, nullptr, nullptr);
  if (b.race) racecheck::leave();
  if (t.state == State::done) {  // it ended: nothing is left on its stack
    t.suspended = nullptr;
    tls_stack_pool->give(t.stack);
  }
  tls_thread = nullptr;
  tls_context = nullptr;
}

// ---- barriers ----

// Releases the barrier when every live thread is at it; they must all be at the same one.
// `caller` is the thread that completed it (null when the scheduler does, after an exit).
void release_barrier_if_complete(Block& b, Thread* caller) {
  if (b.at_barrier == 0 || b.at_barrier != b.live) return;
  const Thread* first = nullptr;
  int any = 0, all = 1, count = 0;
  for (const auto& t : b.threads) {
    if (t.state != State::at_barrier) continue;
    if (first == nullptr) first = &t;
    if (t.where.line() != first->where.line() || std::strcmp(t.where.file_name(), first->where.file_name()) != 0) {
      const std::string what = "divergent __syncthreads: " + who(*first) + " waits at " + site(first->where) + ", " +
                               who(t) + " at " + site(t.where) +
                               " (every live thread of the block must reach the same one)";
      if (caller != nullptr) fault(*caller, what);
      if (b.fault.empty()) b.fault = what;
      return;
    }
    any |= t.predicate != 0;
    all &= t.predicate != 0;
    count += t.predicate != 0;
  }
  for (auto& t : b.threads) {
    if (t.state != State::at_barrier) continue;
    switch (t.reduce) {
      case BlockReduce::none: t.barrier_result = 0; break;
      case BlockReduce::any: t.barrier_result = any; break;
      case BlockReduce::all: t.barrier_result = all; break;
      case BlockReduce::count: t.barrier_result = count; break;
    }
    set_state(b, t, State::runnable);
  }
  b.at_barrier = 0;
  if (b.race) racecheck::barrier();
}

// ---- warp functions ----

int segment_start(int lane, int width) { return lane & ~(width - 1); }

// Computes the result of every lane of a complete group, then releases them.
void complete_warp_group(Block& b, Thread& caller, int warp_base, unsigned mask) {
  Thread* lanes = &b.threads[static_cast<std::size_t>(warp_base)];
  std::uint64_t ballot = 0;
  int count = 0, members = 0;
  for (int l = 0; l < kWarp; ++l) {
    if (!(mask >> l & 1u)) continue;
    ++members;
    if (lanes[l].value != 0) {
      ballot |= 1ull << l;
      ++count;
    }
  }
  for (int l = 0; l < kWarp; ++l) {
    if (!(mask >> l & 1u)) continue;
    Thread& t = lanes[l];
    const int w = t.width, start = segment_start(l, w);
    int src = l;
    switch (t.op) {
      case WarpOp::shfl_idx: src = start + (t.arg & (w - 1)); break;
      case WarpOp::shfl_up: src = l - t.arg >= start ? l - t.arg : l; break;
      // A lane past the end of its segment of `width` lanes reads its own value.
      case WarpOp::shfl_down: src = l + t.arg < start + w ? l + t.arg : l; break;
      case WarpOp::shfl_xor: src = (l ^ t.arg) < start + w ? (l ^ t.arg) : l; break;
      default: break;
    }
    switch (t.op) {
      case WarpOp::shfl_idx:
      case WarpOp::shfl_up:
      case WarpOp::shfl_down:
      case WarpOp::shfl_xor:
        if (src < 0 || src >= kWarp || !(mask >> src & 1u)) {
          fault(caller, who(t) + " reads lane " + std::to_string(src) + " in " + op_name(t.op) + "(mask " + hex(mask) +
                            ") at " + site(t.where) + ": that lane is not in the mask, so the value is undefined");
        }
        t.result = lanes[src].value;
        break;
      case WarpOp::ballot: t.result = ballot; break;
      case WarpOp::any: t.result = count > 0 ? 1 : 0; break;
      case WarpOp::all: t.result = count == members ? 1 : 0; break;
      case WarpOp::sync: t.result = 0; break;
    }
  }
  for (int l = 0; l < kWarp; ++l) {
    if (mask >> l & 1u) set_state(b, lanes[l], State::runnable);
  }
  // __syncwarp orders the memory accesses of its lanes; shuffles and votes do not.
  if (b.race && caller.op == WarpOp::sync) racecheck::warp_synced(caller.warp, mask);
}

// ---- reports ----

// The threads that have not exited, grouped by what they wait in, as ranges of linear ids.
std::string state_report(const Block& b) {
  std::map<std::string, std::vector<int>> groups;
  for (const auto& t : b.threads) {
    if (t.state != State::done) groups[waiting_in(t)].push_back(t.linear);
  }
  std::ostringstream out;
  for (const auto& [what, ids] : groups) {
    out << "\n    threads ";
    for (std::size_t i = 0; i < ids.size();) {
      std::size_t j = i;
      while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
      out << (i > 0 ? "," : "") << ids[i];
      if (j > i) out << "-" << ids[j];
      i = j + 1;
    }
    out << " (linear ids): " << what;
  }
  return out.str();
}

std::string where_launched(const KernelLaunch& k) {
  std::string file = k.file;
  const auto pos = file.find("kernels/");
  if (pos != std::string::npos) file = file.substr(pos);
  return file + ":" + std::to_string(k.line);
}

std::string kernel_header(const KernelLaunch& k, const uint3& block_idx) {
  return "kernel " + std::string(k.name) + " (launched at " + where_launched(k) + ", grid " + dims(k.config.grid) +
         ", block " + dims(k.config.block) + "), block " + dims(block_idx);
}

// ---- one block ----

thread_local Block block_state;                               // reused: its vectors keep their capacity
TUTTI_EMU_TLS thread_local Block* tls_block_state = nullptr;  // &block_state, set at each launch

void run_block(const KernelLaunch& k, uint3 block_idx) {
  Block& b = *tls_block_state;
  const dim3 bd = k.config.block;
  const int n = static_cast<int>(bd.x * bd.y * bd.z);
  b.launch = &k;
  b.threads.clear();
  b.threads.resize(static_cast<std::size_t>(n));
  b.warps.assign(static_cast<std::size_t>((n + kWarp - 1) / kWarp), Warp{});
  for (int i = 0; i < n; ++i) b.warps[static_cast<std::size_t>(i / kWarp)].exists |= 1u << (i % kWarp);
  b.live = n;
  b.at_barrier = 0;
  b.cancelled = false;
  b.fault.clear();
  // Shared memory: dynamic first (at the arena's start, as CUDA places it after the static
  // variables' fixed offsets we cannot know), static variables after it, all 0xff.
  b.base = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(b.arena.data()) + 63) & ~std::uintptr_t{63});
  b.dynamic_bytes = k.config.shared_bytes;
  b.shared_sites.clear();
  b.shared_used = (b.dynamic_bytes + kRedzone + 15) & ~std::size_t{15};
  b.static_bytes = 0;
#if TUTTI_EMU_ASAN
  ASAN_POISON_MEMORY_REGION(b.base, kSharedArena);
  ASAN_UNPOISON_MEMORY_REGION(b.base, b.dynamic_bytes);
#endif
  std::memset(b.base, 0xff, b.dynamic_bytes);
  tls_block = &b;
  b.race = racecheck::enabled();
  if (b.race) {
    racecheck::begin_block(racecheck::BlockInfo{b.base, kSharedArena, n, bd, k.config.grid, block_idx, &b.fault,
                                                [] { return who(*tls_thread); }});
  }

  for (int i = 0; i < n; ++i) {
    Thread& t = b.threads[static_cast<std::size_t>(i)];
    const unsigned ui = static_cast<unsigned>(i);
    t.context.thread_idx = uint3{ui % bd.x, (ui / bd.x) % bd.y, ui / (bd.x * bd.y)};
    t.context.block_idx = block_idx;
    t.context.block_dim = bd;
    t.context.grid_dim = k.config.grid;
    t.linear = i;
    t.warp = i / kWarp;
    t.lane = i % kWarp;
    t.state = State::runnable;  // the warps' masks start as every lane runnable
    t.stack = tls_stack_pool->take();
    t.suspended = make_context(t.stack.sp, t.stack.size, &thread_main);
  }

  std::string report;
  while (b.live > 0 && report.empty()) {
    bool ran = false;
    for (auto& t : b.threads) {
      if (t.state != State::runnable) continue;
      ran = true;
      resume(b, t);
      if (t.state == State::done) {
        --b.live;
        // Lanes waiting for this one in a warp function can never complete.
        const Warp& w = b.warps[static_cast<std::size_t>(t.warp)];
        for (unsigned waiting = w.at_warp; waiting != 0 && b.fault.empty(); waiting &= waiting - 1) {
          const Thread& o = b.threads[static_cast<std::size_t>(t.warp * kWarp + lowest_lane(waiting))];
          if (o.mask >> t.lane & 1u) {
            b.fault = who(o) + ": " + waiting_in(o) + ": lane " + std::to_string(t.lane) +
                      " of the mask has exited (every lane of the mask must call it)";
          }
        }
        release_barrier_if_complete(b, nullptr);
      }
      if (!b.fault.empty()) {
        report = b.fault;
        break;
      }
    }
    if (report.empty() && !ran && b.live > 0) {
      report = "deadlock: no thread can go on" + state_report(b);
    }
  }
  if (!report.empty()) {
    // Unwind every suspended thread (Cancelled is thrown where it waits), then report.
    b.cancelled = true;
    for (auto& t : b.threads) {
      if (t.suspended != nullptr) resume(b, t);
    }
    b.threads.clear();
    tls_block = nullptr;
    throw std::runtime_error(kernel_header(k, block_idx) + ": " + report);
  }
  tls_block = nullptr;
}

}  // namespace

// ---- the device-side API ----

int syncthreads(BlockReduce reduce, int predicate, std::source_location where) {
  Thread& t = *tls_thread;
  Block& b = *tls_block;
  // A lane of this warp that waits in a warp function for this thread can never complete.
  const Warp& w = b.warps[static_cast<std::size_t>(t.warp)];
  for (unsigned waiting = w.at_warp; waiting != 0; waiting &= waiting - 1) {
    const Thread& o = b.threads[static_cast<std::size_t>(t.warp * kWarp + lowest_lane(waiting))];
    if (o.mask >> t.lane & 1u) {
      fault(t, "__syncthreads at " + site(where) + " while lane " + std::to_string(o.lane) +
                   " waits for this lane in " + waiting_in(o));
    }
  }
  t.reduce = reduce;
  t.predicate = predicate;
  t.where = where;
  set_state(b, t, State::at_barrier);
  ++b.at_barrier;
  release_barrier_if_complete(b, &t);
  if (t.state == State::at_barrier) suspend(t);
  return t.barrier_result;
}

std::uint64_t warp_collective(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width,
                              std::source_location where) {
  Thread& t = *tls_thread;
  Block& b = *tls_block;
  const Warp& w = b.warps[static_cast<std::size_t>(t.warp)];
  const Thread* lanes = &b.threads[static_cast<std::size_t>(t.warp * kWarp)];
  // Messages are built only for a fault: this is the emulator's hottest path.
  auto call = [&] { return std::string(op_name(op)) + "(mask " + hex(mask) + ") at " + site(where); };
  auto lane = [](unsigned m) { return "lane " + std::to_string(lowest_lane(m)); };
  if (!(mask >> t.lane & 1u)) fault(t, call() + ": the calling lane " + std::to_string(t.lane) + " is not in the mask");
  if (width <= 0 || width > kWarp || (width & (width - 1)) != 0) {
    fault(t, call() + ": width " + std::to_string(width) + " is not a power of 2 in [1, 32]");
  }
  if (const unsigned missing = mask & ~w.exists) {
    fault(t, call() + ": " + lane(missing) + " of the mask does not exist (the block has " +
                 std::to_string(b.threads.size()) + " threads)");
  }
  if (const unsigned gone = mask & w.exited) fault(t, call() + ": " + lane(gone) + " of the mask has exited");
  if (const unsigned elsewhere = mask & w.at_barrier) {
    fault(t, call() + ": " + lane(elsewhere) + " of the mask waits in " + waiting_in(lanes[lowest_lane(elsewhere)]));
  }
  if (const unsigned waiting = mask & w.at_warp) {
    const Thread& o = lanes[lowest_lane(waiting)];
    if (o.op != op || o.mask != mask)
      fault(t, call() + ": " + lane(waiting) + " of the mask waits in " + waiting_in(o));
  }
  t.op = op;
  t.mask = mask;
  t.value = value;
  t.arg = arg;
  t.width = width;
  t.where = where;
  set_state(b, t, State::at_warp);
  if ((w.at_warp & mask) == mask) {
    complete_warp_group(b, t, t.warp * kWarp, mask);
  } else {
    suspend(t);
  }
  return t.result;
}

unsigned active_mask() {
  const Warp& w = tls_block->warps[static_cast<std::size_t>(tls_thread->warp)];
  return w.exists & ~w.exited;
}

void* shared_variable(const void* site_key, std::size_t size, std::size_t align, std::source_location where) {
  Block& b = *tls_block;
  for (const auto& [key, offset] : b.shared_sites) {
    if (key == site_key) return b.base + offset;
  }
  const std::size_t offset = (b.shared_used + align - 1) & ~(align - 1);
  if (b.static_bytes + size + b.dynamic_bytes > kStaticSharedLimit || offset + size > kSharedArena) {
    fault(*tls_thread, "__shared__ variable at " + site(where) + " of " + std::to_string(size) +
                           " bytes: static and dynamic shared memory exceed 48 KiB per block");
  }
#if TUTTI_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(b.base + offset, size);
#endif
  std::memset(b.base + offset, 0xff, size);
  b.shared_sites.emplace_back(site_key, offset);
  b.shared_used = offset + size + kRedzone;
  b.static_bytes += size;
  return b.base + offset;
}

void* dynamic_shared_memory() { return tls_block->base; }

void run_kernel(const KernelLaunch& launch) {
  tls_stack_pool = &stack_pool;
  tls_block_state = &block_state;
  if (racecheck::enabled()) racecheck::begin_launch(launch.config.grid);
  const dim3 g = launch.config.grid;
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) run_block(launch, uint3{x, y, z});
}

}  // namespace tutti::emu
