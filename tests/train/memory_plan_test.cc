// train::memory_plan against the allocator: for configurations mixing the model (GPT with either
// attention kernel, Llama with a tied or untied head), the ZeRO stage, recomputation, precision
// and micro-batch, a small model trains two steps under
// DistributedDataParallel with AdamW, and the peak of Storage's live bytes on the rank's device
// (Storage::peak_bytes over the steps, less the bytes alive before the model was built) must
// be within 5% of the plan's total.
// Run at 1 and 2 ranks (mpirun), on the CPU and on the emulated GPU (one device per rank).
// Also: any model of tutti's layers (an MLP, a CNN) planned by the layers' own statements, at
// every ZeRO stage; the plan's flat plan is DDP's, the rows respond to the options as the code allocates,
// the largest micro-batch and the advice for a plan that does not fit, and parse_bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include <unistd.h>

#include "ddp/ddp_world.h"
#include "tutti/amp/policy.h"
#include "tutti/comm/mesh.h"
#include "tutti/ddp/ddp.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"
#include "tutti/parallel/tensor_parallel.h"
#include "tutti/train/memory_plan.h"
#include "tutti/train/run.h"

namespace tutti::train {
namespace {

using namespace tutti::models;

using testing::world;
using namespace std::chrono_literals;

GptConfig small() {
  GptConfig c;
  c.layers = 2;
  c.heads = 4;
  c.width = 64;
  c.context = 32;
  return c;  // vocabulary 256
}

// A small Llama: grouped heads (4 sharing 2), an MLP of 160, an untied head.
LlamaConfig small_llama(bool tied = false) {
  LlamaConfig c;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.width = 64;
  c.ffn = 160;
  c.context = 32;
  c.tied_head = tied;
  return c;  // vocabulary 256
}

Tensor tokens(std::int64_t B, std::int64_t T, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(B * T));
  for (auto& x : v) x = static_cast<std::int64_t>(rng() % 256);
  return Tensor::from_ints(v, {B, T}, DType::i32);
}

struct Case {
  int zero;
  bool bf16;
  const char* recompute;
  std::int64_t batch;
  double bucket_mb = 25.0;  // small: several buckets, so that ZeRO-2's pool holds more than one
  enum class Model { gpt, llama, llama_tied, gpt_materialized } model = Model::gpt;
  int tp = 1;             // ranks of the tensor-parallel group (the whole world); DDP over the rest
  bool sequence = false;  // with tp: TensorParallelOptions::sequence_parallel
};

const char* model_name(const Case& k) {
  switch (k.model) {
    case Case::Model::gpt: return "gpt";
    case Case::Model::llama: return "llama";
    case Case::Model::llama_tied: return "llama tied";
    case Case::Model::gpt_materialized: return "gpt materialized";
  }
  return "";
}

// The model, split over `tp` when given (Megatron's split: models::Gpt(config, group)).
std::unique_ptr<CausalLm> make_model(const Case& k, Communicator* tp = nullptr) {
  if (k.model == Case::Model::llama || k.model == Case::Model::llama_tied) {
    const LlamaConfig c = small_llama(k.model == Case::Model::llama_tied);
    return tp ? std::make_unique<Llama>(c, *tp, TensorParallelOptions{.sequence_parallel = k.sequence})
              : std::make_unique<Llama>(c);
  }
  GptConfig c = small();
  if (k.model == Case::Model::gpt_materialized) c.attention = nn::AttentionKernel::materialized;
  return tp ? std::make_unique<Gpt>(c, *tp, TensorParallelOptions{.sequence_parallel = k.sequence})
            : std::make_unique<Gpt>(c);
}

MemoryPlan plan_of(const Case& k, const PlanOptions& o) {
  if (k.model == Case::Model::llama || k.model == Case::Model::llama_tied)
    return memory_plan(small_llama(k.model == Case::Model::llama_tied), o);
  GptConfig c = small();
  if (k.model == Case::Model::gpt_materialized) c.attention = nn::AttentionKernel::materialized;
  return memory_plan(c, o);
}

PlanOptions options_of(const Case& k) {
  PlanOptions o;
  o.world_size = world().world_size();
  o.tensor_parallel = k.tp;
  o.sequence_parallel = k.sequence;
  o.zero_stage = k.zero;
  if (k.bf16) {
    const amp::Policy p = amp::Policy::bf16();
    o.compute = p.compute;
    o.grad = p.grad;
    o.grad_comm = p.comm;
  }
  o.recompute = Recompute::parse(k.recompute);
  o.micro_batch = k.batch;
  o.seq_len = small().context;
  o.bucket_cap_mb = k.bucket_mb;
  o.first_bucket_cap_mb = std::min(1.0, k.bucket_mb);
  return o;
}

// A folder every rank names alike, this run's own: rank 0's process id in its name.
std::filesystem::path shared_folder(const std::string& what) {
  Tensor pid = Tensor::from_ints({static_cast<std::int64_t>(::getpid())}, {1}, DType::i64);
  world().cpu_communicator().broadcast(pid, 0).wait();
  return std::filesystem::temp_directory_path() / ("tutti_" + what + "_" + std::to_string(pid.to_ints()[0]));
}

// Peak bytes on the rank's device over building the model, DDP, AdamW and two training steps,
// less what was alive before. With `checkpoints`, the steps run under a train::Run that
// checkpoints after each (async, as train_gpt does), and then model_state_dict() is taken (as
// train_gpt's final checksum does). With `mesh` ({dp, tp}), the model is split over its tp group
// and DDP runs over its dp group.
// Waits until the device's live bytes stop changing (a GPU backend's watchdog lets go of its
// finished collectives' tensors when it next polls, every 20 ms).
void settle(const Device& device) {
  for (std::int64_t last = -1, i = 0; i < 100 && Storage::live_bytes(device) != last; ++i) {
    last = Storage::live_bytes(device);
    std::this_thread::sleep_for(50ms);
  }
}

std::int64_t measured_peak(const Case& k, std::int64_t* flat_total = nullptr, bool checkpoints = false,
                           const DeviceMesh* mesh = nullptr, bool final_state = false,
                           io::CheckpointMode mode = io::CheckpointMode::async) {
  const Device device = world().device();
  const Stream stream = device.is_cpu() ? Stream() : Stream::create(device);
  stream.synchronize();
  const std::int64_t before = Storage::live_bytes(device);
  std::int64_t peak = 0;
  {
    const std::unique_ptr<CausalLm> owned = make_model(k, mesh ? &mesh->group("tp") : nullptr);
    CausalLm& model = *owned;
    model.set_recompute(Recompute::parse(k.recompute));
    if (k.bf16) amp::apply(amp::Policy::bf16(), model);
    model.to(device, stream).init(1);
    // ZeRO-3: a group per layer (and the Llama's untied head and embedding each one), as the plan assumes.
    const auto groups = k.model == Case::Model::llama || k.model == Case::Model::llama_tied
                            ? Llama::gather_groups(small_llama(k.model == Case::Model::llama_tied))
                            : std::function<std::string(const std::string&)>(Gpt::gather_group);
    ddp::DistributedDataParallel ddp(mesh ? mesh->group("dp") : world().communicator(), model,
                                     {.bucket_cap_mb = k.bucket_mb,
                                      .first_bucket_cap_mb = std::min(1.0, k.bucket_mb),
                                      .sharding = ddp::sharding_of_stage(k.zero, groups)});
    optim::AdamW optimizer(model.parameters(), {.lr = 1e-3f});
    ddp.attach(optimizer);
    if (flat_total) *flat_total = ddp.reducer().plan().total;
    const std::unique_ptr<nn::CrossEntropyLoss> loss = model.make_loss();  // tp: split as the logits
    amp::LossScaler scaler;
    const std::filesystem::path folder = shared_folder("memory_plan_checkpoints");
    std::optional<train::Run> run;
    if (checkpoints) {
      train::State state(ddp, optimizer, scaler);
      if (mesh) state.tensor_parallel = &mesh->group("tp");  // whole tensors, gathered over the group
      run.emplace(world(), state,
                  train::RunOptions{.steps = 2,
                                    .checkpoint_dir = folder.string(),
                                    .overwrite = true,
                                    .checkpoint_every = 1,
                                    .checkpoint_mode = mode,
                                    .stream = stream});
    }
    stream.synchronize();
    // A GPU backend's finished collectives let go of their tensors when its watchdog next polls
    // (every 20 ms): the set-up's broadcast holds the flat values, which ZeRO-3 (and ZeRO-1/2 in
    // half precision) then frees. Let it go before the step's peak starts counting.
    if (!device.is_cpu()) settle(device);
    // Setting up copies the parameters once (flatten): the step's peak is what the plan predicts.
    Storage::reset_peak_bytes(device);
    const std::uint32_t r = static_cast<std::uint32_t>(world().rank());
    for (std::uint32_t step = 0; run ? run->next() : step < 2; ++step) {
      const Tensor x = tokens(k.batch, small().context, 10 + r + 2 * step).to(device, stream);
      const Tensor y = tokens(k.batch, small().context, 20 + r + 2 * step).to(device, stream);
      loss->forward(ddp.forward(x), y, 1.0f, stream);
      if (run) run->add_loss(loss->loss(), 1.0f);
      EXPECT_TRUE(ddp.backward(loss->grad()));
      optimizer.step(ddp.grad_norm(1.0).coefficient);
      ddp.zero_grad();
      if (run) EXPECT_TRUE(run->end_step().checkpoint);
      stream.synchronize();
      // A real step outlasts the GPU backend's watchdog poll (20 ms), which lets go of the
      // checkpoint's finished collectives: so does this one's, before the next step counts.
      if (run && mesh && !device.is_cpu()) settle(device);
    }
    if (run) {
      const StateDict final_state = ddp.state().model_state_dict();  // COLLECTIVE under ZeRO
      EXPECT_EQ(run->finish().status, train::Outcome::Status::completed);
      EXPECT_GE(final_state.size(), model.parameters().size());
    }
    if (final_state) {  // as train_gpt's checksum: the whole model, gathered over the tp group
      StateDict whole = ddp.state().model_state_dict();  // COLLECTIVE under ZeRO
      if (mesh) whole = parallel::whole_state_dict(whole, model, mesh->group("tp"));
      EXPECT_GE(whole.size(), model.parameters().size());
    }
    peak = Storage::peak_bytes(device) - before;
    if (run && world().rank() == 0) std::filesystem::remove_all(folder);
  }
  // A GPU backend's finished collectives let go of their tensors (views of the model's flat
  // buffers) when its watchdog next polls them: wait for that, so that the next case's
  // baseline does not count this one's buffers.
  for (int i = 0; i < 10000 && Storage::live_bytes(device) > before; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(Storage::live_bytes(device), before) << "the case's tensors outlived it";
  return peak;
}

using M = Case::Model;
constexpr Case kCases[] = {
    {0, false, "none", 4},
    {0, true, "blocks", 2},
    {1, false, "mlp", 3},
    {1, true, "none", 2},
    {2, false, "every:2", 4, 0.1},
    {2, true, "attn", 3, 0.1},
    {3, false, "none", 3},
    {3, true, "blocks", 2},
    {0, false, "blocks", 2, 25.0, M::gpt_materialized},
    {0, false, "none", 4, 25.0, M::llama},
    {0, true, "blocks", 2, 25.0, M::llama},
    {1, true, "mlp", 3, 25.0, M::llama_tied},
    {2, false, "every:2", 4, 0.1, M::llama},
    {2, true, "attn", 3, 0.1, M::llama_tied},
    {3, false, "none", 3, 25.0, M::llama},
    {3, true, "blocks", 2, 25.0, M::llama},
    {3, false, "blocks", 2, 25.0, M::llama_tied},
};

TEST(MemoryPlan, WithinFivePercentOfTheMeasuredPeak) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(std::string(model_name(k)) + " zero " + std::to_string(k.zero) + (k.bf16 ? " bf16 " : " f32 ") +
                 k.recompute + " B " + std::to_string(k.batch));
    std::int64_t flat_total = 0;
    const std::int64_t measured = measured_peak(k, &flat_total);
    const MemoryPlan plan = plan_of(k, options_of(k));
    EXPECT_EQ(plan.flat_total, flat_total) << "the plan's flat plan is not DDP's";
    const double ratio = static_cast<double>(plan.total()) / static_cast<double>(measured);
    if (world().rank() == 0) {
      std::printf("memory_plan np %d %s: %-16s zero %d %s %-7s B %lld: plan %lld measured %lld ratio %.4f\n",
                  world().world_size(), world().device().str().c_str(), model_name(k), k.zero, k.bf16 ? "bf16" : "f32 ",
                  k.recompute, static_cast<long long>(k.batch), static_cast<long long>(plan.total()),
                  static_cast<long long>(measured), ratio);
    }
    EXPECT_NEAR(ratio, 1.0, 0.05) << plan.str();
  }
}

