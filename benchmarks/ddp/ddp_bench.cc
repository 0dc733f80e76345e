// ddp_bench: what data parallelism costs and how well communication hides behind backward.
//
//   mpirun -np 2 build/benchmarks/ddp/ddp_bench --hidden 1024 --layers 4 --batch 64
//
// Trains an MLP (in -> hidden x layers -> 10) on synthetic data, three ways, side by side in
// one run with the same per-rank batch:
//   local        each rank alone, no communication: the per-rank throughput of one rank
//   ddp overlap  DistributedDataParallel, each bucket's allreduce started during backward
//   ddp after    DistributedDataParallel, every allreduce after backward (overlap off)
// and, for reference, the allreduce of the whole gradient buffer alone. For each: median step
// time, its split into compute (forward + backward) and exposed communication (the wait after
// backward), samples/s over all ranks, and scaling efficiency = throughput(N) / (N x local).
#include <tutti/tutti.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Config {
  std::int64_t in = 784;
  std::int64_t hidden = 1024;
  int layers = 4;
  std::int64_t batch = 64;  // per rank
  int steps = 20;
  int warmup = 3;
  double bucket_mb = 25;
  std::string device = "auto";
  std::string json;
};

std::unique_ptr<tutti::nn::Sequential> make_model(const Config& c) {
  auto m = std::make_unique<tutti::nn::Sequential>();
  std::int64_t width = c.in;
  for (int i = 0; i < c.layers; ++i) {
    m->add<tutti::nn::Linear>(width, c.hidden).add<tutti::nn::ReLU>();
    width = c.hidden;
  }
  m->add<tutti::nn::Linear>(width, 10);
  return m;
}

struct Result {
  std::string mode;
  double step_ms = 0, compute_ms = 0, exposed_ms = 0, samples_per_s = 0, efficiency = 0, busbw_gbs = 0;
};

