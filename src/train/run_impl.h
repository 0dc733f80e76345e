// The insides of train::Run (include/tutti/train/run.h), shared by its two sources: run.cc
// (the step protocol, the ending) and checkpointing.cc (resume and the one place a checkpoint
// is written). Internal header.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/checkpoint_file.h"
#include "train/snapshots.h"
#include "tutti/comm/communicator.h"
#include "tutti/core/tensor.h"
#include "tutti/io/checkpoint_writer.h"
#include "tutti/train/accounting.h"
#include "tutti/train/preemption.h"
#include "tutti/train/run.h"

namespace tutti::train {

inline constexpr const char* kStep = "train.step";
inline constexpr const char* kLastLoss = "train.last_loss";
// The microseconds of training the state holds (Accounting::useful_seconds), saved with it.
inline constexpr const char* kUsefulUs = "train.useful_us";
// A memory snapshot's tensor-parallel size (metadata; absent: 1): its split parameters' tensors
// are [tp, slice...], each tp rank's slice a row, so it resumes at that size only.
inline constexpr const char* kSnapshotTp = "train.tensor_parallel";
// The Run's metadata in its checkpoints and snapshots (RunOptions::metadata and the precision).
io::Metadata metadata_of(const RunOptions& options);
// Now, and when this process started, in Unix seconds (the start from Linux's /proc, to 10 ms;
// elsewhere: now). run_status.cc.
double unix_now();
double process_started_unix();
// The stop "signal" of a preemption notice in the ranks' vote (signals are below it).
inline constexpr int kPreemptionNotice = 254;
// crc32 of a string (check_same without a Job, the snapshots' node of a host name).
inline std::int64_t crc_of(std::string_view text) { return io::detail::crc_update(0, text.data(), text.size()); }

struct Run::Impl {
  // What the Run needs of a Job, so that ranks as threads (no Job) run the same code.
  Communicator* comm = nullptr;      // the state's device: the step's allreduce
  Communicator* cpu_comm = nullptr;  // CPU tensors: agreements
  int rank = 0;
  int world = 1;
  std::function<void(std::string_view what, std::string_view value)> check_same;
  std::function<int()> signal;            // the stop signal this process got (0: none)
  std::string hostname;                   // with a Job: this rank's host (the snapshots' nodes)
  std::function<void()> pass_start_gate;  // with a Job: Job::pass_start_gate (before the resume)

  State state;
  RunOptions options;
  detail::RunHooks hooks;  // tests only (Run over a Communicator)
  std::string path;        // the checkpoint's file ("": none)
  std::string note;

  std::int64_t step = 0, first_step = 0;
  bool resumed = false;
  double loss = -1;                // the last step's mean loss (-1: none)
  std::int64_t saved_step = -1;    // the step of the last checkpoint written completely or read (-1: none)
  double saved_loss = -1;          // and its loss
  std::int64_t pending_step = -1;  // rank 0: the step whose write was started last and is not known complete
  double pending_loss = -1;

  std::unique_ptr<io::CheckpointWriter> writer;  // rank 0, with a checkpoint_dir

  // Memory snapshots (RunOptions::snapshots.every).
  std::unique_ptr<detail::MemorySnapshots> snapshots;
  std::uint64_t snapshot_node_bytes = 0;
  bool from_memory = false;
  std::string snapshot_folder;
  std::vector<int> nodes;           // per rank: its node (snapshot_nodes())
  std::int64_t snapshot_every = 0;  // K in effect (auto: 0 until chosen)
  // Auto: the training time between end_step()s before the first snapshot.
  std::chrono::steady_clock::time_point last_step_end{};
  double timed_seconds = 0;
  int timed_steps = 0;

  // The status file and the accounting (run_status.cc). Times are Unix seconds (the launcher
  // may read them on another host) or the steady clock's (durations).
  std::string status_path;  // rank 0: "" none
  std::string attempt_id;   // $TUTTI_ATTEMPT_ID (the launcher's name for this attempt)
  double run_started_unix = 0, attempt_started_unix = 0, first_step_done_unix = 0;
  double earlier_rank_seconds = 0;  // the attempts before this one
  double restored_useful_s = 0;     // the useful time the resumed state held
  int attempts = 1;
  double useful_s = 0;  // restored_useful_s + this attempt's steps
  std::chrono::steady_clock::time_point step_began{}, status_written{};
  std::int64_t status_saved_step = -1, snapshot_step = -1;
  bool status_started = false;  // the first write succeeded (a later failure is not an error)
  // Rank 0 reads the earlier attempts' figures from the status file (when resumed) and every
  // rank takes them (COLLECTIVE: a broadcast); then the first write.
  void start_status();
  // Rank 0: writes the status file, when `force` or 0.2 s have passed since the last write.
  void write_status(const char* state, bool force, int exit_code = -1, const std::string& message = "");
  // The three training scalars a checkpoint and a snapshot hold (step, last loss, useful ms).
  StateDict run_scalars() const;
  Accounting account() const;
  // In end_step(), after the step's collective: the step's time counts as useful.
  void note_step_time();
  // ~Run before finish() (an error, or a program that left): rank 0's status says "failed".
  void write_failed_status() noexcept;

