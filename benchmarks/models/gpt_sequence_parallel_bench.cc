// gpt_sequence_parallel_bench: what sequence parallelism (TensorParallelOptions::sequence_parallel)
// saves in memory and costs in time against tensor parallelism alone, on a GPT split over every
// rank of the job, side by side in one run.
//
//   mpirun -np 2 build/benchmarks/models/gpt_sequence_parallel_bench                 # gpt-tiny
//   mpirun -np 4 build/benchmarks/models/gpt_sequence_parallel_bench --layers 6 --width 512 --heads 8
//   mpirun -np 2 build/benchmarks/models/gpt_sequence_parallel_bench --device cuda --precision bf16
//
// Every rank builds both models (models::Gpt(config, the world as the tensor-parallel group,
// {.sequence_parallel = false / true}), the same seed) with AdamW, and trains them on the same
// random tokens (a tensor-parallel group reads one batch). Memory: each model's first step (its
// gradients and the optimizer's state allocated, every layer's buffers made) is measured alone:
// the allocator's peak over it (tutti::Storage::peak_bytes) above what the built model held;
// the two share the parameters', gradients' and optimizer's bytes, so their difference is the
// activations'. Then --steps steps, the two taking turns step by step with the ranks lined up
// (a barrier) before each, so that a slower moment of a shared machine falls on both alike; a
// step is forward, the split loss, backward, the optimizer's step and zero_grad, the device
// synchronized. Rank 0 prints the median step time, its ratio to tensor parallelism alone as
// the ratio of the medians and as the median of each round's ratio (paired), and both memory
// figures. Both models' losses after the steps are printed too: they agree up to the order of
// the sums.
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

#include "common/gpt.h"
#include "common/stats.h"

