// The emulated device's hazard detector: the two kinds of GPU data race that the fixed fiber
// schedule would otherwise serialize into one quiet answer.
//
//  - Shared memory, as compute-sanitizer's racecheck: per byte, the thread that last wrote it
//    and up to two threads that read it in the current barrier interval. A write and a read, a
//    read and a write, or two writes by different threads in one interval are a hazard, unless
//    both threads are lanes of one warp and a __syncwarp naming both completed between the two
//    accesses (racecheck's rule too: shuffles and votes do not order memory, __syncwarp does).
//  - Global memory within one launch: per 4-byte granule of a device allocation (with a byte
//    mask), the block that last wrote it and the first block that read it. A plain access from
//    another block that overlaps a write, or a write that overlaps another block's read, is a
//    hazard: blocks of one launch are not ordered. Atomics are not recorded. (Kept per 64-byte
//    line while one block alone has touched it, per granule once a second block does; see
//    GlobalLine: the line the report names for the first block's access is then its last write,
//    or first read, anywhere in those 64 bytes.)
//
// How it sees the accesses: the translated kernels are compiled with GCC's ThreadSanitizer
// instrumentation (-fsanitize=thread), which calls __tsan_read4(addr), __tsan_write8(addr), ...
// before every load and store, and __tsan_atomic*() for every atomic; this file defines those
// entry points itself, racecheck_atomics.cc the atomic ones (libtsan is not linked), as the Linux
// kernel's KCSAN does. So every access
// that kernel code makes is seen: shared arrays, dynamic shared memory, global memory through
// any pointer, in device helpers and through pointer arithmetic alike. Not seen: accesses in
// code that is not translated (the emulated cuBLAS/cuDNN/NCCL, memcpy/memset calls, which are
// not instrumented). The hooks return at once outside a kernel's fibers (host code of the same
// files) and for the fiber's own stack; the report names each access's .cu line, found from the
// return address with addr2line (racecheck_lines.cc; the kernels carry line tables, -g1).
//
// Both checks record at most what is needed for a report, so some hazards are missed (a third
// reader of a shared byte; a block that reads other bytes of a granule, or bytes of a split line,
// that another block read first), but none is reported that the rules above do not define.
#include "racecheck.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>
#include <unordered_map>
#include <vector>

#include "runtime.h"

