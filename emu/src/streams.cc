// The emulated CUDA runtime's streams and events: each stream is a host thread that runs its
// operations in order. An operation starts only after the marks it waits for (an event, the
// legacy default stream's rule) are reached. The legacy default stream (the null handle) waits
// for all earlier work of the device's blocking streams, and they wait for its earlier work;
// non-blocking streams (what tutti creates) are ordered with nothing but their own events, as
// on a GPU. Operations read and write host memory, so whatever a missing dependency lets run
// early really does run early.
#include <algorithm>
#include <chrono>
#include <map>

#include "runtime.h"

namespace tutti::emu {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
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

}  // namespace

// ---- internals shared with the rest of the emulation ----

std::mutex& lock() {
  static auto& m = *new std::mutex;
  return m;
}

std::condition_variable& completed_cv() {
  static auto& cv = *new std::condition_variable;
  return cv;
}

std::shared_ptr<Stream> stream_of(cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    Device* d = device_at(current_device_index());
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

}  // namespace tutti::emu

// ---- the runtime API: streams and events ----

using namespace tutti::emu;

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  if (device_at(current_device_index()) == nullptr) return set_last_error(cudaErrorNoDevice);
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
  if (device_at(current_device_index()) == nullptr) return set_last_error(cudaErrorNoDevice);
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