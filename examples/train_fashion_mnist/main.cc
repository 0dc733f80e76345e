// train_fashion_mnist: data-parallel training of Fashion-MNIST, the main job of tutti.
//
//   mpirun -np 2 build/examples/train_fashion_mnist --model mlp --epochs 5
//   mpirun -np 2 build/examples/train_fashion_mnist --model cnn --epochs 3 --checkpoint-dir ckpt
//   mpirun -np 2 build/examples/train_fashion_mnist --model cnn --epochs 3 --checkpoint-dir ckpt --resume
//   mpirun -np 2 build/examples/train_fashion_mnist --checkpoint-dir ckpt --resume auto   # rerun after a stop
//   mpirun -np 4 build/examples/train_fashion_mnist --optimizer adamw --zero 2           # ZeRO-2
//
// --batch-size is the GLOBAL batch of one optimizer step: with N ranks and k accumulation
// steps, each rank computes k micro-batches of batch / (k N) samples. The data order depends
// only on the seed, so a run trains the same way on any number of ranks.
//
// Preemption: SIGTERM, SIGINT, SIGUSR1 or SIGUSR2 to any rank (or SIGUSR1/SIGUSR2 to mpirun,
// which forwards them) stops the run at the next step boundary on every rank: the step's
// loss allreduce carries a stop flag, so no extra collective is needed. With
// --checkpoint-dir, rank 0 writes a checkpoint; the run exits with kExitStopped and says how
// to resume.
//
// Exit codes: 0 done; 1 an error; 2 a bad command line; 3 the loss diverged (not finite in
// fp32/bf16); 75 stopped by a signal, resumable (EX_TEMPFAIL); a job that tutti ends: 13, 14
// or 134 (see docs/user-guide.md, "When things go wrong"). Where every rank stops alike
// (diverged, stopped), rank 0 alone says why and exits with the code, the others exit with 0:
// mpirun drops the output of the other ranks, and kills them, once one has exited non-zero.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <tutti/tutti.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../common/progress.h"
#include "../common/run_support.h"
#include "models.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitDiverged = 3;
constexpr int kExitStopped = 75;  // EX_TEMPFAIL: stopped early, run the same command again
struct Flags {
  std::string model = "mlp";
  int epochs = 5;
  std::int64_t batch_size = 128;
  int accum_steps = 1;
  double lr = -1;  // per optimizer when not given
  std::string optimizer = "sgd";
  std::string lr_schedule = "cosine";
  std::int64_t warmup_steps = 0;
  double momentum = 0.9;
  double weight_decay = -1;  // per optimizer when not given
  std::string precision = "fp32";
  std::string grad_comm;  // the precision policy's when not given
  double bucket_mb = 25;
  int zero = 0;  // ZeRO stage
  std::string device = "auto";
  std::uint64_t seed = 1;
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  std::string resume = "no";  // "no", "yes" (--resume) or "auto"
  bool overwrite = false;
  std::int64_t max_steps = 0;
  std::string json;
  bool quiet = false;
  std::string data = tutti::data::fashion_mnist_dir();
  std::int64_t train_subset = 0;
  std::int64_t test_subset = 0;
  double progress_interval = 2.0;
  std::string progress = "auto";
  // Watching the job (docs/observability.md).
  std::string trace;         // TUTTI_TRACE when empty
  std::string metrics_file;  // Prometheus textfile; "%r" is the rank
  double metrics_interval = 10;
  int metrics_port = 0;      // /metrics on port + local rank
  int straggler_every = 50;  // 0: off
  double straggler_threshold = 0.2;
  double peak_tflops = 0;  // 0: the table's (GPU) or the measured GEMM ceiling (CPU)
  std::string debug_slow;  // "R:MS": rank R busy-waits MS ms in every step's compute (tests)
};

// The textfile of this rank: "%r" replaced by the rank, else "-rank<R>" before the extension when
// there are several ranks (node_exporter reads every *.prom file of its directory).
std::string metrics_path_of(const std::string& path, int rank, int world) {
  if (const auto at = path.find("%r"); at != std::string::npos) {
    return path.substr(0, at) + std::to_string(rank) + path.substr(at + 2);
  }
  if (world == 1) return path;
  const auto dot = path.rfind('.');
  const auto slash = path.rfind('/');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string stem = has_ext ? path.substr(0, dot) : path, ext = has_ext ? path.substr(dot) : "";
  return stem + "-rank" + std::to_string(rank) + ext;
}

void busy_wait_ms(double ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// A fingerprint of a data set, cheap to compute: crc32 of every label and of 256 rows spread
// over the images. Ranks that read different copies of the data almost surely differ in it.
std::string data_fingerprint(const tutti::data::Dataset& d) {
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, static_cast<const Bytef*>(d.labels.data()), static_cast<uInt>(d.labels.nbytes()));
  const std::int64_t n = d.size();
  if (n > 0) {
    const std::size_t row = d.images.nbytes() / static_cast<std::size_t>(n);
    for (std::int64_t i = 0; i < 256; ++i) {
      const std::int64_t r = i * (n - 1) / 255;
      crc = crc32(crc, static_cast<const Bytef*>(d.images.data()) + static_cast<std::size_t>(r) * row,
                  static_cast<uInt>(row));
    }
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc));
  return hex;
}