namespace tutti::emu::racecheck {
namespace {

uint3 index_of(unsigned linear, const dim3& d) {
  return uint3{linear % d.x, (linear / d.x) % d.y, linear / (d.x * d.y)};
}

std::string thread_name(int linear, const dim3& d) {
  return "thread " + dims(index_of(static_cast<unsigned>(linear), d)) + " (warp " + std::to_string(linear / 32) +
         ", lane " + std::to_string(linear % 32) + ")";
}

// ---- the state of the host thread that runs blocks ----

constexpr int kWarp = 32;

// One byte of shared memory in the current barrier interval (threads as linear id + 1, 0: none).
struct SharedCell {
  std::uint32_t interval;
  std::uint32_t write_gen, read_gen[2];  // the block's __syncwarp count at the access
  std::uint16_t writer, reader[2];
  std::uint16_t write_pc, read_pc[2];  // interned return addresses (State::pcs)
  bool atomic_write;                   // the last write was an atomic (atomics do not conflict with each other)
};
static_assert(sizeof(SharedCell) == 32);

// Global memory: a 64-byte line of a device allocation that one block alone has accessed in the
// launch (nearly all: blocks work on parts of their own) is a GlobalLine: the block, the bytes it
// wrote and read, the lines of its last write and first read. A second block splits it into 16
// GlobalCells (4-byte granules), checked one by one from then on. Kernels stream through the lines
// as through their data, so they are small: misses on the shadow are the detector's main cost.
struct GlobalLine {
  std::uint32_t owner;  // the block's stamp (below)
  std::uint32_t split;  // the first stamp of the launch in which the line's granules got cells
  std::uint64_t written, read;
  std::uint16_t write_pc, read_pc;  // interned return addresses (State::pcs)
};
static_assert(sizeof(GlobalLine) == 32);
constexpr std::size_t kLine = 64;

// Where line i is kept: permuted within runs of 64 by a hash of the run, since a grid-stride loop
// steps by a power of two (8192 threads x 16 bytes) and would use only a few cache sets.
inline std::size_t skew(std::size_t i) { return i ^ (static_cast<std::uint32_t>(i >> 6) * 0x9E3779B1u >> 26); }

// A granule of a split line: the block that last wrote it and the first that read it in the launch,
// each as its stamp shifted left by 4 over the bytes it accessed, and the lines of those accesses.
struct GlobalCell {
  std::uint32_t write, read;
  std::uint16_t write_pc, read_pc;
};
static_assert(sizeof(GlobalCell) == 12);

// Block stamps: each block run on a host thread gets the next number (a launch's are consecutive),
// so a record is of the current launch when its stamp is at least the launch's first: nothing is
// cleared between launches. 28 bits; when they run out, the shadows are dropped.
constexpr std::uint32_t kStampLimit = std::uint32_t{1} << 28;

// Interned return addresses: 16-bit ids in the cells; a direct-mapped cache in front of the map.
constexpr std::size_t kPcCache = 1024;
struct PcSlot {
  const void* pc = nullptr;
  std::uint16_t id = 0;
  std::uint16_t range = 0;  // State::ranges[range]: where this instruction accessed last
};

// Zero-filled memory, pages mapped where touched. Large blocks are 2 MiB-aligned and advised to
// transparent huge pages (fewer faults and TLB misses); small ones calloc'ed.
struct Zeroed {
  void* p = nullptr;
  std::size_t bytes = 0;
  bool mapped = false;
};
constexpr std::size_t kHugePage = std::size_t{2} << 20;

Zeroed allocate_zeroed(std::size_t bytes) {
  Zeroed z;
  if (bytes < kHugePage / 2) {
    z.p = std::calloc(bytes, 1);
    z.bytes = z.p == nullptr ? 0 : bytes;
    return z;
  }
  const std::size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return z;
  const auto raw = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t lo = (raw + kHugePage - 1) & ~(kHugePage - 1);
  if (lo > raw) munmap(p, lo - raw);
  munmap(reinterpret_cast<void*>(lo + size), raw + kHugePage - lo);
  madvise(reinterpret_cast<void*>(lo), size, MADV_HUGEPAGE);
  z.p = reinterpret_cast<void*>(lo);
  z.bytes = size;
  z.mapped = true;
  return z;
}

void release(Zeroed& z) {
  if (z.mapped) {
    munmap(z.p, z.bytes);
  } else {
    std::free(z.p);
  }
  z = Zeroed{};
}

// The shadow of one device allocation: its lines, and its granules' cells (made at the first split).
struct Shadow {
  std::size_t bytes = 0;  // of the allocation covered
  Zeroed lines, cells;
  GlobalLine* line() const { return static_cast<GlobalLine*>(lines.p); }
  GlobalCell* cell() const { return static_cast<GlobalCell*>(cells.p); }
};

void release(Shadow& shadow) {
  release(shadow.lines);
  release(shadow.cells);
  shadow.bytes = 0;
}

// A recently looked-up range of addresses: a device allocation (with its shadow) or a gap (null).
struct Range {
  std::uintptr_t lo = 0, hi = 0;
  Shadow* shadow = nullptr;
};

struct State {
  // The running thread.
  int linear = 0;
  std::uintptr_t stack_lo = 0, stack_span = 0;
  // The block.
  std::uintptr_t shared_lo = 0, shared_span = 0;
  std::uint32_t interval = 0;  // unique per block and barrier interval on this host thread
  std::uint32_t syncwarps = 0;
  std::vector<std::uint32_t> paired;  // [thread][lane]: the last __syncwarp naming both
  SharedCell* shared_cells = nullptr;
  std::size_t shared_capacity = 0;
  BlockInfo block;
  std::uint32_t block_stamp = 0;  // launch_first + the block's linear id
  bool stopped = false;           // a hazard was reported: the kernel ends (and `active` is null)
  // The launch.
  std::uint32_t launch_first = 1, next_stamp = 1;
  bool global_off = false;  // a grid with more blocks than stamps: not checked
  Range ranges[8];
  unsigned next_range = 0, last_range = 0;
  std::unordered_map<std::uintptr_t, Shadow> shadows;  // by allocation start
  std::size_t shadow_bytes = 0;
  // Interned return addresses: pcs[id]; id 0 is none (more than 65535 distinct lines).
  PcSlot pc_cache[kPcCache];
  std::unordered_map<const void*, std::uint16_t> pc_ids;
  std::vector<const void*> pcs = std::vector<const void*>(1, nullptr);

