// The GPU runtime of a build without CUDA: no GPU is ever visible, and every call that would
// need one throws (callers check device_count() first, so these are bugs if reached).
#include "core/gpu_runtime.h"

#include "tutti/core/error.h"

namespace tutti::gpu {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  TUTTI_THROW(BackendError, what, ": libtutti was built without CUDA (TUTTI_WITH_CUDA=OFF)");
}
}  // namespace

int device_count() { return 0; }
bool built_with_cuda() { return false; }
std::string runtime_version() { return "none"; }
std::string driver_version() { return "none"; }
std::string device_name(int) { no_cuda("device_name"); }
int compute_capability(int) { no_cuda("compute_capability"); }
int multiprocessor_count(int) { no_cuda("multiprocessor_count"); }
void set_device(int) { no_cuda("set_device"); }
int current_device() { no_cuda("current_device"); }
void* malloc_device(std::size_t, int) { no_cuda("malloc_device"); }
void free_device(void*, int) noexcept {}
void* malloc_pinned(std::size_t) { no_cuda("malloc_pinned"); }
void free_pinned(void*) noexcept {}
void memcpy_async(void*, const void*, std::size_t, void*) { no_cuda("memcpy_async"); }
void memset_async(void*, int, std::size_t, void*) { no_cuda("memset_async"); }
void* stream_create(int, bool) { no_cuda("stream_create"); }
void stream_destroy(void*) noexcept {}
void stream_synchronize(void*) { no_cuda("stream_synchronize"); }
void device_synchronize() { no_cuda("device_synchronize"); }
void* event_create(int, bool) { no_cuda("event_create"); }
void event_destroy(void*) noexcept {}
void event_record(void*, void*) { no_cuda("event_record"); }
void stream_wait_event(void*, void*) { no_cuda("stream_wait_event"); }
void event_synchronize(void*) { no_cuda("event_synchronize"); }
bool event_query(void*) { no_cuda("event_query"); }
float event_elapsed_ms(void*, void*) { no_cuda("event_elapsed_ms"); }

}  // namespace tutti::gpu