namespace {

using namespace tutti;
using Clock = std::chrono::steady_clock;

struct Flags {
  bench::GptShape shape;  // --model, --layers, --width, --heads
  std::int64_t seq_len = 128;
  std::int64_t batch = 8;  // sequences of the tensor-parallel group
  int steps = 10;
  std::string device = "auto";
  std::string precision = "f32";
  std::string json;
};

struct Subject {
  bool sequence_parallel = false;
  std::unique_ptr<models::Gpt> model;
  std::unique_ptr<optim::AdamW> optimizer;
  std::unique_ptr<nn::CrossEntropyLoss> loss;
  std::int64_t first_step_bytes = 0;  // the first step's peak above what the built model held
  std::vector<double> step_s;
  double last_loss = 0;
};

void step(Subject& s, const Tensor& x, const Tensor& y, const Stream& stream) {
  s.loss->forward(s.model->forward(x), y, 1.0f, stream);
  s.model->backward(s.loss->grad());
  s.optimizer->step();
  s.model->zero_grad();
  stream.synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"sequence parallelism against tensor parallelism alone on a GPT: memory and step time, side by side"};
  bench::add_gpt_shape_options(app, f.shape);
  app.add_option("--seq-len", f.seq_len, "tokens per sequence (T)")->capture_default_str();
  app.add_option("--batch", f.batch, "sequences per step of the tensor-parallel group (B)")->capture_default_str();
  app.add_option("--steps", f.steps, "timed steps per model")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--device", f.device, "cpu, cuda or auto (JobOptions::device)")->capture_default_str();
  app.add_option("--precision", f.precision, "f32 or bf16 (compute; gradients f32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--json", f.json, "also write the results here (rank 0)");
  CLI11_PARSE(app, argc, argv);
  try {
    JobOptions jo;
    jo.device = f.device;
    Job job(argc, argv, jo);
    const models::GptConfig config = bench::gpt_config(f.shape);
    const int tp = job.world_size();
    TUTTI_CHECK_ARG(tp >= 2,
                    "gpt_sequence_parallel_bench: run it on 2 or more ranks (mpirun -np 2): the world is "
                    "the tensor-parallel group");
    TUTTI_CHECK_ARG(f.seq_len >= 1 && f.seq_len <= config.context && f.batch >= 1 && (f.batch * f.seq_len) % tp == 0,
                    "--seq-len ", f.seq_len, " must be in [1, ", config.context, "], --batch ", f.batch,
                    " positive, and their rows must divide by the ", tp, " ranks");
    const Device device = job.device();
    const Stream stream = device.is_cuda() ? Stream::create(device) : Stream();
    const amp::Policy policy = f.precision == "bf16" ? amp::Policy::bf16() : amp::Policy::fp32();
    // One batch for the group: every rank the same tokens.
    const Tensor x = bench::random_tokens(f.batch, f.seq_len, config.vocab, 1).to(device, stream);
    const Tensor y = bench::random_tokens(f.batch, f.seq_len, config.vocab, 2).to(device, stream);
    Communicator& group = job.communicator();
    std::vector<Subject> subjects;
    for (const bool sequence_parallel : {false, true}) {
      Subject s;
      s.sequence_parallel = sequence_parallel;
      s.model = std::make_unique<models::Gpt>(config, group, models::TensorParallelOptions{sequence_parallel});
      amp::apply(policy, *s.model);
      s.model->to(device, stream).init(1);
      s.optimizer = std::make_unique<optim::AdamW>(optim::weight_decay_groups(s.model->parameters(), 0.1f),
                                                   optim::AdamWOptions{.lr = 1e-4f});
      s.loss = s.model->make_loss();
      stream.synchronize();
      const std::int64_t held = Storage::live_bytes(device);
      Storage::reset_peak_bytes(device);
      step(s, x, y, stream);  // also the warm-up: buffers, gradients, the optimizer's state
      s.first_step_bytes = Storage::peak_bytes(device) - held;
      subjects.push_back(std::move(s));
    }
    for (int i = 0; i < f.steps; ++i) {
      for (Subject& s : subjects) {
        job.cpu_communicator().barrier().wait();
        const auto t0 = Clock::now();
        step(s, x, y, stream);
        s.step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        s.last_loss = nn::item(s.loss->loss());
      }
    }
    if (job.rank() != 0) return 0;
    std::printf(
        "gpt_sequence_parallel_bench: %s (%s), tp %d, %s %s, B %lld x T %lld per group, %d timed steps each "
        "(medians)\n",
        f.shape.model.c_str(), config.fingerprint().c_str(), tp, device.str().c_str(), f.precision.c_str(),
        static_cast<long long>(f.batch), static_cast<long long>(f.seq_len), f.steps);
    std::printf("%-20s %16s %9s %9s %9s %9s %12s\n", "model", "1st step bytes", "x bytes", "step s", "x step",
                "x paired", "last loss");
    nlohmann::json out = nlohmann::json::array();
    const Subject& base = subjects.front();
    for (const Subject& s : subjects) {
      const double st = bench::median(s.step_s);
      std::vector<double> pairs;
      for (std::size_t i = 0; i < s.step_s.size(); ++i) pairs.push_back(s.step_s[i] / base.step_s[i]);
      const double bytes_ratio = static_cast<double>(s.first_step_bytes) / static_cast<double>(base.first_step_bytes);
      const char* name = s.sequence_parallel ? "tp + sequence" : "tp";
      std::printf("%-20s %16lld %9.3f %9.4f %9.3f %9.3f %12.6f\n", name, static_cast<long long>(s.first_step_bytes),
                  bytes_ratio, st, st / bench::median(base.step_s), bench::median(pairs), s.last_loss);
      out.push_back({{"sequence_parallel", s.sequence_parallel},
                     {"first_step_bytes", s.first_step_bytes},
                     {"bytes_ratio", bytes_ratio},
                     {"step_s_median", st},
                     {"step_ratio", st / bench::median(base.step_s)},
                     {"step_ratio_paired", bench::median(pairs)},
                     {"last_loss", s.last_loss},
                     {"step_s", s.step_s}});
    }
    if (!f.json.empty()) {
      std::ofstream(f.json) << nlohmann::json{{"model", f.shape.model},
                                              {"config", config.fingerprint()},
                                              {"tp", tp},
                                              {"precision", f.precision},
                                              {"results", out}}
                                   .dump(2)
                            << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_sequence_parallel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
