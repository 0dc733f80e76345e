#include "run_flags.h"

#include <cmath>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

namespace example {

namespace {

// A check of the text of a whole number (integer) or any number, with its bound.
CLI::Validator number_check(bool integer, bool zero_allowed) {
  const std::string what =
      std::string(integer ? "a " : "a number ") +
      (integer ? (zero_allowed ? "whole number >= 0" : "positive integer") : (zero_allowed ? ">= 0" : "> 0"));
  return CLI::Validator(
      [integer, zero_allowed, what](std::string& text) -> std::string {
        std::size_t used = 0;
        bool ok = false;
        try {
          if (integer) {
            const long long v = std::stoll(text, &used);
            ok = used == text.size() && (zero_allowed ? v >= 0 : v > 0);
          } else {
            const double v = std::stod(text, &used);
            ok = used == text.size() && std::isfinite(v) && (zero_allowed ? v >= 0 : v > 0);
          }
        } catch (const std::exception&) {
          ok = false;
        }
        return ok ? std::string() : "must be " + what + ", got '" + text + "'";
      },
      integer ? (zero_allowed ? "INT>=0" : "INT>0") : (zero_allowed ? "NUMBER>=0" : "NUMBER>0"));
}

}  // namespace

CLI::Validator positive(const int&) { return number_check(true, false); }
CLI::Validator positive(const std::int64_t&) { return number_check(true, false); }
CLI::Validator positive(const std::uint64_t&) { return number_check(true, false); }
CLI::Validator positive(const double&) { return number_check(false, false); }
CLI::Validator non_negative(const int&) { return number_check(true, true); }
CLI::Validator non_negative(const std::int64_t&) { return number_check(true, true); }
CLI::Validator non_negative(const double&) { return number_check(false, true); }
CLI::Validator non_negative_integer() { return number_check(true, true); }

void add_run_flags(CLI::App& app, RunFlags& f) {
  app.add_option("--device", f.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--precision", f.precision, "compute precision: fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--grad-comm", f.grad_comm,
                 "gradient dtype on the wire: fp32, bf16 or fp16 (default: the precision's)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--bucket-mb", f.bucket_mb, "gradient bucket size in MiB")
      ->check(example::positive(f.bucket_mb))
      ->capture_default_str();
  app.add_option("--zero", f.zero,
                 "ZeRO stage: 0 (every rank keeps everything), 1 (optimizer state and fp32 masters sharded), 2 (also "
                 "the gradients), 3 (also the parameters, gathered block by block); checkpoints resume at any "
                 "stage and number of ranks")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app.add_option("--allreduce", f.allreduce,
                 "how gradients are summed across ranks: flat (one allreduce over all ranks) or hierarchical "
                 "(reduce-scatter in each node, allreduce across nodes, all-gather in each node: fewer bytes "
                 "over the link between nodes; --zero 0 only) or powersgd:R (PowerSGD: each weight matrix's "
                 "gradient sent as rank-R factors with error feedback, the rest flat; fp32 gradients, --zero 0 only)")
      ->check([](const std::string& v) {
        if (v == "flat" || v == "hierarchical") return std::string();
        try {
          (void)powersgd_rank(v);
        } catch (const tutti::Error& e) {
          return std::string(e.message());
        }
        return std::string();
      })
      ->capture_default_str();
  app.add_option("--powersgd-start", f.powersgd_start,
                 "--allreduce powersgd:R: steps that allreduce every gradient uncompressed before PowerSGD starts")
      ->check(example::non_negative(f.powersgd_start))
      ->capture_default_str();
  app.add_option("--sync", f.sync,
                 "how ranks stay in step: ddp (gradients averaged over every rank at every step) or diloco:H (DDP "
                 "inside each node; every H steps the nodes average the pseudo-gradient and an outer Nesterov SGD "
                 "applies it: the link between nodes carries the model once per H steps)")
      ->capture_default_str();
  app.add_option("--outer-lr", f.outer_lr, "--sync diloco: the outer optimizer's learning rate")->capture_default_str();
  app.add_option("--outer-momentum", f.outer_momentum, "--sync diloco: the outer optimizer's (Nesterov) momentum")
      ->capture_default_str();
  app.add_option("--outer-dtype", f.outer_dtype,
                 "--sync diloco: the pseudo-gradients between nodes in f32, bf16, int8 or int4 (one scale per 64 "
                 "values)")
      ->check(CLI::IsMember({"f32", "bf16", "int8", "int4"}))
      ->capture_default_str();
  app.add_flag("--error-feedback", f.error_feedback,
               "--sync diloco with --outer-dtype bf16/int8/int4: carry what compression left out into the next sync");
  app.add_option("--streaming", f.streaming,
                 "--sync diloco:H: cut the model into F fragments whose outer syncs are spread over the H steps "
                 "(fragment f at step f*H/F of each period), so that the link carries 1/F of the model at a time "
                 "(1: off; at most H)")
      ->check(example::positive(f.streaming))
      ->capture_default_str();
  app.add_option("--overlap", f.overlap,
                 "--sync diloco:H: let each outer sync travel while the next T inner steps compute, applied T steps "
                 "later with the inner progress made meanwhile kept (0: each sync blocks its step; at most "
                 "H/--streaming)")
      ->check(example::non_negative(f.overlap))
      ->capture_default_str();
  app.add_option("--outer-exchange", f.outer_exchange,
                 "--sync diloco with --outer-dtype int8/int4: allgather (every node gets every node's bytes), "
                 "reduce_scatter (each node averages 1/N and the averages are all-gathered: fewer bytes from 3 "
                 "nodes, one more quantization) or auto (reduce_scatter from 3 nodes)")
      ->check(CLI::IsMember({"auto", "allgather", "reduce_scatter"}))
      ->capture_default_str();
  app.add_option("--ranks-per-node", f.ranks_per_node,
                 "the node map for --sync diloco and --allreduce hierarchical: 0 (the hosts), or N: ranks r with the "
                 "same r / N are a node (fakes nodes on one machine)")
      ->check(example::non_negative(f.ranks_per_node))
      ->capture_default_str();
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "where rank 0 writes checkpoint.tckp");
  app.add_option("--checkpoint-every", f.checkpoint_every, "also checkpoint every N steps (0: only at the end)")
      ->check(example::non_negative(f.checkpoint_every))
      ->capture_default_str();
  app.add_option("--resume", f.resume,
                 "continue from the checkpoint in --checkpoint-dir (an error if there is none); --resume auto: "
                 "continue if there is one, else start afresh (for a scheduler that reruns the same command)")
      ->expected(0, 1)
      ->default_str("yes")
      ->check(CLI::IsMember({"yes", "auto"}));
  app.add_option("--checkpoint-mode", f.checkpoint_mode,
                 "async: rank 0 copies the state to memory and writes the file in the background (the step waits "
                 "only for the copy); sync: the step waits until the file is written")
      ->check(CLI::IsMember({"async", "sync"}))
      ->capture_default_str();
  app.add_option("--checkpoint-busy", f.checkpoint_busy,
                 "async: a checkpoint due while the previous one is still being written waits for it or is skipped "
                 "(never the last one or a stop's)")
      ->check(CLI::IsMember({"wait", "skip"}))
      ->capture_default_str();
  app.add_option("--snapshot-every", f.snapshot_every,
                 "also keep the state in the nodes' memory (and, with --zero, a buddy's copy on another node) every "
                 "N steps: a resume after a lost node takes it when newer than the checkpoint file (0: off; auto: N "
                 "such that snapshots take at most 2% of the time)")
      ->check(CLI::IsMember({"auto"}) | example::non_negative_integer())
      ->capture_default_str();
  app.add_option("--max-micro-batch", f.max_micro_batch,
                 "samples per rank and micro-step at most: the accumulation steps (at least --accum-steps) rise when "
                 "ranks fall, so that a job relaunched on fewer ranks keeps its global batch and fits (0: off)")
      ->check(example::non_negative(f.max_micro_batch));
  app.add_flag(
      "--deterministic", f.deterministic,
      "a model that does not depend on the number of ranks, bit for bit: gradients summed exactly per "
      "slice of --max-micro-batch samples (needs it, and --zero 0 or 1); the CPU GEMMs use one thread per rank");
  app.add_option("--snapshot-dir", f.snapshot_dir, "node-local folder for the memory snapshots (default /dev/shm)");
  app.add_option("--mtbf", f.mtbf,
                 "with --snapshot-every auto: the job's mean time between failures in seconds; snapshots then "
                 "come every sqrt(2 x snapshot time x MTBF) (Young/Daly) instead of at most 2% of the time")
      ->check(example::positive(f.mtbf));
  app.add_option("--preemption-notice", f.preemption_notice,
                 "watch for the cloud's notice that a node will be taken back (aws, gce, azure, a URL, file:PATH; "
                 "{host} is the node's name): every rank then stops after the step with a checkpoint, naming the "
                 "node for tutti-launch to leave out");
  app.add_option("--preemption-poll", f.preemption_poll, "seconds between two polls of --preemption-notice")
      ->check(example::positive(f.preemption_poll))
      ->capture_default_str();
  app.add_option("--price-per-hour", f.price_per_hour,
                 "the price of one rank-hour (a GPU's hour): the JSON summary and the status file report the run's "
                 "cost, and per million samples or tokens")
      ->check(example::positive(f.price_per_hour));
  app.add_flag("--overwrite", f.overwrite, "start afresh even if --checkpoint-dir holds a checkpoint (replacing it)");
  app.add_option("--json", f.json, "write a JSON summary to this path (rank 0)");
  app.add_flag("--quiet", f.quiet, "no progress output");
  app.add_flag("--dry-run", f.dry_run,
               "check the command line and exit (0: valid, 2: not), starting nothing (a manifest's "
               "command, a scheduler's script)");
  app.add_option("--progress-interval", f.progress_interval, "seconds between progress lines")
      ->check(example::positive(f.progress_interval))
      ->capture_default_str();
  app.add_option("--peak-tflops", f.peak_tflops,
                 "peak TFLOP/s per rank for MFU (default: a known GPU's from tutti's table, on the CPU the measured "
                 "GEMM ceiling; $TUTTI_PEAK_TFLOPS)")
      ->check(example::positive(f.peak_tflops));
}

int parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (app.count("--dry-run") > 0) {
    std::printf("%s: --dry-run: the command line is valid\n",
                std::filesystem::path(argc > 0 ? argv[0] : "trainer").filename().c_str());
    return 0;
  }
  return -1;
}

tutti::train::RunOptions run_options(const RunFlags& f, std::int64_t steps, const tutti::Stream& stream,
                                     tutti::train::Summary& summary) {
  tutti::train::RunOptions o;
  o.steps = steps;
  o.checkpoint_dir = f.checkpoint_dir;
  o.resume = tutti::train::parse_resume(f.resume);
  o.overwrite = f.overwrite;
  o.checkpoint_every = f.checkpoint_every;
  o.checkpoint_mode = f.checkpoint_mode == "sync" ? tutti::io::CheckpointMode::sync : tutti::io::CheckpointMode::async;
  o.checkpoint_busy = f.checkpoint_busy == "skip" ? tutti::io::WhenBusy::skip : tutti::io::WhenBusy::wait;
  o.snapshots.every = f.snapshot_every == "auto" ? tutti::train::kSnapshotAuto : std::stoll(f.snapshot_every);
  o.snapshots.dir = f.snapshot_dir;
  TUTTI_CHECK_ARG(f.mtbf == 0 || f.snapshot_every == "auto",
                  "--mtbf needs --snapshot-every auto (it picks the interval), got --snapshot-every ",
                  f.snapshot_every);
  o.snapshots.mtbf = f.mtbf;
  o.price_per_hour = f.price_per_hour;
  o.preemption = {.source = f.preemption_notice, .poll_seconds = f.preemption_poll};
  o.precision = f.precision;
  o.stream = stream;
  o.summary = &summary;
  return o;
}

