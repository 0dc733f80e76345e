// allreduce_bench: tutti's allreduce and the raw backend call side by side, in one run.
//
//   mpirun -np 4 build/benchmarks/comm/allreduce_bench [--min-bytes 8] [--max-bytes 256M]
//       [--factor 2] [--dtype f32] [--device auto|cpu|cuda] [--backend auto|mpi|nccl]
//       [--iters 100] [--warmup 5] [--in-place] [--json results.json]
//       [--mpi-allreduce default|ring|recursive_doubling|rabenseifner|han|...] [--no-raw]
//
// Across nodes (docs/multinode.md): the "nodes" column is Job::node_count(); --mpi-allreduce
// picks Open MPI's algorithm (JobOptions::mpi_allreduce; the raw call uses the same one), and
// --no-raw leaves the raw call out (half the time, for sweeps over algorithms and links).
//
// Up to 64 KiB it also reports "loop": the time per call in runs of back-to-back calls of
// each kind (median over 15 alternating runs of 64 calls, slowest rank), and the ratio
// raw / tutti.
//
// For each size: the median time of many iterations after warm-up (each rank times every
// iteration from issue to completion, tutti's and the raw call's interleaved; the slowest
// rank's median is reported), algbw =
// bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests' definition), and #wrong: elements
// that differ from the exact sum after one more call (the inputs are small integers, whose
// sums every dtype holds exactly). "raw" is MPI_Allreduce on the same memory (CPU tensors,
// or the host side of GPU tensors when tutti stages them through the host), or ncclAllReduce
// on a stream of the bench's own NCCL communicator (GPU tensors, nccl backend).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tutti/tutti.h"

#if TUTTI_BENCH_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include "common/stats.h"

namespace {

using Clock = std::chrono::steady_clock;

// Sizes up to this also get the back-to-back latency loop (see below).
constexpr std::size_t kLoopMaxBytes = 64 * 1024;
constexpr int kLoopBlocks = 15;
constexpr int kLoopCalls = 64;

std::size_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  double v = std::stod(s, &pos);
  const std::string unit = s.substr(pos);
  if (unit == "K" || unit == "KB" || unit == "k")
    v *= 1024;
  else if (unit == "M" || unit == "MB")
    v *= 1024.0 * 1024;
  else if (unit == "G" || unit == "GB")
    v *= 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw std::invalid_argument("bad size: " + s);
  return static_cast<std::size_t>(v);
}

MPI_Datatype mpi_type(tutti::DType d) {
  switch (d) {
    case tutti::DType::f32: return MPI_FLOAT;
    case tutti::DType::i32: return MPI_INT32_T;
    case tutti::DType::i64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;  // halves: raw MPI has no 16-bit float sum
  }
}

using bench::median;

// Element i of rank r: small integers, so that every sum is exact in every dtype.
float input_value(int rank, std::int64_t i) { return static_cast<float>((i % 7) + rank % 3); }

// The raw backend call on the tensors' memory.
struct Raw {
  std::string name;
  std::function<void()> run;
};

}  // namespace

int run(int argc, char** argv);

// A failure (no GPU for --device cuda, a backend missing from this build, ...) is reported as a
// one-line error, not an uncaught exception.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: error: %s\n", e.what());
    return 1;
  }
}

