// TraceSession: the timeline of a job, as Chrome Trace Event JSON (Perfetto and
// chrome://tracing open it): one file per rank and one merged file with a track per rank.
// docs/observability.md ("Watching a job") shows how to turn it on and read it.
//
// doc-test: fragment a sketch: the training loop is elided
//   auto trace = tutti::obs::TraceSession::from_env(job.cpu_communicator(), job.hostname());
//   for (...) { tutti::trace::begin_step(step); ...; tutti::trace::end_step(); }
//   if (trace) trace->write();                        // COLLECTIVE: every rank
//
// The spans themselves are recorded by the layers (tutti/core/trace.h): each module's forward
// and backward, each collective from its start to its completion (bytes, dtype, backend), the
// wait for gradients after backward, the optimizer step, the loss-scaler's host sync, data
// loading, checkpoint saves, and what the program adds (evaluation).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/core/trace.h"

namespace tutti::obs {

struct TraceOptions {
  std::string dir;  // where the files go (created if missing)
  // Steps recorded and the ring's size (trace::Options): TUTTI_TRACE_STEPS=from:to (either side
  // may be empty: "100:" from step 100 on, ":20" the first 21 steps) and TUTTI_TRACE_MAX_EVENTS.
  trace::Options window;
  std::string host;  // named in the rank's track
  // dir from TUTTI_TRACE (empty when unset: no trace), the window from the variables above.
  // Throws InvalidArgument on a malformed value.
  static TraceOptions from_env();
};

class TraceSession {
 public:
  // COLLECTIVE over `comm` (CPU tensors: job.cpu_communicator()), blocks: measures this rank's
  // clock offset to rank 0 (the median over rounds of a barrier and an allgather of the clocks;
  // within the barrier's exit skew, tens of microseconds on one host) and starts recording.
  // One session at a time per process.
  TraceSession(Communicator& comm, TraceOptions options);
  // A session when TUTTI_TRACE is set, else null (not collective then; every rank must see the
  // same environment).
  static std::unique_ptr<TraceSession> from_env(Communicator& comm, std::string host);
  // Stops recording (nothing is written unless write() was called).
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  // COLLECTIVE, blocks: stops recording, waits for the device spans, writes
  // <dir>/trace-rank<R>.json on every rank and <dir>/trace.json on rank 0 (every rank's
  // spans, on rank 0's clock, one process track per rank). Returns the files this rank wrote.
  // Call it once.
  std::vector<std::string> write();

  // This rank's clock minus rank 0's, in nanoseconds (0 on rank 0).
  std::int64_t clock_offset_ns() const { return offset_ns_; }
  const TraceOptions& options() const { return options_; }

 private:
  Communicator& comm_;
  TraceOptions options_;
  std::int64_t offset_ns_ = 0;
  std::int64_t origin_ns_ = 0;  // rank 0's clock at the start: time 0 of the files
  bool written_ = false;
};

// The events of one rank as Trace Event JSON objects, comma-separated (no brackets): the
// process and thread names, then one complete ("X") event per span, times in microseconds
// from origin_ns on the aligned clock (span time - offset_ns - origin_ns). For tests and tools.
std::string trace_events_json(const std::vector<trace::Event>& events, int rank, const std::string& host,
                              std::int64_t offset_ns, std::int64_t origin_ns);

}  // namespace tutti::obs
