// The CUDA runtime API of the emulated device: devices, memory, streams, events, errors.
//
// Streams: each one is a host thread that runs its operations in order. An operation starts
// only after the marks it waits for (an event, the legacy default stream's rule) are reached.
// The legacy default stream (the null handle) waits for all earlier work of the device's
// blocking streams, and they wait for its earlier work; non-blocking streams (what tutti
// creates) are ordered with nothing but their own events, as on a GPU. Operations read and
// write host memory, so whatever a missing dependency lets run early really does run early.
//
// Copies follow the runtime API's rules for pageable host memory: a copy into pageable memory
// returns only when it is done; a copy from it is staged at the call (the caller may reuse the
// buffer at once); every other copy is asynchronous.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "runtime.h"

namespace tutti::emu {
namespace {

int env_int(const char* name, int fallback, int lo) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > 1 << 20) {
    std::fprintf(stderr, "tutti CUDA emulation: ignoring %s=%s (expected an integer >= %d)\n", name, v, lo);
    return fallback;
  }
  return static_cast<int>(x);
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

thread_local int current_index = 0;
thread_local cudaError_t last_error = cudaSuccess;

// The machinery's singletons are never destroyed: stream threads may still wait on them while
// the process exits (destroying a condition variable with waiters can block forever), and a
// legacy default stream's thread lives as long as the process.
std::vector<std::unique_ptr<Device>>& devices() {
  static auto& all = *new std::vector<std::unique_ptr<Device>>([] {
    std::vector<std::unique_ptr<Device>> v;
    for (int i = 0; i < settings().devices; ++i) {
      v.push_back(std::make_unique<Device>());
      v.back()->index = i;
    }
    return v;
  }());
  return all;
}

std::condition_variable& work_cv() {
  static auto& cv = *new std::condition_variable;
  return cv;
}

// Live streams by handle, so that a destroyed or foreign handle is an error, not a crash.
std::map<Stream*, std::shared_ptr<Stream>>& live_streams() {
  static auto& streams = *new std::map<Stream*, std::shared_ptr<Stream>>;
  return streams;
}
std::map<Event*, std::shared_ptr<Event>>& live_events() {
  static auto& events = *new std::map<Event*, std::shared_ptr<Event>>;
  return events;
}

// ---- the stream worker ----

void run_stream(Stream* s) {
  std::mt19937_64 rng(settings().seed * 0x9e3779b97f4a7c15ULL + s->id);
  const int delay = settings().stream_delay_us;
  std::unique_lock l(lock());
  for (;;) {
    work_cv().wait(l, [&] { return !s->queue.empty() || s->stopping; });
    if (s->queue.empty()) return;  // stopping, and drained
    auto [work, waits] = std::move(s->queue.front());
    s->queue.pop_front();
    completed_cv().wait(
        l, [&] { return std::all_of(waits.begin(), waits.end(), [](const Mark& m) { return reached(m); }); });
    const bool skip = s->device->fault != cudaSuccess;
    l.unlock();
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (static_cast<unsigned>(delay) + 1)));
    if (!skip) work();
    l.lock();
    ++s->completed;
    completed_cv().notify_all();
  }
}

std::shared_ptr<Stream> new_stream(Device& d, bool blocking, bool legacy, int priority) {
  static unsigned next_id = 0;
  auto s = std::make_shared<Stream>();
  s->device = &d;
  s->blocking = blocking;
  s->legacy = legacy;
  s->priority = priority;
  {
    std::lock_guard l(lock());
    s->id = next_id++;
    d.streams.push_back(s);
    if (!legacy) live_streams()[s.get()] = s;
  }
  s->worker = std::thread(run_stream, s.get());
  return s;
}

// The legacy default stream of a device, started on first use.
std::shared_ptr<Stream> legacy_stream(Device& d) {
  static auto& m = *new std::mutex;
  std::lock_guard guard(m);
  if (!d.legacy) d.legacy = new_stream(d, /*blocking=*/true, /*legacy=*/true, 0);
  return d.legacy;
}

// ---- allocations ----

struct Allocation {
  std::size_t size;
  MemoryKind kind;
  int device;
};
std::mutex& registry_mutex = *new std::mutex;
std::map<std::uintptr_t, Allocation>& registry = *new std::map<std::uintptr_t, Allocation>;

