#include "tutti/core/trace.h"

#include <chrono>
#include <map>
#include <mutex>
#include <optional>

namespace tutti::trace {
namespace detail {
std::atomic<bool> g_on{false};
}

namespace {

struct PendingDevice {
  Event event;  // times filled at resolution
  tutti::Event begin, end;
  int device = -1;
};

struct Anchor {
  tutti::Event event;
  std::int64_t host_ns = 0;
};

struct Recorder {
  std::mutex mutex;
  Options options;
  bool started = false;
  std::vector<Event> ring;  // capacity options.max_events
  std::size_t head = 0;     // the oldest when full
  std::uint64_t dropped = 0;
  std::vector<PendingDevice> pending;
  std::map<int, Anchor> anchors;  // by device index (-1: the CPU)
  std::atomic<std::int64_t> step{-1};
  std::int64_t step_begin_ns = 0;
  bool step_recorded = false;

  void push(Event e) {
    const std::size_t cap = std::max<std::size_t>(options.max_events, 1);
    if (ring.size() < cap) {
      ring.push_back(std::move(e));
      return;
    }
    ring[head] = std::move(e);
    head = (head + 1) % cap;
    ++dropped;
  }

  // Moves the device spans whose events are done (all of them, waiting, with `wait`) into the ring.
  void resolve(bool wait) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < pending.size(); ++i) {
      PendingDevice& p = pending[i];
      if (wait) {
        p.end.synchronize();
      } else if (!p.end.query() || !p.begin.query()) {
        if (kept != i) pending[kept] = std::move(p);
        ++kept;
        continue;
      }
      const auto it = anchors.find(p.device);
      if (it != anchors.end()) {
        const Anchor& a = it->second;
        p.event.begin_ns = a.host_ns + static_cast<std::int64_t>(p.begin.elapsed_ms_since(a.event) * 1e6);
        p.event.end_ns = a.host_ns + static_cast<std::int64_t>(p.end.elapsed_ms_since(a.event) * 1e6);
        if (p.event.end_ns < p.event.begin_ns) p.event.end_ns = p.event.begin_ns;
        push(std::move(p.event));
      }
    }
    pending.resize(kept);
  }
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: communication threads may record late
  return *r;
}

int device_key(Device d) { return d.is_cuda() ? d.index : -1; }

// The anchor of a device: an event recorded on `stream` and waited for, at a known host time.
// The event happened between the host clock before its record and after its wait. A thread
// descheduled right after the wait (a loaded machine) would date it, and every device span with
// it, that much late: a loaded run once saw buckets 1.2 ms after their step had ended. So the
// narrowest of a few tries, dated at its middle (the first try also waits for the stream's work).
void ensure_anchor(Recorder& r, const Stream& stream) {
  const int key = device_key(stream.device());
  if (r.anchors.count(key) != 0) return;
  std::optional<Anchor> best;
  std::int64_t best_window = 0;
  for (int i = 0; i < 5; ++i) {
    Anchor a{tutti::Event(stream.device(), /*enable_timing=*/true), 0};
    const std::int64_t before = now_ns();
    a.event.record(stream);
    a.event.synchronize();
    const std::int64_t window = now_ns() - before;
    if (!best || window < best_window) {
      a.host_ns = before + window / 2;
      best_window = window;
      best = std::move(a);
    }
  }
  r.anchors.emplace(key, std::move(*best));
}

bool in_window(const Options& o, std::int64_t step) {
  return step >= o.first_step && (o.last_step < 0 || step <= o.last_step);
}

}  // namespace

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string_view name_of(Lane lane) {
  switch (lane) {
    case Lane::host: return "host";
    case Lane::device: return "device";
    case Lane::comm: return "communication";
  }
  return "?";
}

void record(std::string_view name, std::string_view category, Lane lane, std::int64_t begin_ns, std::int64_t end_ns,
            std::string args, bool force) {
  if (!on() && !force) return;
  Recorder& r = recorder();
  Event e{std::string(name), std::string(category), lane, begin_ns, end_ns, r.step.load(), std::move(args)};
  std::lock_guard lock(r.mutex);
  if (!r.started) return;
  r.push(std::move(e));
}