// Tensor parallelism over the whole world (dp 1): each rank holds its heads', MLP features' and
// vocabulary's slices (the embedding's and head's rows, the logits' columns); the blocks' inputs
// and outputs stay whole.
constexpr Case kTensorParallelCases[] = {
    {0, false, "none", 4, 25.0, M::gpt, 2},      {1, true, "blocks", 2, 25.0, M::gpt, 2},
    {3, false, "none", 3, 25.0, M::gpt, 2},      {0, true, "none", 3, 25.0, M::llama, 2},
    {2, false, "mlp", 2, 0.1, M::llama_tied, 2},
};

// What the planner refuses with tensor parallelism (any number of ranks).
TEST(MemoryPlan, TensorParallelRefusesWhatItCannotPlan) {
  PlanOptions o;
  o.world_size = 3;
  o.tensor_parallel = 2;  // does not divide the world
  EXPECT_THROW(memory_plan(small(), o), InvalidArgument);
  o.world_size = 2;
  o.tensor_parallel = 8;  // small() has 4 heads
  EXPECT_THROW(memory_plan(small(), o), InvalidArgument);
  o.world_size = 8;
  EXPECT_THROW(memory_plan(small(), o), InvalidArgument);
  o.tensor_parallel = 1;  // nothing to split the rows over
  o.sequence_parallel = true;
  EXPECT_THROW(memory_plan(small(), o), InvalidArgument);
}

