// gemm_backends_bench: the GPT's CPU GEMMs on OpenBLAS (what tutti runs today) against oneDNN's
// matmul, at the shapes of one training step, side by side in one process, one thread each.
//
// For each linear layer of the model (rows = batch x context tokens of one rank):
//   forward   y[rows, O] = x[rows, I] . w[O, I]^T + bias (then GELU for the MLP's first layer)
//   backward  dx[rows, I] = dy . w,  dw[O, I] = dy^T . x
// The "tutti" column is what tutti runs today: its CPU kernels::linear_forward (OpenBLAS sgemm
// accumulating onto the bias) and kernels::gelu_forward; the backward GEMMs through kernels::matmul, as
// linear_backward runs them. oneDNN runs one matmul primitive per pass, the bias and GELU fused
// as post-ops. The ceiling is obs::measure_cpu_gemm_flops, the one MFU is measured against
// (--ceiling-n 384 as there). Medians of --repeats rounds, the two libraries interleaved within
// each round so that a noisy neighbour hits both.
//
//   build/benchmarks/kernels/gemm_backends_bench --rows 4096 --width 128 --vocab 256
#include <cblas.h>  // openblas_set_num_threads
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <dnnl.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common/random.h"
#include "common/stats.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/linear.h"
#include "tutti/obs/mfu.h"

namespace {

using dnnl::memory;

// One oneDNN matmul C[M, N] = A[M, K] . B[K, N] with A, B given as plain row-major matrices that
// may be stored transposed (ta: A is [K, M]; tb: B is [N, K]), optionally with bias and GELU.
struct OneDnnMatmul {
  dnnl::stream& stream;
  dnnl::matmul prim;
  memory a, b, c, bias;