void* allocate(std::size_t size, MemoryKind kind, int device) {
  // 256-byte aligned as cudaMalloc's, and exactly `size` long: AddressSanitizer's red zone
  // starts at the first byte past the allocation, as compute-sanitizer's memcheck does.
  void* p = nullptr;
  if (posix_memalign(&p, 256, std::max<std::size_t>(size, 1)) != 0) return nullptr;
  // Fresh device memory holds garbage on a GPU; 0xff bytes (nan) make reads of it visible.
  if (kind == MemoryKind::device) std::memset(p, 0xff, size);
  std::lock_guard l(registry_mutex);
  registry[reinterpret_cast<std::uintptr_t>(p)] = Allocation{size, kind, device};
  return p;
}

// The allocation holding [p, p + n), if any (kind pageable when none).
const Allocation* find_allocation(const void* p, std::size_t n = 1) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = registry.upper_bound(a);
  if (it == registry.begin()) return nullptr;
  --it;
  if (a >= it->first + std::max<std::size_t>(it->second.size, 1)) return nullptr;
  if (a + n > it->first + std::max<std::size_t>(it->second.size, 1)) return nullptr;
  return &it->second;
}

bool release(void* p, MemoryKind kind) {
  {
    std::lock_guard l(registry_mutex);
    auto it = registry.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == registry.end() || it->second.kind != kind) return false;
    registry.erase(it);
  }
  std::free(p);
  return true;
}

// Every stream of `d` at the point of the call.
void synchronize_device(Device& d) {
  std::vector<Mark> marks;
  {
    std::lock_guard l(lock());
    for (auto& w : d.streams) {
      if (auto s = w.lock()) marks.push_back(Mark{s, s->enqueued});
    }
  }
  for (const auto& m : marks) wait_for(m);
}

// The error a call returns when the device already faulted.
cudaError_t faulted() {
  const cudaError_t e = sticky_error();
  return e == cudaSuccess ? cudaSuccess : set_last_error(e);
}

}  // namespace

// ---- internals shared with the scheduler and the libraries ----

const Settings& settings() {
  static const Settings s = [] {
    Settings v;
    v.devices = env_int("TUTTI_EMU_DEVICES", 1, 0);
    v.sm_count = env_int("TUTTI_EMU_SM_COUNT", 4, 1);
    v.stream_delay_us = env_int("TUTTI_EMU_STREAM_DELAY_US", 0, 0);
    v.seed = static_cast<std::uint64_t>(env_int("TUTTI_EMU_SEED", 1, 0));
    v.fiber_stack_bytes = static_cast<std::size_t>(env_int("TUTTI_EMU_STACK_KB", 0, 16)) * 1024;
    return v;
  }();
  return s;
}

std::mutex& lock() {
  static auto& m = *new std::mutex;
  return m;
}

std::condition_variable& completed_cv() {
  static auto& cv = *new std::condition_variable;
  return cv;
}

Device* device_at(int index) {
  auto& all = devices();
  return index >= 0 && index < static_cast<int>(all.size()) ? all[static_cast<std::size_t>(index)].get() : nullptr;
}

Device& current_device() {
  Device* d = device_at(current_index);
  if (d == nullptr) throw std::runtime_error("tutti CUDA emulation: no emulated device (TUTTI_EMU_DEVICES=0)");
  return *d;
}

std::shared_ptr<Stream> stream_of(cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    Device* d = device_at(current_index);
    return d == nullptr ? nullptr : legacy_stream(*d);
  }
  std::lock_guard l(lock());
  auto it = live_streams().find(reinterpret_cast<Stream*>(handle));
  return it == live_streams().end() ? nullptr : it->second;
}

bool reached(const Mark& m) { return m.stream == nullptr || m.stream->completed >= m.seq; }

Mark enqueue(const std::shared_ptr<Stream>& s, std::function<void()> work, std::vector<Mark> waits) {
  std::lock_guard l(lock());
  Device& d = *s->device;
  if (s->legacy) {
    for (auto& w : d.streams) {
      auto other = w.lock();
      if (other && other != s && other->blocking && other->enqueued > other->completed) {
        waits.push_back(Mark{other, other->enqueued});
      }
    }
  } else if (s->blocking && d.legacy && d.legacy->enqueued > d.legacy->completed) {
    waits.push_back(Mark{d.legacy, d.legacy->enqueued});
  }
  s->queue.emplace_back(std::move(work), std::move(waits));
  const Mark m{s, ++s->enqueued};
  work_cv().notify_all();
  return m;
}

