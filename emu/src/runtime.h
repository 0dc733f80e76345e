// Internals of the emulated CUDA runtime shared by its parts: devices, streams that run their
// operations in order on their own host thread, events, the allocation registry and the
// sticky fault of a device. The CUDA libraries' emulations (cublas.cc, cudnn.cc, nccl.cc)
// queue their work on streams through enqueue().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime.h"

namespace tutti::emu {

struct Stream;

// Settings from the environment, read once.
struct Settings {
  int devices = 1;
  int sm_count = 4;
  int stream_delay_us = 0;
  std::uint64_t seed = 1;
  std::size_t fiber_stack_bytes = 0;  // 0: the default for the build (larger under ASan)
  bool racecheck = true;              // the hazard detector (racecheck.cc)
};
const Settings& settings();

// A point in one stream's order: reached when the stream has completed `seq` operations.
struct Mark {
  std::shared_ptr<Stream> stream;
  std::uint64_t seq = 0;
};

struct Device {
  int index = 0;
  std::shared_ptr<Stream> legacy;              // the legacy default stream (null handle)
  std::vector<std::weak_ptr<Stream>> streams;  // every live stream, the legacy one included
  // The sticky error of a kernel fault, and what happened; every later call returns it.
  cudaError_t fault = cudaSuccess;
  std::string fault_report;
};

struct Stream {
  Device* device = nullptr;
  bool blocking = true;  // synchronizes with the legacy default stream
  bool legacy = false;
  int priority = 0;
  unsigned id = 0;  // creation order, seeds the random delays
  std::deque<std::pair<std::function<void()>, std::vector<Mark>>> queue;
  std::uint64_t enqueued = 0, completed = 0;
  bool stopping = false;
  std::thread worker;
};

struct Event {
  Device* device = nullptr;
  bool timing = true;
  Mark mark;           // the last record; none yet when mark.stream is null
  double time_ms = 0;  // host clock when the stream reached the record
};

// The one lock of the stream machinery (queues, counters, events, faults) and the condition
// that signals every completed operation.
std::mutex& lock();
std::condition_variable& completed_cv();

// The device of the calling host thread (cudaSetDevice), created on first use.
Device& current_device();
int current_device_index();
Device* device_at(int index);  // null when out of range
// The stream a handle names on the current device: null, cudaStreamLegacy and
// cudaStreamPerThread are the legacy default stream.
std::shared_ptr<Stream> stream_of(cudaStream_t handle);

// Queues `work` on `stream` after `waits` (and after what the legacy-stream rule adds);
// returns the mark reached when it has run. Work on a faulted device is skipped.
Mark enqueue(const std::shared_ptr<Stream>& stream, std::function<void()> work, std::vector<Mark> waits = {});
// Blocks the host until `mark` is reached.
void wait_for(const Mark& mark);
bool reached(const Mark& mark);  // with lock() held
// Blocks the host until every stream of `device` has done what was queued before the call.
void synchronize_device(Device& device);

// Records a kernel fault on the device that ran it: printed once to stderr; sticky.
void record_fault(Device& device, const std::string& report);
// The sticky error of the current device (cudaSuccess when none).
cudaError_t sticky_error();
// Sets the calling thread's last error and returns it.
cudaError_t set_last_error(cudaError_t error);
// The error a call returns when the current device already faulted (and sets it as the last
// error), cudaSuccess otherwise.
cudaError_t faulted();

// For fault reports: a source path as "kernels/cuda/x.cu" (its last three components), and
// "(x,y,z)".
std::string short_path(const std::string& file);
std::string dims(const uint3& v);
inline std::string dims(const dim3& v) { return dims(static_cast<uint3>(v)); }

// Prints `what` to stderr once per process (the libraries say once that they are references).
void notice_once(const char* what);

// Allocations: device memory, pinned host memory, or neither (pageable host memory).
enum class MemoryKind { pageable, pinned, device };
MemoryKind kind_of(const void* p);
// For the hazard detector: the device allocation holding `p`, as [lo, hi) (true), or the range
// around `p` that holds none (false).
bool device_range(const void* p, std::uintptr_t* lo, std::uintptr_t* hi);

// Runs a kernel launch on the current host thread (a stream's worker): every block of the grid.
// Throws std::runtime_error with the report when the kernel faults.
struct KernelLaunch {
  LaunchConfig config;
  const char* name;
  const char* file;
  int line;
  std::unique_ptr<KernelBody> body;
};
void run_kernel(const KernelLaunch& launch);

}  // namespace tutti::emu