  ~State() {
    std::free(shared_cells);
    for (auto& [base, shadow] : shadows) release(shadow);
  }
};

thread_local State state;
// &state (set at each launch: `state` is reached through __tls_get_addr), and the same while a
// fiber of a checked block runs, null otherwise (the hooks' first test).
TUTTI_EMU_TLS thread_local State* current = nullptr;
TUTTI_EMU_TLS thread_local State* active = nullptr;

PcSlot& pc_cached(State& s, const void* pc) {
  return s.pc_cache[(reinterpret_cast<std::uintptr_t>(pc) >> 2) % kPcCache];
}

PcSlot& pc_slot(State& s, const void* pc) {
  PcSlot& slot = pc_cached(s, pc);
  if (slot.pc == pc) return slot;
  auto [it, fresh] = s.pc_ids.try_emplace(pc, std::uint16_t{0});
  if (fresh && s.pcs.size() <= UINT16_MAX) {
    it->second = static_cast<std::uint16_t>(s.pcs.size());
    s.pcs.push_back(pc);
  }
  slot = PcSlot{pc, it->second, 0};
  return slot;
}

constexpr std::size_t kShadowBudget = std::size_t{512} << 20;  // then dropped at the next launch

void report(State& s, const std::string& what) {
  s.stopped = true;
  active = nullptr;
  if (s.block.fault->empty()) s.block.fault->assign(s.block.describe_running_thread() + ": " + what);
}

const char* access_name(bool write, bool atomic = false) { return atomic ? "atomic" : write ? "write" : "read"; }

// ---- shared memory ----

bool ordered(const State& s, int earlier, std::uint32_t gen) {
  return earlier / kWarp == s.linear / kWarp &&
         s.paired[static_cast<std::size_t>(s.linear) * kWarp + static_cast<std::size_t>(earlier % kWarp)] > gen;
}

void shared_hazard(State& s, bool write, bool atomic, std::size_t size, std::uintptr_t offset, const void* pc,
                   const char* other_did, int other, const void* other_pc) {
  char where[64];
  std::snprintf(where, sizeof where, " of %zu bytes at shared offset %#zx", size, static_cast<std::size_t>(offset));
  report(s, std::string("shared-memory hazard: ") + access_name(write, atomic) + where + " at " + source_line(pc) +
                ", and " + thread_name(other, s.block.block_dim) + " " + other_did + " it at " + source_line(other_pc) +
                " in the same barrier interval (no __syncthreads between them, nor a __syncwarp naming both "
                "lanes of one warp)");
}

// An atomic is a write that conflicts with plain accesses only.
void shared_access(State& s, std::uintptr_t offset, std::size_t size, bool write, const void* pc, bool atomic = false) {
  const auto me = static_cast<std::uint16_t>(s.linear + 1);
  const std::uint16_t id = pc_slot(s, pc).id;
  const std::size_t end = std::min<std::size_t>(offset + size, s.shared_span);
  for (std::size_t i = offset; i < end; ++i) {
    SharedCell& c = s.shared_cells[i];
    if (c.interval != s.interval) {
      c = SharedCell{};
      c.interval = s.interval;
    }
    if (c.writer != 0 && c.writer != me && !(atomic && c.atomic_write) && !ordered(s, c.writer - 1, c.write_gen)) {
      return shared_hazard(s, write, atomic, size, offset, pc, c.atomic_write ? "atomically wrote" : "wrote",
                           c.writer - 1, s.pcs[c.write_pc]);
    }
    if (write) {
      for (int r = 0; r < 2; ++r) {
        if (c.reader[r] != 0 && c.reader[r] != me && !ordered(s, c.reader[r] - 1, c.read_gen[r])) {
          return shared_hazard(s, write, atomic, size, offset, pc, "read", c.reader[r] - 1, s.pcs[c.read_pc[r]]);
        }
      }
      if (!(atomic && c.writer == me && !c.atomic_write)) {  // an own plain write stays: others' atomics conflict
        c.writer = me;
        c.atomic_write = atomic;
        c.write_gen = s.syncwarps;
        c.write_pc = id;
      }
      c.reader[0] = c.reader[1] = 0;  // ordered before this write, or reported
    } else {
      // The latest read of each of two distinct readers (a third is not recorded).
      const int r = c.reader[0] == 0 || c.reader[0] == me ? 0 : c.reader[1] == 0 || c.reader[1] == me ? 1 : -1;
      if (r >= 0) {
        c.reader[r] = me;
        c.read_gen[r] = s.syncwarps;
        c.read_pc[r] = id;
      }
    }
  }
}

// ---- global memory ----

// The range around `a` (a device allocation with its shadow, or a gap), looked up on a miss.
Range& range_of(State& s, std::uintptr_t a) {
  if (Range& last = s.ranges[s.last_range]; a - last.lo < last.hi - last.lo) return last;
  for (unsigned i = 0; i < std::size(s.ranges); ++i) {
    if (a - s.ranges[i].lo < s.ranges[i].hi - s.ranges[i].lo) {
      s.last_range = i;
      return s.ranges[i];
    }
  }
  s.last_range = s.next_range++ % std::size(s.ranges);
  Range& r = s.ranges[s.last_range];
  r.shadow = nullptr;
  if (!device_range(reinterpret_cast<const void*>(a), &r.lo, &r.hi)) return r;
  Shadow& shadow = s.shadows[r.lo];
  if (shadow.bytes < r.hi - r.lo) {
    s.shadow_bytes -= shadow.lines.bytes + shadow.cells.bytes;
    release(shadow);
    const std::size_t lines = ((r.hi - r.lo + kLine - 1) / kLine + 63) / 64 * 64;  // whole runs (skew)
    shadow.lines = allocate_zeroed(lines * sizeof(GlobalLine));
    if (shadow.lines.p == nullptr) return r;
    shadow.bytes = r.hi - r.lo;
    s.shadow_bytes += shadow.lines.bytes;
  }
  r.shadow = &shadow;
  return r;
}

[[gnu::noinline]] void global_hazard(State& s, bool write, std::size_t size, std::uintptr_t a, const Range& r,
                                     const void* pc, bool other_wrote, std::uint32_t other_stamp,
                                     std::uint16_t other_pc) {
  char where[96];
  std::snprintf(where, sizeof where, " of %zu bytes at %#zx (device allocation %#zx + %zu)", size,
                static_cast<std::size_t>(a), static_cast<std::size_t>(r.lo), static_cast<std::size_t>(a - r.lo));
  report(s, std::string("global-memory hazard between blocks: ") + access_name(write) + where + " at " +
                source_line(pc) + ", and block " + dims(index_of(other_stamp - s.launch_first, s.block.grid_dim)) +
                " " + (other_wrote ? "wrote" : "read") + " it at " + source_line(s.pcs[other_pc]) +
                " in the same launch (the blocks of a launch are not ordered; only atomics may share an address)");
}

// A second block accessed line `index` in this launch: its granules get cells from its record.
[[gnu::noinline]] bool split(State& s, Shadow& shadow, std::size_t index) {
  const std::size_t granules = (shadow.bytes + 3) / 4;
  if (shadow.cells.p == nullptr) {
    shadow.cells = allocate_zeroed(granules * sizeof(GlobalCell));
    if (shadow.cells.p == nullptr) return false;
    s.shadow_bytes += shadow.cells.bytes;
  }
  GlobalLine& l = shadow.line()[skew(index)];
  const std::size_t per_line = kLine / 4;
  for (std::size_t g = 0; g < per_line && index * per_line + g < granules; ++g) {
    const auto written = static_cast<std::uint32_t>(l.written >> (4 * g) & 0xf);
    const auto read = static_cast<std::uint32_t>(l.read >> (4 * g) & 0xf);
    shadow.cell()[index * per_line + g] = GlobalCell{written != 0 ? l.owner << 4 | written : 0,
                                                     read != 0 ? l.owner << 4 | read : 0, l.write_pc, l.read_pc};
  }
  l.split = s.launch_first;
  return true;
}

// Bytes [at, end) of the allocation, within one line that has cells; false on a hazard.
[[gnu::noinline]] bool cell_access(State& s, const Range& r, std::uintptr_t at, std::uintptr_t end, std::uintptr_t a,
                                   std::size_t size, bool write, const void* pc, std::uint16_t id) {
  const std::uint32_t me = s.block_stamp, first = s.launch_first;
  for (; at < end; at = (at | 3) + 1) {
    // The bytes of granule at / 4 in [at, end).
    const std::uintptr_t n = std::min<std::uintptr_t>(end - at, 4 - (at & 3));
    const auto mask = static_cast<std::uint32_t>(((1u << n) - 1) << (at & 3));
    GlobalCell& c = r.shadow->cell()[at / 4];
    const std::uint32_t writer = c.write >> 4, reader = c.read >> 4;  // stamps; below `first`: none
    if (writer >= first && writer != me && (c.write & mask) != 0) {
      global_hazard(s, write, size, a, r, pc, true, writer, c.write_pc);
      return false;
    }
    if (write) {
      if (reader >= first && reader != me && (c.read & mask) != 0) {
        global_hazard(s, write, size, a, r, pc, false, reader, c.read_pc);
        return false;
      }
      c.write = writer == me ? c.write | mask : me << 4 | mask;
      c.write_pc = id;
    } else if (reader == me) {
      c.read |= mask;
    } else if (reader < first) {
      // The first reader is kept: blocks run one after another, so if it is not the current
      // block, some other block read the granule.
      c.read = me << 4 | mask;
      c.read_pc = id;
    }
  }
  return true;
}

// Block `me`'s access to `bytes` of line `l`, not split in this launch (launch_first `first`),
// when no other block has touched it in the launch: recorded, true. False: another block has.
inline bool line_access(GlobalLine& l, std::uint32_t me, std::uint32_t first, std::uint64_t bytes, bool write,
                        std::uint16_t id) {
  if (l.owner < first) {  // the line's first access in this launch
    l = GlobalLine{me, l.split, write ? bytes : 0, write ? 0 : bytes, id, id};
    return true;
  }
  if (l.owner != me) return false;
  if (write) {
    l.written |= bytes;
    l.write_pc = id;
  } else {
    if (l.read == 0) l.read_pc = id;
    l.read |= bytes;
  }
  return true;
}

[[gnu::noinline]] void global_access(State& s, std::uintptr_t a, std::size_t size, bool write, const void* pc) {
  // An instruction mostly accesses one array: the range it found last is tried first.
  PcSlot& slot = pc_slot(s, pc);
  const Range* hint = &s.ranges[slot.range];
  if (a - hint->lo >= hint->hi - hint->lo) {
    hint = &range_of(s, a);
    slot.range = static_cast<std::uint16_t>(hint - s.ranges);
  }
  const Range& r = *hint;
  if (r.shadow == nullptr) return;
  const std::uintptr_t end = std::min<std::uintptr_t>(a + size, r.hi) - r.lo;
  const std::uint32_t me = s.block_stamp, first = s.launch_first;
  const std::uint16_t id = slot.id;
  for (std::uintptr_t at = a - r.lo; at < end; at = (at | (kLine - 1)) + 1) {
    const std::uintptr_t line_end = std::min<std::uintptr_t>(end, (at | (kLine - 1)) + 1);
    GlobalLine& l = r.shadow->line()[skew(at / kLine)];
    const std::uintptr_t n = line_end - at;
    const std::uint64_t bytes = (n == kLine ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1) << (at % kLine);
    if (l.split != first) {
      if (line_access(l, me, first, bytes, write, id)) continue;
      if (!split(s, *r.shadow, at / kLine)) return;
    }
    if (!cell_access(s, r, at, line_end, a, size, write, pc, id)) return;
    (write ? l.written : l.read) |= bytes;  // a split line's record: what any block did
  }
}

// global_access's common case, small enough to inline into the hooks: an instruction seen
// before, in the range it accessed last, within one line that no other block has touched in the
// launch. False: global_access decides.
inline bool global_access_fast(State& s, std::uintptr_t a, std::size_t size, bool write, const void* pc) {
  PcSlot& slot = pc_cached(s, pc);
  if (slot.pc != pc) return false;
  const Range& r = s.ranges[slot.range];
  const std::uintptr_t at = a - r.lo;
  if (size >= kLine || at >= r.hi - r.lo || r.hi - r.lo - at < size || at % kLine + size > kLine) return false;
  if (r.shadow == nullptr) return true;  // not device memory
  GlobalLine& l = r.shadow->line()[skew(at / kLine)];
  const std::uint32_t first = s.launch_first;
  const std::uint64_t bytes = ((std::uint64_t{1} << size) - 1) << (at % kLine);
  // A read of bytes some block read and none wrote (weights every block reads) changes nothing.
  if (l.split == first) return !write && (bytes & ~l.read) == 0 && (bytes & l.written) == 0;
  return line_access(l, s.block_stamp, s.launch_first, bytes, write, slot.id);
}

// Every plain access of kernel code comes here.
inline void access(const void* p, std::size_t size, bool write, const void* pc) {
  State* s = active;
  if (s == nullptr) return;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a - s->shared_lo < s->shared_span) return shared_access(*s, a - s->shared_lo, size, write, pc);
  if (a - s->stack_lo < s->stack_span) return;  // the thread's own locals (or global_off: all)
  if (!global_access_fast(*s, a, size, write, pc)) global_access(*s, a, size, write, pc);
}

}  // namespace