void wait_for(const Mark& m) {
  std::unique_lock l(lock());
  completed_cv().wait(l, [&] { return reached(m); });
}

void record_fault(Device& d, const std::string& report) {
  {
    std::lock_guard l(lock());
    if (d.fault != cudaSuccess) return;
    d.fault_report =
        "unspecified launch failure on the emulated device cuda:" + std::to_string(d.index) + ": " + report;
    d.fault = cudaErrorLaunchFailure;
  }
  std::fprintf(stderr, "========= tutti CUDA emulation: kernel fault\n========= %s\n", d.fault_report.c_str());
}

void notice_once(const char* what) {
  static auto& m = *new std::mutex;
  static auto& said = *new std::set<std::string>;
  std::lock_guard l(m);
  if (said.insert(what).second) std::fprintf(stderr, "tutti CUDA emulation: %s\n", what);
}

cudaError_t sticky_error() {
  Device* d = device_at(current_index);
  if (d == nullptr) return cudaSuccess;
  std::lock_guard l(lock());
  return d->fault;
}

cudaError_t set_last_error(cudaError_t e) {
  last_error = e;
  return e;
}

MemoryKind kind_of(const void* p) {
  std::lock_guard l(registry_mutex);
  const Allocation* a = find_allocation(p);
  return a == nullptr ? MemoryKind::pageable : a->kind;
}

namespace {
// TUTTI_EMU_LAUNCH_LOG=<file>: the name of every kernel this process launches, once each (the
// file is rewritten by each process). The kernel coverage test reads these.
void log_launch(const char* name) {
  static const char* path = std::getenv("TUTTI_EMU_LAUNCH_LOG");
  if (path == nullptr || *path == '\0') return;
  static auto& m = *new std::mutex;
  static auto& seen = *new std::set<std::string>;
  static std::FILE* out = std::fopen(path, "w");
  std::lock_guard l(m);
  if (out == nullptr || !seen.insert(name).second) return;
  std::fprintf(out, "%s\n", name);
  std::fflush(out);
}
}  // namespace

void launch(const LaunchConfig& config, const char* name, const char* file, int line,
            std::unique_ptr<KernelBody> body) {
  log_launch(name);
  const dim3 g = config.grid, b = config.block;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
      static_cast<unsigned long long>(b.x) * b.y * b.z > 1024 || g.x == 0 || g.y == 0 || g.z == 0 ||
      g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  if (config.shared_bytes > 48 * 1024) {
    set_last_error(cudaErrorInvalidValue);
    return;
  }
  if (faulted() != cudaSuccess) return;
  auto s = stream_of(config.stream);
  if (!s) {
    set_last_error(cudaErrorInvalidResourceHandle);
    return;
  }
  auto k = std::make_shared<KernelLaunch>(KernelLaunch{config, name, file, line, std::move(body)});
  Device* d = s->device;
  enqueue(s, [k, d] {
    try {
      run_kernel(*k);
    } catch (const std::exception& e) {
      record_fault(*d, e.what());
    }
  });
}

}  // namespace tutti::emu

// ---- the runtime API ----

using namespace tutti::emu;

namespace {

const char* error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

// Copies within host memory are what every emulated copy is; the checks are CUDA's.
cudaError_t check_copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  const MemoryKind dk = kind_of(dst), sk = kind_of(src);
  const bool dst_dev = dk == MemoryKind::device, src_dev = sk == MemoryKind::device;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      if (!dst_dev || src_dev) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyDeviceToHost:
      if (dst_dev || !src_dev) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyDeviceToDevice:
      if (!dst_dev || !src_dev) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyHostToHost:
      if (dst_dev || src_dev) return cudaErrorInvalidValue;
      break;
    case cudaMemcpyDefault: break;
    default: return cudaErrorInvalidMemcpyDirection;
  }
  // A device or pinned range must lie inside its allocation.
  std::lock_guard l(registry_mutex);
  if (dk != MemoryKind::pageable && find_allocation(dst, n) == nullptr) return cudaErrorInvalidValue;
  if (sk != MemoryKind::pageable && find_allocation(src, n) == nullptr) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

