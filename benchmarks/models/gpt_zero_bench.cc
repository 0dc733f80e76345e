// gpt_zero_bench: what ZeRO-3 saves in memory and costs in time against ZeRO-2 (or any stages),
// on a GPT, stages side by side in one run.
//
//   mpirun -np 2 build/benchmarks/models/gpt_zero_bench                        # gpt-tiny, stages 2,3
//   mpirun -np 2 build/benchmarks/models/gpt_zero_bench --layers 6 --width 512 --heads 8 --seq-len 64
//   mpirun -np 4 build/benchmarks/models/gpt_zero_bench --steps 1              # memory at N = 4
//
// For each stage (--stages) every rank builds the same Gpt (Gpt::gather_group: a ZeRO-3 group
// per transformer layer) under DistributedDataParallel with AdamW attached, and trains it on
// its own random tokens: one untimed warm-up step, then --steps steps, the stages taking turns
// step by step with the ranks lined up (a barrier) before each, so that a slower moment of a
// shared machine falls on all of them alike. A step is forward, backward (with its
// reduce-scatters), the gradient norm, the optimizer's step and zero_grad, the device
// synchronized. Rank 0 prints the median step time per stage, its ratio to the first stage's as
// the ratio of the medians and as the median of each round's ratio (paired), the median time
// the step waited for parameter gathers (StepStats::exposed_gather_ms: what prefetch did not
// hide; at stages 1-2 the waits for the last step's all-gathers), and the bytes per
// parameter this rank holds (DdpMemory: parameters, master weights, gathered parameters,
// gradients, optimizer state; and, apart, the communication buffers).
#include <tutti/tutti.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/gpt.h"
#include "common/stats.h"

