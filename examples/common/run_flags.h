// The command-line flags both trainers share (train_fashion_mnist, train_gpt): the device and
// precision, ZeRO, and run control (checkpoints, resume, the JSON summary, progress), and the
// train::RunOptions they make. A trainer's Flags derive from RunFlags, so that f.checkpoint_dir
// and its own f.model read alike.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <tutti/tutti.h>

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace example {

// Checks of a flag's value with a plain message naming what it must be ("must be a positive
// integer", "must be a number >= 0"), for the flag's type (CLI11's own PositiveNumber says "not
// in range 0.000000 to 1797..." for every type). The argument only picks the overload.
CLI::Validator positive(const int&);
CLI::Validator positive(const std::int64_t&);
CLI::Validator positive(const std::uint64_t&);
CLI::Validator positive(const double&);
CLI::Validator non_negative(const int&);
CLI::Validator non_negative(const std::int64_t&);
CLI::Validator non_negative(const double&);
// For a flag held as text that may also be a word ("auto"): a whole number >= 0.
CLI::Validator non_negative_integer();

struct RunFlags {
  std::string device = "auto";
  std::string precision = "fp32";
  std::string grad_comm;  // the precision policy's when not given
  double bucket_mb = 25;
  int zero = 0;                    // ZeRO stage
  std::string allreduce = "flat";  // or "hierarchical" (comm/groups.h), or "powersgd:R" (ddp/powersgd.h)
  int powersgd_start = 10;         // --allreduce powersgd:R: PowerSgdOptions::start_step
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  std::string resume = "no";  // "no", "yes" (--resume) or "auto"
  bool overwrite = false;
  std::string checkpoint_mode = "async";  // "async" or "sync"
  std::string checkpoint_busy = "wait";   // "wait" or "skip"
  std::string snapshot_every = "0";       // memory snapshots: "0" (none), "auto" or N steps
  std::string snapshot_dir;               // node-local folder ("": /dev/shm)
  double mtbf = 0;                        // --snapshot-every auto: the MTBF in seconds (0: the 2% bound)
  double price_per_hour = 0;              // of one rank (a GPU): the summary's cost (0: none)
  std::string preemption_notice;          // aws, gce, azure, a URL or file:PATH ("": not watched)
  double preemption_poll = 2;             // seconds between polls
  std::int64_t max_micro_batch = 0;       // per rank (0: --accum-steps as given)
  bool deterministic = false;             // DdpOptions::deterministic: micro-batches of exactly --max-micro-batch
  std::string sync = "ddp";               // "ddp" or "diloco:H" (sync.h)
  double outer_lr = 0.7;                  // DiLoCo's outer optimizer
  double outer_momentum = 0.9;
  std::string outer_dtype = "f32";  // f32, bf16, int8, int4
  bool error_feedback = false;
  int streaming = 1;                    // DiLoCo's fragments, synced at staggered steps (1: off)
  int overlap = 0;                      // DiLoCo: inner steps an outer sync travels before it is applied (0: blocking)
  std::string outer_exchange = "auto";  // DiLoCo int8/int4: auto, allgather, reduce_scatter
  int ranks_per_node = 0;  // 0: the real node map; N: rank / N is the node (--sync diloco, --allreduce hierarchical)
  std::string json;
  bool quiet = false;
  bool dry_run = false;            // --dry-run: parse_command_line checks the command line and ends the program
  double progress_interval = 2.0;  // the trainer may set its own default before add_run_flags
  double peak_tflops = 0;          // 0: the table's (GPU) or the measured GEMM ceiling (CPU)
};

// Adds the flags above to `app`, with f's values as the defaults.
void add_run_flags(CLI::App& app, RunFlags& f);

// app.parse: returns -1 to go on, else the trainer's exit code: 0 after --help and --dry-run (the
// command line is valid: nothing starts), 2 for a bad command line (CLI11 has printed why).
int parse_command_line(CLI::App& app, int argc, char** argv);

// The run control of these flags for a run of `steps` steps (the caller adds its metadata).
// `summary`: where the run's summary goes (made from --json before the Job).
tutti::train::RunOptions run_options(const RunFlags& f, std::int64_t steps, const tutti::Stream& stream,
                                     tutti::train::Summary& summary);

// The communicator DDP reduces the gradients over: job.communicator() for --allreduce flat, else
// a hierarchical one made here (COLLECTIVE: node groups) and kept in `hierarchical`, which must
// outlive the DDP object. Throws InvalidArgument naming the flag where it cannot apply (ZeRO,
// nodes with unequal rank counts) and when the ranks disagree on it.
tutti::Communicator& ddp_communicator(tutti::Job& job, const RunFlags& f,
                                      std::shared_ptr<tutti::Communicator>& hierarchical);

// --allreduce powersgd:R -> R; 0 for the other values. Throws InvalidArgument naming the flag when
// R is not a whole number >= 1.
int powersgd_rank(const std::string& allreduce);

// The communication hook of --allreduce powersgd:R and --powersgd-start (a ddp::PowerSgdHook;
// nullptr for the other values), for DistributedDataParallel::register_comm_hook. Call after
// setting o's grad_comm_dtype. Throws InvalidArgument naming the flags where PowerSGD cannot
// apply (--zero 1-3, --deterministic, --precision fp16, a half --grad-comm).
std::shared_ptr<tutti::ddp::CommHook> comm_hook(const RunFlags& f, const tutti::ddp::DdpOptions& o);

// The accumulation steps of a global batch over `world` ranks: --accum-steps (`accum`) as given,
// or with --max-micro-batch M the fewest (at least `accum`) that keep each rank's micro-batch at
// most M and divide the batch: they rise when ranks fall, at the same global batch. Throws
// InvalidArgument (naming the flags) when the batch does not divide. With --deterministic each
// micro-batch is a slice of exactly M samples: batch / (M x world) steps, whatever `accum`.
int accumulation_steps(const RunFlags& f, std::int64_t global_batch, int accum, int world);

// The start-up line on memory snapshots ("" when off): how often, the memory per node, where,
// and what they survive (`nodes`: the job's).
std::string snapshot_line(const RunFlags& f, const tutti::train::Run& run, int nodes);

}  // namespace example
