// Stream and Event: ordering of work on a device.
//
// On a GPU a Stream is a CUDA stream and an Event a CUDA event; work issued to one stream
// runs in order, and an Event recorded on one stream can be waited on by another without
// blocking the host (this is how communication overlaps with compute). On the CPU, work
// runs synchronously when it is issued, so a CPU Stream and a CPU Event are no-ops.
#pragma once

#include <memory>

#include "tutti/core/device.h"

namespace tutti {

class Stream {
 public:
  // The CPU stream (a no-op).
  Stream() = default;
  // The device's default stream (for CUDA, the legacy default stream 0).
  static Stream default_for(Device device);
  // A new stream on the device, owned by the returned object and its copies. On the CPU it
  // is the CPU stream. high_priority: for communication streams (CUDA stream priority).
  static Stream create(Device device, bool high_priority = false);

  Device device() const { return device_; }
  // The cudaStream_t (as void*, so this header stays free of CUDA); nullptr for the
  // default stream and on the CPU.
  void* native() const { return handle_.get(); }
  // Blocks the host until all work issued so far has finished. No-op on the CPU.
  void synchronize() const;

 private:
  Device device_ = Device::cpu();
  std::shared_ptr<void> handle_;
};

class Event {
 public:
  // An event for the device. CUDA events are created without timing unless asked.
  explicit Event(Device device = Device::cpu(), bool enable_timing = false);

  // Captures the work issued to `stream` so far.
  void record(const Stream& stream);
  // Makes `stream` wait (on the device, not the host) for the recorded work.
  void wait(const Stream& stream) const;
  // Blocks the host until the recorded work is done.
  void synchronize() const;
  // True when the recorded work is done (always true on the CPU).
  bool query() const;
  // Milliseconds between `start` and this event; both must be recorded with timing on.
  // On the CPU, the wall-clock time between the two record() calls.
  float elapsed_ms_since(const Event& start) const;
  void* native() const { return handle_.get(); }
  Device device() const { return device_; }

 private:
  Device device_;
  std::shared_ptr<void> handle_;
  double cpu_record_time_s_ = 0.0;
};

}  // namespace tutti