int accumulation_steps(const RunFlags& f, std::int64_t global_batch, int accum, int world) {
  if (f.deterministic) {
    TUTTI_CHECK_ARG(f.max_micro_batch > 0 && global_batch % (f.max_micro_batch * world) == 0,
                    "--deterministic: --batch-size ", global_batch, " must be a multiple of --max-micro-batch (",
                    f.max_micro_batch, ", the slice: the micro-batch of every rank at every world size) x ", world,
                    " rank(s)");
    return static_cast<int>(global_batch / (f.max_micro_batch * world));
  }
  if (f.max_micro_batch > 0) {
    for (int k = accum; k <= global_batch; ++k) {
      if (global_batch % (static_cast<std::int64_t>(k) * world) == 0 && global_batch / (k * world) <= f.max_micro_batch)
        return k;
    }
    TUTTI_CHECK_ARG(false, "--batch-size ", global_batch, " over ", world,
                    " rank(s): no number of accumulation steps "
                    "(from --accum-steps ",
                    accum, ") divides it into micro-batches of at most --max-micro-batch ", f.max_micro_batch,
                    " per rank");
  }
  TUTTI_CHECK_ARG(global_batch % (static_cast<std::int64_t>(accum) * world) == 0, "--batch-size ", global_batch,
                  " must be divisible by --accum-steps x ranks = ", accum, " x ", world,
                  " (every rank computes batch / (accum-steps x ranks) samples per micro-step; --max-micro-batch "
                  "picks the accumulation steps)");
  return accum;
}