TEST(MemoryPlan, TensorParallelWithinFivePercentOfTheMeasuredPeak) {
  // tp 2 needs two ranks: under np1 TensorParallelRefusesWhatItCannotPlan is what runs.
  if (world().world_size() != 2) return;
  const DeviceMesh mesh = world().mesh({{"dp", 1}, {"tp", 2}});
  for (const Case& k : kTensorParallelCases) {
    SCOPED_TRACE(std::string(model_name(k)) + " tp 2 zero " + std::to_string(k.zero) + (k.bf16 ? " bf16 " : " f32 ") +
                 k.recompute + " B " + std::to_string(k.batch));
    std::int64_t flat_total = 0;
    const std::int64_t measured = measured_peak(k, &flat_total, false, &mesh);
    const MemoryPlan plan = plan_of(k, options_of(k));
    EXPECT_EQ(plan.flat_total, flat_total) << "the plan's flat plan is not DDP's";
    Case whole = k;
    whole.tp = 1;
    const MemoryPlan unsplit = plan_of(whole, options_of(whole));
    // Checkpointed blocks keep only their (whole) residuals: the split layers' buffers are then
    // the recompute workspace's.
    EXPECT_LT(plan.bytes("activations") + plan.bytes("recompute workspace"),
              unsplit.bytes("activations") + unsplit.bytes("recompute workspace"))
        << "the split layers keep less";
    EXPECT_LT(plan.flat_total, unsplit.flat_total) << "each rank holds a slice";
    const double ratio = static_cast<double>(plan.total()) / static_cast<double>(measured);
    if (world().rank() == 0) {
      std::printf(
          "memory_plan tp 2 %s: %-12s zero %d %s %-6s B %lld: plan %lld measured %lld ratio %.4f (tp 1 plan %lld)\n",
          world().device().str().c_str(), model_name(k), k.zero, k.bf16 ? "bf16" : "f32 ", k.recompute,
          static_cast<long long>(k.batch), static_cast<long long>(plan.total()), static_cast<long long>(measured),
          ratio, static_cast<long long>(unsplit.total()));
    }
    EXPECT_NEAR(ratio, 1.0, 0.05) << plan.str();
  }
}

