// train_gpt: data-parallel training of a GPT-2-style language model.
//
//   mpirun -np 2 build/examples/train_gpt --model gpt-tiny                  # bytes of Debian's fortunes
//   mpirun -np 2 build/examples/train_gpt --data book.txt --steps 3000       # any text, byte-level
//   mpirun -np 8 build/examples/train_gpt --model gpt2-124m --precision bf16 \
//       --data fineweb_train_*.bin --val-data fineweb_val_000000.bin --tokenizer gpt2_tokenizer.bin
//
// --batch-size is the GLOBAL batch of one optimizer step in sequences of --seq-len tokens:
// with N ranks and k accumulation steps each rank runs k micro-batches of batch / (k N)
// sequences. The data order depends only on the seed (tutti::data::TokenLoader), so a run
// trains the same way on any number of ranks. docs/gpt.md explains the model, the data, the
// MFU formula and what was measured.
//
// Exit codes as train_fashion_mnist's: 0 done, 1 an error, 2 a bad command line, 3 the loss
// diverged, 75 stopped by a signal (resumable with --resume).
#include <unistd.h>
#include <zlib.h>

#include <tutti/tutti.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../common/progress.h"
#include "../common/run_support.h"
#include "../common/summary.h"
#include "data.h"
#include "flags.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kExitDiverged = 3;
constexpr int kExitStopped = 75;

std::string corpus_fingerprint(const tutti::data::TokenCorpus& c) {
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(c.tokens.data()),
                          static_cast<uInt>(c.tokens.size() * sizeof(std::uint16_t)));
  char hex[32];
  std::snprintf(hex, sizeof hex, "%08lx/%lld", static_cast<unsigned long>(crc), static_cast<long long>(c.size()));
  return hex;
}

std::string shaping_flags(const gpt::Flags& f, const tutti::models::GptConfig& c) {
  std::ostringstream s;
  s << c.fingerprint() << " --seq-len " << f.seq_len << " --batch-size " << f.batch_size << " --accum-steps "
    << f.accum_steps << " --steps " << f.steps << " --lr " << f.lr << " --min-lr " << f.min_lr << " --warmup-steps "
    << f.warmup_steps << " --weight-decay " << f.weight_decay << " --beta2 " << f.beta2 << " --grad-clip "
    << f.grad_clip << " --precision " << f.precision << " --grad-comm " << f.grad_comm << " --bucket-mb " << f.bucket_mb
    << " --zero " << f.zero << " --seed " << f.seed << " --eval-every " << f.eval_every << " --val-tokens "
    << f.val_tokens << " --checkpoint-every " << f.checkpoint_every << " --max-steps " << f.max_steps << " --resume "
    << f.resume;
  return s.str();
}

// Mean loss over the first min(all, --val-tokens / T) validation windows, each rank
// computing its contiguous share. COLLECTIVE.
double evaluate(tutti::Job& job, tutti::models::Gpt& model, const tutti::data::TokenLoader& val,
                std::int64_t max_windows, std::int64_t chunk, const tutti::Stream& stream) {
  std::optional<tutti::trace::Span> span;
  if (tutti::trace::on()) span.emplace("evaluation", "eval");
  const std::int64_t n = std::min(val.windows(), max_windows);
  const std::int64_t begin = n * job.rank() / job.world_size(), end = n * (job.rank() + 1) / job.world_size();
  tutti::Tensor acc = tutti::Tensor::zeros({2}, tutti::DType::f32, job.device());  // sum of losses, count
  const tutti::Tensor sum = acc.view(0, {1}), count = acc.view(1, {1});
  const tutti::Tensor one = tutti::Tensor::from_floats({1.0f}, {1}).to(job.device(), stream);
  tutti::nn::CrossEntropyLoss loss;
  model.eval();
  for (std::int64_t b = begin; b < end; b += chunk) {
    const tutti::data::TokenBatch batch = val.windows_range(b, std::min(end, b + chunk));
    const std::int64_t rows = batch.inputs.numel();
    const tutti::Tensor x = batch.inputs.to(job.device(), stream), y = batch.targets.to(job.device(), stream);
    const tutti::Tensor logits = model.forward(x);
    loss.forward(logits, y, 1.0f, stream);
    tutti::kernels::add_scaled(loss.loss(), static_cast<float>(rows), sum, stream);
    tutti::kernels::add_scaled(one, static_cast<float>(rows), count, stream);
  }
  model.train();
  tutti::CallOptions call;
  call.label = "validation loss";
  call.stream = stream;
  job.communicator().allreduce(acc, tutti::ReduceOp::sum, call).wait(stream);
  stream.synchronize();
  const std::vector<float> v = acc.to_floats();
  return v[1] > 0 ? v[0] / v[1] : 0.0;
}

