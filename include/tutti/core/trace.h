// trace: the spans that layers record for the timeline (docs/observability.md, "Watching a job").
//
// This is the small recording side that every layer may call: a span is a name, a category, a
// lane and a begin and end time. It keeps spans in memory and nothing else: writing them as
// Chrome Trace Event JSON, aligning the ranks' clocks and merging files is obs/'s
// (tutti/obs/trace.h), so that kernels, comm and nn stay free of I/O.
//
// Cost: when nothing records (the default), every instrumented place costs one relaxed load of
// a global flag and a branch (trace::on()). Recording is switched on by obs::TraceSession, and
// by begin_step() only for the steps of its window.
//
// Clocks: host times are std::chrono::steady_clock in nanoseconds (now_ns()). On a GPU the
// spans of device work come from CUDA events recorded on the streams (record_device, Span
// with a CUDA stream): they are placed on the host clock through an anchor event per device,
// synchronized once when the first such span is recorded, and resolved when their events have
// completed (at begin_step/end_step without waiting, at collect() waiting).
//
// Threads: every function may be called from any thread (a mutex guards the buffer; the
// communication threads of the mpi backend record their collectives).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/core/stream.h"

namespace tutti::trace {

namespace detail {
extern std::atomic<bool> g_on;
}

// Whether spans are recorded now: the one branch an instrumented place takes when tracing is off.
inline bool on() { return detail::g_on.load(std::memory_order_relaxed); }

// steady_clock now, in nanoseconds.
std::int64_t now_ns();

// Where a span is drawn. host: the thread that runs the training loop (steps, data, the model's
// layers on the CPU, optimizer, waits); device: the compute stream of a GPU (layers' kernels,
// from events); comm: the communicator's collectives (the mpi backend's thread, or NCCL's
// stream). One lane holds spans that nest or follow each other, never partly overlap.
enum class Lane : std::uint8_t { host = 0, device = 1, comm = 2 };
std::string_view name_of(Lane lane);

struct Event {
  std::string name;      // "forward Linear(784, 512)", "ddp bucket 0", "optimizer step"
  std::string category;  // "forward", "backward", "comm", "wait", "optimizer", "data", "step", ...
  Lane lane = Lane::host;
  std::int64_t begin_ns = 0, end_ns = 0;  // steady clock of this process
  std::int64_t step = -1;                 // the step begin_step() last named (-1: before any)
  std::string args;  // extra JSON members without braces: "\"bytes\":4096,\"dtype\":\"f32\"" (or empty)
};

// Records a finished span (nothing happens unless on(), or `force`: a span that was begun while
// recording, such as a collective issued in the window and completed after it).
void record(std::string_view name, std::string_view category, Lane lane, std::int64_t begin_ns, std::int64_t end_ns,
            std::string args = {}, bool force = false);
// Records a span of device work between two events recorded with timing on the same GPU
// (Event(device, true)); resolved to host times once both have completed. On the CPU the
// events' record() times are used at once.
void record_device(std::string_view name, std::string_view category, Lane lane, const tutti::Event& begin,
                   const tutti::Event& end, std::string args = {});

// A span from construction to destruction. With a CUDA stream it records timing events on the
// stream (the span of the device work issued meanwhile, on Lane::device); otherwise host times.
// Costs nothing but the flag's branch when not on().
class Span {
 public:
  Span(std::string_view name, std::string_view category, Lane lane = Lane::host);
  Span(std::string_view name, std::string_view category, const Stream& stream);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  // Extra JSON members for the span ("\"bytes\":4096"); ignored when not recording.
  void set_args(std::string args) {
    if (active_) args_ = std::move(args);
  }
  bool active() const { return active_; }

 private:
  bool active_ = false;
  bool device_ = false;
  Lane lane_ = Lane::host;
  std::string name_, category_, args_;
  std::int64_t begin_ns_ = 0;
  tutti::Event begin_event_, end_event_;
  Stream stream_;
};

// Steps: the training loop names them, so that a span knows its step and the window
// (Options::first_step..last_step) decides when recording is on. begin_step also resolves the
// device spans whose events are done. end_step records the step's span ("step N", category
// "step", Lane::host) when the step was recorded.
void begin_step(std::int64_t step);
void end_step();
// The step named by the last begin_step (-1 before any).
std::int64_t current_step();

struct Options {
  // Steps recorded: first_step <= step <= last_step (last_step < 0: no end). Spans outside any
  // step (set-up, evaluation after the last step) are recorded while the window is open.
  std::int64_t first_step = 0;
  std::int64_t last_step = -1;
  // The buffer holds at most this many spans: a ring, the oldest dropped first (dropped() says
  // how many), so a long run keeps its last spans in bounded memory (~150 bytes a span).
  std::size_t max_events = 1 << 20;
};

// Starts recording (clearing what was recorded before) with these options. Not collective;
// obs::TraceSession calls it on every rank.
void start(const Options& options);
// Stops recording; the spans stay until collect() or the next start().
void stop();
// Whether start() was called without stop() (recording may still be off outside the window).
bool started();
// Waits for the device spans' events, then hands out every span recorded, oldest first, and
// empties the buffer.
std::vector<Event> collect();
// Spans dropped by the ring since start().
std::uint64_t dropped();

}  // namespace tutti::trace