const char* cudaGetErrorName(cudaError_t error) { return error_name(error); }

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: {
      // The report of the current device's fault: set once, never changed after.
      Device* d = device_at(current_index);
      if (d != nullptr && d->fault == cudaErrorLaunchFailure) return d->fault_report.c_str();
      return "unspecified launch failure";
    }
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() {
  const cudaError_t sticky = sticky_error();
  if (sticky != cudaSuccess) return sticky;
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  const cudaError_t sticky = sticky_error();
  return sticky != cudaSuccess ? sticky : last_error;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = settings().devices;
  return *count > 0 ? cudaSuccess : set_last_error(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  if (device_at(device) == nullptr) return set_last_error(cudaErrorInvalidDevice);
  current_index = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (settings().devices == 0) return set_last_error(cudaErrorNoDevice);
  *device = current_index;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device_at(device) == nullptr) return set_last_error(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "tutti emulated CUDA device (CPU fibers, %d SMs)", settings().sm_count);
  prop->totalGlobalMem = std::size_t{16} << 30;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024, prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff, prop->maxGridSize[1] = 65535, prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = settings().sm_count;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device_at(device) == nullptr) return set_last_error(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = settings().sm_count; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 48 * 1024; break;
    default: return set_last_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (device_at(current_index) == nullptr) return set_last_error(cudaErrorNoDevice);
  synchronize_device(current_device());
  return faulted();
}

