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
// --checkpoint-dir, rank 0 writes a checkpoint; the run exits with 75 and says how to resume.
// Resume, checkpoints, the stop, divergence and the summary's ending are tutti::train::Run's
// (include/tutti/train/run.h); the step, the evaluation and the output are this program's.
//
// Exit codes: 0 done; 1 an error; 2 a bad command line; 3 the loss diverged (not finite in
// fp32/bf16); 75 stopped by a signal, resumable (EX_TEMPFAIL); a job that tutti ends: 13, 14
// or 134 (see docs/user-guide.md, "When things go wrong"). Where every rank stops alike
// (diverged, stopped), rank 0 alone says why and exits with the code, the others exit with 0:
// mpirun drops the output of the other ranks, and kills them, once one has exited non-zero.
#include <unistd.h>
#include <zlib.h>

#include <tutti/tutti.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../common/progress.h"
#include "../common/run_flags.h"
#include "../common/run_support.h"
#include "../common/sync.h"
#include "flags.h"
#include "models.h"
#include "watch.h"

namespace {

using Clock = std::chrono::steady_clock;

// A figure that may not be known (negative): JSON null then.
void set_or_null(tutti::train::Summary& summary, const std::string& key, double value) {
  if (value >= 0) {
    summary.set(key, value);
  } else {
    summary.set_null(key);
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

// Test accuracy over the whole test set, data-parallel: each rank counts its share, the
// counts are summed over ranks. COLLECTIVE. sharded: ZeRO-3, whose every forward gathers
// parameters (collective): every rank runs as many forwards, a rank whose share has fewer
// chunks one more of a sample it does not count.
double evaluate(tutti::Job& job, tutti::nn::Module& model, const tutti::data::Dataset& test,
                const tutti::Stream& stream, bool sharded) {
  std::optional<tutti::trace::Span> span;
  if (tutti::trace::on()) span.emplace("evaluation", "eval");
  const tutti::Device device = job.device();
  const tutti::data::Dataset mine = tutti::data::eval_shard(test, job.rank(), job.world_size());
  tutti::Tensor correct = tutti::Tensor::zeros({1}, tutti::DType::i64, device);
  model.eval();
  const std::int64_t chunk = 1000;
  const std::int64_t most = (test.size() + job.world_size() - 1) / job.world_size();  // the largest share
  for (std::int64_t begin = 0; begin < mine.size() || (sharded && begin < most); begin += chunk) {
    if (begin >= mine.size()) {
      const tutti::data::Dataset one = test.slice(0, 1);
      model.forward(device.is_cpu() ? one.images : one.images.to(device, stream));
      continue;
    }
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

int run(fmnist::Flags f, tutti::train::Summary& summary, int& argc, char**& argv) {
  const auto t_start = Clock::now();
  // The Job first: its deadline covers everything that follows on every rank, the data
  // loading included (a rank that hangs there is named by the others' timeout report).
  tutti::JobOptions job_options;
  job_options.device = f.device;
  job_options.catch_stop_signals = true;             // SIGTERM & co. stop at a step boundary, with a checkpoint
  if (f.deterministic) job_options.cpu_threads = 1;  // OpenBLAS's results depend on its thread count
  tutti::Job job(argc, argv, job_options);
  const int world = job.world_size();
  const bool chatty = job.rank() == 0 && !f.quiet;
  example::warn_if_blas_kernels_are_old(job, "train_fashion_mnist");
  f.accum_steps = example::accumulation_steps(f, f.batch_size, f.accum_steps, world);
  TUTTI_CHECK_ARG(f.resume == "no" || !f.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  // A summary that could not be written at the end would lose the run's result: fail now.
  summary.set_rank(job.rank());

  tutti::data::FashionMnistOptions data_options;
  data_options.flatten = example::spec_of(f.model).flat_input;
  data_options.standardize = true;
  data_options.train_samples = f.train_subset;  // the subsets only are read (0: all)
  data_options.test_samples = f.test_subset;
  const tutti::data::FashionMnist data = tutti::data::load_fashion_mnist(f.data, data_options);
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
  ddp_options.sharding = tutti::ddp::sharding_of_stage(f.zero);
  if (f.deterministic) ddp_options.deterministic = tutti::ddp::DeterministicOptions{};
  const auto hook = example::comm_hook(f, ddp_options);  // --allreduce powersgd:R
  example::Sync sync(job, f);                            // --sync, --allreduce: what DDP runs over (COLLECTIVE)
  tutti::ddp::DistributedDataParallel ddp(sync.ddp_communicator(), *model, ddp_options);
  if (hook) ddp.register_comm_hook(hook);

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
  sync.start(ddp, *optimizer);  // --sync diloco: node 0's parameters everywhere (COLLECTIVE)
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
  // The schedule spans the epochs asked for (not --max-steps), so a run cut short by
  // --max-steps follows the same learning rates as the whole run up to that step.
  const std::int64_t schedule_steps = steps_per_epoch * f.epochs;
  if (f.lr_schedule == "cosine") {
    optimizer->set_schedule(tutti::optim::LrSchedule::cosine(static_cast<float>(lr), f.warmup_steps, schedule_steps));
  } else if (f.warmup_steps > 0) {
    optimizer->set_schedule(tutti::optim::LrSchedule::linear_warmup(static_cast<float>(lr), f.warmup_steps));
  }

  // Run control (tutti::train::Run): resume (every rank reads the checkpoint), checkpoints,
  // the stop flag and the loss in one allreduce a step, divergence, the summary's ending.
  tutti::train::RunOptions run_options = example::run_options(f, total_steps, stream, summary);
  run_options.work_per_step = static_cast<double>(f.batch_size);  // samples of the global batch
  run_options.metadata = {{"model", spec.fingerprint}, {"optimizer", f.optimizer}, {"program", "train_fashion_mnist"}};
  run_options.must_match = {"model", "optimizer"};
  tutti::train::State state(ddp, *optimizer, scaler, loader);
  // The CPU's measured peak (MFU), kept with the run: a relaunch neither measures nor probes anew.
  double run_peak_flops = 0;
  state.add_scalar("obs.peak_flops", run_peak_flops);
  sync.add_state(state);
  tutti::train::Run run(job, state, run_options);

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
        run.resumed() ? (" | resumed at step " + std::to_string(run.first_step())).c_str() : "", run.note().c_str(),
        device.is_cpu() && !spec.flat_input ? (" | conv " + tutti::kernels::cpu_blas_info().conv).c_str() : "");
    if (sync.diloco()) std::printf("train_fashion_mnist: sync %s\n", sync.describe().c_str());
    const std::string snapshots = example::snapshot_line(f, run, job.node_count());
    if (!snapshots.empty()) std::printf("train_fashion_mnist: %s\n", snapshots.c_str());
    std::fflush(stdout);
  }

  // Watching the job: the timeline, Prometheus metrics, stragglers, MFU (docs/observability.md).
  // MFU: the model's training FLOPs per sample (its layers') x samples/s over the ranks' peak.
  const tutti::Shape sample_shape = spec.flat_input ? tutti::Shape{784} : tutti::Shape{1, 28, 28};
  const double flops_per_sample = model->training_flops_per_sample(sample_shape);
  tutti::obs::PeakFlops peak = tutti::obs::peak_flops(device, policy.compute, f.peak_tflops, run_peak_flops);
  if (peak.measured) run_peak_flops = peak.flops;
  fmnist::Watch watch(job, f, peak.flops);
  // What the summary says however the run ends (docs/user-guide.md, "The JSON summary").
  example::CheckpointLog checkpoints;  // rank 0: checkpoints skipped or waited, their stall
  summary.set("ranks", world);
  summary.set("nodes", job.node_count());
  summary.set("precision", f.precision);
  summary.set("grad_comm", tutti::name_of(policy.comm));
  summary.set("zero", f.zero);
  summary.set("sync", sync.mode());
  summary.set("model", f.model);
  summary.set("optimizer", f.optimizer);
  summary.set("lr", lr);
  summary.set("lr_schedule", f.lr_schedule);
  summary.set("global_batch_size", f.batch_size);
  summary.set("accum_steps", f.accum_steps);
  summary.set("epochs", f.epochs);
  summary.set("device", device.str());
  summary.set("backend", job.backend());
  summary.set("flops_per_sample", flops_per_sample);
  set_or_null(summary, "peak_tflops", peak.flops > 0 ? peak.flops / 1e12 : -1);
  summary.set("peak_source", peak.source);
  summary.set("cpu_blas_kernels", tutti::kernels::cpu_blas_info().core);

  // Open MPI gives every rank a pseudo-terminal even when mpirun's own output is a pipe or a
  // file, so "auto" draws the bar only outside Open MPI; --progress bar asks for it anyway.
  const bool under_open_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  const bool bar = f.progress == "bar" || (f.progress == "auto" && !under_open_mpi && isatty(STDOUT_FILENO));
  example::Progress progress(chatty, f.progress_interval, total_steps, run.first_step(), bar);
  double first_loss = -1, accuracy = -1, train_seconds = 0;
  bool probed_at_end = false;  // the peak probed after the last step (the summary's)
  while (run.next()) {
    // A step never straddles two epochs: skip the tail of micro-batches that cannot fill one.
    if (loader.position().step + f.accum_steps > loader.steps_per_epoch()) {
      loader.set_position({loader.position().epoch + 1, 0});
    }
    const auto t0 = Clock::now();
    const std::int64_t step = run.step() + 1;
    // Stragglers: every K steps the ranks' figures ride along in this step's loss allreduce.
    const tutti::Tensor straggler_figures = run.sync_slots(watch.sync_slots(step));
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
      run.add_loss(loss.loss(), 1.0f / static_cast<float>(f.accum_steps));
      ddp.backward(loss.grad(), scaler.scale());
    }
    const bool stepped = scaler.update(ddp.found_nonfinite());
    if (stepped) optimizer->step();
    const tutti::ddp::StepStats stats = ddp.reducer().last_stats();
    ddp.zero_grad();
    sync.end_step(run);  // --sync diloco: the outer sync every H steps
    watch.after_step(step, stats, data_s, straggler_figures, stream);
    const tutti::train::StepEnd& end = run.end_step();  // the allreduce, divergence, the checkpoint
    // A checkpoint skipped, or waiting for the previous one's write (async): said in the log.
    if (const std::string note = checkpoints.observe(end); chatty && !note.empty()) {
      progress.finish_line();
      std::printf("%s\n", note.c_str());
      std::fflush(stdout);
    }
    watch.after_sync(step, straggler_figures, stream, progress);
    if (first_loss < 0) first_loss = end.loss;
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count() - end.checkpoint_seconds;
    train_seconds += step_s;
    // A measured CPU ceiling probed again after steps 1, 2, 4, ... and the last, every rank at the
    // same step, outside the step's time; MFU is against the best probe so far, so the last
    // progress line and the summary state one figure (obs::peak_probe_due).
    if (peak.measured && (end.last || tutti::obs::peak_probe_due(step))) {
      peak = tutti::obs::remeasure_peak(peak, end.last ? 0.2 : 0.05);
      run_peak_flops = peak.flops;
      if (watch.metrics) watch.metrics->set_peak_flops(peak.flops);
      probed_at_end = end.last;
    }
    const double samples_per_s = static_cast<double>((step - run.first_step()) * f.batch_size) / train_seconds;
    const double mfu = peak.flops > 0 ? tutti::obs::mfu(flops_per_sample, samples_per_s, world, peak.flops) : -1;
    if (watch.metrics) {
      tutti::obs::StepRecord r;
      r.step = step;
      r.step_seconds = step_s;
      r.data_seconds = data_s;
      r.samples = f.batch_size / world;
      r.loss = end.loss;
      r.loss_scale = scaler.scale();
      r.skipped = !stepped;
      r.ddp = stats;
      r.flops = flops_per_sample * static_cast<double>(r.samples);
      watch.metrics->observe_step(r);
      if (device.is_cuda()) watch.metrics->set_device_memory(ddp.memory().total());
      if (end.checkpoint) watch.metrics->observe_checkpoint(end.checkpoint_seconds);
      watch.metrics->observe_accounting(run.accounting(), f.price_per_hour > 0);
    }
    if (end.diverged) break;
    const bool epoch_done = step % steps_per_epoch == 0;
    const int epoch = static_cast<int>((step - 1) / steps_per_epoch) + 1;
    progress.update(step, epoch, f.epochs, end.loss, samples_per_s, scaler.skipped_steps(), mfu,
                    epoch_done || end.last || end.stop);
    if (epoch_done || end.last) {
      accuracy = evaluate(job, *model, data.test, stream, f.zero == 3);
      if (chatty) {
        progress.finish_line();
        std::printf("epoch %d: test accuracy %.4f, train loss %.4f, %.0f samples/s, %s elapsed\n", epoch, accuracy,
                    end.loss, samples_per_s,
                    example::format_duration(std::chrono::duration<double>(Clock::now() - t_start).count()).c_str());
        std::fflush(stdout);
      }
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
  if (run.completed()) {
    // The figures of a completed run (a stopped or diverged one ends with what it had).
    const std::int64_t step = run.step(), first_step = run.first_step();
    if (accuracy < 0) accuracy = evaluate(job, *model, data.test, stream, f.zero == 3);  // resumed at the end
    const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
    const std::uint32_t crc = example::parameters_crc32(ddp.state().model_state_dict());
    const double samples_per_s =
        train_seconds > 0 ? static_cast<double>((step - first_step) * f.batch_size) / train_seconds : 0;
    // Resumed at the end (no step ran): the CPU's ceiling once more, every rank at once.
    if (!probed_at_end) peak = tutti::obs::remeasure_peak(peak);
    const double last_loss = run.loss();
    if (job.rank() == 0 && !f.quiet) {
      if (peak.flops > 0 && train_seconds > 0) {
        std::printf("MFU %.2f%%: %.3g FLOPs per sample (training), %.3f TFLOP/s per rank of a peak of %.3f (%s)\n",
                    100.0 * tutti::obs::mfu(flops_per_sample, samples_per_s, world, peak.flops), flops_per_sample,
                    flops_per_sample * samples_per_s / world / 1e12, peak.flops / 1e12, peak.source.c_str());
      }
      if (first_step >= total_steps) {
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
    summary.set("steps", step);
    set_or_null(summary, "final_train_loss", last_loss);
    set_or_null(summary, "initial_train_loss", first_loss);
    summary.set("test_accuracy", accuracy);
    summary.set("wall_s", wall);
    summary.set("train_s", train_seconds);
    summary.set("samples_per_s", samples_per_s);
    summary.set("skipped_steps", scaler.skipped_steps());
    summary.set("loss_scale", scaler.scale());
    summary.set("params_crc32", crc);
    summary.set("tflops_per_rank", train_seconds > 0 ? flops_per_sample * samples_per_s / world / 1e12 : 0.0);
    set_or_null(summary, "peak_tflops", peak.flops > 0 ? peak.flops / 1e12 : -1);
    set_or_null(
        summary, "mfu",
        peak.flops > 0 && train_seconds > 0 ? tutti::obs::mfu(flops_per_sample, samples_per_s, world, peak.flops) : -1);
    summary.set("straggler_reports", watch.straggler_reports());
    if (watch.last_straggler().empty()) {
      summary.set_null("last_straggler");
    } else {
      summary.set("last_straggler", watch.last_straggler());
    }
  }
  checkpoints.summarize(summary);
  const tutti::train::Outcome outcome = run.finish();  // stopped: waits for every rank, agrees on the signal
  if (!outcome.message.empty()) {
    progress.finish_line();
    std::fprintf(stderr, "train_fashion_mnist: %s\n", outcome.message.c_str());
  }
  return outcome.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  fmnist::Flags f;
  if (const int rc = fmnist::parse_flags(argc, argv, f); rc >= 0) return rc;
  // The error of this rank, printed once; if it is this rank's alone, the Job (gone by now)
  // has told the other ranks, which print that this rank failed and end.
  tutti::train::Summary summary(f.json);
  try {
    return run(f, summary, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: error: %s\n", e.what());
    summary.failed(e.what());
    return 1;
  }
}