void atomic_access(const volatile void* p, std::size_t size, const void* pc) {
  State* s = active;
  if (s == nullptr) return;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a - s->shared_lo < s->shared_span) shared_access(*s, a - s->shared_lo, size, true, pc, true);
}

// ---- what the scheduler tells the detector ----

bool enabled() { return settings().racecheck; }

void drop_shadows(State& s) {
  for (auto& [base, shadow] : s.shadows) release(shadow);
  s.shadows.clear();
  s.shadow_bytes = 0;
}

void begin_launch(const dim3& grid) {
  State& s = state;
  current = &s;
  for (auto& r : s.ranges) r = Range{};  // allocations may have changed since the last launch
  const std::uint64_t blocks = std::uint64_t{grid.x} * grid.y * grid.z;
  s.global_off = blocks >= kStampLimit;
  if (s.shadow_bytes > kShadowBudget || s.next_stamp + blocks >= kStampLimit) {
    drop_shadows(s);
    s.next_stamp = 1;
  }
  s.launch_first = s.next_stamp;
  if (!s.global_off) s.next_stamp += static_cast<std::uint32_t>(blocks);
}

void begin_block(const BlockInfo& block) {
  State& s = *current;
  s.block = block;
  s.block_stamp = s.launch_first + block.block_idx.x + block.block_idx.y * block.grid_dim.x +
                  block.block_idx.z * block.grid_dim.x * block.grid_dim.y;
  s.shared_lo = reinterpret_cast<std::uintptr_t>(block.shared);
  s.shared_span = block.shared_bytes;
  if (s.shared_capacity < block.shared_bytes) {
    std::free(s.shared_cells);
    s.shared_cells = static_cast<SharedCell*>(std::calloc(block.shared_bytes, sizeof(SharedCell)));
    if (s.shared_cells == nullptr) throw std::bad_alloc();
    s.shared_capacity = block.shared_bytes;
  }
  s.paired.assign(static_cast<std::size_t>(block.threads) * kWarp, 0);
  s.syncwarps = 0;
  s.stopped = false;
  barrier();
}