namespace {

using namespace tutti;
using Clock = std::chrono::steady_clock;

struct Flags {
  bench::GptShape shape;  // --model, --layers, --width, --heads
  std::int64_t seq_len = 128;
  std::int64_t batch = 8;  // sequences per rank
  int steps = 10;
  std::string stages = "2,3";
  std::string device = "auto";
  std::string precision = "f32";
  std::string json;
};

struct Subject {
  int stage = 0;
  std::unique_ptr<models::Gpt> model;
  std::unique_ptr<ddp::DistributedDataParallel> ddp;
  std::unique_ptr<optim::AdamW> optimizer;
  nn::CrossEntropyLoss loss;
  std::vector<double> step_s;
  std::vector<double> wait_ms;  // StepStats::exposed_gather_ms: gathers prefetch did not hide
};

void step(Subject& s, const Tensor& x, const Tensor& y, const Stream& stream) {
  s.loss.forward(s.ddp->forward(x), y, 1.0f, stream);
  s.ddp->backward(s.loss.grad());
  s.optimizer->step(s.ddp->grad_norm(1.0).coefficient);
  s.ddp->zero_grad();
  stream.synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"ZeRO-3 against ZeRO-2 on a GPT: bytes per parameter and step time, side by side"};
  bench::add_gpt_shape_options(app, f.shape);
  app.add_option("--seq-len", f.seq_len, "tokens per sequence (T)")->capture_default_str();
  app.add_option("--batch", f.batch, "sequences per rank per step (B)")->capture_default_str();
  app.add_option("--steps", f.steps, "timed steps per stage")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--stages", f.stages, "comma-separated ZeRO stages; ratios are to the first")->capture_default_str();
  app.add_option("--device", f.device, "cpu, cuda or auto (JobOptions::device)")->capture_default_str();
  app.add_option("--precision", f.precision, "f32 or bf16 (compute; gradients f32, sent as bf16)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--json", f.json, "also write the results here (rank 0)");
  CLI11_PARSE(app, argc, argv);
  try {
    JobOptions jo;
    jo.device = f.device;
    Job job(argc, argv, jo);
    const models::GptConfig config = bench::gpt_config(f.shape);
    TUTTI_CHECK_ARG(f.seq_len >= 1 && f.seq_len <= config.context && f.batch >= 1, "--seq-len ", f.seq_len,
                    " must be in [1, ", config.context, "] and --batch ", f.batch, " positive");
    const Device device = job.device();
    const Stream stream = device.is_cuda() ? Stream::create(device) : Stream();
    const amp::Policy policy = f.precision == "bf16" ? amp::Policy::bf16() : amp::Policy::fp32();
    const auto r = static_cast<std::uint32_t>(job.rank());
    const Tensor x = bench::random_tokens(f.batch, f.seq_len, config.vocab, 1 + 2 * r).to(device, stream);
    const Tensor y = bench::random_tokens(f.batch, f.seq_len, config.vocab, 2 + 2 * r).to(device, stream);
    std::vector<Subject> subjects;
    for (const std::string& text : bench::split_commas(f.stages)) {
      Subject s;
      s.stage = std::stoi(text);
      s.model = std::make_unique<models::Gpt>(config);
      amp::apply(policy, *s.model);
      s.model->to(device, stream).init(1);
      ddp::DdpOptions o;
      o.sharding = ddp::sharding_of_stage(s.stage, models::Gpt::gather_group);
      s.ddp = std::make_unique<ddp::DistributedDataParallel>(job.communicator(), *s.model, o);
      s.optimizer = std::make_unique<optim::AdamW>(optim::weight_decay_groups(s.model->parameters(), 0.1f),
                                                   optim::AdamWOptions{.lr = 1e-4f});
      s.ddp->attach(*s.optimizer);
      step(s, x, y, stream);  // warm-up: buffers, the optimizer's state
      subjects.push_back(std::move(s));
    }
    for (int i = 0; i < f.steps; ++i) {
      for (Subject& s : subjects) {
        job.cpu_communicator().barrier().wait();
        const auto t0 = Clock::now();
        step(s, x, y, stream);
        s.step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        s.wait_ms.push_back(s.ddp->reducer().last_stats().exposed_gather_ms);
      }
    }
    if (job.rank() != 0) return 0;
    const double n_params = static_cast<double>(config.parameter_count());
    std::printf(
        "gpt_zero_bench: %s (%s, %lld parameters), %d rank(s), %s %s, B %lld x T %lld per rank, %d timed "
        "steps per stage (medians)\n",
        f.shape.model.c_str(), config.fingerprint().c_str(), static_cast<long long>(config.parameter_count()),
        job.world_size(), device.str().c_str(), f.precision.c_str(), static_cast<long long>(f.batch),
        static_cast<long long>(f.seq_len), f.steps);
    std::printf("%-6s %10s %10s %10s %10s %10s %10s %10s %9s %9s %9s %9s\n", "stage", "params B/p", "master",
                "gathered", "grads", "optimizer", "sum B/p", "comm B/p", "step s", "x step", "x paired", "wait ms");
    nlohmann::json out = nlohmann::json::array();
    const double base = bench::median(subjects.front().step_s);
    for (const Subject& s : subjects) {
      const ddp::DdpMemory m = s.ddp->memory();
      auto per = [&](std::int64_t b) { return static_cast<double>(b) / n_params; };
      const std::int64_t sum = m.parameters + m.master_weights + m.gathered + m.gradients + m.optimizer_state;
      const double st = bench::median(s.step_s);
      std::vector<double> pairs;
      for (std::size_t i = 0; i < s.step_s.size(); ++i) pairs.push_back(s.step_s[i] / subjects.front().step_s[i]);
      const double paired = bench::median(pairs);
      std::printf("%-6d %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %9.4f %9.3f %9.3f %9.2f\n", s.stage,
                  per(m.parameters), per(m.master_weights), per(m.gathered), per(m.gradients), per(m.optimizer_state),
                  per(sum), per(m.communication), st, st / base, paired, bench::median(s.wait_ms));
      out.push_back({{"stage", s.stage},
                     {"parameters", m.parameters},
                     {"master_weights", m.master_weights},
                     {"gathered", m.gathered},
                     {"gradients", m.gradients},
                     {"optimizer_state", m.optimizer_state},
                     {"communication", m.communication},
                     {"bytes_per_parameter", per(sum)},
                     {"step_s_median", st},
                     {"step_ratio", st / base},
                     {"step_ratio_paired", paired},
                     {"exposed_gather_ms_median", bench::median(s.wait_ms)},
                     {"step_s", s.step_s}});
    }
    if (!f.json.empty()) {
      std::ofstream(f.json) << nlohmann::json{{"model", f.shape.model},
                                              {"config", config.fingerprint()},
                                              {"world_size", job.world_size()},
                                              {"precision", f.precision},
                                              {"results", out}}
                                   .dump(2)
                            << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_zero_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
