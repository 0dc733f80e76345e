// ddp_bench: what data parallelism costs, how well communication hides behind backward, and
// what each ZeRO stage saves in memory and costs in time.
//
//   mpirun -np 2 build/benchmarks/ddp/ddp_bench --hidden 1024 --layers 4 --batch 64
//   mpirun -np 4 build/benchmarks/ddp/ddp_bench --optimizer adamw --precision bf16 --modes zero0,zero1,zero2
//   --memory-only
//
// Trains an MLP (in -> hidden x layers -> 10, or in -> widths... -> 10) on synthetic data, in
// several modes side by side in one run, with the same per-rank batch:
//   local        each rank alone, no communication: the per-rank throughput of one rank
//   overlap      DistributedDataParallel (zero 0), each bucket's allreduce started during backward
//   after        the same with every allreduce after backward (overlap off)
//   hier         overlap with the hierarchical allreduce (comm/groups.h): reduce-scatter in the
//                node, allreduce across nodes, all-gather in the node (--ranks-per-node fakes
//                the node map)
//   zero1        ZeRO-1: reduce-scatter, sharded update, all-gather in the next forward
//   zero2        ZeRO-2: as zero1, without a full-size gradient buffer
//   traced       overlap with the timeline recording (docs/observability.md): its steps record
//                every span (layers, collectives, waits, optimizer), the other modes' do not, so
//                traced / overlap is what tracing costs; the spans are written to --trace DIR
// The modes' steps are interleaved (one step of each in turn, the ranks lined up before each),
// so that the machine's drift falls on all of them alike; each rank times its own steps and
// the tables give medians: step
// time, its split into compute and exposed communication (the wait after backward; ZeRO: plus
// the waits for the gathers), samples/s over all ranks, and scaling efficiency =
// throughput(N) / (N x local).
//
// Memory: bytes this rank holds per component (DdpMemory: what the tensors hold, not a
// formula), per parameter, next to the formula for the optimizer and precision; and every
// tensor the mode allocated (Storage::live_bytes before and after it was set up and ran two
// steps: activations and batches included).
#include <tutti/tutti.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/args.h"
#include "common/stats.h"

