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
#include <unistd.h>
#include <zlib.h>

#include <tutti/tutti.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../common/progress.h"
#include "../common/run_support.h"
#include "../common/summary.h"
#include "flags.h"
#include "models.h"
#include "watch.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitDiverged = 3;
constexpr int kExitStopped = 75;  // EX_TEMPFAIL: stopped early, run the same command again
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

int run(const fmnist::Flags& f, example::RunSummary& summary, int& argc, char**& argv) {
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
  summary.set_rank(job.rank());

  tutti::data::FashionMnistOptions data_options;
  data_options.flatten = example::spec_of(f.model).flat_input;
  data_options.standardize = true;
  tutti::data::FashionMnist data = tutti::data::load_fashion_mnist(f.data, data_options);
  if (f.train_subset > 0) data.train = data.train.slice(0, std::min(f.train_subset, data.train.size()));
  if (f.test_subset > 0) data.test = data.test.slice(0, std::min(f.test_subset, data.test.size()));
  // Ranks that disagree would issue different collectives: say so now, on every rank.
  job.check_same("the flags that shape the run", fmnist::shaping_flags(f));
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
  tutti::obs::PeakFlops peak = tutti::obs::peak_flops(device, policy.compute, f.peak_tflops);
  fmnist::Watch watch(job, f, peak.flops);
  // What the summary says however the run ends (docs/user-guide.md, "The JSON summary").
  summary.fields() = {{"ranks", world},
                      {"nodes", job.node_count()},
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
                      {"device", device.str()},
                      {"backend", std::string(job.backend())},
                      {"flops_per_sample", flops_per_sample},
                      {"peak_tflops", peak.flops > 0 ? nlohmann::json(peak.flops / 1e12) : nlohmann::json()},
                      {"peak_source", peak.source},
                      {"cpu_blas_kernels", tutti::kernels::cpu_blas_info().core}};
  summary.set_step(step, last_loss);

  // Open MPI gives every rank a pseudo-terminal even when mpirun's own output is a pipe or a
  // file, so "auto" draws the bar only outside Open MPI; --progress bar asks for it anyway.
  const bool under_open_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  const bool bar = f.progress == "bar" || (f.progress == "auto" && !under_open_mpi && isatty(STDOUT_FILENO));
  example::Progress progress(chatty, f.progress_interval, total_steps, first_step, bar);
  // What every step reduces anyway, two floats: its mean loss and whether some rank was asked
  // to stop (a stop flag in a sync the step already has: no extra collective).
  // (On the steps that check for stragglers, each rank's figures ride along: Watch::sync_slots.)
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
    // Stragglers: every K steps the ranks' figures ride along in this step's loss allreduce.
    const int straggler_slots = watch.sync_slots(step + 1);
    if (step_sync.numel() != 2 + straggler_slots) {
      step_sync = tutti::Tensor::zeros({2 + straggler_slots}, tutti::DType::f32, device);
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
      watch.debug_slow(micro, stream);
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
    const tutti::Tensor straggler_figures =
        straggler_slots > 0 ? step_sync.view(2, {straggler_slots}) : tutti::Tensor();
    watch.after_step(step, stats, data_s, straggler_figures, stream);
    // The mean loss over the whole global batch (the mean of the ranks' equal-sized means),
    // and the stop flag (> 0 when any rank has one).
    job.communicator().allreduce(step_sync, tutti::ReduceOp::avg, loss_call).wait(stream);
    last_loss = tutti::nn::item(step_loss, stream);
    const bool stop_now = tutti::nn::item(stop_flag, stream) > 0;
    summary.set_step(step, last_loss);
    watch.after_sync(step, straggler_figures, stream, progress);
    if (first_loss < 0) first_loss = last_loss;
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    tutti::trace::end_step();
    train_seconds += step_s;
    const double samples_per_s = static_cast<double>((step - first_step) * f.batch_size) / train_seconds;
    const double mfu = peak.flops > 0 ? tutti::obs::mfu(flops_per_sample, samples_per_s, world, peak.flops) : -1;
    if (watch.metrics) {
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
      watch.metrics->observe_step(r);
      if (device.is_cuda()) watch.metrics->set_device_memory(ddp.memory().total());
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
      summary.diverged();
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
      if (watch.metrics) watch.metrics->observe_checkpoint(std::chrono::duration<double>(Clock::now() - ts).count());
      saved_step = step;
      saved_loss = last_loss;
    }
    if (stop_now && step < total_steps) {
      stopped = true;
      break;
    }
  }
  if (watch.trace) {
    // COLLECTIVE: every rank writes its file, rank 0 the merged one.
    const std::vector<std::string> files = watch.trace->write();
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
    const tutti::Job::StopAgreement stop = job.agree_stop();  // the signal and the rank it reached
    summary.stopped(example::signal_name(stop.signal), ckpt_path);
    if (job.rank() == 0) {
      progress.finish_line();
      std::string how = ckpt_path.empty()
                            ? "No checkpoint was written (no --checkpoint-dir): the run cannot be resumed."
                            : "Checkpoint written to " + ckpt_path + ". Resume with the same command and --resume " +
                                  "(--resume auto also starts afresh when there is no checkpoint).";
      std::fprintf(stderr, "train_fashion_mnist: stopped at step %lld of %lld by %s (on rank %d). %s\n",
                   static_cast<long long>(step), static_cast<long long>(total_steps), example::signal_name(stop.signal),
                   stop.rank, how.c_str());
    }
    return job.rank() == 0 ? kExitStopped : 0;
  }
  const bool nothing_to_do = first_step >= total_steps;
  if (accuracy < 0) accuracy = evaluate(job, *model, data.test, stream);  // resumed at the end

  const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
  const std::uint32_t crc = example::parameters_crc32(ddp.model_state_dict());
  const double samples_per_s =
      train_seconds > 0 ? static_cast<double>((step - first_step) * f.batch_size) / train_seconds : 0;
  // The CPU's ceiling once more, every rank at once, the larger kept (obs::remeasure_peak).
  peak = tutti::obs::remeasure_peak(peak);
  if (job.rank() == 0 && !f.quiet) {
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
  nlohmann::json& out = summary.fields();
  out["steps"] = step;
  out["final_train_loss"] = last_loss >= 0 ? nlohmann::json(last_loss) : nlohmann::json();
  out["initial_train_loss"] = first_loss >= 0 ? nlohmann::json(first_loss) : nlohmann::json();
  out["test_accuracy"] = accuracy;
  out["wall_s"] = wall;
  out["train_s"] = train_seconds;
  out["samples_per_s"] = samples_per_s;
  out["skipped_steps"] = scaler.skipped_steps();
  out["loss_scale"] = scaler.scale();
  out["params_crc32"] = crc;
  out["tflops_per_rank"] = train_seconds > 0 ? flops_per_sample * samples_per_s / world / 1e12 : 0.0;
  out["peak_tflops"] = peak.flops > 0 ? nlohmann::json(peak.flops / 1e12) : nlohmann::json();
  out["mfu"] = peak.flops > 0 && train_seconds > 0
                   ? nlohmann::json(tutti::obs::mfu(flops_per_sample, samples_per_s, world, peak.flops))
                   : nlohmann::json();
  out["straggler_reports"] = watch.straggler_reports();
  out["last_straggler"] = watch.last_straggler().empty() ? nlohmann::json() : nlohmann::json(watch.last_straggler());
  summary.completed();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  fmnist::Flags f;
  if (const int rc = fmnist::parse_flags(argc, argv, f); rc >= 0) return rc;
  // The error of this rank, printed once; if it is this rank's alone, the Job (gone by now)
  // has told the other ranks, which print that this rank failed and end.
  example::RunSummary summary(f.json);
  try {
    return run(f, summary, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: error: %s\n", e.what());
    summary.failed(e.what());
    return 1;
  }
}