// Sequence parallelism at tp 2: the norms' and the residual stream's rows halved, the split layers'
// two shared whole-batch buffers added.
constexpr Case kSequenceParallelCases[] = {
    {0, false, "none", 4, 25.0, M::gpt, 2, true},
    {1, true, "blocks", 2, 25.0, M::gpt, 2, true},
    {3, false, "none", 3, 25.0, M::llama, 2, true},
    {2, true, "mlp", 2, 0.1, M::llama_tied, 2, true},
};

TEST(MemoryPlan, SequenceParallelWithinFivePercentOfTheMeasuredPeak) {
  if (world().world_size() != 2) return;  // tp 2 needs two ranks
  const DeviceMesh mesh = world().mesh({{"dp", 1}, {"tp", 2}});
  for (const Case& k : kSequenceParallelCases) {
    SCOPED_TRACE(std::string(model_name(k)) + " tp 2 sequence-parallel zero " + std::to_string(k.zero) +
                 (k.bf16 ? " bf16 " : " f32 ") + k.recompute + " B " + std::to_string(k.batch));
    const std::int64_t measured = measured_peak(k, nullptr, false, &mesh);
    const MemoryPlan plan = plan_of(k, options_of(k));
    Case plain = k;
    plain.sequence = false;
    const MemoryPlan without = plan_of(plain, options_of(plain));
    EXPECT_GT(plan.bytes("sequence workspace"), 0);
    EXPECT_LT(plan.bytes("activations"), without.bytes("activations")) << "the rows are split";
    const double ratio = static_cast<double>(plan.total()) / static_cast<double>(measured);
    if (world().rank() == 0) {
      std::printf(
          "memory_plan tp 2 sequence-parallel %s: %-12s zero %d %s %-6s B %lld: plan %lld measured %lld "
          "ratio %.4f (without: plan %lld)\n",
          world().device().str().c_str(), model_name(k), k.zero, k.bf16 ? "bf16" : "f32 ", k.recompute,
          static_cast<long long>(k.batch), static_cast<long long>(plan.total()), static_cast<long long>(measured),
          ratio, static_cast<long long>(without.total()));
    }
    EXPECT_NEAR(ratio, 1.0, 0.05) << plan.str();
  }
}