std::string snapshot_line(const RunFlags& f, const tutti::train::Run& run, int nodes) {
  if (f.snapshot_every == "0") return "";
  char mtbf[96];
  std::snprintf(mtbf, sizeof mtbf, "Young/Daly's for an MTBF of %g s", f.mtbf);
  const std::string every = f.snapshot_every != "auto" ? "every " + f.snapshot_every + " steps"
                            : f.mtbf > 0
                                ? "auto (the first after step 5, then every N steps: " + std::string(mtbf) + ")"
                                : "auto (the first after step 5, then every N steps for at most 2% of the time)";
  char text[512];
  std::snprintf(
      text, sizeof text, "memory snapshots: %s, %.1f MiB per node (at most; twice that with the previous one) in %s%s",
      every.c_str(), static_cast<double>(run.snapshot_bytes_per_node()) / (1 << 20), run.snapshot_dir().c_str(),
      nodes < 2    ? ": one node, so they outlive the processes, not the node"
      : f.zero > 0 ? ", each rank's part also on a buddy node"
                   : ", one copy per node");
  return text;
}

int powersgd_rank(const std::string& allreduce) {
  const std::string prefix = "powersgd:";
  if (allreduce.rfind(prefix, 0) != 0) return 0;
  const std::string r = allreduce.substr(prefix.size());
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(r, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TUTTI_CHECK_ARG(used == r.size() && used > 0 && value >= 1 && value <= 65536, "--allreduce: '", allreduce,
                  "': R (the rank of PowerSGD's approximation) must be a whole number >= 1, e.g. powersgd:4");
  return static_cast<int>(value);
}

std::shared_ptr<tutti::ddp::CommHook> comm_hook(const RunFlags& f, const tutti::ddp::DdpOptions& o) {
  const int rank = powersgd_rank(f.allreduce);
  if (rank == 0) return nullptr;
  TUTTI_CHECK_ARG(f.zero == 0, "--allreduce ", f.allreduce, " (PowerSGD) needs --zero 0, got --zero ", f.zero);
  TUTTI_CHECK_ARG(!f.deterministic, "--allreduce ", f.allreduce,
                  " (PowerSGD) cannot be combined with --deterministic (an exact, uncompressed sum)");
  TUTTI_CHECK_ARG(!o.reducer.grad_comm_dtype || *o.reducer.grad_comm_dtype == tutti::DType::f32, "--allreduce ",
                  f.allreduce,
                  " (PowerSGD) needs fp32 gradients on the wire: pass --grad-comm fp32 (this precision's is ",
                  tutti::name_of(*o.reducer.grad_comm_dtype), ")");
  TUTTI_CHECK_ARG(f.precision != "fp16", "--allreduce ", f.allreduce,
                  " (PowerSGD) cannot be combined with --precision fp16: a loss-scaled step that overflows would put "
                  "inf into the error feedback (use --precision bf16 --grad-comm fp32, or fp32)");
  tutti::ddp::PowerSgdOptions p;
  p.rank = rank;
  p.start_step = f.powersgd_start;
  return std::make_shared<tutti::ddp::PowerSgdHook>(p);
}

tutti::Communicator& ddp_communicator(tutti::Job& job, const RunFlags& f,
                                      std::shared_ptr<tutti::Communicator>& hierarchical) {
  job.check_same("--allreduce", f.allreduce + " --powersgd-start " + std::to_string(f.powersgd_start));
  if (f.allreduce == "flat" || powersgd_rank(f.allreduce) > 0) return job.communicator();
  TUTTI_CHECK_ARG(f.zero == 0,
                  "--allreduce hierarchical needs --zero 0 (ZeRO reduce-scatters the gradients over all "
                  "ranks), got --zero ",
                  f.zero);
  tutti::NodeGroups groups = job.node_groups({}, f.ranks_per_node);
  try {
    hierarchical = tutti::hierarchical_communicator(job.communicator(), groups);
  } catch (const tutti::InvalidArgument& e) {
    TUTTI_THROW(InvalidArgument, "--allreduce hierarchical: ", e.message());
  }
  return *hierarchical;
}

}  // namespace example
