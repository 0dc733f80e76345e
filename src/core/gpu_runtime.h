// The GPU runtime as the rest of libtutti sees it: a thin layer over the CUDA runtime API
// so that files other than gpu_runtime_cuda.cc need not include CUDA headers or #ifdef.
// gpu_runtime_none.cc implements it for builds without CUDA (no GPU, every call throws).
// Internal header: not installed.
#pragma once

#include <cstddef>
#include <string>

namespace tutti::gpu {

// Number of visible GPUs; 0 when no driver, no GPU, or no CUDA in the build. Never throws.
int device_count();
bool built_with_cuda();
std::string runtime_version();
std::string driver_version();
std::string device_name(int device);  // "NVIDIA H200"
int compute_capability(int device);   // 90 for sm_90
int multiprocessor_count(int device);

// Sets the calling thread's current device.
void set_device(int device);
int current_device();

void* malloc_device(std::size_t nbytes, int device);
void free_device(void* ptr, int device) noexcept;
void* malloc_pinned(std::size_t nbytes);
void free_pinned(void* ptr) noexcept;

// Copies between any two pointers (host, pinned or device; UVA decides), ordered on stream.
void memcpy_async(void* dst, const void* src, std::size_t nbytes, void* stream);
void memset_async(void* dst, int value, std::size_t nbytes, void* stream);

void* stream_create(int device, bool high_priority);
void stream_destroy(void* stream) noexcept;
void stream_synchronize(void* stream);
// Waits for all work on the current device, every stream included.
void device_synchronize();

void* event_create(int device, bool enable_timing);
void event_destroy(void* event) noexcept;
void event_record(void* event, void* stream);
void stream_wait_event(void* stream, void* event);
void event_synchronize(void* event);
bool event_query(void* event);
float event_elapsed_ms(void* start, void* end);

}  // namespace tutti::gpu