// The final state dict at tp 2 (train_gpt's checksum): model_state_dict, then whole_state_dict
// over the group, which on the CPU keeps the whole tensors in the device's (host) memory; and with
// a train::Run writing a checkpoint after each step (State::tensor_parallel: the model's and the
// optimizer's state gathered whole over the group). The writer is the sync one: an async write
// keeps the gathered whole tensors until the file is written, and on a loaded machine step 1's
// write was still in flight at step 2's peak in 1 run of 8-12 (0.5-1.4 MB above the plan, 8-18% of
// this small model's peak), which the plan's between-step row does not count.
TEST(MemoryPlan, TensorParallelGathersWithinFivePercentOfTheMeasuredPeak) {
  if (world().world_size() != 2) return;  // tp 2 needs two ranks
  const DeviceMesh mesh = world().mesh({{"dp", 1}, {"tp", 2}});
  for (const bool checkpoints : {false, true}) {
    for (const Case& k : {kTensorParallelCases[0], kTensorParallelCases[2], kTensorParallelCases[3]}) {
      SCOPED_TRACE(std::string(model_name(k)) + " tp 2 zero " + std::to_string(k.zero) + " with the final gather" +
                   (checkpoints ? " and checkpoints" : ""));
      const std::int64_t measured = measured_peak(k, nullptr, checkpoints, &mesh, true, io::CheckpointMode::sync);
      PlanOptions o = options_of(k);
      o.state_dict = true;
      o.cpu = world().device().is_cpu();
      if (checkpoints) o.checkpoint = PlanOptions::Checkpoint::sync;
      const MemoryPlan plan = plan_of(k, o);
      if (o.cpu) EXPECT_GT(plan.total(), plan_of(k, options_of(k)).total()) << "the gathers set the CPU's peak";
      const double ratio = static_cast<double>(plan.total()) / static_cast<double>(measured);
      if (world().rank() == 0) {
        std::printf("memory_plan tp 2 + final gather%s %s: %-12s zero %d: plan %lld measured %lld ratio %.4f\n",
                    checkpoints ? " + checkpoints" : "", world().device().str().c_str(), model_name(k), k.zero,
                    static_cast<long long>(plan.total()), static_cast<long long>(measured), ratio);
      }
      if (checkpoints && !o.cpu) {
        // Whether the model's gathered batches are let go before the optimizer's gather is the
        // watchdog's timing: the plan counts both (about 11% of this model's peak).
        EXPECT_GE(ratio, 0.999) << plan.str();
        EXPECT_LE(ratio, 1.15) << plan.str();
      } else {
        EXPECT_NEAR(ratio, 1.0, 0.05) << plan.str();
      }
    }
  }
}

// Any model of tutti's layers: an MLP (Linear, ReLU, GELU, LayerNorm, Dropout) and a CNN (Conv2d,
// ReLU, MaxPool2d, Flatten, Linear: train_fashion_mnist's shape, smaller), planned by each layer's
// own statement (Module::buffer_bytes) and DDP's, against the allocator over two steps, every
// ZeRO stage, f32 and bf16.
std::unique_ptr<nn::Sequential> small_module(bool cnn) {
  auto m = std::make_unique<nn::Sequential>();
  if (cnn) {
    const nn::Conv2dOptions same{.padding = 1};
    m->add<nn::Conv2d>(1, 4, 3, same).add<nn::ReLU>().add<nn::MaxPool2d>();
    m->add<nn::Conv2d>(4, 8, 3, same).add<nn::ReLU>().add<nn::MaxPool2d>();
    m->add<nn::Flatten>().add<nn::Linear>(8 * 4 * 4, 32).add<nn::ReLU>().add<nn::Linear>(32, 10);
  } else {
    m->add<nn::Linear>(48, 96).add<nn::ReLU>().add<nn::Linear>(96, 96).add<nn::GELU>();
    m->add<nn::LayerNorm>(96).add<nn::Dropout>(0.1f).add<nn::Linear>(96, 10);
  }
  return m;
}

Shape sample_of(bool cnn) { return cnn ? Shape{1, 16, 16} : Shape{48}; }