// The flags that shape the run: every rank must have the same (an MPMD launch could differ).
std::string shaping_flags(const Flags& f) {
  std::ostringstream s;
  s << "--model " << f.model << " --epochs " << f.epochs << " --batch-size " << f.batch_size << " --accum-steps "
    << f.accum_steps << " --lr " << f.lr << " --optimizer " << f.optimizer << " --lr-schedule " << f.lr_schedule
    << " --warmup-steps " << f.warmup_steps << " --momentum " << f.momentum << " --weight-decay " << f.weight_decay
    << " --precision " << f.precision << " --grad-comm " << f.grad_comm << " --bucket-mb " << f.bucket_mb << " --zero "
    << f.zero << " --seed " << f.seed << " --max-steps " << f.max_steps << " --train-subset " << f.train_subset
    << " --test-subset " << f.test_subset << " --checkpoint-every " << f.checkpoint_every << " --resume " << f.resume
    << (f.overwrite ? " --overwrite" : "");
  return s.str();
}

// Throws unless `path` can be written (rank 0 checks --json at the start, not at the end).
void check_writable(const std::string& path, const char* flag) {
  const bool existed = std::filesystem::exists(path);
  {
    std::ofstream probe(path, std::ios::app);
    TUTTI_CHECK_ARG(probe.good(), flag, " ", path, ": cannot write there (", std::strerror(errno), ")");
  }
  if (!existed) std::filesystem::remove(path);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
  }
  return "a signal";
}

// Test accuracy over the whole test set, data-parallel: each rank counts its share, the
// counts are summed over ranks. COLLECTIVE.
double evaluate(tutti::Job& job, tutti::nn::Module& model, const tutti::data::Dataset& test,
                const tutti::Stream& stream) {
  std::optional<tutti::trace::Span> span;
  if (tutti::trace::on()) span.emplace("evaluation", "eval");
  const tutti::Device device = job.device();
  const tutti::data::Dataset mine = tutti::data::eval_shard(test, job.rank(), job.world_size());
  tutti::Tensor correct = tutti::Tensor::zeros({1}, tutti::DType::i64, device);
  model.eval();
  const std::int64_t chunk = 1000;
  for (std::int64_t begin = 0; begin < mine.size(); begin += chunk) {
    const tutti::data::Dataset part = mine.slice(begin, std::min(mine.size(), begin + chunk));
    const tutti::Tensor x = device.is_cpu() ? part.images : part.images.to(device, stream);
    const tutti::Tensor y = device.is_cpu() ? part.labels : part.labels.to(device, stream);
    tutti::kernels::count_correct(model.forward(x), y, correct, /*accumulate=*/true, -100, stream);
  }
  model.train();
  tutti::CallOptions call;
  call.label = "evaluation counts";
  call.stream = stream;
  job.communicator().allreduce(correct, tutti::ReduceOp::sum, call).wait(stream);
  stream.synchronize();
  return static_cast<double>(correct.to_ints()[0]) / static_cast<double>(test.size());
}