  OneDnnMatmul(dnnl::engine& e, dnnl::stream& s, std::int64_t M, std::int64_t N, std::int64_t K, bool ta, bool tb,
               float* A, float* B, float* C, float* Bias, bool gelu)
      : stream(s) {
    const memory::desc a_md({M, K}, memory::data_type::f32, ta ? memory::format_tag::ba : memory::format_tag::ab);
    const memory::desc b_md({K, N}, memory::data_type::f32, tb ? memory::format_tag::ba : memory::format_tag::ab);
    const memory::desc c_md({M, N}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc bias_md({1, N}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::primitive_attr attr;
    if (gelu) {
      dnnl::post_ops po;
      po.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
      attr.set_post_ops(po);
    }
    const auto desc =
        Bias != nullptr ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
    const dnnl::matmul::primitive_desc pd(desc, attr, e);
    prim = dnnl::matmul(pd);
    a = memory(a_md, e, A);
    b = memory(b_md, e, B);
    c = memory(c_md, e, C);
    if (Bias != nullptr) bias = memory(bias_md, e, Bias);
  }
  void operator()() {
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    if (bias) args.emplace(DNNL_ARG_BIAS, bias);
    prim.execute(stream, args);
    stream.wait();
  }
};

struct Layer {
  std::string name;
  std::int64_t in, out;
  bool gelu;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "The GPT's CPU GEMMs: tutti's (OpenBLAS, GELU a separate pass) against oneDNN matmul with fused post-ops"};
  std::int64_t rows = 4096, width = 128, vocab = 256;
  int ceiling_n = 384;
  int repeats = 7;
  app.add_option("--rows", rows, "tokens per rank and step (batch x context)")->check(CLI::PositiveNumber);
  app.add_option("--width", width, "the model's width C")->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "the (padded) vocabulary, the head's outputs")->check(CLI::PositiveNumber);
  app.add_option("--ceiling-n", ceiling_n, "the square GEMM that measures the ceiling (obs::measure_cpu_gemm_flops)")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "rounds; medians are reported")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(1);
  openblas_set_num_threads(1);

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);

  // The ceiling.
  const std::size_t cn = static_cast<std::size_t>(ceiling_n);
  auto ca = bench::uniform_floats(cn * cn, 1), cb = bench::uniform_floats(cn * cn, 2);
  std::vector<float> cc(cn * cn);
  OneDnnMatmul ceiling_dnnl(eng, stream, ceiling_n, ceiling_n, ceiling_n, false, false, ca.data(), cb.data(), cc.data(),
                            nullptr, false);
  std::vector<double> ceil_blas, ceil_dnnl;
  const double ceil_flops = 2.0 * ceiling_n * ceiling_n * ceiling_n;
  for (int r = 0; r < repeats; ++r) {
    ceil_blas.push_back(tutti::obs::measure_cpu_gemm_flops(ceiling_n, 0.05));
    ceil_dnnl.push_back(ceil_flops / bench::seconds_per_call(ceiling_dnnl, 8));
  }
  const double peak = bench::median(ceil_blas);
  std::printf("ceiling (%d^3): tutti %.1f GFLOP/s, oneDNN %.1f GFLOP/s (%.2fx)\n", ceiling_n, peak / 1e9,
              bench::median(ceil_dnnl) / 1e9, bench::median(ceil_dnnl) / peak);

  const std::int64_t C = width;
  const std::vector<Layer> layers{{"attn.qkv", C, 3 * C, false},
                                  {"attn.proj", C, C, false},
                                  {"mlp.fc +gelu", C, 4 * C, true},
                                  {"mlp.proj", 4 * C, C, false},
                                  {"lm_head", C, vocab, false}};
  std::printf("\n%-14s %-9s %8s %8s %7s   (%% of tutti's ceiling; rows %lld)\n", "layer", "pass", "tutti", "oneDNN",
              "ratio", static_cast<long long>(rows));
  double total_blas = 0, total_dnnl = 0, total_flops = 0;
  for (const Layer& l : layers) {
    const std::size_t R = static_cast<std::size_t>(rows), I = static_cast<std::size_t>(l.in),
                      O = static_cast<std::size_t>(l.out);
    auto x = bench::uniform_floats(R * I, 3), w = bench::uniform_floats(O * I, 4), bias = bench::uniform_floats(O, 5),
         dy = bench::uniform_floats(R * O, 6);
    std::vector<float> y(R * O), h(R * O), dx(R * I), dw(O * I);
    const tutti::Tensor tx = tutti::Tensor::wrap(x.data(), {rows, l.in}, tutti::DType::f32),
                        tw = tutti::Tensor::wrap(w.data(), {l.out, l.in}, tutti::DType::f32),
                        tb = tutti::Tensor::wrap(bias.data(), {l.out}, tutti::DType::f32),
                        ty = tutti::Tensor::wrap(y.data(), {rows, l.out}, tutti::DType::f32),
                        th = tutti::Tensor::wrap(h.data(), {rows, l.out}, tutti::DType::f32),
                        tdy = tutti::Tensor::wrap(dy.data(), {rows, l.out}, tutti::DType::f32),
                        tdx = tutti::Tensor::wrap(dx.data(), {rows, l.in}, tutti::DType::f32),
                        tdw = tutti::Tensor::wrap(dw.data(), {l.out, l.in}, tutti::DType::f32);
    OneDnnMatmul fwd(eng, stream, rows, l.out, l.in, false, true, x.data(), w.data(), l.gelu ? h.data() : y.data(),
                     bias.data(), l.gelu);
    OneDnnMatmul bwd_x(eng, stream, rows, l.in, l.out, false, false, dy.data(), w.data(), dx.data(), nullptr, false);
    OneDnnMatmul bwd_w(eng, stream, l.out, l.in, rows, true, false, dy.data(), x.data(), dw.data(), nullptr, false);
    struct Pass {
      const char* name;
      std::function<void()> blas, dnnl;
    };
    const std::vector<Pass> passes{
        {"forward",
         [&] {
           tutti::kernels::linear_forward(tx, tw, tb, ty);
           if (l.gelu) tutti::kernels::gelu_forward(ty, th);
         },
         fwd},
        {"dx", [&] { tutti::kernels::matmul(tdy, false, tw, false, tdx); }, bwd_x},
        {"dw", [&] { tutti::kernels::matmul(tdy, true, tx, false, tdw); }, bwd_w},
    };
    const double flops = 2.0 * rows * l.in * l.out;
    std::vector<float*> outputs{l.gelu ? h.data() : y.data(), dx.data(), dw.data()};
    std::vector<std::size_t> sizes{y.size(), dx.size(), dw.size()};
    for (std::size_t i = 0; i < passes.size(); ++i) {
      // Both compute the same thing: compared once, before timing.
      passes[i].blas();
      const std::vector<float> want(outputs[i], outputs[i] + sizes[i]);
      passes[i].dnnl();
      double worst = 0;
      for (std::size_t j = 0; j < sizes[i]; ++j)
        worst = std::max(worst, std::abs(double(outputs[i][j]) - want[j]) / (1.0 + std::abs(double(want[j]))));
      if (worst > 1e-3) {
        std::fprintf(stderr, "%s %s: oneDNN differs from tutti by %.3g (relative)\n", l.name.c_str(), passes[i].name,
                     worst);
        return 1;
      }
    }
    for (const Pass& p : passes) {
      std::vector<double> tb, td;
      for (int r = 0; r < repeats; ++r) {
        tb.push_back(bench::seconds_per_call(p.blas, 3));
        td.push_back(bench::seconds_per_call(p.dnnl, 3));
      }
      const double b = bench::median(tb), d = bench::median(td);
      total_blas += b;
      total_dnnl += d;
      total_flops += flops;
      std::printf("%-14s %-9s %7.1f%% %7.1f%% %6.2fx\n", l.name.c_str(), p.name, 100.0 * flops / b / peak,
                  100.0 * flops / d / peak, b / d);
    }
  }
  std::printf("%-14s %-9s %7.1f%% %7.1f%% %6.2fx\n", "all", "", 100.0 * total_flops / total_blas / peak,
              100.0 * total_flops / total_dnnl / peak, total_blas / total_dnnl);
  return 0;
}
