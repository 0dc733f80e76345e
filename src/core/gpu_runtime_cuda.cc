// The GPU runtime over the CUDA runtime API (builds with TUTTI_WITH_CUDA).
#include <cuda_runtime.h>

#include <mutex>

#include "core/cuda_check.h"
#include "core/gpu_runtime.h"

namespace tutti::gpu {
namespace {
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

std::string version_str(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
}  // namespace

int device_count() {
  // Asked once: cudaGetDeviceCount fails on a machine without a driver or GPU, which is
  // the normal case on CI; that reads as zero GPUs. The sticky error is cleared.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

bool built_with_cuda() { return true; }

std::string runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return "unknown";
  return version_str(v);
}

std::string driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) return "none";
  return version_str(v);
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  TUTTI_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

int compute_capability(int device) {
  int major = 0, minor = 0;
  TUTTI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TUTTI_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

int multiprocessor_count(int device) {
  int n = 0;
  TUTTI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

void set_device(int device) { TUTTI_CUDA_CHECK(cudaSetDevice(device)); }

int current_device() {
  int d = 0;
  TUTTI_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void* malloc_device(std::size_t nbytes, int device) {
  int previous = current_device();
  if (previous != device) set_device(device);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, nbytes == 0 ? 1 : nbytes);
  if (previous != device) set_device(previous);
  if (err != cudaSuccess) {
    detail::throw_cuda_error(
        err, ("cudaMalloc of " + std::to_string(nbytes) + " bytes on cuda:" + std::to_string(device)).c_str(), __FILE__,
        __LINE__);
  }
  return p;
}

void free_device(void* ptr, int) noexcept { (void)cudaFree(ptr); }

void* malloc_pinned(std::size_t nbytes) {
  void* p = nullptr;
  TUTTI_CUDA_CHECK(cudaMallocHost(&p, nbytes == 0 ? 1 : nbytes));
  return p;
}

void free_pinned(void* ptr) noexcept { (void)cudaFreeHost(ptr); }

void memcpy_async(void* dst, const void* src, std::size_t nbytes, void* stream) {
  if (nbytes == 0) return;
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, as_stream(stream)));
}

void memset_async(void* dst, int value, std::size_t nbytes, void* stream) {
  if (nbytes == 0) return;
  TUTTI_CUDA_CHECK(cudaMemsetAsync(dst, value, nbytes, as_stream(stream)));
}

void* stream_create(int device, bool high_priority) {
  int previous = current_device();
  if (previous != device) set_device(device);
  int least = 0, greatest = 0;
  TUTTI_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  TUTTI_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least));
  if (previous != device) set_device(previous);
  return s;
}

void stream_destroy(void* stream) noexcept {
  if (stream != nullptr) (void)cudaStreamDestroy(as_stream(stream));
}

void stream_synchronize(void* stream) { TUTTI_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream))); }

void device_synchronize() { TUTTI_CUDA_CHECK(cudaDeviceSynchronize()); }

void* event_create(int device, bool enable_timing) {
  int previous = current_device();
  if (previous != device) set_device(device);
  cudaEvent_t e = nullptr;
  TUTTI_CUDA_CHECK(cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
  if (previous != device) set_device(previous);
  return e;
}

void event_destroy(void* event) noexcept {
  if (event != nullptr) (void)cudaEventDestroy(as_event(event));
}

void event_record(void* event, void* stream) { TUTTI_CUDA_CHECK(cudaEventRecord(as_event(event), as_stream(stream))); }

void stream_wait_event(void* stream, void* event) {
  TUTTI_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
}

void event_synchronize(void* event) { TUTTI_CUDA_CHECK(cudaEventSynchronize(as_event(event))); }

bool event_query(void* event) {
  const cudaError_t err = cudaEventQuery(as_event(event));
  if (err == cudaErrorNotReady) return false;
  TUTTI_CUDA_CHECK(err);
  return true;
}

float event_elapsed_ms(void* start, void* end) {
  float ms = 0.f;
  TUTTI_CUDA_CHECK(cudaEventElapsedTime(&ms, as_event(start), as_event(end)));
  return ms;
}

}  // namespace tutti::gpu