cudaError_t cudaDeviceReset() {
  if (device_at(current_index) == nullptr) return set_last_error(cudaErrorNoDevice);
  Device& d = current_device();
  synchronize_device(d);
  std::lock_guard l(lock());
  d.fault = cudaSuccess;
  d.fault_report.clear();
  last_error = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, std::size_t size) {
  if (device_at(current_index) == nullptr) return set_last_error(cudaErrorNoDevice);
  if (faulted() != cudaSuccess) return sticky_error();
  *ptr = allocate(size, MemoryKind::device, current_index);
  return *ptr == nullptr ? set_last_error(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  // cudaFree waits for the device: work still queued may use the memory.
  if (device_at(current_index) != nullptr) synchronize_device(current_device());
  return release(ptr, MemoryKind::device) ? cudaSuccess : set_last_error(cudaErrorInvalidValue);
}

cudaError_t cudaMallocHost(void** ptr, std::size_t size) {
  *ptr = allocate(size, MemoryKind::pinned, -1);
  return *ptr == nullptr ? set_last_error(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  for (auto& d : devices()) synchronize_device(*d);
  return release(ptr, MemoryKind::pinned) ? cudaSuccess : set_last_error(cudaErrorInvalidValue);
}

cudaError_t cudaMallocAsync(void** ptr, std::size_t size, cudaStream_t stream) {
  if (faulted() != cudaSuccess) return sticky_error();
  auto s = stream_of(stream);
  if (!s) return set_last_error(cudaErrorInvalidResourceHandle);
  // Taken at once: a conservative stand-in for "usable in stream order".
  *ptr = allocate(size, MemoryKind::device, s->device->index);
  return *ptr == nullptr ? set_last_error(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return cudaSuccess;
  auto s = stream_of(stream);
  if (!s) return set_last_error(cudaErrorInvalidResourceHandle);
  if (kind_of(ptr) != MemoryKind::device) return set_last_error(cudaErrorInvalidValue);
  // Freed when the stream gets there: work queued before may still use it, work after may not.
  enqueue(s, [ptr] { release(ptr, MemoryKind::device); });
  return faulted();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (faulted() != cudaSuccess) return sticky_error();
  if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess) return set_last_error(e);
  auto s = stream_of(stream);
  if (!s) return set_last_error(cudaErrorInvalidResourceHandle);
  const MemoryKind dk = kind_of(dst), sk = kind_of(src);
  if (dk == MemoryKind::pageable) {
    // Into pageable memory: the call returns when the copy is done.
    wait_for(enqueue(s, [=] { std::memcpy(dst, src, count); }));
    return faulted();
  }
  if (sk == MemoryKind::pageable) {
    // From pageable memory: staged now, so the caller may reuse the buffer at once.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + count);
    enqueue(s, [=] { std::memcpy(dst, staged->data(), count); });
    return cudaSuccess;
  }
  enqueue(s, [=] { std::memcpy(dst, src, count); });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, nullptr); e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (faulted() != cudaSuccess) return sticky_error();
  {
    std::lock_guard l(registry_mutex);
    const Allocation* a = find_allocation(dst, count);
    if (a == nullptr || a->kind != MemoryKind::device) return set_last_error(cudaErrorInvalidValue);
  }
  auto s = stream_of(stream);
  if (!s) return set_last_error(cudaErrorInvalidResourceHandle);
  enqueue(s, [=] { std::memset(dst, value, count); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, std::size_t count) {
  if (const cudaError_t e = cudaMemsetAsync(dst, value, count, nullptr); e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  if (device_at(current_index) == nullptr) return set_last_error(cudaErrorNoDevice);
  auto s = new_stream(current_device(), (flags & cudaStreamNonBlocking) == 0, /*legacy=*/false, priority);
  *stream = reinterpret_cast<cudaStream_t>(s.get());
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithPriority(stream, 0, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard l(lock());
    auto it = live_streams().find(reinterpret_cast<Stream*>(stream));
    if (it == live_streams().end()) return set_last_error(cudaErrorInvalidResourceHandle);
    s = it->second;
    live_streams().erase(it);
    s->stopping = true;
    work_cv().notify_all();
  }
  // Work already queued still runs (as on a GPU); the worker ends when it is done.
  s->worker.join();
  std::lock_guard l(lock());
  auto& list = s->device->streams;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](const std::weak_ptr<Stream>& w) {
                              auto o = w.lock();
                              return !o || o == s;
                            }),
             list.end());
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  auto s = stream_of(stream);
  if (!s) return set_last_error(cudaErrorInvalidResourceHandle);
  Mark m;
  {
    std::lock_guard l(lock());
    m = Mark{s, s->enqueued};
  }
  wait_for(m);
  return faulted();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  auto s = stream_of(stream);
  if (!s) return set_last_error(cudaErrorInvalidResourceHandle);
  if (faulted() != cudaSuccess) return sticky_error();
  std::lock_guard l(lock());
  return s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  auto s = stream_of(stream);
  if (!s) return set_last_error(cudaErrorInvalidResourceHandle);
  if (faulted() != cudaSuccess) return sticky_error();
  enqueue(s, [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (device_at(current_index) == nullptr) return set_last_error(cudaErrorNoDevice);
  auto e = std::make_shared<Event>();
  e->device = &current_device();
  e->timing = (flags & cudaEventDisableTiming) == 0;
  std::lock_guard l(lock());
  live_events()[e.get()] = e;
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

namespace {
std::shared_ptr<Event> event_of(cudaEvent_t handle) {
  std::lock_guard l(lock());
  auto it = live_events().find(reinterpret_cast<Event*>(handle));
  return it == live_events().end() ? nullptr : it->second;
}
}  // namespace

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard l(lock());
  // A record still queued keeps the event alive until it has run.
  return live_events().erase(reinterpret_cast<Event*>(event)) == 1 ? cudaSuccess
                                                                   : set_last_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto e = event_of(event);
  auto s = stream_of(stream);
  if (!e || !s) return set_last_error(cudaErrorInvalidResourceHandle);
  if (faulted() != cudaSuccess) return sticky_error();
  const Mark m = enqueue(s, [e] { e->time_ms = now_ms(); });
  std::lock_guard l(lock());
  e->mark = m;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  auto e = event_of(event);
  auto s = stream_of(stream);
  if (!e || !s) return set_last_error(cudaErrorInvalidResourceHandle);
  if (faulted() != cudaSuccess) return sticky_error();
  Mark m;
  {
    std::lock_guard l(lock());
    m = e->mark;  // the record as of now; a later record does not move this wait
  }
  if (m.stream) enqueue(s, [] {}, {m});
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  auto e = event_of(event);
  if (!e) return set_last_error(cudaErrorInvalidResourceHandle);
  Mark m;
  {
    std::lock_guard l(lock());
    m = e->mark;
  }
  wait_for(m);
  return faulted();
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  auto e = event_of(event);
  if (!e) return set_last_error(cudaErrorInvalidResourceHandle);
  if (faulted() != cudaSuccess) return sticky_error();
  std::lock_guard l(lock());
  return reached(e->mark) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto a = event_of(start), b = event_of(end);
  if (!a || !b) return set_last_error(cudaErrorInvalidResourceHandle);
  std::lock_guard l(lock());
  if (!a->timing || !b->timing || !a->mark.stream || !b->mark.stream)
    return set_last_error(cudaErrorInvalidResourceHandle);
  if (!reached(a->mark) || !reached(b->mark)) return cudaErrorNotReady;
  *ms = static_cast<float>(b->time_ms - a->time_ms);
  return cudaSuccess;
}
