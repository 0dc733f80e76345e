// Run: the control of a data-parallel training run around the program's own loop: resume
// (explicit or automatic) and the refusal to overwrite, the ranks' agreement on the run,
// checkpoints (every N steps, at the end, on a stop), a stop signal on any rank that stops
// every rank after the same step, divergence, and the JSON summary. The step itself stays
// the program's (llm.c style): it runs its micro-steps, its optimizer, its evaluation.
// docs/gpt.md ("In your own program") has this loop as a whole program that CI compiles and runs.
//
// doc-test: fragment a sketch; docs/gpt.md ("In your own program") is the whole program, run in CI
//   tutti::train::Summary summary(json_path);                 // optional (train/summary.h)
//   tutti::Job job(argc, argv, {.catch_stop_signals = true}); // SIGTERM & co. set a flag
//   ...  model, ddp, optimizer, scaler, loader  ...
//   tutti::train::Run run(job, {ddp, optimizer, scaler, loader},
//                         {.steps = 1000, .checkpoint_dir = "ckpt", .resume = tutti::train::Resume::automatic,
//                          .checkpoint_every = 100, .summary = &summary});
//   while (run.next()) {                                      // false: done, stopped or diverged
//     for (int micro = 0; micro < k; ++micro) {
//       ... loss.forward(ddp.forward(x), y, scaler.scale()); ddp.backward(loss.grad(), scaler.scale());
//       run.add_loss(loss.loss(), 1.0f / k);                  // this rank's mean loss of the step
//     }
//     if (scaler.update(ddp.found_nonfinite())) optimizer.step(ddp.grad_norm(1.0).coefficient);  // clipped
//     ddp.zero_grad();
//     run.end_step();                                         // COLLECTIVE: loss, stop flag, checkpoint
//   }
//   const tutti::train::Outcome outcome = run.finish();       // COLLECTIVE
//   if (!outcome.message.empty()) std::fprintf(stderr, "prog: %s\n", outcome.message.c_str());
//   return outcome.exit_code;                                 // 0, 3 (diverged), 75 (stopped)
//
// One collective a step: end_step() allreduces (average) one small f32 tensor on the
// program's stream: this rank's mean loss of the step, a stop flag (1 on a rank that got a
// stop signal or request_stop()), and the program's own figures (sync_slots()). So every
// rank sees the same mean loss and the same stop decision after the same step.
//
// Who prints: nothing here prints. finish() returns the message rank 0 should print to
// stderr after "<program>: " ("stopped at step 12 of 600 by SIGTERM (on rank 1). Checkpoint
// written to ...", "error: the training loss is nan at step 37 (fp32): the run diverged. The
// last good checkpoint ... is ..."), empty on the other ranks and when the run completed;
// errors are thrown (tutti::Error, naming the step and the file). Messages name the options
// as the examples' command-line flags do (--resume, --overwrite, --checkpoint-dir).
//
// The checkpoint is one file, <checkpoint_dir>/checkpoint.tckp (io/checkpoint.h: written
// atomically, checked on reading), holding "model." and "optim." (whole tensors: it resumes at
// any ZeRO stage on any number of ranks), "scaler.", "train.step", "train.last_loss", the
// DDP's communication hook's state (PowerSGD's "powersgd.": every rank's error gathered, so a
// resume on as many ranks continues exactly, and note() says what a resume did otherwise) and
// the program's entries (State::add). State the checkpoint holds that no part of the resuming
// run reads (a "powersgd." without PowerSGD, a "diloco." without DiLoCo) is not used, and
// note() says so. Every rank reads it on resume; rank 0 writes it with an
// io::CheckpointWriter (io/checkpoint_writer.h) that the Run holds. At ZeRO stage 0 rank 0
// alone takes the live tensors (DDP's *_state_views, not collective); under ZeRO every rank
// gathers the whole tensors first (collective). RunOptions::checkpoint_mode async (the
// default): the step is held only for the copy to host memory and a background thread writes
// the file; a checkpoint due while the previous one is still being written waits for it or is
// skipped (RunOptions::checkpoint_busy; StepEnd says which). The last step's checkpoint and a
// stop's are never skipped: the Run waits for the write in flight, saves, and waits for this
// one too, so that the file is complete when end_step() returns. A background write that
// failed is thrown by rank 0's next end_step() (before the step's collective) or by finish():
// tutti::Error naming the step and the file; the Job (or ThreadGroup) ends the other ranks.
// The divergence message names the last checkpoint written completely, never one in flight
// or skipped.
//
// For a launcher (tutti-launch, docs/launcher.md), from the environment, so that any program
// built on a Run is launchable as it is: TUTTI_RESUME ("no", "yes", "auto") replaces
// RunOptions::resume, and TUTTI_STATUS_FILE names the status file when RunOptions::status_file
// is empty. The status file is one JSON object that rank 0 replaces atomically (a temporary
// file renamed over it) when the run starts, at most every 0.2 s while it runs, on every
// checkpoint and snapshot, and when it ends: its state ("running", "completed", "stopped",
// "diverged", "failed": the Run was destroyed before finish(), e.g. by an error), the step,
// the last checkpoint written completely and the last snapshot, where the run resumed from,
// and the accounting (train/accounting.h). A resumed run reads the accounting of the attempts
// before it from the file before replacing it.
//
// Exit codes (Outcome::exit_code): 0 completed; 3 diverged and 75 (EX_TEMPFAIL, "run the same
// command again") stopped, on rank 0 only, 0 on the others: mpirun drops the output of the
// other ranks, and kills them, once one has exited non-zero, and every rank stops alike.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/io/checkpoint.h"
#include "tutti/io/checkpoint_writer.h"
#include "tutti/train/accounting.h"
#include "tutti/train/preemption.h"
#include "tutti/train/summary.h"