int run(const Flags& f, int& argc, char**& argv) {
  const auto t_start = Clock::now();
  // The Job first: its deadline covers everything that follows on every rank, the data
  // loading included (a rank that hangs there is named by the others' timeout report).
  tutti::JobOptions job_options;
  job_options.device = f.device;
  job_options.catch_stop_signals = true;  // SIGTERM & co. stop at a step boundary, with a checkpoint
  tutti::Job job(argc, argv, job_options);
  const int world = job.world_size();
  const bool chatty = job.rank() == 0 && !f.quiet;
  example::warn_if_blas_kernels_are_old(job, "train_fashion_mnist");
  TUTTI_CHECK_ARG(f.batch_size % (static_cast<std::int64_t>(f.accum_steps) * world) == 0, "--batch-size ", f.batch_size,
                  " must be divisible by --accum-steps x ranks = ", f.accum_steps, " x ", world,
                  " (every rank computes batch / (accum-steps x ranks) samples per micro-step)");
  TUTTI_CHECK_ARG(f.resume == "no" || !f.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  // A summary that could not be written at the end would lose the run's result: fail now.
  if (job.rank() == 0 && !f.json.empty()) check_writable(f.json, "--json");

  tutti::data::FashionMnistOptions data_options;
  data_options.flatten = example::spec_of(f.model).flat_input;
  data_options.standardize = true;
  tutti::data::FashionMnist data = tutti::data::load_fashion_mnist(f.data, data_options);
  if (f.train_subset > 0) data.train = data.train.slice(0, std::min(f.train_subset, data.train.size()));
  if (f.test_subset > 0) data.test = data.test.slice(0, std::min(f.test_subset, data.test.size()));
  // Ranks that disagree would issue different collectives: say so now, on every rank.
  job.check_same("the flags that shape the run", shaping_flags(f));
  job.check_same("the number of training samples", data.train.size());
  job.check_same("the number of test samples", data.test.size());
  job.check_same("the data's fingerprint (crc32 of the labels and of 256 images; a different copy of the data?)",
                 data_fingerprint(data.train) + "/" + data_fingerprint(data.test));

  const tutti::Device device = job.device();
  const tutti::Stream stream = device.is_cuda() ? tutti::Stream::create(device) : tutti::Stream();
  const example::ModelSpec spec = example::spec_of(f.model);
  auto model = example::make_model(f.model);
  const tutti::amp::Policy policy = example::precision_policy(f.precision, f.grad_comm);
  tutti::amp::apply(policy, *model);
  model->to(device, stream).init(f.seed);

  tutti::ddp::DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = f.bucket_mb;
  ddp_options.accumulation_steps = f.accum_steps;
  ddp_options.reducer.grad_comm_dtype = policy.comm;
  ddp_options.zero_stage = f.zero;
  tutti::ddp::DistributedDataParallel ddp(job.communicator(), *model, ddp_options);

  std::unique_ptr<tutti::optim::Optimizer> optimizer;
  double lr = f.lr, weight_decay = f.weight_decay;
  if (f.optimizer == "sgd") {
    if (lr < 0) lr = 0.05;
    if (weight_decay < 0) weight_decay = 0;
    tutti::optim::SgdOptions o;
    o.lr = static_cast<float>(lr);
    o.momentum = static_cast<float>(f.momentum);
    o.weight_decay = static_cast<float>(weight_decay);
    optimizer = std::make_unique<tutti::optim::SGD>(model->parameters(), o);
  } else {
    if (lr < 0) lr = 1e-3;
    if (weight_decay < 0) weight_decay = 0.01;
    tutti::optim::AdamWOptions o;
    o.lr = static_cast<float>(lr);
    o.weight_decay = static_cast<float>(weight_decay);
    optimizer = std::make_unique<tutti::optim::AdamW>(model->parameters(), o);
  }
  // The optimizer takes DDP's plan: one fused update per run of parameters (stage 0), or this
  // rank's shard and the all-gather after each step (ZeRO).
  ddp.attach(*optimizer);
  tutti::amp::LossScaler scaler(policy.default_scaler());
  tutti::nn::CrossEntropyLoss loss;

  tutti::data::LoaderOptions loader_options;
  loader_options.global_micro_batch_size = f.batch_size / f.accum_steps;  // one micro-step over all ranks
  loader_options.rank = job.rank();
  loader_options.world_size = world;
  loader_options.seed = f.seed;
  tutti::data::DistributedLoader loader(data.train, loader_options);
  const std::int64_t steps_per_epoch = loader.steps_per_epoch() / f.accum_steps;
  TUTTI_CHECK_ARG(steps_per_epoch > 0, "--batch-size ", f.batch_size, " is larger than the training set (",
                  data.train.size(), " samples)");
  std::int64_t total_steps = steps_per_epoch * f.epochs;
  if (f.max_steps > 0) total_steps = std::min(total_steps, f.max_steps);
  job.check_same("the number of steps planned", total_steps);
  // The schedule spans the epochs asked for (not --max-steps), so a run cut short by
  // --max-steps follows the same learning rates as the whole run up to that step.
  const std::int64_t schedule_steps = steps_per_epoch * f.epochs;
  if (f.lr_schedule == "cosine") {
    optimizer->set_schedule(tutti::optim::LrSchedule::cosine(static_cast<float>(lr), f.warmup_steps, schedule_steps));
  } else if (f.warmup_steps > 0) {
    optimizer->set_schedule(tutti::optim::LrSchedule::linear_warmup(static_cast<float>(lr), f.warmup_steps));
  }

  // Resume: every rank reads the same checkpoint (so every rank must see it).
  const std::string ckpt_path = f.checkpoint_dir.empty() ? "" : f.checkpoint_dir + "/checkpoint.tckp";
  const bool ckpt_exists = !ckpt_path.empty() && std::filesystem::exists(ckpt_path);
  job.check_same("whether " + ckpt_path + " exists (every rank reads the checkpoint: is --checkpoint-dir shared?)",
                 ckpt_exists ? "yes" : "no");
  TUTTI_CHECK_ARG(f.resume != "yes" || ckpt_exists, "--resume: no checkpoint at ", ckpt_path,
                  " (--resume auto starts afresh when there is none)");
  TUTTI_CHECK_ARG(f.resume != "no" || !ckpt_exists || f.overwrite, "a checkpoint exists at ", ckpt_path,
                  ": pass --resume to continue it (or --resume auto), or --overwrite to start afresh and replace it");
  const bool resuming = f.resume != "no" && ckpt_exists;
  tutti::io::Metadata metadata{{"model", spec.fingerprint},
                               {"optimizer", f.optimizer},
                               {"precision", f.precision},
                               {"program", "train_fashion_mnist"}};
  std::int64_t step = 0;
  double last_loss = -1;  // the mean loss of the last step (-1: none yet)
  std::string scaler_note;
  if (resuming) {
    const tutti::io::Checkpoint ckpt = tutti::io::load_checkpoint(ckpt_path);
    tutti::io::check_metadata(ckpt, "model", spec.fingerprint, ckpt_path);
    tutti::io::check_metadata(ckpt, "optimizer", f.optimizer, ckpt_path);
    // Whole tensors by name, whatever the number of ranks and the ZeRO stage that wrote them.
    const tutti::StateDict model_state = tutti::io::strip_prefix(ckpt.state, "model.");
    tutti::StateDict expected = model->extra_state();
    for (const tutti::nn::Parameter* p : model->parameters())
      expected[p->name] = tutti::Tensor::empty(p->shape(), tutti::DType::f32);
    tutti::io::check_state_matches(model_state, expected, ckpt_path);
    ddp.load_model_state_dict(model_state);
    ddp.load_optimizer_state_dict(*optimizer, tutti::io::strip_prefix(ckpt.state, "optim."));
    // The loss scaler's state belongs to the precision it was saved with: an fp32 run's
    // (off, scale 1) would start an fp16 run at scale 1 instead of the default 2^16.
    const auto saved_precision = ckpt.metadata.find("precision");
    if (saved_precision == ckpt.metadata.end() || saved_precision->second == f.precision) {
      scaler.load_state_dict(tutti::io::strip_prefix(ckpt.state, "scaler."));
    } else {
      scaler_note = " (checkpoint written in " + saved_precision->second + ": the loss scaler starts afresh)";
    }
    loader.load_state_dict(tutti::io::strip_prefix(ckpt.state, "loader."));
    step = tutti::get_int_scalar(ckpt.state, "train.step");
    if (ckpt.state.count("train.last_loss")) last_loss = tutti::get_scalar(ckpt.state, "train.last_loss");
  }
  const std::int64_t first_step = step;
  std::int64_t saved_step = resuming ? step : -1;  // the step of the last checkpoint written or read
  double saved_loss = last_loss;                   // and its loss

  auto save = [&] {
    example::save_checkpoint(
        job, ddp, *optimizer,
        [&] {
          tutti::StateDict rest;
          tutti::io::add_prefixed(rest, "scaler.", scaler.state_dict());
          tutti::io::add_prefixed(rest, "loader.", loader.state_dict());
          rest["train.step"] = tutti::int_scalar_tensor(step);
          rest["train.last_loss"] = tutti::scalar_tensor(last_loss);
          return rest;
        },
        ckpt_path, metadata, step);
  };

  std::int64_t params = 0;
  for (auto* p : model->parameters()) params += p->numel();
  if (chatty) {
    std::printf(
        "train_fashion_mnist: %d rank(s), device %s, backend %s | model %s (%lld parameters) | precision %s, "
        "grad comm %s, loss scaler %s, zero %d | global batch %lld (%lld per rank x %d micro-step(s)) | %s lr %g | "
        "%s schedule | %lld steps (%lld per epoch)%s%s%s\n",
        world, device.str().c_str(), std::string(job.backend()).c_str(), spec.fingerprint.c_str(),
        static_cast<long long>(params), f.precision.c_str(), std::string(tutti::name_of(policy.comm)).c_str(),
        scaler.enabled() ? "dynamic" : "off", f.zero, static_cast<long long>(f.batch_size),
        static_cast<long long>(loader.local_micro_batch_size()), f.accum_steps, f.optimizer.c_str(), lr,
        f.lr_schedule.c_str(), static_cast<long long>(total_steps), static_cast<long long>(steps_per_epoch),
        resuming ? (" | resumed at step " + std::to_string(step)).c_str() : "", scaler_note.c_str(),
        device.is_cpu() && !spec.flat_input ? (" | conv " + tutti::kernels::cpu_blas_info().conv).c_str() : "");
    std::fflush(stdout);
  }

  // Watching the job: the timeline, Prometheus metrics, stragglers, MFU (docs/observability.md).
  // MFU: the model's training FLOPs per sample (its layers') x samples/s over the ranks' peak.
  const tutti::Shape sample_shape = spec.flat_input ? tutti::Shape{784} : tutti::Shape{1, 28, 28};
  const double flops_per_sample = model->training_flops_per_sample(sample_shape);
  const tutti::obs::PeakFlops peak = tutti::obs::peak_flops(device, policy.compute, f.peak_tflops);
  std::unique_ptr<tutti::obs::TraceSession> trace_session;
  {
    tutti::obs::TraceOptions o = tutti::obs::TraceOptions::from_env();
    if (!f.trace.empty()) o.dir = f.trace;
    o.host = job.hostname();
    if (!o.dir.empty()) trace_session = std::make_unique<tutti::obs::TraceSession>(job.cpu_communicator(), o);
  }
  std::unique_ptr<tutti::obs::TrainingMetrics> metrics;
  std::unique_ptr<tutti::obs::TextfileExporter> metrics_file;
  std::unique_ptr<tutti::obs::HttpExporter> metrics_http;
  if (!f.metrics_file.empty() || f.metrics_port > 0) {
    tutti::obs::MetricLabels labels{"train_fashion_mnist", job.rank(), job.local_rank(), job.hostname()};
    metrics = std::make_unique<tutti::obs::TrainingMetrics>(
        labels, tutti::obs::TrainingMetricsOptions{peak.flops, std::string(job.backend()), device.str()});
    if (!f.metrics_file.empty()) {
      metrics_file = std::make_unique<tutti::obs::TextfileExporter>(
          metrics->registry(), metrics_path_of(f.metrics_file, job.rank(), world), f.metrics_interval);
    }
    if (f.metrics_port > 0) {
      metrics_http = std::make_unique<tutti::obs::HttpExporter>(metrics->registry(), f.metrics_port + job.local_rank());
    }
  }
  std::optional<tutti::obs::StragglerDetector> stragglers;
  if (f.straggler_every > 0 && world > 1) {
    tutti::obs::StragglerOptions so;
    so.every = f.straggler_every;
    so.threshold = f.straggler_threshold;
    stragglers.emplace(job.rank(), world, tutti::obs::all_hosts(job.cpu_communicator(), job.hostname()), so);
  }
  int slow_rank = -1;
  double slow_ms = 0;
  if (!f.debug_slow.empty()) {
    const auto colon = f.debug_slow.find(':');
    TUTTI_CHECK_ARG(colon != std::string::npos, "--debug-slow ", f.debug_slow, ": expected RANK:MS");
    slow_rank = std::stoi(f.debug_slow.substr(0, colon));
    slow_ms = std::stod(f.debug_slow.substr(colon + 1));
  }
  std::int64_t straggler_reports = 0;
  std::string last_straggler;

  // Open MPI gives every rank a pseudo-terminal even when mpirun's own output is a pipe or a
  // file, so "auto" draws the bar only outside Open MPI; --progress bar asks for it anyway.
  const bool under_open_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  const bool bar = f.progress == "bar" || (f.progress == "auto" && !under_open_mpi && isatty(STDOUT_FILENO));
  example::Progress progress(chatty, f.progress_interval, total_steps, first_step, bar);
  // What every step reduces anyway, two floats: its mean loss and whether some rank was asked
  // to stop (a stop flag in a sync the step already has: no extra collective).
  // (On the steps that check for stragglers, each rank's times ride along: 2 floats per rank.)
  tutti::Tensor step_sync = tutti::Tensor::zeros({2}, tutti::DType::f32, device);
  const tutti::Tensor one = tutti::Tensor::from_floats({1.0f}, {1}).to(device, stream);
  double first_loss = -1, accuracy = -1, train_seconds = 0;
  bool stopped = false;
  tutti::CallOptions loss_call;
  loss_call.label = "train loss and stop flag";
  loss_call.stream = stream;
  while (step < total_steps) {
    // A step never straddles two epochs: skip the tail of micro-batches that cannot fill one.
    if (loader.position().step + f.accum_steps > loader.steps_per_epoch()) {
      loader.set_position({loader.position().epoch + 1, 0});
    }
    const auto t0 = Clock::now();
    tutti::trace::begin_step(step + 1);
    // Stragglers: every K steps the ranks' times ride along in this step's loss allreduce.
    const bool straggler_due = stragglers && stragglers->due(step + 1);
    if (straggler_due && step_sync.numel() == 2) {
      step_sync = tutti::Tensor::zeros({2 + stragglers->slot_count()}, tutti::DType::f32, device);
    } else if (!straggler_due && step_sync.numel() != 2) {
      step_sync = tutti::Tensor::zeros({2}, tutti::DType::f32, device);
    }
    const tutti::Tensor step_loss = step_sync.view(0, {1});
    const tutti::Tensor stop_flag = step_sync.view(1, {1});
    step_sync.zero(stream);
    double data_s = 0;
    for (int micro = 0; micro < f.accum_steps; ++micro) {
      const auto td = Clock::now();
      const tutti::data::Batch b = loader.next();
      const tutti::Tensor x = device.is_cpu() ? b.images : b.images.to(device, stream);
      const tutti::Tensor y = device.is_cpu() ? b.labels : b.labels.to(device, stream);
      data_s += std::chrono::duration<double>(Clock::now() - td).count();
      const tutti::Tensor& logits = ddp.forward(x);
      if (job.rank() == slow_rank) {
        stream.synchronize();
        busy_wait_ms(slow_ms);
      }
      loss.forward(logits, y, scaler.scale(), stream);
      tutti::kernels::add_scaled(loss.loss(), 1.0f / static_cast<float>(f.accum_steps), step_loss, stream);
      ddp.backward(loss.grad(), scaler.scale());
    }
    const bool stepped = scaler.update(ddp.found_nonfinite());
    if (stepped) optimizer->step();
    const tutti::ddp::StepStats stats = ddp.last_stats();
    ddp.zero_grad();
    ++step;
    if (job.stop_requested()) tutti::kernels::add_scaled(one, 1.0f, stop_flag, stream);
    if (stragglers) stragglers->add_step(step, stats.compute_before_comm_ms * 1e-3, data_s);
    if (straggler_due) {
      std::vector<float> slots(static_cast<std::size_t>(stragglers->slot_count()));
      stragglers->fill(slots.data());
      step_sync.view(2, {stragglers->slot_count()})
          .copy_from(tutti::Tensor::from_floats(slots, {stragglers->slot_count()}).to(device, stream), stream);
    }
    // The mean loss over the whole global batch (the mean of the ranks' equal-sized means),
    // and the stop flag (> 0 when any rank has one).
    job.communicator().allreduce(step_sync, tutti::ReduceOp::avg, loss_call).wait(stream);
    last_loss = tutti::nn::item(step_loss, stream);
    const bool stop_now = tutti::nn::item(stop_flag, stream) > 0;
    if (straggler_due) {
      // The allreduce averaged the slots: analyze with the world size as the scale.
      stream.synchronize();
      const tutti::Tensor reduced = step_sync.view(2, {stragglers->slot_count()}).to(tutti::Device::cpu(), stream);
      const tutti::obs::StragglerReport report = stragglers->analyze(reduced.data_as<float>(), world);
      if (report.rank >= 0) {
        ++straggler_reports;
        last_straggler = report.message();
        if (report.new_straggler && job.rank() == 0) {
          progress.finish_line();
          std::fprintf(stderr, "train_fashion_mnist: %s\n", last_straggler.c_str());
        }
      }
      if (metrics) metrics->observe_straggler(report.rank, report.slower_by, report.rank == job.rank());
    }
    if (first_loss < 0) first_loss = last_loss;
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    tutti::trace::end_step();
    train_seconds += step_s;
    const double samples_per_s = static_cast<double>((step - first_step) * f.batch_size) / train_seconds;
    const double mfu = peak.flops > 0 ? tutti::obs::mfu(flops_per_sample, samples_per_s, world, peak.flops) : -1;
    if (metrics) {
      tutti::obs::StepRecord r;
      r.step = step;
      r.step_seconds = step_s;
      r.data_seconds = data_s;
      r.samples = f.batch_size / world;
      r.loss = last_loss;
      r.loss_scale = scaler.scale();
      r.skipped = !stepped;
      r.ddp = stats;
      r.flops = flops_per_sample * static_cast<double>(r.samples);
      metrics->observe_step(r);
      if (device.is_cuda()) metrics->set_device_memory(ddp.memory().total());
    }
    // fp16's loss scaler skips non-finite steps; in fp32 and bf16 a non-finite loss means
    // the run diverged. Every rank sees the same mean loss, so every rank stops here alike.
    if (!std::isfinite(last_loss) && f.precision != "fp16") {
      if (job.rank() == 0) {
        char where[1024];
        if (saved_step >= 0) {
          std::snprintf(where, sizeof where,
                        "The last good checkpoint (written before the loss stopped being "
                        "finite) is %s, at step %lld with train loss %g: resume from it with a smaller --lr (now %g), "
                        "or from an earlier one.",
                        ckpt_path.c_str(), static_cast<long long>(saved_step), saved_loss, lr);
        } else {
          std::snprintf(where, sizeof where,
                        "No checkpoint was written (--checkpoint-dir with --checkpoint-every N "
                        "keeps one); start again with a smaller --lr (now %g).",
                        lr);
        }
        std::fprintf(stderr,
                     "train_fashion_mnist: error: the training loss is %g at step %lld (%s): the run "
                     "diverged. %s\n",
                     last_loss, static_cast<long long>(step), f.precision.c_str(), where);
      }
      return job.rank() == 0 ? kExitDiverged : 0;
    }

    const bool epoch_done = step % steps_per_epoch == 0;
    const int epoch = static_cast<int>((step - 1) / steps_per_epoch) + 1;
    progress.update(step, epoch, f.epochs, last_loss, samples_per_s, scaler.skipped_steps(), mfu,
                    epoch_done || step == total_steps || stop_now);
    if (epoch_done || step == total_steps) {
      accuracy = evaluate(job, *model, data.test, stream);
      if (chatty) {
        progress.finish_line();
        std::printf("epoch %d: test accuracy %.4f, train loss %.4f, %.0f samples/s, %s elapsed\n", epoch, accuracy,
                    last_loss, samples_per_s,
                    example::format_duration(std::chrono::duration<double>(Clock::now() - t_start).count()).c_str());
        std::fflush(stdout);
      }
    }
    if (!ckpt_path.empty() &&
        ((f.checkpoint_every > 0 && step % f.checkpoint_every == 0) || step == total_steps || stop_now)) {
      const auto ts = Clock::now();
      save();
      if (metrics) metrics->observe_checkpoint(std::chrono::duration<double>(Clock::now() - ts).count());
      saved_step = step;
      saved_loss = last_loss;
    }
    if (stop_now && step < total_steps) {
      stopped = true;
      break;
    }
  }
  if (trace_session) {
    // COLLECTIVE: every rank writes its file, rank 0 the merged one.
    const std::vector<std::string> files = trace_session->write();
    if (chatty) {
      progress.finish_line();
      std::printf("timeline: %s (open it in Perfetto or chrome://tracing; scripts/trace_plot.py draws it)\n",
                  files.back().c_str());
    }
  }
  if (stopped) {
    // Every rank leaves once the checkpoint is written: after a stop signal the Job waits only
    // briefly in MPI_Finalize (the launcher may be taking the job down).
    job.communicator().barrier({.label = "stopped: the checkpoint is written"}).wait();
    if (job.rank() == 0) {
      progress.finish_line();
      const int sig = job.stop_signal();
      std::string how = ckpt_path.empty()
                            ? "No checkpoint was written (no --checkpoint-dir): the run cannot be resumed."
                            : "Checkpoint written to " + ckpt_path + ". Resume with the same command and --resume " +
                                  "(--resume auto also starts afresh when there is no checkpoint).";
      std::fprintf(stderr, "train_fashion_mnist: stopped at step %lld of %lld by %s%s. %s\n",
                   static_cast<long long>(step), static_cast<long long>(total_steps),
                   sig != 0 ? signal_name(sig) : "a signal to another rank", sig != 0 ? " (on rank 0)" : "",
                   how.c_str());
    }
    return job.rank() == 0 ? kExitStopped : 0;
  }
  const bool nothing_to_do = first_step >= total_steps;
  if (accuracy < 0) accuracy = evaluate(job, *model, data.test, stream);  // resumed at the end

  const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
  const std::uint32_t crc = example::parameters_crc32(ddp.model_state_dict());
  if (job.rank() == 0) {
    const double samples_per_s =
        train_seconds > 0 ? static_cast<double>((step - first_step) * f.batch_size) / train_seconds : 0;
    if (!f.quiet) {
      if (peak.flops > 0 && train_seconds > 0) {
        std::printf("MFU %.2f%%: %.3g FLOPs per sample (training), %.3f TFLOP/s per rank of a peak of %.3f (%s)\n",
                    100.0 * tutti::obs::mfu(flops_per_sample, samples_per_s, world, peak.flops), flops_per_sample,
                    flops_per_sample * samples_per_s / world / 1e12, peak.flops / 1e12, peak.source.c_str());
      }
      if (nothing_to_do) {
        std::printf(
            "done: the checkpoint is at step %lld of %lld already, nothing to train; final train loss %s, "
            "test accuracy %.4f\n",
            static_cast<long long>(step), static_cast<long long>(total_steps),
            last_loss >= 0 ? std::to_string(last_loss).c_str() : "unknown (not in this checkpoint)", accuracy);
      } else {
        std::printf(
            "done: %lld steps, final train loss %.6f, test accuracy %.4f, %.0f samples/s, %lld skipped "
            "step(s), %.1f s\n",
            static_cast<long long>(step), last_loss, accuracy, samples_per_s,
            static_cast<long long>(scaler.skipped_steps()), wall);
      }
    }
    if (!f.json.empty()) {
      nlohmann::json out = {
          {"steps", step},
          {"final_train_loss", last_loss >= 0 ? nlohmann::json(last_loss) : nlohmann::json()},
          {"initial_train_loss", first_loss >= 0 ? nlohmann::json(first_loss) : nlohmann::json()},
          {"test_accuracy", accuracy},
          {"wall_s", wall},
          {"train_s", train_seconds},
          {"samples_per_s", samples_per_s},
          {"ranks", world},
          {"nodes", job.node_count()},
          {"skipped_steps", scaler.skipped_steps()},
          {"precision", f.precision},
          {"grad_comm", std::string(tutti::name_of(policy.comm))},
          {"zero", f.zero},
          {"model", f.model},
          {"optimizer", f.optimizer},
          {"lr", lr},
          {"lr_schedule", f.lr_schedule},
          {"global_batch_size", f.batch_size},
          {"accum_steps", f.accum_steps},
          {"epochs", f.epochs},
          {"resumed_from_step", resuming ? first_step : 0},
          {"loss_scale", scaler.scale()},
          {"device", device.str()},
          {"backend", std::string(job.backend())},
          {"params_crc32", crc},
          {"flops_per_sample", flops_per_sample},
          {"tflops_per_rank", train_seconds > 0 ? flops_per_sample * samples_per_s / world / 1e12 : 0.0},
          {"peak_tflops", peak.flops > 0 ? nlohmann::json(peak.flops / 1e12) : nlohmann::json()},
          {"peak_source", peak.source},
          {"mfu", peak.flops > 0 && train_seconds > 0
                      ? nlohmann::json(tutti::obs::mfu(flops_per_sample, samples_per_s, world, peak.flops))
                      : nlohmann::json()},
          {"straggler_reports", straggler_reports},
          {"last_straggler", last_straggler.empty() ? nlohmann::json() : nlohmann::json(last_straggler)}};
      std::ofstream(f.json) << out.dump(2) << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{
      "Data-parallel training of Fashion-MNIST with tutti. Run it under mpirun, e.g.\n"
      "  mpirun -np 2 train_fashion_mnist --model mlp --epochs 5"};
  app.add_option("--model", f.model, "mlp (784-512-256-10) or cnn (two conv blocks)")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  app.add_option("--epochs", f.epochs, "passes over the training set")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch-size", f.batch_size, "GLOBAL batch per optimizer step, split evenly across ranks")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--accum-steps", f.accum_steps, "micro-batches accumulated per optimizer step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate (default 0.05 for sgd, 1e-3 for adamw)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", f.optimizer, "sgd (momentum) or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_option("--lr-schedule", f.lr_schedule, "constant, or cosine decay to 0 over the epochs")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->capture_default_str();
  app.add_option("--warmup-steps", f.warmup_steps, "linear learning-rate warm-up steps")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "weight decay (default 0 for sgd, 0.01 for adamw)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--precision", f.precision, "compute precision: fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--grad-comm", f.grad_comm,
                 "gradient dtype on the wire: fp32, bf16 or fp16 (default: the precision's)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--bucket-mb", f.bucket_mb, "gradient bucket size in MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--zero", f.zero,
                 "ZeRO stage: 0 (every rank keeps everything), 1 (optimizer state and fp32 masters sharded), 2 (also "
                 "the gradients); checkpoints resume at any stage and number of ranks")
      ->check(CLI::Range(0, 2))
      ->capture_default_str();
  app.add_option("--device", f.device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--seed", f.seed, "seed of the initialization and the data order")->capture_default_str();
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "where rank 0 writes checkpoint.tckp");
  app.add_option("--checkpoint-every", f.checkpoint_every, "also checkpoint every N steps (0: only at the end)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--resume", f.resume,
                 "continue from the checkpoint in --checkpoint-dir (an error if there is none); --resume auto: "
                 "continue if there is one, else start afresh (for a scheduler that reruns the same command)")
      ->expected(0, 1)
      ->default_str("yes")
      ->check(CLI::IsMember({"yes", "auto"}));
  app.add_flag("--overwrite", f.overwrite, "start afresh even if --checkpoint-dir holds a checkpoint (replacing it)");
  app.add_option("--max-steps", f.max_steps, "stop after this many steps in total (0: all epochs)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--json", f.json, "write a JSON summary to this path (rank 0)");
  app.add_flag("--quiet", f.quiet, "no progress output");
  app.add_option("--data", f.data,
                 "directory with Fashion-MNIST's *-ubyte.gz files (default: $TUTTI_FASHION_MNIST_DIR if set, "
                 "else Debian's)")
      ->capture_default_str();
  app.add_option("--train-subset", f.train_subset, "use only the first N training samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--test-subset", f.test_subset, "use only the first N test samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--progress-interval", f.progress_interval, "seconds between progress lines")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--progress", f.progress, "bar (redrawn in place), lines, or auto (a bar on a terminal)")
      ->check(CLI::IsMember({"auto", "bar", "lines"}))
      ->capture_default_str();
  app.add_option("--trace", f.trace,
                 "write a timeline of every rank (Chrome trace JSON: DIR/trace.json and DIR/trace-rank<R>.json); "
                 "default: $TUTTI_TRACE; $TUTTI_TRACE_STEPS=FROM:TO limits it to those steps");
  app.add_option("--metrics-file", f.metrics_file,
                 "Prometheus textfile (node_exporter's textfile collector), rewritten atomically; %r is the rank, "
                 "else -rank<R> is added with several ranks");
  app.add_option("--metrics-interval", f.metrics_interval, "seconds between rewrites of --metrics-file")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--metrics-port", f.metrics_port, "serve Prometheus metrics at http://HOST:PORT+local_rank/metrics")
      ->check(CLI::Range(1, 65535));
  app.add_option("--straggler-every", f.straggler_every,
                 "compare the ranks' compute and data-loading times every N steps (0: never); rank 0 reports a rank "
                 "slower than the others' median by more than --straggler-threshold")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--straggler-threshold", f.straggler_threshold,
                 "fraction slower than the median that makes a straggler")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--peak-tflops", f.peak_tflops,
                 "peak TFLOP/s per rank for MFU (default: a known GPU's from tutti's table, on the CPU the measured "
                 "GEMM ceiling; $TUTTI_PEAK_TFLOPS)")
      ->check(CLI::PositiveNumber);
  app.add_option("--debug-slow", f.debug_slow,
                 "RANK:MS: that rank busy-waits MS ms in every step (to see a straggler)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // The error of this rank, printed once; if it is this rank's alone, the Job (gone by now)
  // has told the other ranks, which print that this rank failed and end.
  try {
    return run(f, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: error: %s\n", e.what());
    return 1;
  }
}