void record_device(std::string_view name, std::string_view category, Lane lane, const tutti::Event& begin,
                   const tutti::Event& end, std::string args) {
  Recorder& r = recorder();
  PendingDevice p;
  p.event = Event{std::string(name), std::string(category), lane, 0, 0, r.step.load(), std::move(args)};
  p.begin = begin;
  p.end = end;
  p.device = device_key(begin.device());
  std::lock_guard lock(r.mutex);
  if (!r.started) return;
  if (r.anchors.count(p.device) == 0) {
    // The first device span of this device: its begin event is the anchor (waited for once).
    Anchor a{begin, 0};
    a.event.synchronize();
    a.host_ns = now_ns();
    r.anchors.emplace(p.device, std::move(a));
  }
  r.pending.push_back(std::move(p));
}

Span::Span(std::string_view name, std::string_view category, Lane lane) {
  if (!on()) return;
  active_ = true;
  lane_ = lane;
  name_ = name;
  category_ = category;
  begin_ns_ = now_ns();
}

Span::Span(std::string_view name, std::string_view category, const Stream& stream) {
  if (!on()) return;
  active_ = true;
  name_ = name;
  category_ = category;
  if (stream.device().is_cuda()) {
    device_ = true;
    lane_ = Lane::device;
    stream_ = stream;
    {
      Recorder& r = recorder();
      std::lock_guard lock(r.mutex);
      ensure_anchor(r, stream);
    }
    begin_event_ = tutti::Event(stream.device(), true);
    end_event_ = tutti::Event(stream.device(), true);
    begin_event_.record(stream);
  } else {
    lane_ = Lane::host;
    begin_ns_ = now_ns();
  }
}

Span::~Span() {
  if (!active_) return;
  try {
    if (device_) {
      end_event_.record(stream_);
      record_device(name_, category_, lane_, begin_event_, end_event_, std::move(args_));
    } else {
      record(name_, category_, lane_, begin_ns_, now_ns(), std::move(args_), /*force=*/true);
    }
  } catch (...) {
    // A span must never turn a destructor into a crash (the device may be failing).
  }
}

void begin_step(std::int64_t step) {
  Recorder& r = recorder();
  r.step.store(step);
  std::lock_guard lock(r.mutex);
  if (!r.started) return;
  r.step_recorded = in_window(r.options, step);
  detail::g_on.store(r.step_recorded, std::memory_order_relaxed);
  r.step_begin_ns = now_ns();
  if (!r.pending.empty()) r.resolve(false);
}

void end_step() {
  Recorder& r = recorder();
  const std::int64_t step = r.step.load();
  const std::int64_t end = now_ns();
  std::lock_guard lock(r.mutex);
  if (!r.started || !r.step_recorded) return;
  r.push(Event{"step " + std::to_string(step), "step", Lane::host, r.step_begin_ns, end, step,
               "\"step\":" + std::to_string(step)});
  if (!r.pending.empty()) r.resolve(false);
  r.step_recorded = false;
  // After the window's last step nothing more is recorded.
  if (r.options.last_step >= 0 && step >= r.options.last_step) detail::g_on.store(false, std::memory_order_relaxed);
}

std::int64_t current_step() { return recorder().step.load(); }

void start(const Options& options) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.options = options;
  r.started = true;
  r.ring.clear();
  r.ring.reserve(std::min<std::size_t>(options.max_events, 4096));
  r.head = 0;
  r.dropped = 0;
  r.pending.clear();
  r.step_recorded = false;
  r.step.store(-1);
  // Before the first step: on when the window starts at the beginning.
  detail::g_on.store(in_window(options, 0), std::memory_order_relaxed);
}

void stop() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  detail::g_on.store(false, std::memory_order_relaxed);
  r.started = false;
}

bool started() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  return r.started;
}

std::vector<Event> collect() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  const bool was = r.started;
  r.started = true;  // resolve() pushes
  r.resolve(true);
  r.started = was;
  std::vector<Event> out;
  out.reserve(r.ring.size());
  for (std::size_t i = 0; i < r.ring.size(); ++i) out.push_back(std::move(r.ring[(r.head + i) % r.ring.size()]));
  r.ring.clear();
  r.head = 0;
  r.anchors.clear();
  return out;
}

std::uint64_t dropped() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  return r.dropped;
}

}  // namespace tutti::trace