namespace tutti {
class Job;
class Communicator;
namespace ddp {
class DistributedDataParallel;
}
namespace optim {
class Optimizer;
}
namespace amp {
class LossScaler;
}
}  // namespace tutti

namespace tutti::train {

// RunOptions::snapshots.every: chosen by the Run ("--snapshot-every auto").
inline constexpr std::int64_t kSnapshotAuto = -1;

// Whether a run continues the checkpoint in RunOptions::checkpoint_dir.
enum class Resume : std::uint8_t {
  no,         // start afresh; an existing checkpoint is an error unless RunOptions::overwrite
  yes,        // continue it; an error if there is none
  automatic,  // continue it if there is one, else start afresh (a scheduler reruns one command)
};
// "no", "yes", "auto" (the examples' --resume values); InvalidArgument otherwise.
Resume parse_resume(std::string_view text);

// The training state a Run saves and restores: the DDP model, the optimizer, the loss scaler,
// and entries: the program's own (the loader's position, counters, ddp::DiLoCo) and the
// library's, registered the same way. Keeps references: they must outlive the Run.
class State {
 public:
  // Registers the state of the DDP's communication hook, if one is registered
  // (DistributedDataParallel::register_comm_hook: register it first), as the entry
  // "<hook name>." (PowerSGD: "powersgd.", collective, left out of memory snapshots: a resume
  // from one restarts PowerSGD, and note() says so).
  State(ddp::DistributedDataParallel& ddp, optim::Optimizer& optimizer, amp::LossScaler& scaler);
  // With a loader (anything with state_dict() and load_state_dict()) under "loader.".
  template <class Loader>
  State(ddp::DistributedDataParallel& ddp, optim::Optimizer& optimizer, amp::LossScaler& scaler, Loader& loader)
      : State(ddp, optimizer, scaler) {
    add("loader.", loader);
  }

  // Any object with `StateDict state_dict() [const]` and `void load_state_dict(const StateDict&)`,
  // saved under `prefix` and restored from it (the entries without the prefix).
  template <class T>
  State& add(const std::string& prefix, T& object) {
    return add(
        prefix, [&object] { return object.state_dict(); },
        [&object](const StateDict& s) { object.load_state_dict(s); });
  }
  State& add(const std::string& prefix, std::function<StateDict()> save, std::function<void(const StateDict&)> load);

  struct Entry {
    std::string prefix;  // its tensors' names in the checkpoint start with it ("loader.")
    std::function<StateDict()> save;
    // Restores it from the checkpoint's entries under `prefix` (prefix removed; empty when the
    // checkpoint has none); returns what Run::note() adds about it ("" when it continued exactly).
    std::function<std::string(const StateDict&)> load;
    bool collective = false;  // save() is collective (add_collective)
    // "": memory snapshots (RunOptions::snapshots.every) hold the entry as the checkpoint file
    // does, or refuse it when it is collective. Otherwise they leave it out, a resume from one
    // leaves the object as it is, and this text is added to Run::note() ("memory snapshots keep
    // no PowerSGD state: PowerSGD starts afresh").
    std::string not_in_snapshots;
  };
  // The general form of the add()s above.
  State& add(Entry entry);
  // As add(), for an object whose state_dict() is COLLECTIVE (ddp::DiLoCo): every rank calls it
  // when a checkpoint is written, and rank 0's result is saved. Memory snapshots
  // (RunOptions::snapshots.every) refuse a State with such an entry (InvalidArgument).
  template <class T>
  State& add_collective(const std::string& prefix, T& object) {
    add(prefix, object);
    entries.back().collective = true;
    return *this;
  }
  // A number of the program's own, saved as an f32 scalar named `name` ("train.last_val_loss")
  // and read back on resume (left as it is when the checkpoint has none).
  State& add_scalar(const std::string& name, double& value);