void enter(int linear, std::uintptr_t stack_lo, std::uintptr_t stack_hi) {
  State& s = *current;
  s.linear = linear;
  // The thread's own stack is not checked; nor is any address outside shared memory when global
  // memory is not (global_off): the hooks then need one test for both.
  s.stack_lo = s.global_off ? 0 : stack_lo;
  s.stack_span = s.global_off ? UINTPTR_MAX : stack_hi - stack_lo;
  active = s.stopped ? nullptr : &s;
}

void leave() { active = nullptr; }

void barrier() {
  State& s = *current;
  if (++s.interval == 0) {
    // Wrapped: forget every cell rather than mistake an old interval for the current one.
    std::memset(static_cast<void*>(s.shared_cells), 0, s.shared_capacity * sizeof(SharedCell));
    s.interval = 1;
  }
}

void warp_synced(int warp, unsigned mask) {
  State& s = *current;
  const std::uint32_t gen = ++s.syncwarps;
  for (unsigned lanes = mask; lanes != 0; lanes &= lanes - 1) {
    const auto t = static_cast<std::size_t>(warp * kWarp + __builtin_ctz(lanes));
    for (unsigned others = mask; others != 0; others &= others - 1) {
      s.paired[t * kWarp + static_cast<std::size_t>(__builtin_ctz(others))] = gen;
    }
  }
}

}  // namespace tutti::emu::racecheck