int run(gpt::Flags f, example::RunSummary& summary, int& argc, char**& argv) {
  const auto t_start = Clock::now();
  tutti::JobOptions job_options;
  job_options.device = f.device;
  job_options.catch_stop_signals = true;
  tutti::Job job(argc, argv, job_options);
  const int world = job.world_size();
  const bool chatty = job.rank() == 0 && !f.quiet;
  example::warn_if_blas_kernels_are_old(job, "train_gpt");

  // The model's shape: the preset, then the overrides.
  tutti::models::GptConfig config = tutti::models::GptConfig::preset(f.model);
  if (f.layers > 0) config.layers = f.layers;
  if (f.heads > 0) config.heads = f.heads;
  if (f.width > 0) config.width = f.width;
  if (f.context > 0) config.context = f.context;
  if (f.seq_len == 0) f.seq_len = config.context;
  if (f.min_lr < 0) f.min_lr = f.lr / 10;
  TUTTI_CHECK_ARG(f.seq_len <= config.context, "--seq-len ", f.seq_len, " is longer than the context ", config.context);
  TUTTI_CHECK_ARG(f.batch_size % (static_cast<std::int64_t>(f.accum_steps) * world) == 0, "--batch-size ", f.batch_size,
                  " must be divisible by --accum-steps x ranks = ", f.accum_steps, " x ", world);
  TUTTI_CHECK_ARG(f.resume == "no" || !f.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  summary.set_rank(job.rank());  // a summary that cannot be written fails now, not at the end

  const example::GptData data = example::load_gpt_data(f.data, f.val_data, f.val_fraction);
  if (data.bytes) {
    config.vocab = 256;
    config.padded_vocab = 256;
  } else {
    config.vocab = data.train.vocab;
    config.padded_vocab = tutti::models::pad_vocab(config.vocab);
  }
  job.check_same("the flags that shape the run", shaping_flags(f, config));
  job.check_same("the training data (crc32/tokens)", corpus_fingerprint(data.train));
  job.check_same("the validation data (crc32/tokens)", corpus_fingerprint(data.val));

  const tutti::Device device = job.device();
  const tutti::Stream stream = device.is_cuda() ? tutti::Stream::create(device) : tutti::Stream();
  tutti::models::Gpt model(config);
  const tutti::amp::Policy policy = example::precision_policy(f.precision, f.grad_comm);
  tutti::amp::apply(policy, model);
  model.to(device, stream).init(f.seed);

  tutti::ddp::DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = f.bucket_mb;
  ddp_options.accumulation_steps = f.accum_steps;
  ddp_options.reducer.grad_comm_dtype = policy.comm;
  ddp_options.zero_stage = f.zero;
  tutti::ddp::DistributedDataParallel ddp(job.communicator(), model, ddp_options);

  // Two parameter groups: the weight matrices decay; LayerNorm gains, biases and the two
  // embeddings (the token embedding is also the tied output head) do not (GPT-2's and
  // nanoGPT's recipe): the library's default rule, which reads what the layers marked.
  tutti::optim::AdamWOptions adamw;
  adamw.lr = static_cast<float>(f.lr);
  adamw.beta1 = static_cast<float>(f.beta1);
  adamw.beta2 = static_cast<float>(f.beta2);
  adamw.weight_decay = static_cast<float>(f.weight_decay);
  tutti::optim::AdamW optimizer(
      tutti::optim::weight_decay_groups(model.parameters(), static_cast<float>(f.weight_decay)), adamw);
  optimizer.set_stream(stream);
  // The optimizer takes DDP's plan: one fused update per run of parameters that share a weight
  // decay (stage 0), or this rank's shard and the all-gather after each step (ZeRO).
  ddp.attach(optimizer);
  std::int64_t decayed = 0;
  for (const auto& g : optimizer.groups()) {
    if (optimizer.weight_decay_of(g) > 0) {
      for (const auto* p : g.parameters) decayed += p->numel();
    }
  }
  optimizer.set_schedule(tutti::optim::LrSchedule::cosine(static_cast<float>(f.lr), f.warmup_steps, f.steps,
                                                          static_cast<float>(f.min_lr)));
  tutti::amp::LossScaler scaler(policy.default_scaler());
  tutti::nn::CrossEntropyLoss loss;

  tutti::data::TokenLoaderOptions lo;
  lo.sequence_length = f.seq_len;
  lo.global_micro_batch_size = f.batch_size / f.accum_steps;
  lo.rank = job.rank();
  lo.world_size = world;
  lo.seed = f.seed;
  tutti::data::TokenLoader loader(data.train, lo);
  tutti::data::TokenLoaderOptions vo = lo;
  vo.shuffle = false;
  vo.global_micro_batch_size = world;
  tutti::data::TokenLoader val_loader(data.val, vo);
  const std::int64_t val_windows = std::max<std::int64_t>(world, f.val_tokens / f.seq_len);
  const std::int64_t tokens_per_step = f.batch_size * f.seq_len;

  // Resume.
  const std::string ckpt_path = f.checkpoint_dir.empty() ? "" : f.checkpoint_dir + "/checkpoint.tckp";
  const bool ckpt_exists = !ckpt_path.empty() && std::filesystem::exists(ckpt_path);
  job.check_same("whether " + ckpt_path + " exists (is --checkpoint-dir shared?)", ckpt_exists ? "yes" : "no");
  TUTTI_CHECK_ARG(f.resume != "yes" || ckpt_exists, "--resume: no checkpoint at ", ckpt_path);
  TUTTI_CHECK_ARG(f.resume != "no" || !ckpt_exists || f.overwrite, "a checkpoint exists at ", ckpt_path,
                  ": pass --resume (or --resume auto) to continue it, or --overwrite to start afresh");
  const bool resuming = f.resume != "no" && ckpt_exists;
  const tutti::io::Metadata metadata{
      {"model", config.fingerprint()}, {"precision", f.precision}, {"program", "train_gpt"}};
  std::int64_t step = 0;
  double last_loss = -1, last_val = -1;
  if (resuming) {
    const tutti::io::Checkpoint ckpt = tutti::io::load_checkpoint(ckpt_path);
    tutti::io::check_metadata(ckpt, "model", config.fingerprint(), ckpt_path);
    const tutti::StateDict model_state = tutti::io::strip_prefix(ckpt.state, "model.");
    tutti::io::check_state_matches(model_state, model.state_dict(), ckpt_path);
    ddp.load_model_state_dict(model_state);
    ddp.load_optimizer_state_dict(optimizer, tutti::io::strip_prefix(ckpt.state, "optim."));
    const auto saved_precision = ckpt.metadata.find("precision");
    if (saved_precision == ckpt.metadata.end() || saved_precision->second == f.precision) {
      scaler.load_state_dict(tutti::io::strip_prefix(ckpt.state, "scaler."));
    }
    loader.load_state_dict(tutti::io::strip_prefix(ckpt.state, "loader."));
    step = tutti::get_int_scalar(ckpt.state, "train.step");
    last_loss = tutti::get_scalar(ckpt.state, "train.last_loss");
    last_val = tutti::get_scalar(ckpt.state, "train.last_val_loss");
  }
  const std::int64_t first_step = step;
  auto save = [&] {
    example::save_checkpoint(
        job, ddp, optimizer,
        [&] {
          tutti::StateDict rest;
          tutti::io::add_prefixed(rest, "scaler.", scaler.state_dict());
          tutti::io::add_prefixed(rest, "loader.", loader.state_dict());
          rest["train.step"] = tutti::int_scalar_tensor(step);
          rest["train.last_loss"] = tutti::scalar_tensor(last_loss);
          rest["train.last_val_loss"] = tutti::scalar_tensor(last_val);
          return rest;
        },
        ckpt_path, metadata, step);
  };

  std::int64_t params = 0;
  for (auto* p : model.parameters()) params += p->numel();
  // MFU: the model's FLOPs as its layers count them (Module::flops), over the peak of tutti's table
  // (a known GPU), the GEMM ceiling measured now (CPU) or --peak-tflops (docs/observability.md).
  const double flops_per_token = model.flops_per_token(f.seq_len);
  const std::string device_name = tutti::device_description(device);
  tutti::obs::PeakFlops peak_info = tutti::obs::peak_flops(device, policy.compute, f.peak_tflops);
  double peak = peak_info.flops / 1e12;  // TFLOP/s per rank; 0: not known
  std::unique_ptr<tutti::obs::TraceSession> trace =
      tutti::obs::TraceSession::from_env(job.cpu_communicator(), job.hostname());
  if (chatty) {
    std::printf(
        "train_gpt: %d rank(s), device %s, backend %s | model %s: %s, %lld parameters | data %s | "
        "precision %s, grad comm %s, zero %d | global batch %lld x %lld tokens (%lld sequences per rank x %d "
        "micro-step(s)) | adamw lr %g -> %g, %lld warm-up steps, cosine, weight decay %g on %lld parameters, clip %g | "
        "%lld steps%s\n",
        world, device_name.c_str(), std::string(job.backend()).c_str(), f.model.c_str(), config.fingerprint().c_str(),
        static_cast<long long>(params), data.description.c_str(), f.precision.c_str(),
        std::string(tutti::name_of(policy.comm)).c_str(), f.zero, static_cast<long long>(f.batch_size),
        static_cast<long long>(f.seq_len), static_cast<long long>(loader.local_micro_batch_size()), f.accum_steps, f.lr,
        f.min_lr, static_cast<long long>(f.warmup_steps), f.weight_decay, static_cast<long long>(decayed), f.grad_clip,
        static_cast<long long>(f.steps), resuming ? (" | resumed at step " + std::to_string(step)).c_str() : "");
    std::fflush(stdout);
  }
  // What the summary says however the run ends (docs/user-guide.md, "The JSON summary").
  summary.fields() = {{"ranks", world},
                      {"precision", f.precision},
                      {"zero", f.zero},
                      {"decayed_parameters", decayed},
                      {"model", f.model},
                      {"config", config.fingerprint()},
                      {"parameters", params},
                      {"global_batch_size", f.batch_size},
                      {"seq_len", f.seq_len},
                      {"accum_steps", f.accum_steps},
                      {"resumed_from_step", resuming ? first_step : 0},
                      {"device", device_name},
                      {"backend", std::string(job.backend())},
                      {"peak_tflops", peak > 0 ? nlohmann::json(peak) : nlohmann::json()},
                      {"peak_source", peak_info.source},
                      {"flops_per_token", flops_per_token}};
  summary.set_step(step, last_loss);

  // One allreduce per step carries the loss and the stop flag (average > 0: some rank got a stop
  // signal), so that every rank stops after the same step without a collective of its own.
  tutti::Tensor step_sync = tutti::Tensor::zeros({2}, tutti::DType::f32, device);
  const tutti::Tensor step_loss = step_sync.view(0, {1}), stop_flag = step_sync.view(1, {1});
  const tutti::Tensor one = tutti::Tensor::from_floats({1.0f}, {1}).to(device, stream);
  tutti::CallOptions loss_call;
  loss_call.label = "train loss and stop flag";
  loss_call.stream = stream;
  double train_seconds = 0, first_loss = -1;
  // The steady rate leaves out the first steps (cuBLAS's heuristics, the allocator's first
  // requests, cold caches): at most 10, a fifth of the run.
  const std::int64_t last_step = f.max_steps > 0 ? std::min(f.steps, f.max_steps) : f.steps;
  const std::int64_t warm_steps = std::max<std::int64_t>(0, std::min<std::int64_t>(10, (last_step - step) / 5));
  double steady_seconds = 0;
  auto last_print = Clock::now();
  bool stopped = false;
  tutti::Job::StopAgreement stop_agreed;
  nlohmann::json curve = nlohmann::json::array();  // (step, tokens, train loss, val loss)
  // crc32 of this rank's first micro-batch (its inputs as int32): a peer that reads the same
  // data in the same order reports the same (benchmarks/peers/torch_gpt.py).
  std::uint32_t first_batch_crc = 0;
  while (step < last_step) {
    const auto t0 = Clock::now();
    tutti::trace::begin_step(step + 1);
    step_sync.zero(stream);
    for (int micro = 0; micro < f.accum_steps; ++micro) {
      const tutti::data::TokenBatch b = loader.next();
      if (step == first_step && micro == 0) {
        first_batch_crc = static_cast<std::uint32_t>(crc32(
            crc32(0L, Z_NULL, 0), static_cast<const Bytef*>(b.inputs.data()), static_cast<uInt>(b.inputs.nbytes())));
      }
      const tutti::Tensor x = b.inputs.to(device, stream), y = b.targets.to(device, stream);
      const tutti::Tensor logits = ddp.forward(x);
      loss.forward(logits, y, scaler.scale(), stream);
      tutti::kernels::add_scaled(loss.loss(), 1.0f / static_cast<float>(f.accum_steps), step_loss, stream);
      ddp.backward(loss.grad(), scaler.scale());
    }
    if (scaler.update(ddp.found_nonfinite())) {
      float coefficient = 1.0f;
      if (f.grad_clip > 0) coefficient = ddp.grad_norm(f.grad_clip).coefficient;
      optimizer.step(coefficient);
    }
    ddp.zero_grad();
    ++step;
    if (job.stop_requested()) tutti::kernels::add_scaled(one, 1.0f, stop_flag, stream);
    job.communicator().allreduce(step_sync, tutti::ReduceOp::avg, loss_call).wait(stream);
    last_loss = tutti::nn::item(step_loss, stream);
    const bool stop_now = tutti::nn::item(stop_flag, stream) > 0;
    if (first_loss < 0) first_loss = last_loss;
    summary.set_step(step, last_loss);
    const double step_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    tutti::trace::end_step();
    train_seconds += step_seconds;
    if (step > first_step + warm_steps) steady_seconds += step_seconds;
    if (!std::isfinite(last_loss) && f.precision != "fp16") {
      if (job.rank() == 0)
        std::fprintf(stderr,
                     "train_gpt: error: the training loss is %g at step %lld (%s): the run diverged; start "
                     "again with a smaller --lr (now %g)%s\n",
                     last_loss, static_cast<long long>(step), f.precision.c_str(), f.lr,
                     ckpt_path.empty() ? "" : ", or resume an earlier checkpoint");
      summary.diverged();
      return job.rank() == 0 ? kExitDiverged : 0;
    }
    const double tokens_per_s = static_cast<double>((step - first_step) * tokens_per_step) / train_seconds;
    const bool eval_now = (f.eval_every > 0 && step % f.eval_every == 0) || step == last_step;
    if (eval_now) {
      ddp.synchronize_parameters();  // ZeRO: the forward below is the model's own, outside DDP
      last_val = evaluate(job, model, val_loader, val_windows, loader.local_micro_batch_size(), stream);
      curve.push_back({step, step * tokens_per_step, last_loss, last_val});
    }
    const auto now = Clock::now();
    if (chatty && (eval_now || std::chrono::duration<double>(now - last_print).count() >= f.progress_interval)) {
      last_print = now;
      const double eta = train_seconds / static_cast<double>(step - first_step) * static_cast<double>(last_step - step);
      std::printf("step %lld/%lld | loss %.4f%s | lr %.3g | %.0f tokens/s", static_cast<long long>(step),
                  static_cast<long long>(f.steps), last_loss,
                  eval_now ? (" | val " + std::to_string(last_val).substr(0, 6)).c_str() : "",
                  static_cast<double>(optimizer.lr()), tokens_per_s);
      if (peak > 0) std::printf(" | MFU %.1f%%", 100.0 * flops_per_token * tokens_per_s / (world * peak * 1e12));
      std::printf(" | ETA %s\n", example::format_duration(eta).c_str());
      std::fflush(stdout);
    }
    if (!ckpt_path.empty() &&
        ((f.checkpoint_every > 0 && step % f.checkpoint_every == 0) || step == last_step || stop_now)) {
      save();
    }
    if (stop_now && step < last_step) {
      stopped = true;
      stop_agreed = job.agree_stop();  // only to name the signal and the rank that got it
      break;
    }
  }
  if (trace) {
    const std::vector<std::string> files = trace->write();  // COLLECTIVE
    if (chatty) std::printf("timeline: %s\n", files.back().c_str());
  }
  if (stopped) {
    job.communicator().barrier({.label = "stopped: the checkpoint is written"}).wait();
    summary.stopped(example::signal_name(stop_agreed.signal), ckpt_path);
    if (job.rank() == 0) {
      std::fprintf(stderr, "train_gpt: stopped at step %lld of %lld by signal %d (%s) on rank %d. %s\n",
                   static_cast<long long>(step), static_cast<long long>(f.steps), stop_agreed.signal,
                   strsignal(stop_agreed.signal), stop_agreed.rank,
                   ckpt_path.empty() ? "No checkpoint was written (no --checkpoint-dir)."
                                     : ("Checkpoint written to " + ckpt_path +
                                        ": resume with the same command and "
                                        "--resume.")
                                           .c_str());
    }
    return job.rank() == 0 ? kExitStopped : 0;
  }
  ddp.synchronize_parameters();
  if (last_val < 0) last_val = evaluate(job, model, val_loader, val_windows, loader.local_micro_batch_size(), stream);

  const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
  const std::uint32_t crc = example::parameters_crc32(ddp.model_state_dict());
  const double tokens_per_s =
      train_seconds > 0 ? static_cast<double>((step - first_step) * tokens_per_step) / train_seconds : 0;
  const std::int64_t steady_steps = step - first_step - warm_steps;
  const double steady_tokens_per_s = steady_seconds > 0 && steady_steps > 0
                                         ? static_cast<double>(steady_steps * tokens_per_step) / steady_seconds
                                         : tokens_per_s;
  // The CPU's ceiling once more, every rank at once, the larger kept (obs::remeasure_peak).
  peak_info = tutti::obs::remeasure_peak(peak_info);
  peak = peak_info.flops / 1e12;
  const double mfu = peak > 0 ? flops_per_token * tokens_per_s / (world * peak * 1e12) : -1;
  const double steady_mfu = peak > 0 ? flops_per_token * steady_tokens_per_s / (world * peak * 1e12) : -1;
  std::string sample;
  if (job.rank() == 0) {
    // What a person looks at first: text from the trained model.
    if (f.sample_tokens > 0) {
      tutti::models::SampleOptions so;
      so.tokens = f.sample_tokens;
      so.temperature = static_cast<float>(f.temperature);
      so.top_k = f.top_k;
      so.seed = f.seed;
      const example::Detokenizer detok(data.bytes, f.tokenizer);
      std::vector<std::int32_t> prompt = data.bytes ? example::Detokenizer::bytes_of(f.prompt)
                                                    : std::vector<std::int32_t>{50256};  // GPT-2's <|endoftext|>
      if (prompt.empty()) prompt.push_back(data.bytes ? '\n' : 50256);
      sample = detok.decode(tutti::models::generate(model, prompt, so));
    }
    if (!f.quiet) {
      std::printf("done: %lld steps, %lld tokens, train loss %.4f, val loss %.4f, %.0f tokens/s",
                  static_cast<long long>(step), static_cast<long long>(step * tokens_per_step), last_loss, last_val,
                  tokens_per_s);
      if (mfu >= 0)
        std::printf(", MFU %.1f%% of %.3g TFLOP/s per rank (%s)", 100 * mfu, peak, peak_info.source.c_str());
      else
        std::printf(", MFU not known (%s: --peak-tflops sets one)", peak_info.source.c_str());
      std::printf(", %.1f s\n", wall);
      if (!sample.empty())
        std::printf("--- sample (temperature %g, top-k %lld, seed %llu) ---\n%s\n---\n", f.temperature,
                    static_cast<long long>(f.top_k), static_cast<unsigned long long>(f.seed), sample.c_str());
      std::fflush(stdout);
    }
  }
  nlohmann::json& out = summary.fields();
  out["steps"] = step;
  out["tokens"] = step * tokens_per_step;
  out["final_train_loss"] = last_loss;
  out["final_val_loss"] = last_val;
  out["initial_train_loss"] = first_loss >= 0 ? nlohmann::json(first_loss) : nlohmann::json();
  out["tokens_per_s"] = tokens_per_s;
  out["peak_tflops"] = peak > 0 ? nlohmann::json(peak) : nlohmann::json();
  out["mfu"] = mfu >= 0 ? nlohmann::json(mfu) : nlohmann::json();
  out["tokens_per_s_steady"] = steady_tokens_per_s;
  out["mfu_steady"] = steady_mfu >= 0 ? nlohmann::json(steady_mfu) : nlohmann::json();
  out["warm_steps"] = warm_steps;
  out["wall_s"] = wall;
  out["train_s"] = train_seconds;
  out["loss_curve"] = curve;
  out["sample"] = sample;
  out["first_batch_crc32"] = first_batch_crc;
  out["params_crc32"] = crc;
  summary.completed();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gpt::Flags f;
  if (const int rc = gpt::parse_flags(argc, argv, f); rc >= 0) return rc;
  example::RunSummary summary(f.json);
  try {
    return run(f, summary, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
    summary.failed(e.what());
    return 1;
  }
}