  ddp::DistributedDataParallel* ddp;
  optim::Optimizer* optimizer;
  amp::LossScaler* scaler;
  std::vector<Entry> entries;
  // Set: the model is split over this tensor-parallel group (models::Gpt(config, group),
  // parallel/tensor_parallel.h), and DDP runs over the mesh's other dimension (DeviceMesh: the
  // ranks of one tp group share their data-parallel rank). Checkpoints then hold the unsplit
  // model's whole tensors (parallel::whole_state_dict, COLLECTIVE over the tp group of rank 0,
  // the one of data-parallel rank 0, when one is written) and a resume cuts this rank's slices
  // from them (split_state_dict), so a checkpoint resumes at any tensor-parallel size, 1
  // included. A collective entry (add_collective; PowerSGD's, whose state is of this rank's
  // slices) is saved per rank of the group, "<prefix>tp<r>.<key>" and "<prefix>tp.size" (its
  // tensors gathered over the group: it must have the same names and shapes on every rank), and
  // a resume gives each rank its own; at another tensor-parallel size the entry gets no state
  // (PowerSGD starts afresh) and note() says why. Memory snapshots hold each rank's slices (every
  // rank writes its part, as under ZeRO) and resume at the same tensor-parallel size only: at
  // another, the resume takes the checkpoint file and note() says why.
  Communicator* tensor_parallel = nullptr;
};

// Memory snapshots (spot-proof training; need RunOptions::checkpoint_dir): after every N-th
// step (not the last step's or a stop's, which go to the checkpoint file) each rank's part of
// the state goes to a file in its node's memory, which outlives the process (not the node):
// under ZeRO every rank writes its shard and sends it to a buddy rank on another node, so that
// the survivors of any one lost node hold every part; at stage 0 the lowest rank of each node
// writes the whole state (with State::tensor_parallel every rank writes its slices, as under
// ZeRO). A resume (Resume::yes or automatic) takes the newest snapshot whose
// every part some rank holds when it is at least as new as the checkpoint file, on any number
// of ranks and any stage; note() says which source it used and what was lost. The construction
// refuses (InvalidArgument, before any step) when a node's folder has too little free space.
// The snapshot holds what the checkpoint file does, but the State entries marked
// not_in_snapshots (PowerSGD's hook's: a resume from a snapshot restarts PowerSGD, and note()
// says so). COLLECTIVE, a blocking copy to host memory and one exchange with the buddy: see
// docs/user-guide.md for the cost.
struct SnapshotOptions {
  // After every N-th step; 0: no snapshots. --snapshot-every. kSnapshotAuto: K chosen by the
  // Run so that snapshots take at most `cost` of the training time: the first snapshot is after
  // the 5th step of the run, timed against the steps before it, and the ranks take the largest K
  // any of them asks for (StepEnd::snapshot_every says it from then on). With `mtbf`, K is Young
  // and Daly's optimum instead: the interval sqrt(2 x snapshot seconds x mtbf), in steps (at
  // least 1).
  std::int64_t every = 0;
  double cost = 0.02;
  // The job's mean time between failures in seconds, for kSnapshotAuto (0: unknown). --mtbf.
  double mtbf = 0;
  // The node-local folder ("": /dev/shm); the snapshots go in its sub-folder tutti-<run id>,
  // the run id being kept in <checkpoint_dir>/run-id. --snapshot-dir.
  std::string dir;
  // Ranks without a Job (Run over a Communicator, e.g. threads): the node of each rank, whose
  // folder is then dir/node<i> (empty: a node per rank). With a Job: the hosts.
  std::vector<int> nodes;
};

struct RunOptions {
  // The run is complete after this many optimizer steps in all (> 0; a resumed run counts the
  // checkpoint's).
  std::int64_t steps = 0;
  // Where checkpoint.tckp is written and read ("": no checkpoints, and no resume). Every rank
  // must see the same folder (a shared file system across nodes).
  std::string checkpoint_dir;
  Resume resume = Resume::no;
  // With Resume::no: start afresh even when a checkpoint exists (it is replaced).
  bool overwrite = false;
  // Also checkpoint after every N-th step (0: only after the last step and on a stop).
  std::int64_t checkpoint_every = 0;
  // async: rank 0 copies the state to host memory and a background thread writes the file;
  // sync: the step waits until the file is written (the examples' --checkpoint-mode).
  io::CheckpointMode checkpoint_mode = io::CheckpointMode::async;
  // Async: what a checkpoint every N steps does when the previous one is still being written:
  // wait for it, or skip this one (never the last step's or a stop's). --checkpoint-busy. skip with
  // sync: InvalidArgument.
  io::WhenBusy checkpoint_busy = io::WhenBusy::wait;
  // Memory snapshots: off unless snapshots.every is set (below).
  SnapshotOptions snapshots;
  // Strings stored in the checkpoint: the model's fingerprint ("model"), the program...
  io::Metadata metadata;
  // Keys of `metadata` a checkpoint must hold alike to be resumed ("... is for another model").
  std::vector<std::string> must_match{"model"};
  // The precision as the program names it ("fp32", "bf16", "fp16"; "": not named). Stored as
  // metadata "precision"; a checkpoint of another precision leaves the loss scaler's state
  // out (note() says so); named in the divergence message.
  std::string precision;
  // The stream the loss tensors are computed on (GPU); the step's allreduce is ordered after it.
  Stream stream;
  // Where the run's steps and ending are summarized (nullptr: nowhere). The Run sets its rank,
  // "resumed_from_step" (and when resumed "resumed_from" and "resume_note", its note()), and the
  // ending in finish().
  Summary* summary = nullptr;
  // Preemption notices (train/preemption.h; source "": none): every rank polls the source; on
  // a notice on any rank, every rank stops after the current step as after a stop signal, with
  // a memory snapshot first when snapshots are on (quick, and the survivors hold it) and then
  // the checkpoint file. Outcome::preempted_hosts names the hosts with a notice; the status
  // file too, for tutti-launch to leave them out. --preemption-notice.
  PreemptionOptions preemption;
  // The status file for a launcher (see above; "": $TUTTI_STATUS_FILE, and none when that is
  // unset too). Rank 0 writes it; the launcher must see the folder (a shared one across nodes).
  std::string status_file;
  // Accounting (Run::accounting): what one step trains, counted in `work_unit` (the tokens or
  // samples of the global batch; 0: no cost per million), and the price of one rank-hour (one
  // GPU's hour; 0: no cost). --price-per-hour.
  double work_per_step = 0;
  std::string work_unit = "samples";
  double price_per_hour = 0;
  // What the stop message says after "Checkpoint written to <path>.".
  std::string resume_advice =
      "Resume with the same command and --resume (--resume auto also starts afresh when there is no checkpoint).";
};

// What end_step() found.
struct StepEnd {
  std::int64_t step = 0;  // the steps done (this step's number, counting from 1)
  double loss = 0;        // the step's mean loss over every rank (as add_loss() summed it)
  bool diverged = false;  // the loss is not finite (and the loss scaler is off): the run ends
  bool stop = false;      // some rank asked to stop: the run ends after this step
  bool last = false;      // step == RunOptions::steps
  // A checkpoint of this step was due: written (sync), or its write started (async; complete
  // at the latest when a later end_step() or finish() returns without throwing), or skipped.
  bool checkpoint = false;
  double checkpoint_seconds = 0;  // how long it held this step (gathering, waiting, copying, writing)
  // Rank 0's writer (the other ranks: false, -1, 0):
  bool checkpoint_skipped = false;         // skipped: the write of checkpoint_busy_step was in flight
  std::int64_t checkpoint_busy_step = -1;  // the step whose write in flight made this one wait or skip (-1: none)
  double checkpoint_waited_seconds = 0;    // of checkpoint_seconds, waiting for that write
  bool snapshot = false;                   // a memory snapshot of this step was written (every rank)
  double snapshot_seconds = 0;             // how long it held this step
  std::int64_t snapshot_every = 0;         // the K in effect after this step (0: none, or auto and not chosen yet)
};

struct Outcome {
  enum class Status : std::uint8_t { completed, stopped, diverged };
  Status status = Status::completed;
  int exit_code = 0;      // 0; 3 (diverged) or 75 (stopped) on rank 0, 0 on the others
  std::string message;    // rank 0: what to print to stderr after "<program>: "; "" elsewhere
  std::int64_t step = 0;  // the steps done
  int signal = 0;         // stopped: the signal the lowest stopping rank got (0: request_stop() or a notice)
  int signal_rank = -1;   // stopped: that rank
  // Stopped by a preemption notice (RunOptions::preemption): the hosts that had one, on every
  // rank (empty otherwise).
  std::vector<std::string> preempted_hosts;
};

namespace detail {
// What tests put in place of the real thing (tests/train); not part of the API.
struct RunHooks {
  io::CheckpointHooks checkpoint{};  // rank 0's writer's hooks (io::CheckpointHooks)
  std::function<std::uint64_t(const std::string& dir)> snapshot_free_bytes;  // a node folder's; empty: statvfs
};
}  // namespace detail

class Run {
 public:
  // COLLECTIVE. Checks that the ranks agree on the run (its options; whether the checkpoint
  // exists: every rank reads it), refuses to start over an existing checkpoint unless told
  // (resume or overwrite), and on resume loads every part of `state` from the checkpoint.
  // The stop flag is the Job's (JobOptions::catch_stop_signals) or request_stop().
  Run(Job& job, State state, RunOptions options);
  // COLLECTIVE. The same without a Job (ranks as threads: ThreadGroup; or a communicator of
  // the program's own): the ranks' agreement goes over `comm` (CPU tensors), and the stop
  // flag is request_stop() only. `comm` serves the state's device.
  Run(Communicator& comm, State state, RunOptions options, detail::RunHooks hooks = {});
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Starts the next step: true when there is one to do; false once the run completed, was
  // stopped or diverged (then call finish()). Not collective. Marks the step's start in the
  // trace (core/trace.h).
  bool next();
  // Within a step: adds weight x loss (f32 [1] on the state's device, e.g. CrossEntropyLoss's
  // loss()) to this rank's loss of the step, on RunOptions::stream. Not collective; no sync.
  // Under DdpOptions::deterministic the sum over adds and ranks is exact (fixed point, 2^-32;
  // weight must be positive; weight x accumulation steps counts to 16 significant bits, so that
  // 1/k is exact): it does not depend on the world size nor on the order of the additions.
  void add_loss(const Tensor& loss, float weight = 1.0f);
  // Within a step, before add_loss(): `count` more floats in this step's allreduce (average
  // over the ranks), for the program's own figures (a straggler detector's): write them into
  // the returned tensor (f32 [count] on the device) before end_step(), read them after.
  Tensor sync_slots(int count);
  // This rank asks the run to stop after the current step, as a stop signal would (`signal`
  // is named in the message; 0: "a stop request"). Not collective.
  void request_stop(int signal = 0);
  // COLLECTIVE, ends the step: the allreduce of the loss and the stop flag (one collective),
  // the divergence check, the checkpoint when one is due. Throws what a failed save threw
  // (tutti::Error naming the step and the file; the other ranks are told by the Job), and, on
  // rank 0, the failure of a background write of an earlier checkpoint.
  const StepEnd& end_step();
  // COLLECTIVE, after next() returned false: a stopped run waits until every rank is there
  // (the checkpoint is written) and agrees on the signal and the rank that got it; writes the
  // summary's ending (completed, stopped or diverged: set the program's final figures first).
  Outcome finish();