int run(int argc, char** argv) {
  CLI::App app{"tutti allreduce benchmark: tutti's allreduce next to the raw backend call"};
  std::string min_bytes_s = "8", max_bytes_s = "256M", dtype_s = "f32", device = "auto", backend = "auto", json_path;
  int factor = 2, iters = 100, warmup = 5;
  bool in_place = false, no_raw = false;
  std::string mpi_allreduce;
  app.add_option("--min-bytes,-b", min_bytes_s, "smallest message (8, 1K, 1M...)");
  app.add_option("--max-bytes,-e", max_bytes_s, "largest message");
  app.add_option("--factor,-f", factor, "size multiplier between steps")->check(CLI::Range(2, 1024));
  app.add_option("--dtype,-d", dtype_s, "f32, f16, bf16, i32, i64");
  app.add_option("--device", device, "auto, cpu, cuda, cuda:N");
  app.add_option("--backend", backend, "auto, mpi, nccl");
  app.add_option("--iters,-n", iters, "timed iterations per size (fewer for large sizes, at least 10)");
  app.add_option("--warmup,-w", warmup, "untimed iterations per size");
  app.add_flag("--in-place", in_place, "allreduce in place (default: out of place)");
  app.add_option("--json", json_path, "write the table as JSON to this path (rank 0)");
  app.add_option("--mpi-allreduce", mpi_allreduce, "Open MPI's allreduce algorithm (JobOptions::mpi_allreduce)");
  app.add_flag("--no-raw", no_raw, "time tutti's allreduce only");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  tutti::JobOptions options;
  options.device = device;
  options.backend = backend;
  options.mpi_allreduce = mpi_allreduce;
  tutti::Job job(argc, argv, options);
  const int nodes = job.node_count();
  const int rank = job.rank(), world = job.world_size();
  tutti::Communicator& comm = job.communicator();
  const tutti::DType dtype = tutti::parse_dtype(dtype_s);
  const std::size_t es = tutti::size_of(dtype);
  const tutti::Device dev = job.device();
  const bool nccl = comm.backend() == "nccl";
  const std::string summary = job.summary();
  if (rank == 0) {
    std::printf("%s", summary.c_str());
    std::printf(
        "# allreduce sum, %s, %s, %d rank(s), backend %s, device %s; times: median over iterations, slowest rank\n",
        dtype_s.c_str(), in_place ? "in place" : "out of place", world, std::string(comm.backend()).c_str(),
        dev.str().c_str());
    std::printf("# %d node(s), %d rank(s) on this node; MPI allreduce algorithm: %s%s\n", nodes, job.local_size(),
                job.mpi_allreduce().c_str(), no_raw ? "; raw call not timed (--no-raw)" : "");
    std::printf("# %5s %12s %11s %5s | %11s %9s %9s | %11s %9s %9s | %6s %6s | %8s %8s %6s\n", "nodes", "bytes",
                "count", "type", "tutti(us)", "algbw", "busbw", "raw(us)", "algbw", "busbw", "ratio", "#wrong",
                "loop:tutti", "raw", "ratio");
  }

#if TUTTI_BENCH_WITH_NCCL
  ncclComm_t raw_nccl = nullptr;
  cudaStream_t raw_stream = nullptr;
  if (nccl) {
    ncclUniqueId id{};
    if (rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    cudaSetDevice(dev.index);
    ncclCommInitRank(&raw_nccl, world, id, rank);
    cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking);
  }
#endif

  nlohmann::json table = nlohmann::json::array();
  const std::size_t min_bytes = std::max(parse_bytes(min_bytes_s), es), max_bytes = parse_bytes(max_bytes_s);
  const tutti::Stream stream = dev.is_cuda() ? tutti::Stream::create(dev) : tutti::Stream();
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= static_cast<std::size_t>(factor)) {
    const std::int64_t count = static_cast<std::int64_t>(bytes / es);
    std::vector<float> init(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) init[static_cast<std::size_t>(i)] = input_value(rank, i);
    tutti::Tensor host_in =
        is_floating(dtype)
            ? tutti::Tensor::from_floats(init, {count}, dtype)
            : tutti::Tensor::from_ints(std::vector<std::int64_t>(init.begin(), init.end()), {count}, dtype);
    tutti::Tensor in = host_in.to(dev);
    const tutti::Tensor out = in_place ? in : tutti::Tensor::zeros({count}, dtype, dev);
    // The raw call: on the same memory (the host copy when tutti stages GPU tensors).
    tutti::Tensor raw_in = (dev.is_cuda() && !nccl) ? host_in.clone() : in;
    const tutti::Tensor raw_out = in_place ? raw_in : tutti::Tensor::zeros({count}, dtype, raw_in.device());
    Raw raw;
    if (!nccl) {
      raw.name = "MPI_Allreduce";
      const MPI_Datatype type = mpi_type(dtype);
      if (type == MPI_DATATYPE_NULL) {
        if (rank == 0) std::fprintf(stderr, "raw MPI has no sum of %s: use f32, i32 or i64\n", dtype_s.c_str());
        return 2;
      }
      raw.run = [&, type] {
        MPI_Allreduce(in_place ? MPI_IN_PLACE : raw_in.data(), raw_out.data(), static_cast<int>(count), type, MPI_SUM,
                      MPI_COMM_WORLD);
      };
    } else {
#if TUTTI_BENCH_WITH_NCCL
      raw.name = "ncclAllReduce";
      const ncclDataType_t type = dtype == tutti::DType::f32    ? ncclFloat32
                                  : dtype == tutti::DType::f16  ? ncclFloat16
                                  : dtype == tutti::DType::bf16 ? ncclBfloat16
                                  : dtype == tutti::DType::i32  ? ncclInt32
                                                                : ncclInt64;
      raw.run = [&, type] {
        ncclAllReduce(raw_in.data(), raw_out.data(), static_cast<std::size_t>(count), type, ncclSum, raw_nccl,
                      raw_stream);
        cudaStreamSynchronize(raw_stream);
      };
#endif
    }
    auto tutti_run = [&] {
      comm.allreduce(in, out, tutti::ReduceOp::sum, {.label = "bench", .stream = stream}).wait();
    };

    const int n_iters =
        std::max(10, std::min(iters, static_cast<int>((std::size_t{1} << 30) / std::max<std::size_t>(bytes, 1))));
    std::vector<double> t_tutti, t_raw;
    auto timed = [](const std::function<void()>& f, std::vector<double>& into) {
      const auto t0 = Clock::now();
      f();
      into.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    };
    if (no_raw) raw.run = [] {};
    for (int i = 0; i < warmup; ++i) {
      tutti_run();
      raw.run();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // Interleaved, in alternating order, so that the load of a shared machine hits both alike.
    for (int i = 0; i < n_iters; ++i) {
      if (i % 2 == 0) {
        timed(tutti_run, t_tutti);
        timed(raw.run, t_raw);
      } else {
        timed(raw.run, t_raw);
        timed(tutti_run, t_tutti);
      }
    }
    double times[2] = {median(t_tutti), median(t_raw)}, slowest[2] = {0, 0};
    MPI_Allreduce(times, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

    // Latency of back-to-back calls, for small messages: the mean per call of a run of tutti
    // calls, then of a run of raw calls. Interleaving single calls (above) lets the ranks fall
    // into a rhythm where one call of each pair absorbs the other rank's lag; a run of calls
    // of one kind does not split the waiting that way.
    // Blocks of kLoopCalls calls, tutti's and raw's blocks alternating; the median block's mean
    // per call is reported, so that a rank preempted once does not decide the figure.
    double loop[2] = {0, 0}, loop_slowest[2] = {0, 0};
    const bool measure_loop = bytes <= kLoopMaxBytes;
    if (measure_loop) {
      const std::function<void()> tutti_fn = tutti_run;
      const std::function<void()>* runs[2] = {&tutti_fn, &raw.run};
      std::vector<double> blocks[2];
      for (int b = 0; b < kLoopBlocks; ++b) {
        for (int k = 0; k < 2; ++k) {
          MPI_Barrier(MPI_COMM_WORLD);
          const auto t0 = Clock::now();
          for (int i = 0; i < kLoopCalls; ++i) (*runs[k])();
          blocks[k].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kLoopCalls);
        }
      }
      loop[0] = median(blocks[0]);
      loop[1] = median(blocks[1]);
      MPI_Allreduce(loop, loop_slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }

    // Check: one more call of each from fresh inputs; every element must be the exact sum.
    long long wrong[2] = {0, 0}, wrong_all[2] = {0, 0};
    auto count_wrong = [&](const tutti::Tensor& t) {
      long long w = 0;
      const std::vector<float> v = is_floating(dtype) ? t.to_floats() : [&] {
        const auto ints = t.to_ints();
        return std::vector<float>(ints.begin(), ints.end());
      }();
      for (std::int64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < world; ++q) want += input_value(q, i);
        if (v[static_cast<std::size_t>(i)] != want) ++w;
      }
      return w;
    };
    in.copy_from(host_in);
    tutti_run();
    wrong[0] = count_wrong(out);
    if (!no_raw) {
      raw_in.copy_from(host_in);
      raw.run();
      wrong[1] = count_wrong(raw_out);
    }
    MPI_Allreduce(wrong, wrong_all, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);

    const double gb = static_cast<double>(count) * static_cast<double>(es) / 1e9;
    const double bus = world > 1 ? 2.0 * (world - 1) / world : 0.0;
    const double alg_t = gb / (slowest[0] * 1e-6), alg_r = gb / (slowest[1] * 1e-6);
    if (rank == 0) {
      char loop_text[64] = "", raw_text[96];
      if (measure_loop) {
        std::snprintf(loop_text, sizeof loop_text, " | %8.2f %8.2f %6.3f", loop_slowest[0], loop_slowest[1],
                      loop_slowest[1] / loop_slowest[0]);
        if (no_raw) std::snprintf(loop_text, sizeof loop_text, " | %8.2f %8s %6s", loop_slowest[0], "-", "-");
      }
      std::snprintf(raw_text, sizeof raw_text, "%11.1f %9.3f %9.3f | %6.3f", slowest[1], alg_r, alg_r * bus,
                    alg_t / alg_r);
      if (no_raw) std::snprintf(raw_text, sizeof raw_text, "%11s %9s %9s | %6s", "-", "-", "-", "-");
      std::printf("  %5d %12zu %11lld %5s | %11.1f %9.3f %9.3f | %s %6lld%s\n", nodes,
                  static_cast<std::size_t>(count) * es, static_cast<long long>(count), dtype_s.c_str(), slowest[0],
                  alg_t, alg_t * bus, raw_text, wrong_all[0] + wrong_all[1], loop_text);
      std::fflush(stdout);
      table.push_back({{"bytes", static_cast<std::size_t>(count) * es},
                       {"count", count},
                       {"dtype", dtype_s},
                       {"ranks", world},
                       {"nodes", nodes},
                       {"ranks_per_node", job.local_size()},
                       {"mpi_allreduce", job.mpi_allreduce()},
                       {"backend", std::string(comm.backend())},
                       {"raw", no_raw ? std::string("none") : raw.name},
                       {"device", dev.str()},
                       {"in_place", in_place},
                       {"iterations", n_iters},
                       {"tutti_time_us", slowest[0]},
                       {"tutti_algbw_gbs", alg_t},
                       {"tutti_busbw_gbs", alg_t * bus},
                       {"raw_time_us", slowest[1]},
                       {"raw_algbw_gbs", alg_r},
                       {"raw_busbw_gbs", alg_r * bus},
                       {"ratio", alg_t / alg_r},
                       {"wrong", wrong_all[0]},
                       {"raw_wrong", wrong_all[1]}});
      if (measure_loop) {
        table.back()["tutti_loop_us"] = loop_slowest[0];
        table.back()["raw_loop_us"] = loop_slowest[1];
      }
    }
  }
  if (rank == 0 && !json_path.empty()) {
    std::ofstream(json_path) << table.dump(2) << "\n";
  }
#if TUTTI_BENCH_WITH_NCCL
  if (raw_nccl != nullptr) ncclCommDestroy(raw_nccl);
  if (raw_stream != nullptr) cudaStreamDestroy(raw_stream);
#endif
  return 0;
}
