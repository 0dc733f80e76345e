// train_gpt: data-parallel training of a GPT-2 or Llama language model.
//
//   mpirun -np 2 build/examples/train_gpt --model gpt-tiny                  # bytes of Debian's fortunes
//   mpirun -np 2 build/examples/train_gpt --model llama-tiny                # a Llama, the same bytes
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
// diverged, 75 stopped by a signal (resumable with --resume). Resume, checkpoints, the stop,
// divergence and the summary's ending are tutti::train::Run's (include/tutti/train/run.h).
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
#include "../common/run_flags.h"
#include "../common/run_support.h"
#include "../common/sync.h"
#include "data.h"
#include "flags.h"
#include "model.h"
#include "plan.h"

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

std::string corpus_fingerprint(const tutti::data::TokenCorpus& c) {
  const uLong crc = crc32_z(crc32(0L, Z_NULL, 0), static_cast<const Bytef*>(c.tokens.data()),
                            static_cast<z_size_t>(c.tokens.size() * c.tokens.width()));
  char hex[32];
  std::snprintf(hex, sizeof hex, "%08lx/%lld", static_cast<unsigned long>(crc), static_cast<long long>(c.size()));
  return hex;
}

std::string shaping_flags(const gpt::Flags& f, const gpt::ModelConfig& c) {
  std::ostringstream s;
  s << gpt::fingerprint_of(c) << " --attention " << f.attention << " --seq-len " << f.seq_len << " --batch-size "
    << f.batch_size << " --accum-steps " << f.accum_steps << " --steps " << f.steps << " --lr " << f.lr << " --min-lr "
    << f.min_lr << " --warmup-steps " << f.warmup_steps << " --weight-decay " << f.weight_decay << " --beta2 "
    << f.beta2 << " --grad-clip " << f.grad_clip << " --precision " << f.precision << " --grad-comm " << f.grad_comm
    << " --bucket-mb " << f.bucket_mb << " --zero " << f.zero << " --seed " << f.seed << " --eval-every "
    << f.eval_every << " --val-tokens " << f.val_tokens << " --checkpoint-every " << f.checkpoint_every
    << " --max-steps " << f.max_steps << " --resume " << f.resume << " --init-from " << f.init_from << " --export "
    << f.export_dir << " --tp " << f.tp << (f.sequence_parallel ? " --sequence-parallel" : "");
  return s.str();
}

// Mean loss over the first min(all, --val-tokens / T) validation windows, each of `parts` data-parallel
// groups computing its contiguous share (part: this rank's group; --tp: the ranks of a
// tensor-parallel group compute the same windows together). COLLECTIVE.
// sharded: ZeRO-3, whose every forward gathers parameters, or --tp, whose forward sums over its
// group (collective): every rank runs as many forwards, a rank with fewer windows one more of a
// window it does not count.
double evaluate(tutti::Job& job, tutti::models::CausalLm& model, const tutti::data::TokenLoader& val,
                std::int64_t max_windows, std::int64_t chunk, const tutti::Stream& stream, bool sharded, int part,
                int parts) {
  std::optional<tutti::trace::Span> span;
  if (tutti::trace::on()) span.emplace("evaluation", "eval");
  const std::int64_t n = std::min(val.windows(), max_windows);
  const std::int64_t begin = n * part / parts, end = n * (part + 1) / parts;
  tutti::Tensor acc = tutti::Tensor::zeros({2}, tutti::DType::f32, job.device());  // sum of losses, count
  const tutti::Tensor sum = acc.view(0, {1}), count = acc.view(1, {1});
  const tutti::Tensor one = tutti::Tensor::from_floats({1.0f}, {1}).to(job.device(), stream);
  // --tp: the logits' vocabulary is split over the group, and so is the loss (COLLECTIVE).
  const std::unique_ptr<tutti::nn::CrossEntropyLoss> loss = model.make_loss();
  model.eval();
  const std::int64_t most = (n + parts - 1) / parts;  // the most windows of a rank
  for (std::int64_t b = begin; b < end || (sharded && b < begin + most); b += chunk) {
    if (b >= end) {
      if (n > 0) model.forward(val.windows_range(0, 1).inputs.to(job.device(), stream));
      continue;
    }
    const tutti::data::TokenBatch batch = val.windows_range(b, std::min(end, b + chunk));
    const std::int64_t rows = batch.inputs.numel();
    const tutti::Tensor x = batch.inputs.to(job.device(), stream), y = batch.targets.to(job.device(), stream);
    const tutti::Tensor logits = model.forward(x);
    loss->forward(logits, y, 1.0f, stream);
    tutti::kernels::add_scaled(loss->loss(), static_cast<float>(rows), sum, stream);
    tutti::kernels::add_scaled(one, static_cast<float>(rows), count, stream);
  }
  model.train();
  // Over every rank: a tensor-parallel group adds its windows' sums and counts tp times alike.
  tutti::CallOptions call;
  call.label = "validation loss";
  call.stream = stream;
  job.communicator().allreduce(acc, tutti::ReduceOp::sum, call).wait(stream);
  stream.synchronize();
  const std::vector<float> v = acc.to_floats();
  return v[1] > 0 ? v[0] / v[1] : 0.0;
}