// mode: 0 local, 1 ddp overlap, 2 ddp after backward.
Result run(tutti::Job& job, const Config& c, int mode, std::int64_t* params_out) {
  const tutti::Device device = job.device();
  tutti::Stream stream = device.is_cuda() ? tutti::Stream::create(device) : tutti::Stream();
  auto model = make_model(c);
  model->to(device, stream).init(1);
  *params_out = 0;
  for (auto* p : model->parameters()) *params_out += p->numel();

  std::unique_ptr<tutti::ddp::DistributedDataParallel> ddp;
  if (mode > 0) {
    tutti::ddp::DdpOptions o;
    o.bucket_cap_mb = c.bucket_mb;
    o.overlap = mode == 1;
    ddp = std::make_unique<tutti::ddp::DistributedDataParallel>(job.communicator(), *model, o);
  }
  tutti::optim::SgdOptions so;
  so.lr = 1e-3f;
  tutti::optim::SGD opt(model->parameters(), so);
  opt.set_stream(stream);
  tutti::nn::CrossEntropyLoss loss;

  std::mt19937 rng(static_cast<unsigned>(job.rank()) + 1u);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> xs(static_cast<std::size_t>(c.batch * c.in));
  for (float& v : xs) v = normal(rng);
  std::vector<std::int64_t> ys(static_cast<std::size_t>(c.batch));
  for (auto& v : ys) v = static_cast<std::int64_t>(rng() % 10);
  const tutti::Tensor x = tutti::Tensor::from_floats(xs, {c.batch, c.in}).to(device, stream);
  const tutti::Tensor y = tutti::Tensor::from_ints(ys, {c.batch}, tutti::DType::i32).to(device, stream);

  std::vector<double> step, compute, exposed, busbw;
  // Ranks line up once; after that they run free, as in training, so that the measured
  // steps include the drift between ranks that overlap can hide.
  job.cpu_communicator().barrier().wait();
  for (int it = 0; it < c.warmup + c.steps; ++it) {
    const auto t0 = Clock::now();
    if (ddp) {
      loss.forward(ddp->forward(x), y, 1.0f, stream);
      ddp->backward(loss.grad());
      opt.step();
      ddp->zero_grad();
    } else {
      model->zero_grad();
      loss.forward(model->forward(x), y, 1.0f, stream);
      model->backward(loss.grad());
      opt.step();
    }
    stream.synchronize();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (it < c.warmup) continue;
    step.push_back(ms);
    if (ddp) {
      const auto& s = ddp->last_stats();
      exposed.push_back(s.exposed_comm_ms);
      compute.push_back(ms - s.exposed_comm_ms);
      busbw.push_back(s.busbw_gbs);
    } else {
      compute.push_back(ms);
      exposed.push_back(0);
    }
  }
  Result r;
  r.mode = mode == 0 ? "local" : mode == 1 ? "ddp overlap" : "ddp after";
  r.step_ms = median(step);
  r.compute_ms = median(compute);
  r.exposed_ms = median(exposed);
  r.busbw_gbs = median(busbw);
  r.samples_per_s = static_cast<double>(c.batch) * (mode == 0 ? 1 : job.world_size()) / (r.step_ms * 1e-3);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"ddp_bench: DistributedDataParallel throughput, overlap on vs off, scaling efficiency"};
  app.add_option("--in", c.in, "input width");
  app.add_option("--hidden", c.hidden, "hidden width");
  app.add_option("--layers", c.layers, "hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "samples per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", c.steps, "measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", c.warmup, "unmeasured steps first");
  app.add_option("--bucket-mb", c.bucket_mb, "DDP bucket cap (MiB)")->check(CLI::PositiveNumber);
  app.add_option("--device", c.device, "auto, cpu or cuda");
  app.add_option("--json", c.json, "write the results as JSON to this path");
  CLI11_PARSE(app, argc, argv);

  try {
    tutti::JobOptions jo;
    jo.device = c.device;
    tutti::Job job(argc, argv, jo);
    const int n = job.world_size();
    std::int64_t params = 0;
    std::vector<Result> results;
    for (int mode : {0, 1, 2}) results.push_back(run(job, c, mode, &params));
    const double local = results[0].samples_per_s;
    for (Result& r : results) r.efficiency = r.mode == "local" ? 1.0 : r.samples_per_s / (n * local);

    // The allreduce of the whole gradient buffer alone, for reference.
    tutti::Tensor grads = tutti::Tensor::zeros({params}, tutti::DType::f32, job.device());
    std::vector<double> ar;
    for (int it = 0; it < c.warmup + c.steps; ++it) {
      job.cpu_communicator().barrier().wait();
      const auto t0 = Clock::now();
      job.communicator().allreduce(grads).wait();
      if (it >= c.warmup) ar.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    const double allreduce_ms = median(ar);

    if (job.rank() == 0) {
      std::printf("# %d node(s), %d rank(s) per node\n", job.node_count(), job.local_size());
      std::printf("# ddp_bench: %d rank(s), backend %s, device %s, MLP %lld-%lldx%d-10 (%.2f M parameters, %.1f MiB "
                  "of f32 gradients), batch %lld per rank, bucket %.0f MiB, %d steps (median)\n",
                  n, std::string(job.backend()).c_str(), job.device().str().c_str(), static_cast<long long>(c.in),
                  static_cast<long long>(c.hidden), c.layers, params / 1e6, params * 4.0 / (1 << 20),
                  static_cast<long long>(c.batch), c.bucket_mb, c.steps);
      std::printf("# allreduce of all gradients alone: %.2f ms\n", allreduce_ms);
      std::printf("%-12s %10s %11s %11s %9s %12s %10s %9s\n", "mode", "step_ms", "compute_ms", "exposed_ms",
                  "exposed%", "samples/s", "efficiency", "busbw");
      for (const Result& r : results) {
        std::printf("%-12s %10.2f %11.2f %11.2f %8.1f%% %12.0f %10.3f %9.2f\n", r.mode.c_str(), r.step_ms, r.compute_ms,
                    r.exposed_ms, 100.0 * r.exposed_ms / r.step_ms, r.samples_per_s, r.efficiency, r.busbw_gbs);
      }
      if (!c.json.empty()) {
        nlohmann::json out = nlohmann::json::array();
        for (const Result& r : results) {
          out.push_back({{"mode", r.mode}, {"ranks", n}, {"nodes", job.node_count()}, {"parameters", params}, {"batch_per_rank", c.batch},
                         {"step_ms", r.step_ms}, {"compute_ms", r.compute_ms}, {"exposed_comm_ms", r.exposed_ms},
                         {"samples_per_s", r.samples_per_s}, {"scaling_efficiency", r.efficiency},
                         {"busbw_gbs", r.busbw_gbs}, {"allreduce_alone_ms", allreduce_ms}, {"bucket_mb", c.bucket_mb},
                         {"device", job.device().str()}});
        }
        std::ofstream(c.json) << out.dump(2) << "\n";
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