// ---- ThreadSanitizer's instrumentation ABI (what -fsanitize=thread code calls) ----

namespace rc = tutti::emu::racecheck;

#define TUTTI_RACECHECK_ACCESS(n)                                                                             \
  extern "C" void __tsan_read##n(void* p) { rc::access(p, n, false, __builtin_return_address(0)); }           \
  extern "C" void __tsan_write##n(void* p) { rc::access(p, n, true, __builtin_return_address(0)); }           \
  extern "C" void __tsan_unaligned_read##n(void* p) { rc::access(p, n, false, __builtin_return_address(0)); } \
  extern "C" void __tsan_unaligned_write##n(void* p) { rc::access(p, n, true, __builtin_return_address(0)); } \
  extern "C" void __tsan_volatile_read##n(void* p) { rc::access(p, n, false, __builtin_return_address(0)); }  \
  extern "C" void __tsan_volatile_write##n(void* p) { rc::access(p, n, true, __builtin_return_address(0)); }
TUTTI_RACECHECK_ACCESS(1)
TUTTI_RACECHECK_ACCESS(2)
TUTTI_RACECHECK_ACCESS(4)
TUTTI_RACECHECK_ACCESS(8)
TUTTI_RACECHECK_ACCESS(16)
#undef TUTTI_RACECHECK_ACCESS

extern "C" void __tsan_read_range(void* p, std::size_t n) { rc::access(p, n, false, __builtin_return_address(0)); }
extern "C" void __tsan_write_range(void* p, std::size_t n) { rc::access(p, n, true, __builtin_return_address(0)); }
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_vptr_update(void**, void*) {}
extern "C" void __tsan_vptr_read(void**) {}
