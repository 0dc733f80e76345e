#include "tutti/core/stream.h"

#include <chrono>

#include "core/gpu_runtime.h"
#include "tutti/core/error.h"

namespace tutti {
namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Stream Stream::default_for(Device device) {
  device.require_available();
  Stream s;
  s.device_ = device;
  return s;  // a null handle is CUDA's default stream
}

Stream Stream::create(Device device, bool high_priority) {
  device.require_available();
  Stream s;
  s.device_ = device;
  if (device.is_cuda()) {
    s.handle_ = std::shared_ptr<void>(gpu::stream_create(device.index, high_priority), gpu::stream_destroy);
  }
  return s;
}

void Stream::synchronize() const {
  if (device_.is_cuda()) gpu::stream_synchronize(native());
}

Event::Event(Device device, bool enable_timing) : device_(device) {
  if (device.is_cuda()) {
    device.require_available();
    handle_ = std::shared_ptr<void>(gpu::event_create(device.index, enable_timing), gpu::event_destroy);
  }
}

void Event::record(const Stream& stream) {
  TUTTI_CHECK_ARG(stream.device() == device_, "Event::record: event on ", device_.str(), ", stream on ",
                  stream.device().str());
  if (device_.is_cuda()) {
    gpu::event_record(native(), stream.native());
  } else {
    cpu_record_time_s_ = now_s();
  }
}

void Event::wait(const Stream& stream) const {
  if (device_.is_cuda() && stream.device().is_cuda()) gpu::stream_wait_event(stream.native(), native());
  // A CPU stream runs work as it is issued: by the time it could wait, the work is done.
  // A CPU stream waiting on a GPU event must block the host.
  if (device_.is_cuda() && stream.device().is_cpu()) synchronize();
}

void Event::synchronize() const {
  if (device_.is_cuda()) gpu::event_synchronize(native());
}

bool Event::query() const { return device_.is_cuda() ? gpu::event_query(native()) : true; }

float Event::elapsed_ms_since(const Event& start) const {
  TUTTI_CHECK_ARG(start.device_ == device_, "Event::elapsed_ms_since: events on different devices");
  if (device_.is_cuda()) return gpu::event_elapsed_ms(start.native(), native());
  return static_cast<float>((cpu_record_time_s_ - start.cpu_record_time_s_) * 1e3);
}

}  // namespace tutti
