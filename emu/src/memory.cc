// The emulated CUDA runtime's memory: the allocation registry (device memory, pinned host
// memory; anything else is pageable host memory), and the allocation, copy and memset calls.
//
// Copies follow the runtime API's rules for pageable host memory: a copy into pageable memory
// returns only when it is done; a copy from it is staged at the call (the caller may reuse the
// buffer at once); every other copy is asynchronous. Copies outside an allocation, or in the
// wrong direction, are refused as CUDA refuses them.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>

#include "runtime.h"

namespace tutti::emu {
namespace {

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

}  // namespace

bool device_range(const void* p, std::uintptr_t* lo, std::uintptr_t* hi) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard l(registry_mutex);
  auto next = registry.upper_bound(a);
  *lo = 0;
  *hi = next == registry.end() ? UINTPTR_MAX : next->first;
  if (next == registry.begin()) return false;
  const auto& [base, allocation] = *std::prev(next);
  const std::uintptr_t end = base + std::max<std::size_t>(allocation.size, 1);
  if (a >= end) {
    *lo = end;
    return false;
  }
  *lo = base;
  *hi = end;
  return allocation.kind == MemoryKind::device;
}

MemoryKind kind_of(const void* p) {
  std::lock_guard l(registry_mutex);
  const Allocation* a = find_allocation(p);
  return a == nullptr ? MemoryKind::pageable : a->kind;
}

}  // namespace tutti::emu

// ---- the runtime API: memory ----

using namespace tutti::emu;

namespace {

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

cudaError_t cudaMalloc(void** ptr, std::size_t size) {
  if (device_at(current_device_index()) == nullptr) return set_last_error(cudaErrorNoDevice);
  if (faulted() != cudaSuccess) return sticky_error();
  *ptr = allocate(size, MemoryKind::device, current_device_index());
  return *ptr == nullptr ? set_last_error(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  // cudaFree waits for the device: work still queued may use the memory.
  if (device_at(current_device_index()) != nullptr) synchronize_device(current_device());
  return release(ptr, MemoryKind::device) ? cudaSuccess : set_last_error(cudaErrorInvalidValue);
}

cudaError_t cudaMallocHost(void** ptr, std::size_t size) {
  *ptr = allocate(size, MemoryKind::pinned, -1);
  return *ptr == nullptr ? set_last_error(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  for (int i = 0; Device* d = device_at(i); ++i) synchronize_device(*d);
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
