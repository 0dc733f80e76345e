// The CUDA runtime API of the emulated device: settings, devices, errors, launches.
//
// The parts: this file (settings, devices, sticky faults, errors, device queries, kernel
// launches), streams.cc (streams, events and the stream workers), memory.cc (allocations,
// copies, memsets), scheduler.cc (how a kernel runs), racecheck.cc (the hazard detector).
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>
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
    v.racecheck = env_int("TUTTI_EMU_RACECHECK", 1, 0) != 0;
    return v;
  }();
  return s;
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

int current_device_index() { return current_index; }

// The error a call returns when the device already faulted.
cudaError_t faulted() {
  const cudaError_t e = sticky_error();
  return e == cudaSuccess ? cudaSuccess : set_last_error(e);
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

std::string short_path(const std::string& file) {
  const auto slash = file.rfind('/');
  if (slash == std::string::npos) return file;
  const auto parent = file.rfind('/', slash > 0 ? slash - 1 : 0);
  const auto grand = parent == std::string::npos || parent == 0 ? std::string::npos : file.rfind('/', parent - 1);
  return file.substr(grand == std::string::npos ? 0 : grand + 1);
}

std::string dims(const uint3& v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", v.x, v.y, v.z);
  return buf;
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
