// CheckpointWriter: checkpoints that stall training only for a copy to host memory.
//
// save() copies the state into host buffers that the writer owns and reuses from save to save
// (pinned when a GPU is present, so that device-to-host copies run at full speed), and a
// background thread writes the file in io::save_checkpoint's format, with the same
// guarantees (checksums, temporary file, fsync, atomic rename, directory fsync: see
// tutti/io/checkpoint.h; the file is byte for byte what save_checkpoint writes). Once save()
// returns, the caller may change its tensors: the file holds the values they had during the
// call (a snapshot).
//
// At most one write is in flight. A save that comes while one is being written waits for it
// (WhenBusy::wait) or is skipped (WhenBusy::skip, nothing copied); its SaveResult says which,
// and how long the training thread was held, for the program's log (the library prints
// nothing). CheckpointMode::sync writes on the caller's thread inside save(), as
// save_checkpoint does, with the same results and errors: the same object serves both modes.
//
// A background write that fails is never lost: the next check(), save() or finish() throws
// its error (tutti::Error, usually BackendError, naming the path, the step and the OS error,
// e.g. "open('ckpt/checkpoint.tckp.tmp.42') failed: No space left on device (while writing the
// checkpoint of step 300 to 'ckpt/checkpoint.tckp' in the background)"), and so does every
// later call: a writer that failed stays failed (make a new one to go on). The previous file
// at that path is left as it was.
//
// The protocol, in a training loop (only the rank that writes needs a writer; gather the
// state on every rank first where that is collective, as with ZeRO):
//
// doc-test: fragment a sketch: the training loop is elided
//   io::CheckpointWriter writer({.mode = io::CheckpointMode::async});
//   for (step = ...) {
//     writer.check();                            // every step: cheap (one atomic load)
//     ... train ...
//     if (step % every == 0) {
//       io::SaveResult r = writer.save(path, step, state, metadata, model.stream());
//       if (r.skipped) log("checkpoint of step ", step, " skipped: step ", r.busy_step, " is being written");
//     }
//   }
//   writer.finish();                             // at the end, before exit: waits, throws a failure
//
// A checkpoint that must not be skipped (the last one, or the one a stop signal asks for):
// finish() first, so that no write is in flight, then save(), then finish(). The writer does
// not create directories.
//
// A state made for the save (ZeRO's gathered tensors) is handed over instead (save_handing_over):
// the writer writes its host tensors where they are, so the host holds them once.
//
// `state` may hold the live tensors themselves (views of a model's parameters or an
// optimizer's state on its device): save() copies them, so there is no need for the CPU
// copies that state_dict() functions make. Pass the stream they are produced on.
//
// Threads: one thread (the owner) calls save(), check() and finish(); the writer's own thread
// only writes. Not copyable or movable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/io/checkpoint.h"

namespace tutti::io {

enum class CheckpointMode {
  sync,   // save() writes the file before it returns
  async,  // save() copies to host buffers; a background thread writes
};

// What an async save does when the previous write is still in flight.
enum class WhenBusy {
  wait,  // wait for it to finish, then take this snapshot (no checkpoint is lost)
  skip,  // take nothing and return at once (the training thread is never held for the disk)
};

// Hooks for tests and instrumentation; empty by default.
struct CheckpointHooks {
  // Called on the thread that writes (the background thread in async mode), after the snapshot
  // is taken and before the file is opened. An exception it throws is that write's failure.
  std::function<void(std::int64_t step, const std::string& path)> before_write;
  // Called on the owner's thread when a save finds a write in flight and is about to wait for
  // it (WhenBusy::wait), with the step being written.
  std::function<void(std::int64_t busy_step)> before_wait;
};

struct CheckpointWriterOptions {
  CheckpointMode mode = CheckpointMode::async;
  WhenBusy when_busy = WhenBusy::wait;
  // Async: page-locked host buffers where a GPU is present (ignored without one).
  bool pinned = true;
  CheckpointHooks hooks{};
};

// What one save() did, for the program's log. stall_s() is how long it held the caller.
struct SaveResult {
  std::int64_t step = -1;
  bool started = false;          // this snapshot was written (sync) or its write started (async)
  bool skipped = false;          // async, WhenBusy::skip: a write was in flight; nothing was taken
  std::int64_t busy_step = -1;   // the step whose write in flight made this save wait or skip; -1 if none
  double waited_s = 0;           // held waiting for that write (WhenBusy::wait)
  double copy_s = 0;             // copying the state to host memory (sync: the GPU tensors only)
  double write_s = 0;            // sync: writing, fsync and rename; 0 in async mode
  std::uint64_t file_bytes = 0;  // size of the file this snapshot makes (0 when skipped)
  double stall_s() const { return waited_s + copy_s + write_s; }
};

class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointWriterOptions options = {});
  // Does not throw. A write in flight is completed first (the destructor waits for it, so a
  // program that ends normally never leaves a checkpoint half done); its failure, or an
  // earlier one not yet thrown, is dropped here: call finish() before, which throws it.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves `state` (tensors on any device) and `metadata` as the checkpoint of `step` at `path`
  // (a plain file, replaced atomically). First throws a failed earlier write's error (as
  // check()); then InvalidArgument for an empty path or an entry save_checkpoint would refuse,
  // before anything is copied. Sync: writes and returns (errors are thrown here). Async: waits
  // for or skips a write in flight (options().when_busy), copies every tensor into the host
  // buffers (GPU tensors on `stream` when it is a GPU stream, else on their device's default
  // stream; the copies are finished when save() returns), hands the buffers to the background
  // thread and returns. The buffers are allocated on the first save and grown when a later
  // state needs more; otherwise reused.
  SaveResult save(const std::string& path, std::int64_t step, const StateDict& state, const Metadata& metadata = {},
                  const Stream& stream = Stream());

  // As save() of `state` and `handed_over` together (their keys must differ: InvalidArgument),
  // where `handed_over` was made for this save and nothing else refers to its tensors (a ZeRO
  // gather, a state_dict() copy): in async mode its host tensors are not copied into the buffers
  // but written where they are, and the writer keeps them until their write ends, so such a
  // state is held once, not twice (its GPU tensors are copied as by save()). A skipped save
  // drops them at once.
  SaveResult save_handing_over(const std::string& path, std::int64_t step, const StateDict& state,
                               StateDict handed_over, const Metadata& metadata = {}, const Stream& stream = Stream());

  // Throws the error of a background write that failed; otherwise returns at once. Cheap
  // enough for every step.
  void check();
  // Waits until no write is in flight, then check(). Call it at the end of training, and
  // before reading a file this writer wrote. The writer stays usable.
  void finish();

  // Whether a background write is in flight now.
  bool busy() const;
  // The step of the last file this writer completed (renamed into place); -1 if none.
  std::int64_t last_written_step() const;
  // Bytes of host memory the snapshot buffers hold (not the tensors handed over).
  std::uint64_t buffer_bytes() const;
  const CheckpointWriterOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::io