std::int64_t measured_module_peak(bool cnn, int zero, bool bf16, std::int64_t batch) {
  const Device device = world().device();
  const Stream stream = device.is_cpu() ? Stream() : Stream::create(device);
  const std::int64_t before = Storage::live_bytes(device);
  std::int64_t peak = 0;
  {
    const std::unique_ptr<nn::Sequential> model = small_module(cnn);
    if (bf16) amp::apply(amp::Policy::bf16(), *model);
    model->to(device, stream).init(1);
    ddp::DistributedDataParallel ddp(
        world().communicator(), *model,
        {.bucket_cap_mb = 0.01, .first_bucket_cap_mb = 0.01, .sharding = ddp::sharding_of_stage(zero)});
    optim::AdamW optimizer(model->parameters(), {.lr = 1e-3f});
    ddp.attach(optimizer);
    nn::CrossEntropyLoss loss;
    stream.synchronize();
    if (!device.is_cpu()) settle(device);
    Storage::reset_peak_bytes(device);
    std::mt19937 rng(7 + world().rank());
    std::uniform_real_distribution<float> u(-1, 1);
    Shape input{batch};
    for (const std::int64_t d : sample_of(cnn)) input.push_back(d);
    for (int step = 0; step < 2; ++step) {
      std::vector<float> x(static_cast<std::size_t>(numel_of(input)));
      for (float& v : x) v = u(rng);
      std::vector<std::int64_t> y(static_cast<std::size_t>(batch));
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int64_t>((i * 3 + step) % 10);
      // On the CPU the host tensors are the batch (a copy would count twice).
      Tensor xs = Tensor::from_floats(x, input), ys = Tensor::from_ints(y, {batch}, DType::i64);
      if (!device.is_cpu()) xs = xs.to(device, stream), ys = ys.to(device, stream);
      loss.forward(ddp.forward(xs), ys, 1.0f, stream);
      EXPECT_TRUE(ddp.backward(loss.grad()));
      optimizer.step(ddp.grad_norm(1.0).coefficient);
      ddp.zero_grad();
      stream.synchronize();
    }
    peak = Storage::peak_bytes(device) - before;
  }
  for (int i = 0; i < 10000 && Storage::live_bytes(device) > before; ++i) std::this_thread::sleep_for(1ms);
  return peak;
}

TEST(ModulePlan, AnMlpAndACnnWithinFivePercentOfTheMeasuredPeak) {
  for (const bool cnn : {false, true}) {
    for (const int zero : {0, 1, 2, 3}) {
      for (const bool bf16 : {false, true}) {
        const char* name = cnn ? "CNN" : "MLP";
        SCOPED_TRACE(std::string(name) + " zero " + std::to_string(zero) + (bf16 ? " bf16" : " f32"));
        const std::int64_t batch = 16, measured = measured_module_peak(cnn, zero, bf16, batch);
        PlanOptions o;
        o.world_size = world().world_size();
        o.zero_stage = zero;
        if (bf16) {
          const amp::Policy p = amp::Policy::bf16();
          o.compute = p.compute;
          o.grad = p.grad;
          o.grad_comm = p.comm;
        }
        o.micro_batch = batch;
        o.bucket_cap_mb = o.first_bucket_cap_mb = 0.01;
        const std::unique_ptr<nn::Sequential> model = small_module(cnn);
        if (bf16) amp::apply(amp::Policy::bf16(), *model);
        const MemoryPlan plan = memory_plan(*model, sample_of(cnn), o);
        const double ratio = static_cast<double>(plan.total()) / static_cast<double>(measured);
        if (world().rank() == 0) {
          std::printf("memory_plan %s np %d %s: zero %d %s: plan %lld measured %lld ratio %.4f\n", name,
                      world().world_size(), world().device().str().c_str(), zero, bf16 ? "bf16" : "f32 ",
                      static_cast<long long>(plan.total()), static_cast<long long>(measured), ratio);
        }
        EXPECT_NEAR(ratio, 1.0, 0.05) << plan.str();
      }
    }
  }
  // A layer that does not state its buffers is named, not guessed at.
  class Opaque : public nn::Module {
   public:
    std::string describe() const override { return "Opaque"; }

   protected:
    Tensor forward_impl(const Tensor& x) override { return x; }
    Tensor backward_impl(const Tensor& dy) override { return dy; }
  };
  nn::Sequential unknown;
  unknown.add<nn::Linear>(4, 4).add<Opaque>();
  try {
    memory_plan(unknown, {4}, PlanOptions{});
    ADD_FAILURE() << "a layer without a statement was planned";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Opaque does not state its buffers"), std::string::npos) << e.what();
  }
}

// With checkpoints and a final state dict: on the CPU the host copies are the device's memory
// (the async writer's buffers at stage 0, ZeRO's gathered state until it is written), on the
// emulated GPU only ZeRO's gathers are.
constexpr Case kCheckpointCases[] = {
    {0, false, "none", 4},
    {1, true, "none", 2},
    {2, false, "every:2", 4, 0.1},
    {3, false, "none", 3},
    {3, true, "blocks", 2, 25.0, M::llama},
};