  enum class Phase : std::uint8_t { between, in_step, completed, stopped, diverged, finished };
  Phase phase = Phase::between;
  bool loss_added = false;
  int requested_signal = -1;                   // request_stop(): the signal named (-1: not requested)
  std::unique_ptr<PreemptionWatcher> watcher;  // RunOptions::preemption (null: none)
  std::vector<std::string> preempted_hosts;    // after a stop by a notice: the hosts that had one
  // finish(), stopped, with a watcher: the hosts of the ranks that had a notice (COLLECTIVE).
  std::vector<std::string> gather_preempted_hosts() const;

  Tensor sync;  // f32 [2 + slots]: the step's loss, the stop flag, the program's figures
  Tensor one;   // f32 [1] = 1 on the device (the stop flag's increment)
  // DdpOptions::deterministic: i64 [3] on the device: the step's weight x loss summed in fixed
  // point (multiples of 2^-32; exact, so independent of the order), then the status (inf or
  // nan seen, out of range seen), summed over the ranks by a second allreduce.
  Tensor exact_loss;
  StepEnd end;

  Impl(State s, RunOptions o, detail::RunHooks h = {})
      : state(std::move(s)), options(std::move(o)), hooks(std::move(h)) {}

  // Construction, after the seams above are set: the checks, then the resume.
  void start();
  // checkpointing.cc
  void resume_from_checkpoint();
  // The loading half of a resume: every part of `state` from a checkpoint (the file's, or one
  // assembled from memory snapshots), `source` naming it in errors.
  void load_state(const io::Checkpoint& ckpt, const std::string& source);
  // run_snapshots.cc's seams: the nodes of the ranks, the run id (<checkpoint_dir>/run-id; a new
  // one when the run starts afresh), this run's snapshots, the state as parts, and one write.
  std::vector<int> snapshot_nodes() const;
  std::string node_dir() const;
  std::string read_run_id() const;
  std::string new_run_id(const std::string& old);
  std::unique_ptr<detail::MemorySnapshots> make_snapshots(const std::string& run_id) const;
  StateDict snapshot_part() const;
  // Whether every rank writes a part: under ZeRO (its shard), and with tensor parallelism (its
  // slices, as rows of [tp, slice...] tensors: kSnapshotTp says the tp size in the metadata).
  bool every_rank_writes() const;
  // With tensor parallelism: this rank's rows of a snapshot's [tp, slice...] tensors, each the
  // state of a split parameter ("<name>" or "<name>.<state>"); the other entries as they are.
  StateDict own_rows(const StateDict& assembled) const;
  // The tensor-parallel size a snapshot is written at (its metadata's kSnapshotTp): "1" without.
  std::string snapshot_tp() const;
  // After the resume: the free-space check (COLLECTIVE), the figures for the start-up line.
  void start_snapshots();
  void write_snapshot();
  // write_snapshot() now, timed into end's snapshot fields (COLLECTIVE).
  void snapshot_this_step();
  // Once a step, after the step's allreduce: a snapshot when one is due (auto: the first one
  // after the 5th step, then K chosen from its cost; COLLECTIVE then).
  void maybe_snapshot(bool last, bool stop);
  // THE place a checkpoint is written: COLLECTIVE under ZeRO (every rank gathers the whole
  // tensors), rank 0 saves with `writer`. `must`: the last step's or a stop's (never skipped,
  // complete on return). Fills end's checkpoint fields.
  void write_checkpoint(bool must);
  // Rank 0: moves pending_step to saved_step once the writer completed it.
  void note_written();
  // Once a step, before its collective: rank 0 throws a background write's failure.
  void check_background_work();
  // In finish(), before the ending is agreed and summarized: rank 0 waits for a write in
  // flight (and throws its failure), so that "Checkpoint written to" is true.
  void wait_background_work();
  // Whether this rank was asked to stop, and by what signal (0: request_stop()).
  bool noticed() const { return watcher && watcher->noticed(); }
  bool stop_requested() const { return requested_signal >= 0 || signal() != 0 || noticed(); }
  // A signal first, then a preemption notice (kPreemptionNotice), then request_stop()'s.
  int stop_signal() const { return signal() != 0 ? signal() : noticed() ? kPreemptionNotice : requested_signal; }
  // This rank's host for "{host}" and the Outcome's preempted hosts: the Job's, or "rank<r>".
  std::string host_name() const { return hostname.empty() ? "rank" + std::to_string(rank) : hostname; }
};

}  // namespace tutti::train