int run(gpt::Flags f, tutti::train::Summary& summary, int& argc, char**& argv) {
  const auto t_start = Clock::now();
  tutti::JobOptions job_options;
  job_options.device = f.device;
  job_options.catch_stop_signals = true;
  if (f.deterministic) job_options.cpu_threads = 1;  // OpenBLAS's results depend on its thread count
  tutti::Job job(argc, argv, job_options);
  const int world = job.world_size();
  const bool chatty = job.rank() == 0 && !f.quiet;
  example::warn_if_blas_kernels_are_old(job, "train_gpt");

  // The data, then the model's shape: the preset, the overrides, the data's vocabulary.
  TUTTI_CHECK_ARG(f.resume == "no" || !f.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  summary.set_rank(job.rank());  // a summary that cannot be written fails now, not at the end
  const example::GptData data = example::load_gpt_data(f.data, f.val_data, f.val_fraction);
  const gpt::ModelConfig config = gpt::model_config(f, data.bytes ? 256 : data.train.vocab);
  const std::int64_t context = gpt::context_of(config);
  if (!f.init_from.empty()) {  // the vocabulary is the folder's: the data must fit it
    const std::int64_t vocab = std::visit([](const auto& c) { return c.vocab; }, config);
    for (const tutti::data::TokenCorpus* c : {&data.train, &data.val}) {
      std::int64_t largest = 0;
      for (std::int64_t i = 0; i < c->size(); ++i) largest = std::max<std::int64_t>(largest, c->tokens[i]);
      TUTTI_CHECK_ARG(c->size() == 0 || largest < vocab, "--init-from ", f.init_from, ": the model's vocabulary is ",
                      vocab, " tokens, but the data (", c->description, ") holds token ", largest);
    }
  }
  if (f.seq_len == 0) f.seq_len = std::min<std::int64_t>(context, 1024);
  if (f.min_lr < 0) f.min_lr = f.lr / 10;
  TUTTI_CHECK_ARG(f.seq_len <= context, "--seq-len ", f.seq_len, " is longer than the context ", context);
  // --tp N: N ranks per model, data parallelism over the world / N groups.
  TUTTI_CHECK_ARG(world % f.tp == 0, "--tp ", f.tp, " must divide the ", world, " rank(s)");
  TUTTI_CHECK_ARG(!f.sequence_parallel || f.tp > 1,
                  "--sequence-parallel splits the rows over the --tp group: give "
                  "--tp 2 or more");
  const int dp = world / f.tp;
  f.accum_steps = example::accumulation_steps(f, f.batch_size, f.accum_steps, dp);
  // --sequence-parallel splits each micro-batch's rows (its sequences' tokens) over the tp group;
  // rows that do not divide would run unsplit, without a word.
  const std::int64_t micro_rows = f.batch_size / (static_cast<std::int64_t>(f.accum_steps) * dp) * f.seq_len;
  TUTTI_CHECK_ARG(!f.sequence_parallel || micro_rows % f.tp == 0, "--sequence-parallel: a micro-batch's ", micro_rows,
                  " rows (sequences per rank x --seq-len) must divide by --tp ", f.tp);
  job.check_same("the flags that shape the run", shaping_flags(f, config));
  job.check_same("the training data (crc32/tokens)", corpus_fingerprint(data.train));
  job.check_same("the validation data (crc32/tokens)", corpus_fingerprint(data.val));

  const tutti::Device device = job.device();
  const tutti::Stream stream = device.is_cuda() ? tutti::Stream::create(device) : tutti::Stream();
  // At ZeRO-3 the model is built without storage (nn::DeferredParameters): DDP fills each rank's
  // shards one transformer layer at a time, from the seed or the --init-from folder, so that no
  // rank ever holds the whole model. The other stages keep it whole anyway.
  // --sync, --allreduce, --tp: the groups DDP (and DiLoCo) run over and, with --tp, the mesh of
  // dp x tp ranks (node x dp x tp with --sync diloco) whose tp group the model is split over
  // (COLLECTIVE).
  example::Sync sync(job, f, f.tp);
  tutti::Communicator* tp_group = sync.tensor_parallel_group();
  std::unique_ptr<tutti::models::CausalLm> owned_model;
  if (f.zero == 3) {
    tutti::nn::DeferredParameters defer;
    owned_model = gpt::make_model(config, tp_group, {.sequence_parallel = f.sequence_parallel});
  } else {
    owned_model = gpt::make_model(config, tp_group, {.sequence_parallel = f.sequence_parallel});
  }
  tutti::models::CausalLm& model = *owned_model;
  model.set_recompute(tutti::models::Recompute::parse(f.recompute));
  const tutti::amp::Policy policy = example::precision_policy(f.precision, f.grad_comm);
  tutti::amp::apply(policy, model);
  model.to(device, stream).init(f.seed);
  // Pretrained weights: every rank reads the folder, one tensor at a time (models/hf.h), before DDP
  // shards them; at ZeRO-3 rank 0 reads each tensor as DDP fills its group, and broadcasts the
  // group. A resume then loads the checkpoint over them.
  auto last = Clock::now();  // of the loading's progress line, which DDP's construction may print
  if (!f.init_from.empty()) {
    tutti::models::hf::load_weights(f.init_from, model, [&](std::int64_t read, std::int64_t total) {
      if (!chatty || (read < total && Clock::now() - last < std::chrono::seconds(5))) return;
      last = Clock::now();
      std::printf("train_gpt: loading %s: %.0f%% (%.2f of %.2f GB)\n", f.init_from.c_str(),
                  100.0 * static_cast<double>(read) / static_cast<double>(std::max<std::int64_t>(total, 1)),
                  static_cast<double>(read) / 1e9, static_cast<double>(total) / 1e9);
      std::fflush(stdout);
    });
  }

  tutti::ddp::DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = f.bucket_mb;
  ddp_options.accumulation_steps = f.accum_steps;
  ddp_options.reducer.grad_comm_dtype = policy.comm;
  // ZeRO-3: a transformer layer per gather group.
  ddp_options.sharding = tutti::ddp::sharding_of_stage(f.zero, gpt::gather_groups(config));
  if (f.deterministic) ddp_options.deterministic = tutti::ddp::DeterministicOptions{};
  const auto hook = example::comm_hook(f, ddp_options);  // --allreduce powersgd:R
  tutti::ddp::DistributedDataParallel ddp(sync.ddp_communicator(), model, ddp_options);
  if (hook) ddp.register_comm_hook(hook);
  // What building, loading and sharding the model took at its worst (the optimizer's state is
  // not made yet).
  const std::int64_t setup_peak_bytes = tutti::Storage::peak_bytes(device);

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
  sync.start(ddp, optimizer);  // --sync diloco: node 0's parameters everywhere (COLLECTIVE)

  std::int64_t decayed = 0;
  for (const auto& g : optimizer.groups()) {
    if (optimizer.weight_decay_of(g) > 0) {
      for (const auto* p : g.parameters) decayed += p->numel();
    }
  }
  optimizer.set_schedule(tutti::optim::LrSchedule::cosine(static_cast<float>(f.lr), f.warmup_steps, f.steps,
                                                          static_cast<float>(f.min_lr)));
  tutti::amp::LossScaler scaler(policy.default_scaler());
  // --tp: each rank's logits are its columns of the vocabulary; the loss is split alike.
  const std::unique_ptr<tutti::nn::CrossEntropyLoss> loss = model.make_loss();

  tutti::data::TokenLoaderOptions lo;
  lo.sequence_length = f.seq_len;
  lo.global_micro_batch_size = f.batch_size / f.accum_steps;
  // A data-parallel group's slice of each batch (--tp: its ranks read the same).
  const int dp_rank = sync.data_parallel_rank();
  lo.rank = dp_rank;
  lo.world_size = dp;
  lo.seed = f.seed;
  tutti::data::TokenLoader loader(data.train, lo);
  tutti::data::TokenLoaderOptions vo = lo;
  vo.shuffle = false;
  vo.global_micro_batch_size = dp;
  tutti::data::TokenLoader val_loader(data.val, vo);
  const std::int64_t val_windows = std::max<std::int64_t>(dp, f.val_tokens / f.seq_len);
  const std::int64_t tokens_per_step = f.batch_size * f.seq_len;

  // Run control (tutti::train::Run): resume (every rank reads the checkpoint), checkpoints,
  // the stop flag and the loss in one allreduce a step, divergence, the summary's ending.
  const std::int64_t last_step = f.max_steps > 0 ? std::min(f.steps, f.max_steps) : f.steps;
  tutti::train::RunOptions run_options = example::run_options(f, last_step, stream, summary);
  run_options.work_per_step = static_cast<double>(tokens_per_step);
  run_options.work_unit = "tokens";
  // The model's configuration as Hugging Face's config.json: what examples/export_hf reads to turn
  // a checkpoint into a folder transformers loads.
  run_options.metadata = {
      {"model", model.fingerprint()},
      {"program", "train_gpt"},
      {"model_config",
       std::visit([](const auto& c) { return tutti::models::hf::config_json(c, tutti::DType::f32); }, config)}};
  double last_val = -1;
  tutti::train::State state(ddp, optimizer, scaler, loader);
  state.tensor_parallel = tp_group;  // --tp: checkpoints of whole tensors, resumable at any --tp
  state.add_scalar("train.last_val_loss", last_val);
  // The CPU's measured peak (MFU), kept with the run: a relaunch neither measures nor probes anew.
  double run_peak_flops = 0;
  state.add_scalar("obs.peak_flops", run_peak_flops);
  sync.add_state(state);
  tutti::train::Run run(job, state, run_options);
  const std::int64_t first_step = run.first_step();

  // The whole model's parameters and FLOPs (--tp: the unsplit model's, counted once: MFU is
  // its useful work over every rank's peak). Built without storage.
  std::unique_ptr<tutti::models::CausalLm> unsplit;
  if (tp_group) {
    tutti::nn::DeferredParameters defer;
    unsplit = gpt::make_model(config);
  }
  tutti::models::CausalLm& whole_model = unsplit ? *unsplit : model;
  std::int64_t params = 0;
  for (auto* p : whole_model.parameters()) params += p->numel();
  // What the run trains: the preset, or the Hugging Face folder it started from.
  const std::string model_name = f.init_from.empty() ? f.model : f.init_from;
  // MFU: the model's FLOPs as its layers count them (Module::flops), over the peak of tutti's table
  // (a known GPU), the GEMM ceiling measured now (CPU) or --peak-tflops (docs/observability.md).
  const double flops_per_token = whole_model.flops_per_token(f.seq_len);
  const std::string device_name = tutti::device_description(device);
  tutti::obs::PeakFlops peak_info = tutti::obs::peak_flops(device, policy.compute, f.peak_tflops, run_peak_flops);
  if (peak_info.measured) run_peak_flops = peak_info.flops;
  double peak = peak_info.flops / 1e12;  // TFLOP/s per rank; 0: not known
  std::unique_ptr<tutti::obs::TraceSession> trace =
      tutti::obs::TraceSession::from_env(job.cpu_communicator(), job.hostname());
  if (chatty) {
    std::printf(
        "train_gpt: %d rank(s), device %s, backend %s | model %s: %s, %lld parameters | data %s | "
        "precision %s, grad comm %s, zero %d, tp %d%s, recompute %s | global batch %lld x %lld tokens (%lld sequences "
        "per rank "
        "x %d "
        "micro-step(s)) | adamw lr %g -> %g, %lld warm-up steps, cosine, weight decay %g on %lld parameters, clip %g | "
        "%lld steps%s%s\n",
        world, device_name.c_str(), std::string(job.backend()).c_str(), model_name.c_str(), model.fingerprint().c_str(),
        static_cast<long long>(params), data.description.c_str(), f.precision.c_str(),
        std::string(tutti::name_of(policy.comm)).c_str(), f.zero, f.tp,
        f.sequence_parallel ? " (sequence-parallel)" : "", f.recompute.c_str(), static_cast<long long>(f.batch_size),
        static_cast<long long>(f.seq_len), static_cast<long long>(loader.local_micro_batch_size()), f.accum_steps, f.lr,
        f.min_lr, static_cast<long long>(f.warmup_steps), f.weight_decay, static_cast<long long>(decayed), f.grad_clip,
        static_cast<long long>(f.steps),
        run.resumed() ? (" | resumed at step " + std::to_string(first_step)).c_str() : "", run.note().c_str());
    if (sync.diloco()) std::printf("train_gpt: sync %s\n", sync.describe().c_str());
    const std::string snapshots = example::snapshot_line(f, run, job.node_count());
    if (!snapshots.empty()) std::printf("train_gpt: %s\n", snapshots.c_str());
    std::fflush(stdout);
  }
  // What the summary says however the run ends (docs/user-guide.md, "The JSON summary").
  example::CheckpointLog checkpoints;  // rank 0: checkpoints skipped or waited, their stall
  summary.set("ranks", world);
  summary.set("precision", f.precision);
  summary.set("zero", f.zero);
  summary.set("tp", f.tp);
  summary.set("sequence_parallel", f.sequence_parallel);
  summary.set("sync", sync.mode());
  summary.set("recompute", f.recompute);
  summary.set("decayed_parameters", decayed);
  summary.set("model", model_name);
  summary.set("config", model.fingerprint());
  summary.set("attention", f.attention);
  summary.set("parameters", params);
  summary.set("global_batch_size", f.batch_size);
  summary.set("seq_len", f.seq_len);
  summary.set("accum_steps", f.accum_steps);
  summary.set("device", device_name);
  summary.set("backend", job.backend());
  set_or_null(summary, "peak_tflops", peak > 0 ? peak : -1);
  summary.set("peak_source", peak_info.source);
  summary.set("flops_per_token", flops_per_token);

  double train_seconds = 0, first_loss = -1;
  // The steady rate leaves out the first steps (cuBLAS's heuristics, the allocator's first
  // requests, cold caches): at most 10, a fifth of the run.
  const std::int64_t warm_steps = std::max<std::int64_t>(0, std::min<std::int64_t>(10, (last_step - first_step) / 5));
  double steady_seconds = 0;
  bool probed_at_end = false;  // the peak probed after the last step (the "done" line's)
  auto last_print = Clock::now();
  nlohmann::json curve = nlohmann::json::array();  // (step, tokens, train loss, val loss)
  // crc32 of this rank's first micro-batch (its inputs as int32): a peer that reads the same
  // data in the same order reports the same (benchmarks/peers/torch_gpt.py).
  std::uint32_t first_batch_crc = 0;
  while (run.next()) {
    const auto t0 = Clock::now();
    for (int micro = 0; micro < f.accum_steps; ++micro) {
      const tutti::data::TokenBatch b = loader.next();
      if (run.step() == first_step && micro == 0) {
        first_batch_crc = static_cast<std::uint32_t>(crc32(
            crc32(0L, Z_NULL, 0), static_cast<const Bytef*>(b.inputs.data()), static_cast<uInt>(b.inputs.nbytes())));
      }
      const tutti::Tensor x = b.inputs.to(device, stream), y = b.targets.to(device, stream);
      const tutti::Tensor logits = ddp.forward(x);
      loss->forward(logits, y, scaler.scale(), stream);
      run.add_loss(loss->loss(), 1.0f / static_cast<float>(f.accum_steps));
      ddp.backward(loss->grad(), scaler.scale());
    }
    if (scaler.update(ddp.found_nonfinite())) {
      float coefficient = 1.0f;
      if (f.grad_clip > 0) {
        coefficient = (tp_group ? tutti::parallel::grad_norm(ddp, *tp_group, f.grad_clip) : ddp.grad_norm(f.grad_clip))
                          .coefficient;
      }
      optimizer.step(coefficient);
    }
    ddp.zero_grad();
    sync.end_step(run);                                 // --sync diloco: the outer sync every H steps
    const tutti::train::StepEnd& end = run.end_step();  // the allreduce, divergence, the checkpoint
    // A checkpoint skipped, or waiting for the previous one's write (async): said in the log.
    if (const std::string note = checkpoints.observe(end); chatty && !note.empty()) {
      std::printf("%s\n", note.c_str());
      std::fflush(stdout);
    }
    const std::int64_t step = end.step;
    if (first_loss < 0) first_loss = end.loss;
    const double step_seconds = std::chrono::duration<double>(Clock::now() - t0).count() - end.checkpoint_seconds;
    train_seconds += step_seconds;
    if (step > first_step + warm_steps) steady_seconds += step_seconds;
    if (end.diverged) break;
    // A measured CPU ceiling probed again after steps 1, 2, 4, ... and the last, every rank at the
    // same step, outside the step's time; MFU is against the best probe so far, so the last
    // progress line and the "done" line state one figure (obs::peak_probe_due).
    if (peak_info.measured && (end.last || tutti::obs::peak_probe_due(step))) {
      peak_info = tutti::obs::remeasure_peak(peak_info, end.last ? 0.2 : 0.05);
      run_peak_flops = peak_info.flops;
      peak = peak_info.flops / 1e12;
      probed_at_end = end.last;
    }
    const double tokens_per_s = static_cast<double>((step - first_step) * tokens_per_step) / train_seconds;
    const bool eval_now = (f.eval_every > 0 && step % f.eval_every == 0) || end.last;
    if (eval_now) {
      ddp.state().synchronize_parameters();  // ZeRO: the forward below is the model's own, outside DDP
      last_val = evaluate(job, model, val_loader, val_windows, loader.local_micro_batch_size(), stream,
                          f.zero == 3 || tp_group, dp_rank, dp);
      curve.push_back({step, step * tokens_per_step, end.loss, last_val});
    }
    const auto now = Clock::now();
    if (chatty && (eval_now || std::chrono::duration<double>(now - last_print).count() >= f.progress_interval)) {
      last_print = now;
      const double eta = train_seconds / static_cast<double>(step - first_step) * static_cast<double>(last_step - step);
      std::printf("step %lld/%lld | loss %.4f%s | lr %.3g | %.0f tokens/s", static_cast<long long>(step),
                  static_cast<long long>(f.steps), end.loss,
                  eval_now ? (" | val " + std::to_string(last_val).substr(0, 6)).c_str() : "",
                  static_cast<double>(optimizer.lr()), tokens_per_s);
      if (peak > 0) std::printf(" | MFU %.1f%%", 100.0 * flops_per_token * tokens_per_s / (world * peak * 1e12));
      std::printf(" | ETA %s\n", example::format_duration(eta).c_str());
      std::fflush(stdout);
    }
  }
  if (trace) {
    const std::vector<std::string> files = trace->write();  // COLLECTIVE
    if (chatty) std::printf("timeline: %s\n", files.back().c_str());
  }
  if (run.completed()) {
    // The figures of a completed run (a stopped or diverged one ends with what it had).
    const std::int64_t step = run.step();
    ddp.state().synchronize_parameters();
    // Resumed at the end: the checkpoint's validation loss may be of an earlier evaluation.
    if (curve.empty())
      last_val = evaluate(job, model, val_loader, val_windows, loader.local_micro_batch_size(), stream,
                          f.zero == 3 || tp_group, dp_rank, dp);
    const double wall = std::chrono::duration<double>(Clock::now() - t_start).count();
    tutti::StateDict final_state = ddp.state().model_state_dict();  // COLLECTIVE under ZeRO
    if (tp_group) final_state = tutti::parallel::whole_state_dict(final_state, model, *tp_group);  // COLLECTIVE
    const std::uint32_t crc = example::parameters_crc32(final_state);
    if (!f.export_dir.empty() && job.rank() == 0) {
      tutti::models::hf::ExportOptions eo;
      eo.dtype = f.export_dtype == "bf16"  ? tutti::DType::bf16
                 : f.export_dtype == "f16" ? tutti::DType::f16
                                           : tutti::DType::f32;
      // The whole model's shape (with --tp the state was gathered whole; the split model's own
      // parameters are slices).
      std::visit([&](const auto& c) { tutti::models::hf::save(f.export_dir, c, final_state, eo); }, config);
      summary.set("exported_to", f.export_dir);
      if (!f.quiet)
        std::printf("train_gpt: exported %s to %s (%s)\n", model.describe().c_str(), f.export_dir.c_str(),
                    f.export_dtype.c_str());
    }
    const double tokens_per_s =
        train_seconds > 0 ? static_cast<double>((step - first_step) * tokens_per_step) / train_seconds : 0;
    const std::int64_t steady_steps = step - first_step - warm_steps;
    const double steady_tokens_per_s = steady_seconds > 0 && steady_steps > 0
                                           ? static_cast<double>(steady_steps * tokens_per_step) / steady_seconds
                                           : tokens_per_s;
    // Resumed at the end (no step ran): the CPU's ceiling once more, every rank at once.
    if (!probed_at_end) peak_info = tutti::obs::remeasure_peak(peak_info);
    peak = peak_info.flops / 1e12;
    const double mfu = peak > 0 ? flops_per_token * tokens_per_s / (world * peak * 1e12) : -1;
    const double steady_mfu = peak > 0 ? flops_per_token * steady_tokens_per_s / (world * peak * 1e12) : -1;
    std::string sample;
    // What a person looks at first: text from the trained model. Rank 0's; at ZeRO-3 every
    // forward gathers parameters (collective), so every rank generates (the same text).
    if (f.sample_tokens > 0 && (job.rank() == 0 || f.zero == 3 || tp_group)) {
      tutti::models::SampleOptions so;
      so.tokens = f.sample_tokens;
      so.temperature = static_cast<float>(f.temperature);
      so.top_k = f.top_k;
      so.seed = f.seed;
      const example::Detokenizer detok(data.bytes, f.tokenizer);
      // Token data: the tokenizer's document token (GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>).
      const std::int32_t document = gpt::document_token(model.vocab());
      std::vector<std::int32_t> prompt =
          data.bytes ? example::Detokenizer::bytes_of(f.prompt) : std::vector<std::int32_t>{document};
      if (prompt.empty()) prompt.push_back(data.bytes ? '\n' : document);
      sample = detok.decode(tutti::models::generate(model, prompt, so));
    }
    if (job.rank() == 0) {
      if (!f.quiet) {
        std::printf("done: %lld steps, %lld tokens, train loss %.4f, val loss %.4f, %.0f tokens/s",
                    static_cast<long long>(step), static_cast<long long>(step * tokens_per_step), run.loss(), last_val,
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
    summary.set("steps", step);
    summary.set("tokens", step * tokens_per_step);
    summary.set("final_train_loss", run.loss());
    summary.set("final_val_loss", last_val);
    set_or_null(summary, "initial_train_loss", first_loss);
    summary.set("tokens_per_s", tokens_per_s);
    set_or_null(summary, "peak_tflops", peak > 0 ? peak : -1);
    set_or_null(summary, "mfu", mfu);
    summary.set("tokens_per_s_steady", steady_tokens_per_s);
    set_or_null(summary, "mfu_steady", steady_mfu);
    summary.set("warm_steps", warm_steps);
    summary.set("wall_s", wall);
    summary.set("train_s", train_seconds);
    // The most bytes this rank's tensors held on its device at once (tutti's allocations:
    // not CUDA's context, cuBLAS's or NCCL's own).
    summary.set("peak_device_bytes", tutti::Storage::peak_bytes(device));
    // The same when the model was built, loaded and sharded, before the optimizer's state (at
    // ZeRO-3 one layer at a time, never the whole model).
    summary.set("setup_peak_device_bytes", setup_peak_bytes);
    // Gradient bytes this rank put on the wire in the last step (DDP's StepStats: the buckets,
    // or PowerSGD's P, Q and uncompressed gradients), and the communicator DDP used.
    summary.set("reduced_bytes_last_step", ddp.reducer().last_stats().bytes_reduced);
    summary.set("allreduce", f.allreduce);
    summary.set_json("loss_curve", curve.dump());
    summary.set("sample", sample);
    summary.set("first_batch_crc32", first_batch_crc);
    summary.set("params_crc32", crc);
  }
  checkpoints.summarize(summary);
  const tutti::train::Outcome outcome = run.finish();  // stopped: waits for every rank, agrees on the signal
  if (!outcome.message.empty()) std::fprintf(stderr, "train_gpt: %s\n", outcome.message.c_str());
  return outcome.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  gpt::Flags f;
  if (const int rc = gpt::parse_flags(argc, argv, f); rc >= 0) return rc;
  if (f.plan) {
    try {
      return gpt::print_plan(f);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
      return 2;
    }
  }
  tutti::train::Summary summary(f.json);
  try {
    return run(f, summary, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
    summary.failed(e.what());
    return 1;
  }
}