TEST(MemoryPlan, WithCheckpointsWithinFivePercentOfTheMeasuredPeak) {
  for (const Case& k : kCheckpointCases) {
    SCOPED_TRACE(std::string(model_name(k)) + " zero " + std::to_string(k.zero) + (k.bf16 ? " bf16 " : " f32 ") +
                 k.recompute + " B " + std::to_string(k.batch) + " with checkpoints");
    const std::int64_t measured = measured_peak(k, nullptr, true);
    PlanOptions o = options_of(k);
    o.state_dict = true;
    o.cpu = world().device().is_cpu();
    o.checkpoint = PlanOptions::Checkpoint::async;
    const MemoryPlan plan = plan_of(k, o);
    // Not the steps alone, except on a GPU where a rank's values are whole already (stage 0,
    // and ZeRO-1/2 of f32 on one rank): the writer copies them to host memory.
    const bool gathers = k.zero > 0 && (world().world_size() > 1 || k.bf16 || k.zero == 3);
    if (o.cpu || gathers)
      EXPECT_GT(plan.total(), plan_of(k, options_of(k)).total());
    else
      EXPECT_EQ(plan.total(), plan_of(k, options_of(k)).total());
    const double ratio = static_cast<double>(plan.total()) / static_cast<double>(measured);
    if (world().rank() == 0) {
      std::printf(
          "memory_plan with checkpoints np %d %s: %-10s zero %d %s %-7s B %lld: plan %lld measured %lld "
          "ratio %.4f\n",
          world().world_size(), world().device().str().c_str(), model_name(k), k.zero, k.bf16 ? "bf16" : "f32 ",
          k.recompute, static_cast<long long>(k.batch), static_cast<long long>(plan.total()),
          static_cast<long long>(measured), ratio);
    }
    // The plan is the rank that writes: rank 0. The others hold no writer's buffers, and drop a
    // gathered state at once: for them the plan is a bound.
    if (world().rank() == 0)
      EXPECT_NEAR(ratio, 1.0, 0.05) << plan.str();
    else
      EXPECT_GT(ratio, 0.95) << plan.str();
  }
}

TEST(MemoryPlan, RowsFollowTheOptions) {
  const GptConfig c = GptConfig::preset("gpt2-124m");
  PlanOptions o;
  o.world_size = 4;
  o.micro_batch = 8;
  const MemoryPlan f32 = memory_plan(c, o);
  EXPECT_GE(f32.flat_total, c.parameter_count());
  EXPECT_EQ(f32.bytes("parameters"), 4 * f32.flat_total);
  EXPECT_EQ(f32.bytes("optimizer state"), 8 * f32.flat_total);
  // ZeRO-1 shards the optimizer state over the ranks, ZeRO-2 the gradients too.
  o.zero_stage = 1;
  const MemoryPlan z1 = memory_plan(c, o);
  EXPECT_EQ(z1.bytes("optimizer state"), 8 * z1.shard);
  EXPECT_EQ(z1.shard * 4, z1.flat_total);
  o.zero_stage = 2;
  const MemoryPlan z2 = memory_plan(c, o);
  EXPECT_EQ(z2.bytes("gradients"), 4 * z2.shard);
  EXPECT_LT(z2.bytes("gradients"), z1.bytes("gradients"));
  // ...but its pool of bucket buffers is sized by the largest bucket (the tied embedding's).
  EXPECT_GE(z2.bytes("communication buffers"), 2 * 4 * c.padded_vocab * c.width);
  EXPECT_LT(z1.total(), f32.total());
  // ZeRO-3 shards the parameters too, and holds two layers and the resident group whole (the
  // embeddings, ln_f): 12·C² + 13·C elements a layer (+ padding), V·C + T·C + 2·C resident.
  o.zero_stage = 3;
  const MemoryPlan z3 = memory_plan(c, o);
  EXPECT_EQ(z3.bytes("parameters"), 4 * z3.shard);
  EXPECT_EQ(z3.bytes("gradients"), 4 * z3.shard);
  const std::int64_t layer = 12 * c.width * c.width + 13 * c.width;
  const std::int64_t resident = (c.padded_vocab + c.context + 2) * c.width;
  EXPECT_GE(z3.bytes("gathered parameters"), 4 * (2 * layer + resident));
  EXPECT_LE(z3.bytes("gathered parameters"), 4 * (2 * layer + resident) + 4 * 3 * 8 * 4);
  EXPECT_EQ(z2.bytes("gathered parameters"), 0);
  EXPECT_LT(z3.total(), z2.total());
  // Recomputing every block keeps at most a third of the activations (issue 24's target, T 1024,
  // set with the attention that keeps its T x T probabilities).
  GptConfig materialized = c;
  materialized.attention = nn::AttentionKernel::materialized;
  const MemoryPlan kept_all = memory_plan(materialized, o);
  o.recompute = Recompute::parse("blocks");
  const MemoryPlan blocks_materialized = memory_plan(materialized, o);
  const double kept =
      static_cast<double>(blocks_materialized.bytes("activations") + blocks_materialized.bytes("recompute workspace") +
                          blocks_materialized.bytes("logits")) /
      static_cast<double>(kept_all.bytes("activations") + kept_all.bytes("logits"));
  EXPECT_LT(kept, 1.0 / 3.0);
  // The tiled kernel keeps a log-sum-exp per query instead: at T 1024 the activations without
  // recomputation shrink by the probabilities, 12 layers x B·H·T² elements.
  const std::int64_t probs = std::int64_t{12} * 8 * 12 * 1024 * 1024 * 4;
  EXPECT_EQ(kept_all.bytes("activations") - z2.bytes("activations"), probs - std::int64_t{12} * 8 * 12 * 1024 * 4);
  const MemoryPlan blocks = memory_plan(c, o);
  EXPECT_GT(blocks.bytes("recompute workspace"), 0);
  EXPECT_LT(blocks.bytes("recompute workspace"), blocks_materialized.bytes("recompute workspace"));
  // The activations scale with the micro-batch; the parameters do not.
  o.micro_batch = 16;
  const MemoryPlan twice = memory_plan(c, o);
  EXPECT_EQ(twice.bytes("activations"), 2 * blocks.bytes("activations"));
  EXPECT_EQ(twice.bytes("parameters"), blocks.bytes("parameters"));
  o.recompute.every = 13;
  o.recompute.mode = Recompute::Mode::every;
  EXPECT_THROW(memory_plan(c, o), InvalidArgument);
}

