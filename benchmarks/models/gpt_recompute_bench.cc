// gpt_recompute_bench: what activation checkpointing (models::Gpt::set_recompute) saves and
// costs, policies side by side in one run.
//
//   build/benchmarks/models/gpt_recompute_bench                                  # gpt-tiny, T 128
//   build/benchmarks/models/gpt_recompute_bench --model gpt2-124m --seq-len 256 --batch 1 --steps 3
//   build/benchmarks/models/gpt_recompute_bench --device cuda --model gpt2-124m --seq-len 1024 --batch 8
//
// For each policy (--policies, default none,blocks,mlp) it builds a fresh model (same seed),
// allocates its gradients, and measures its first forward and backward: the activation bytes
// are the allocator's peak over that step (tutti::Storage::peak_bytes) minus the bytes held
// before it (parameters, gradients), i.e. every buffer the layers keep for backward, the
// logits and their gradient, and the recomputation's workspace. Then every model trains
// --steps steps of AdamW (one untimed warm-up step first), the policies taking turns step by
// step, so that a slower moment of a shared machine falls on all of them alike; a step's time
// is its forward, backward and optimizer step with the device synchronized. The table gives
// the median step time, and both figures as ratios to the first policy's: the step's as the
// ratio of the medians and as the median of each round's ratio (paired: the steps of one round
// ran back to back, so the pairs cancel most of another process's load).
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
  bench::GptShape shape;  // --model, --layers
  std::int64_t seq_len = 128;
  std::int64_t batch = 4;
  int steps = 5;
  std::string policies = "none,blocks,mlp";
  std::string device = "cpu";
  std::string precision = "f32";
  std::string json;
};

struct Subject {
  std::string policy;
  std::unique_ptr<models::Gpt> model;
  std::unique_ptr<optim::AdamW> optimizer;
  nn::CrossEntropyLoss loss;  // its buffers (the logits' gradient) reused, as a trainer does
  std::int64_t activation_bytes = 0;
  std::int64_t workspace_bytes = 0;
  std::vector<double> step_s;
};

void step(Subject& s, const Tensor& x, const Tensor& y, const Stream& stream, bool optimize) {
  s.loss.forward(s.model->forward(x), y, 1.0f, stream);
  s.model->backward(s.loss.grad());
  if (optimize) {
    s.optimizer->step();
    s.model->zero_grad();
  }
  stream.synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Activation checkpointing of a GPT: activation bytes and step time per recompute policy"};
  bench::add_gpt_shape_options(app, f.shape, /*all=*/false);
  app.add_option("--seq-len", f.seq_len, "tokens per sequence (T)")->capture_default_str();
  app.add_option("--batch", f.batch, "sequences per step (B)")->capture_default_str();
  app.add_option("--steps", f.steps, "timed steps per policy")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--policies", f.policies, "comma-separated Recompute policies; ratios are to the first")
      ->capture_default_str();
  app.add_option("--device", f.device, "cpu or cuda[:N]")->capture_default_str();
  app.add_option("--precision", f.precision, "f32 or bf16 (activations and compute)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--json", f.json, "also write the results here");
  CLI11_PARSE(app, argc, argv);
  try {
    const models::GptConfig config = bench::gpt_config(f.shape);
    TUTTI_CHECK_ARG(f.seq_len >= 1 && f.seq_len <= config.context && f.batch >= 1, "--seq-len ", f.seq_len,
                    " must be in [1, ", config.context, "] and --batch ", f.batch, " positive");
    const Device device = Device::parse(f.device);
    device.require_available();
    const Stream stream = device.is_cuda() ? Stream::create(device) : Stream();
    const DType dtype = f.precision == "bf16" ? DType::bf16 : DType::f32;
    const Tensor x = bench::random_tokens(f.batch, f.seq_len, config.vocab, 1).to(device, stream);
    const Tensor y = bench::random_tokens(f.batch, f.seq_len, config.vocab, 2).to(device, stream);
    std::vector<Subject> subjects;
    for (const std::string& p : bench::split_commas(f.policies)) {
      Subject s;
      s.policy = models::Recompute::parse(p).str();
      s.model = std::make_unique<models::Gpt>(config);
      s.model->set_recompute(models::Recompute::parse(p));
      s.model->set_precision(dtype);
      s.model->to(device, stream).init(1);
      s.model->storage().allocate_grads();
      stream.synchronize();
      Storage::reset_peak_bytes(device);
      const std::int64_t before = Storage::live_bytes(device);
      step(s, x, y, stream, /*optimize=*/false);
      s.activation_bytes = Storage::peak_bytes(device) - before;
      s.workspace_bytes = s.model->recompute_workspace_bytes();
      s.model->zero_grad();
      s.optimizer = std::make_unique<optim::AdamW>(s.model->parameters());
      s.optimizer->set_stream(stream);
      step(s, x, y, stream, true);  // warm-up: the optimizer's state
      subjects.push_back(std::move(s));
    }
    for (int i = 0; i < f.steps; ++i) {
      for (Subject& s : subjects) {
        const auto t0 = Clock::now();
        step(s, x, y, stream, true);
        s.step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    std::printf("gpt_recompute_bench: %s (%s), %s %s, B %lld x T %lld, %d timed steps per policy (medians)\n",
                f.shape.model.c_str(), config.fingerprint().c_str(), device_description(device).c_str(),
                f.precision.c_str(), static_cast<long long>(f.batch), static_cast<long long>(f.seq_len), f.steps);
    std::printf("%-9s %16s %14s %14s %12s %12s %12s\n", "policy", "activation MiB", "workspace MiB", "x activation",
                "step s", "x step", "x paired");
    nlohmann::json out = nlohmann::json::array();
    const double base_bytes = static_cast<double>(subjects.front().activation_bytes);
    const double base_step = bench::median(subjects.front().step_s);
    for (const Subject& s : subjects) {
      const double st = bench::median(s.step_s);
      std::vector<double> pairs;
      for (std::size_t i = 0; i < s.step_s.size(); ++i) pairs.push_back(s.step_s[i] / subjects.front().step_s[i]);
      const double paired = bench::median(pairs);
      std::printf("%-9s %16.1f %14.1f %14.3f %12.4f %12.3f %12.3f\n", s.policy.c_str(),
                  static_cast<double>(s.activation_bytes) / (1 << 20),
                  static_cast<double>(s.workspace_bytes) / (1 << 20),
                  static_cast<double>(s.activation_bytes) / base_bytes, st, st / base_step, paired);
      out.push_back({{"policy", s.policy},
                     {"activation_bytes", s.activation_bytes},
                     {"workspace_bytes", s.workspace_bytes},
                     {"activation_ratio", static_cast<double>(s.activation_bytes) / base_bytes},
                     {"step_s_median", st},
                     {"step_ratio", st / base_step},
                     {"step_ratio_paired", paired},
                     {"step_s", s.step_s}});
    }
    if (!f.json.empty()) {
      std::ofstream(f.json) << nlohmann::json{{"model", f.shape.model},
                                              {"config", config.fingerprint()},
                                              {"device", device_description(device)},
                                              {"precision", f.precision},
                                              {"batch", f.batch},
                                              {"seq_len", f.seq_len},
                                              {"results", out}}
                                   .dump(2)
                            << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_recompute_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