namespace {

using Clock = std::chrono::steady_clock;

using bench::median;

struct Config {
  std::int64_t in = 784;
  std::int64_t hidden = 1024;
  int layers = 4;
  std::string widths;       // "512,256": overrides hidden x layers
  std::int64_t batch = 64;  // per rank
  int steps = 20;
  int warmup = 3;
  double bucket_mb = 25;
  std::string device = "auto";
  std::string optimizer = "sgd";
  std::string precision = "fp32";
  std::string modes = "local,overlap,after,zero1,zero2";
  int ranks_per_node = 0;  // hier: 0 = the real node map
  bool memory_only = false;
  std::string json;
  std::string trace_dir;  // empty: ddp_bench_trace/ beside the program (in the build tree)
};

std::unique_ptr<tutti::nn::Sequential> make_model(const Config& c) {
  auto m = std::make_unique<tutti::nn::Sequential>();
  std::vector<std::int64_t> widths;
  for (const std::string& w : bench::split_commas(c.widths)) widths.push_back(std::stoll(w));
  if (widths.empty()) widths.assign(static_cast<std::size_t>(c.layers), c.hidden);
  std::int64_t width = c.in;
  for (std::int64_t w : widths) {
    m->add<tutti::nn::Linear>(width, w).add<tutti::nn::ReLU>();
    width = w;
  }
  m->add<tutti::nn::Linear>(width, 10);
  return m;
}

std::string model_name(const Config& c) {
  std::string s = "MLP " + std::to_string(c.in);
  if (!c.widths.empty()) {
    for (const std::string& w : bench::split_commas(c.widths)) s += "-" + w;
  } else {
    s += "-" + std::to_string(c.hidden) + "x" + std::to_string(c.layers);
  }
  return s + "-10";
}

// Bytes per parameter the formula gives (DeepSpeed's accounting): parameters in the compute
// dtype, fp32 masters beside half parameters, gradients in their dtype, optimizer state in
// fp32; stage 1 shards masters and state, stage 2 gradients too.
double formula_bytes_per_param(const Config& c, int zero, int n) {
  const bool half = c.precision == "bf16";
  const double state = c.optimizer == "adamw" ? 8 : 4;
  const double shard_ms = zero >= 1 ? n : 1, shard_g = zero == 2 ? n : 1;
  const double params = half ? 2 : 4, masters = half ? 4 : 0, grads = half ? 2 : 4;
  return params + masters / shard_ms + grads / shard_g + state / shard_ms;
}

struct Instance {
  std::string mode;
  int zero = -1;  // -1: local
  std::unique_ptr<tutti::nn::Sequential> model;
  std::unique_ptr<tutti::ddp::DistributedDataParallel> ddp;
  std::unique_ptr<tutti::optim::Optimizer> opt;
  tutti::nn::CrossEntropyLoss loss;
  tutti::ddp::DdpMemory memory;
  std::int64_t live_bytes = 0;
  std::vector<double> step, compute, exposed, busbw;
};

struct Result {
  std::string mode;
  int zero = -1;
  double step_ms = 0, compute_ms = 0, exposed_ms = 0, samples_per_s = 0, efficiency = 0, busbw_gbs = 0;
  tutti::ddp::DdpMemory memory;
  std::int64_t live_bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"ddp_bench: DistributedDataParallel throughput and memory, overlap on and off, ZeRO stages"};
  app.add_option("--in", c.in, "input width");
  app.add_option("--hidden", c.hidden, "hidden width");
  app.add_option("--layers", c.layers, "hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--widths", c.widths, "hidden widths, e.g. 512,256 (the trainer's MLP): overrides --hidden/--layers");
  app.add_option("--batch", c.batch, "samples per rank per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", c.steps, "measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", c.warmup, "unmeasured steps first");
  app.add_option("--bucket-mb", c.bucket_mb, "DDP bucket cap (MiB)")->check(CLI::PositiveNumber);
  app.add_option("--device", c.device, "auto, cpu or cuda");
  app.add_option("--optimizer", c.optimizer, "sgd (momentum) or adamw")->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--precision", c.precision, "fp32, or bf16 (bf16 compute, gradients and wire; fp32 masters)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--modes", c.modes, "comma list of local, overlap, after, hier, zero0, zero1, zero2");
  app.add_option("--ranks-per-node", c.ranks_per_node,
                 "hier: fake nodes of this many consecutive ranks (0: the real node map)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--memory-only", c.memory_only, "set up each mode and run two steps: memory, no timing");
  app.add_option("--json", c.json, "write the results as JSON to this path");
  app.add_option("--trace", c.trace_dir,
                 "where the traced mode writes its timeline (default: ddp_bench_trace/ beside the program)");
  CLI11_PARSE(app, argc, argv);