  std::int64_t step() const;        // steps done
  std::int64_t first_step() const;  // where this run started: 0, or the checkpoint's step
  bool resumed() const;
  std::int64_t steps() const;  // RunOptions::steps
  double loss() const;         // the last step's mean loss (-1: none yet, or not in the checkpoint)
  bool completed() const;      // next() returned false with every step done (not stopped, not diverged)
  // The checkpoint's file ("" without a checkpoint_dir).
  const std::string& checkpoint_path() const;
  // The step of the last checkpoint this run read or wrote completely (-1: none); on rank 0,
  // a write in flight is not counted until it is complete.
  std::int64_t checkpoint_written_step() const;
  // A note on the resume for the program's start-up line ("" when none), e.g. " (checkpoint
  // written in fp32: the loss scaler starts afresh)", " from memory (step 120: 4 parts, 1 of
  // them a buddy's copy; the checkpoint file is at step 100)", " (the PowerSGD state was
  // written on 4 rank(s), here 2: its step count and Q are kept, the error feedback starts at
  // zero)".
  const std::string& note() const;
  // The run's cost so far over its attempts (train/accounting.h), as of now. Not collective.
  Accounting accounting() const;
  // Whether the resume took a memory snapshot (RunOptions::snapshots.every) rather than the file.
  bool resumed_from_memory() const;
  // Memory snapshots: this rank's node's folder ("" when off), and the bytes the fullest node
  // keeps there (its parts and buddy copies; twice that while a snapshot replaces the last).
  const std::string& snapshot_dir() const;
  std::uint64_t snapshot_bytes_per_node() const;

  struct Impl;  // internal

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::train