TEST(MemoryPlan, BetweenStepRowsAddToTheSteadyState) {
  PlanOptions o;
  o.compute = o.grad_comm = DType::bf16;
  o.world_size = 2;
  o.zero_stage = 1;
  o.micro_batch = 2;
  o.recompute = Recompute::parse("blocks");
  const MemoryPlan step = memory_plan(small(), o);
  EXPECT_GT(step.first_step_extra, 0);
  EXPECT_EQ(step.total(), step.step_total());
  o.evaluation = o.state_dict = true;
  const MemoryPlan both = memory_plan(small(), o);
  EXPECT_EQ(both.step_total(), step.step_total());
  EXPECT_EQ(both.bytes("state dict"), 4 * both.flat_total);  // ZeRO-1 in bf16 gathers the f32 values
  EXPECT_EQ(both.total(), std::max(step.total(), step.total() - step.first_step_extra + both.bytes("state dict")));
  o.zero_stage = 0;
  EXPECT_EQ(memory_plan(small(), o).bytes("state dict"), 0);  // whole on every rank already
}

TEST(MemoryPlan, LargestMicroBatchAndAdvice) {
  const GptConfig c = GptConfig::preset("gpt2-1558m");
  PlanOptions o;
  o.compute = o.grad_comm = DType::bf16;
  o.gpu = true;
  const std::int64_t h200 = parse_bytes("141GB");
  const std::int64_t b = largest_micro_batch(c, o, h200);
  ASSERT_GE(b, 1);
  o.micro_batch = b;
  EXPECT_LE(memory_plan(c, o).total(), h200);
  EXPECT_EQ(fit_advice(c, o, h200), "");
  o.micro_batch = b + 1;
  EXPECT_GT(memory_plan(c, o).total(), h200);
  const std::string advice = fit_advice(c, o, h200);
  for (const char* what : {"does not fit", "micro-batch", "--recompute blocks", "--zero 1", "ranks"}) {
    EXPECT_NE(advice.find(what), std::string::npos) << what << " in\n" << advice;
  }
  // Recomputation lets a larger micro-batch fit.
  o.recompute = Recompute::parse("blocks");
  EXPECT_GT(largest_micro_batch(c, o, h200), b);
}

TEST(MemoryPlan, ParseBytes) {
  EXPECT_EQ(parse_bytes("141GB"), 141'000'000'000);
  EXPECT_EQ(parse_bytes("80 GiB"), 80LL << 30);
  EXPECT_EQ(parse_bytes("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_bytes("1.5TB"), 1'500'000'000'000);
  EXPECT_EQ(parse_bytes("4096"), 4096);
  EXPECT_THROW(parse_bytes("lots"), InvalidArgument);
  EXPECT_THROW(parse_bytes("12 parsecs"), InvalidArgument);
}

}  // namespace
}  // namespace tutti::train

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv, "auto"); }