  try {
    tutti::JobOptions jo;
    jo.device = c.device;
    tutti::Job job(argc, argv, jo);
    const int n = job.world_size();
    const tutti::Device device = job.device();
    const tutti::Stream stream = device.is_cuda() ? tutti::Stream::create(device) : tutti::Stream();
    const tutti::amp::Policy policy = c.precision == "bf16" ? tutti::amp::Policy{tutti::DType::bf16, tutti::DType::f32,
                                                                                 tutti::DType::bf16, tutti::DType::bf16}
                                                            : tutti::amp::Policy::fp32();

    std::mt19937 rng(static_cast<unsigned>(job.rank()) + 1u);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> xs(static_cast<std::size_t>(c.batch * c.in));
    for (float& v : xs) v = normal(rng);
    std::vector<std::int64_t> ys(static_cast<std::size_t>(c.batch));
    for (auto& v : ys) v = static_cast<std::int64_t>(rng() % 10);
    const tutti::Tensor x = tutti::Tensor::from_floats(xs, {c.batch, c.in}).to(device, stream);
    const tutti::Tensor y = tutti::Tensor::from_ints(ys, {c.batch}, tutti::DType::i32).to(device, stream);

    auto one_step = [&](Instance& m) {
      if (m.ddp) {
        m.loss.forward(m.ddp->forward(x), y, 1.0f, stream);
        m.ddp->backward(m.loss.grad());
        m.opt->step();
        m.ddp->zero_grad();
      } else {
        m.model->zero_grad();
        m.loss.forward(m.model->forward(x), y, 1.0f, stream);
        m.model->backward(m.loss.grad());
        m.opt->step();
      }
      stream.synchronize();
    };

    // The hierarchical allreduce's communicator, if a mode needs it.
    std::shared_ptr<tutti::Communicator> hier;
    if (c.modes.find("hier") != std::string::npos) {
      hier = tutti::hierarchical_communicator(job.communicator(), job.node_groups({}, c.ranks_per_node));
    }

    // Set up every mode, one after another, measuring what each allocates.
    std::vector<std::unique_ptr<Instance>> all;
    std::int64_t params = 0;
    for (const std::string& mode : bench::split_commas(c.modes)) {
      auto m = std::make_unique<Instance>();
      m->mode = mode;
      if (mode == "overlap" || mode == "after" || mode == "zero0" || mode == "traced" || mode == "hier")
        m->zero = 0;
      else if (mode == "zero1")
        m->zero = 1;
      else if (mode == "zero2")
        m->zero = 2;
      else if (mode != "local")
        throw std::runtime_error("unknown mode '" + mode + "'");
      const std::int64_t before = tutti::Storage::live_bytes(device);
      m->model = make_model(c);
      tutti::amp::apply(policy, *m->model);
      m->model->to(device, stream).init(1);
      params = 0;
      for (auto* p : m->model->parameters()) params += p->numel();
      if (m->zero >= 0) {
        tutti::ddp::DdpOptions o;
        o.bucket_cap_mb = c.bucket_mb;
        o.reducer.overlap = mode != "after";
        o.sharding = tutti::ddp::sharding_of_stage(m->zero);
        tutti::Communicator& comm = mode == "hier" ? *hier : job.communicator();
        m->ddp = std::make_unique<tutti::ddp::DistributedDataParallel>(comm, *m->model, o);
      } else {
        m->model->storage().flatten();
        m->model->storage().allocate_grads();
      }
      if (c.optimizer == "sgd") {
        m->opt = std::make_unique<tutti::optim::SGD>(m->model->parameters(),
                                                     tutti::optim::SgdOptions{.lr = 1e-3f, .momentum = 0.9f});
      } else {
        m->opt = std::make_unique<tutti::optim::AdamW>(m->model->parameters(), tutti::optim::AdamWOptions{.lr = 1e-4f});
      }
      if (m->ddp) {
        m->ddp->attach(*m->opt);
      } else {
        m->opt->set_stream(stream);
        m->opt->bind(tutti::optim::flat_target(*m->model));
      }
      for (int i = 0; i < 2; ++i) one_step(*m);
      m->live_bytes = tutti::Storage::live_bytes(device) - before;
      if (m->ddp) {
        m->memory = m->ddp->memory();
      } else {
        auto bytes = [](const tutti::Tensor& t) {
          return t.defined() ? static_cast<std::int64_t>(t.storage()->nbytes()) : 0;
        };
        m->memory.parameters =
            bytes(m->model->storage().compute_copies().defined() ? m->model->storage().compute_copies()
                                                                 : m->model->storage().values());
        m->memory.master_weights =
            m->model->storage().compute_copies().defined() ? bytes(m->model->storage().values()) : 0;
        m->memory.gradients = bytes(m->model->storage().grads());
        m->memory.optimizer_state = m->opt->state_bytes();
      }
      all.push_back(std::move(m));
    }

    // The traced mode records its steps only: a step number of -1 is outside every window, so the
    // other modes' steps record nothing (and cost only the flag's branch, as with tracing off).
    std::unique_ptr<tutti::obs::TraceSession> trace;
    const bool any_traced = std::any_of(all.begin(), all.end(), [](const auto& m) { return m->mode == "traced"; });
    if (any_traced && !c.memory_only) {
      tutti::obs::TraceOptions to;
      to.dir = c.trace_dir.empty()
                   ? (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "ddp_bench_trace").string()
                   : c.trace_dir;
      to.host = job.hostname();
      trace = std::make_unique<tutti::obs::TraceSession>(job.cpu_communicator(), to);
      tutti::trace::begin_step(-1);
    }
    if (!c.memory_only) {
      // The ranks line up before every timed step (else a mode would be charged the drift the
      // previous mode left, a collective-free local step above all); within the step they run
      // free, so the drift that overlap can hide is in it. The modes take turns in a rotating
      // order, so that none always runs first.
      for (int it = 0; it < c.warmup + c.steps; ++it) {
        for (std::size_t k = 0; k < all.size(); ++k) {
          Instance& m = *all[(k + static_cast<std::size_t>(it)) % all.size()];
          job.cpu_communicator().barrier().wait();
          const bool traced = trace && m.mode == "traced";
          const auto t0 = Clock::now();
          if (traced) tutti::trace::begin_step(it);
          one_step(m);
          if (traced) {
            tutti::trace::end_step();
            tutti::trace::begin_step(-1);
          }
          const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          if (it < c.warmup) continue;
          m.step.push_back(ms);
          if (m.ddp) {
            const auto& s = m.ddp->reducer().last_stats();
            const double exposed = s.exposed_comm_ms + s.exposed_gather_ms;
            m.exposed.push_back(exposed);
            m.compute.push_back(ms - exposed);
            m.busbw.push_back(s.busbw_gbs);
          } else {
            m.compute.push_back(ms);
            m.exposed.push_back(0);
          }
        }
      }
    }

    std::vector<std::string> trace_files;
    if (trace) trace_files = trace->write();  // COLLECTIVE

    std::vector<Result> results;
    double local = 0;
    for (auto& mp : all) {
      Result r;
      r.mode = mp->mode;
      r.zero = mp->zero;
      r.step_ms = median(mp->step);
      r.compute_ms = median(mp->compute);
      r.exposed_ms = median(mp->exposed);
      r.busbw_gbs = median(mp->busbw);
      r.memory = mp->memory;
      r.live_bytes = mp->live_bytes;
      r.samples_per_s = r.step_ms > 0 ? static_cast<double>(c.batch) * (mp->zero < 0 ? 1 : n) / (r.step_ms * 1e-3) : 0;
      if (mp->zero < 0) local = r.samples_per_s;
      results.push_back(r);
    }
    for (Result& r : results) r.efficiency = r.zero < 0 ? 1.0 : (local > 0 ? r.samples_per_s / (n * local) : 0);

    // The allreduce of the whole gradient buffer alone, for reference.
    double allreduce_ms = 0, hier_allreduce_ms = 0;
    std::int64_t hier_wrong = 0;  // elements of the hierarchical allreduce that were not the world size
    if (!c.memory_only) {
      tutti::Tensor grads = tutti::Tensor::zeros({params}, policy.grad, device);
      std::vector<double> ar, hier_ar;
      tutti::Tensor ones, hier_grads;
      if (hier) {
        ones = tutti::Tensor::from_floats(std::vector<float>(static_cast<std::size_t>(params), 1.0f), {params})
                   .to(device, stream);
        hier_grads = tutti::Tensor::zeros({params}, tutti::DType::f32, device);
      }
      for (int it = 0; it < c.warmup + c.steps; ++it) {
        job.cpu_communicator().barrier().wait();
        auto t0 = Clock::now();
        job.communicator().allreduce(grads).wait();
        if (it >= c.warmup) ar.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (!hier) continue;
        hier_grads.copy_from(ones, stream);
        stream.synchronize();
        job.cpu_communicator().barrier().wait();
        t0 = Clock::now();
        hier->allreduce(hier_grads).wait();
        if (it >= c.warmup) hier_ar.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        // Every element must be the world size: a wrong sum would make the timing meaningless.
        const std::vector<float> got = hier_grads.to(tutti::Device::cpu(), stream).to_floats();
        for (float v : got) hier_wrong += v != static_cast<float>(n);
      }
      allreduce_ms = median(ar);
      if (hier) hier_allreduce_ms = median(hier_ar);
    }

    if (job.rank() == 0) {
      std::printf("# %d node(s), %d rank(s) per node\n", job.node_count(), job.local_size());
      std::printf(
          "# ddp_bench: %d rank(s), backend %s, device %s, %s (%.3f M parameters), %s, %s, batch %lld per rank, "
          "bucket %.0f MiB, %d steps (median)\n",
          n, std::string(job.backend()).c_str(), device.str().c_str(), model_name(c).c_str(), params / 1e6,
          c.optimizer.c_str(), c.precision.c_str(), static_cast<long long>(c.batch), c.bucket_mb, c.steps);
      if (!c.memory_only) {
        std::printf("# allreduce of all gradients alone: %.2f ms\n", allreduce_ms);
        if (hier) {
          std::printf("# hierarchical allreduce of all gradients alone: %.2f ms (%s)\n", hier_allreduce_ms,
                      hier_wrong == 0 ? "sums checked" : "WRONG SUMS");
        }
        std::printf("%-8s %10s %11s %11s %9s %12s %10s %9s %9s\n", "mode", "step_ms", "compute_ms", "exposed_ms",
                    "exposed%", "samples/s", "efficiency", "busbw", "vs_zero0");
        double zero0 = 0;
        for (const Result& r : results) {
          if (r.mode == "overlap" || r.mode == "zero0") zero0 = r.step_ms;
        }
        double traced = 0;
        for (const Result& r : results) {
          if (r.mode == "traced") traced = r.step_ms;
        }
        if (traced > 0 && zero0 > 0) {
          std::printf("# tracing overhead: traced / overlap step time = %.4f (%+.2f%%); timeline in %s\n",
                      traced / zero0, 100.0 * (traced / zero0 - 1.0),
                      trace_files.empty() ? "?" : trace_files.back().c_str());
        }
        for (const Result& r : results) {
          std::printf("%-8s %10.2f %11.2f %11.2f %8.1f%% %12.0f %10.3f %9.2f %9.3f\n", r.mode.c_str(), r.step_ms,
                      r.compute_ms, r.exposed_ms, 100.0 * r.exposed_ms / std::max(r.step_ms, 1e-9), r.samples_per_s,
                      r.efficiency, r.busbw_gbs, zero0 > 0 ? r.step_ms / zero0 : 0.0);
        }
      }
      std::printf(
          "# memory of rank 0, bytes per parameter (formula: parameters, fp32 masters, gradients, optimizer "
          "state, sharded over %d rank(s) as the stage says)\n",
          n);
      std::printf("%-8s %10s %8s %8s %8s %8s %8s %8s %8s %12s\n", "mode", "params", "masters", "grads", "optim", "comm",
                  "total", "formula", "ratio", "all_tensors");
      const double P = static_cast<double>(params);
      for (const Result& r : results) {
        const int stage = std::max(r.zero, 0);
        const double formula = formula_bytes_per_param(c, stage, n);
        std::printf("%-8s %10.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %12.3f\n", r.mode.c_str(),
                    r.memory.parameters / P, r.memory.master_weights / P, r.memory.gradients / P,
                    r.memory.optimizer_state / P, r.memory.communication / P, r.memory.total() / P, formula,
                    (r.memory.total() - r.memory.communication) / P / formula, r.live_bytes / P);
      }
      if (!c.json.empty()) {
        nlohmann::json out = nlohmann::json::array();
        for (const Result& r : results) {
          out.push_back({{"mode", r.mode},
                         {"zero", r.zero},
                         {"ranks", n},
                         {"nodes", job.node_count()},
                         {"parameters", params},
                         {"model", model_name(c)},
                         {"optimizer", c.optimizer},
                         {"precision", c.precision},
                         {"batch_per_rank", c.batch},
                         {"step_ms", r.step_ms},
                         {"compute_ms", r.compute_ms},
                         {"exposed_comm_ms", r.exposed_ms},
                         {"samples_per_s", r.samples_per_s},
                         {"scaling_efficiency", r.efficiency},
                         {"busbw_gbs", r.busbw_gbs},
                         {"allreduce_alone_ms", allreduce_ms},
                         {"hierarchical_allreduce_alone_ms", hier_allreduce_ms},
                         {"bucket_mb", c.bucket_mb},
                         {"device", device.str()},
                         {"memory",
                          {{"parameters", r.memory.parameters},
                           {"master_weights", r.memory.master_weights},
                           {"gradients", r.memory.gradients},
                           {"optimizer_state", r.memory.optimizer_state},
                           {"communication", r.memory.communication},
                           {"total", r.memory.total()},
                           {"all_tensors", r.live_bytes},
                           {"formula_bytes_per_parameter", formula_bytes_per_param(c, std::max(r.zero, 0), n)}}}});
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
