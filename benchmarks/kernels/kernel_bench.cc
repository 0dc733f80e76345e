// kernel_bench: speed of tutti's kernels against the machine's ceilings, measured in the same run.
//
//   kernel_bench [--device cpu|cuda] [--size-mb 64] [--samples 7] [--blas-threads 1] [--json out.json]
//
// Memory-bound ops report GB/s (bytes each op must move at least once, read + write) against
// the copy ceiling (a large device-to-device copy on the GPU, memcpy on the CPU; a copy moves
// 2 x its size). GEMM-like ops (linear, conv, attention) report TFLOP/s against a GEMM of the same dtype
// (cuBLAS at 4096^3 on the GPU; OpenBLAS sgemm on the CPU, f32 for every dtype since tutti's CPU
// path computes halves through fp32). Ceilings are measured before and after the ops, and the
// better of the two counts; in addition, each memory-bound op is compared with the copy timed
// right before and right after it (the better of the two), so that a shared machine's drift
// during the run does not move the ratio (the ceiling_copy row is the run's best). Every number
// is the median over --samples timings, each timing long enough (an adaptive number of
// back-to-back calls) to hide the timer's resolution. On the CPU everything runs on one thread
// (OpenBLAS included, unless --blas-threads says otherwise), as in training, where each rank is
// one thread and the ranks fill the cores.
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "tutti/core/device.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels/attention.h"
#include "tutti/kernels/cast.h"
#include "tutti/kernels/conv.h"
#include "tutti/kernels/cross_entropy.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/flash_attention.h"
#include "tutti/kernels/layernorm.h"
#include "tutti/kernels/linear.h"
#include "tutti/kernels/optimizer.h"
#include "tutti/kernels/reduce.h"
#include "tutti/kernels/threads.h"

#if TUTTI_BENCH_CUBLAS
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace {

using namespace tutti;
using namespace tutti::kernels;
using std::int64_t;

struct Result {
  std::string op;
  DType dtype = DType::f32;
  double bytes = 0;  // memory-bound ops
  double flops = 0;  // GEMM-like ops
  double median_ms = 0;
  double rate = 0;     // GB/s or TFLOP/s
  double ceiling = 0;  // same unit
  // Memory-bound ops: the copy ceiling measured right before and right after the op (the
  // better of the two), so that each ratio is taken side by side with the machine as it was.
  double local_ceiling = 0;
  std::string ceiling_name;
  double fraction() const { return ceiling > 0 ? rate / ceiling : 0; }
  bool compute() const { return flops > 0; }
};

class Bench {
 public:
  Bench(Device device, int samples) : device_(device), samples_(samples) {
    stream_ = device.is_cuda() ? Stream::create(device) : Stream();
  }

  Device device() const { return device_; }
  const Stream& stream() const { return stream_; }

  // Median milliseconds per call of f. Warm-up call first; then each sample runs f enough
  // times back to back to last about target_ms.
  double time_ms(const std::function<void()>& f) {
    f();
    const double once = timed(f, 1);
    const double target_ms = device_.is_cuda() ? 20.0 : 60.0;
    const int iters = static_cast<int>(std::clamp(target_ms / std::max(once, 1e-3), 1.0, 2000.0));
    std::vector<double> ms;
    for (int s = 0; s < samples_; ++s) ms.push_back(timed(f, iters) / iters);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  double timed(const std::function<void()>& f, int iters) {
    Event start(device_, true), stop(device_, true);
    start.record(stream_);
    for (int i = 0; i < iters; ++i) f();
    stop.record(stream_);
    stop.synchronize();
    return stop.elapsed_ms_since(start);
  }

  Device device_;
  int samples_;
  Stream stream_;
};

// A tensor on `device` with values spread over [lo, hi) (a cheap hash, not all equal).
Tensor make(const Shape& shape, DType dtype, Device device, float lo = -1.f, float hi = 1.f, std::uint32_t seed = 1) {
  std::vector<float> v(static_cast<std::size_t>(numel_of(shape)));
  std::uint32_t h = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    h = h * 1664525u + 1013904223u;
    x = lo + (hi - lo) * static_cast<float>(h >> 8) / 16777216.0f;
  }
  return Tensor::from_floats(v, shape, dtype).to(device);
}

std::string dtype_str(DType d) { return std::string(name_of(d)); }

// ---- ceilings ----

// Plain element-by-element copy loops, compiled like the kernels: ordinary stores through the
// cache, once for baseline x86-64 and once with clones for wider vector units as the CPU
// kernels' compute-bound loops have (kernels/cpu/common.h; which is faster varies by machine).
// GCC would otherwise recognize the loops and call memcpy instead.
#if defined(__GNUC__) && !defined(__clang__)
#define TUTTI_BENCH_COPY_LOOP [[gnu::noinline, gnu::optimize("no-tree-loop-distribute-patterns")]]
#else
#define TUTTI_BENCH_COPY_LOOP [[gnu::noinline]]
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TUTTI_BENCH_WIDE [[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "avx", "default")]]
#else
#define TUTTI_BENCH_WIDE
#endif
TUTTI_BENCH_COPY_LOOP void copy_loop(const float* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}
TUTTI_BENCH_COPY_LOOP TUTTI_BENCH_WIDE void copy_loop_wide(const float* __restrict src, float* __restrict dst,
                                                           int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// GB/s of a copy of `bytes` (counted as 2 x bytes moved), with its buffers made once.
// On the CPU, the best of memcpy and the copy loops, all single-threaded like the kernels:
// glibc's memcpy switches to non-temporal stores for large copies, which on some machines (VMs
// in particular) is slower than the write-allocate stores every kernel uses, and a ceiling that
// the kernels' own loops beat would make the ratios meaningless. full() tries every way and
// remembers the fastest; quick() times only that one (the per-op ceilings).
class CopyProbe {
 public:
  CopyProbe(Bench& b, std::size_t bytes)
      : bench_(b),
        n_(static_cast<int64_t>(bytes / 4)),
        src_(make({n_}, DType::f32, b.device())),
        dst_(Tensor::empty({n_}, DType::f32, b.device())) {}

  double full(double* ms) {
    *ms = time_way(0);
    best_ = 0;
    if (bench_.device().is_cpu()) {
      for (int way = 1; way <= 2; ++way) {
        const double t = time_way(way);
        if (t < *ms) *ms = t, best_ = way;
      }
    }
    return gbps(*ms);
  }
  double quick() { return gbps(time_way(best_)); }

 private:
  double gbps(double ms) const { return 2.0 * static_cast<double>(n_) * 4 / (ms * 1e6); }
  double time_way(int way) {
    float* src = src_.data_as<float>();
    float* dst = dst_.data_as<float>();
    if (way == 1) return bench_.time_ms([&] { copy_loop(src, dst, n_); });
    if (way == 2) return bench_.time_ms([&] { copy_loop_wide(src, dst, n_); });
    return bench_.time_ms([&] { dst_.copy_from(src_, bench_.stream()); });
  }

  Bench& bench_;
  int64_t n_;
  Tensor src_, dst_;
  int best_ = 0;
};

// TFLOP/s of one GEMM C[m, n] = A[m, k] · B[k, n] in `dtype`; *ms_out receives the median time.
double gemm_tflops(Bench& b, DType dtype, int m, int n, int k, double* ms_out) {
  const double flops = 2.0 * m * n * k;
  if (b.device().is_cpu()) {
    std::vector<float> A(static_cast<std::size_t>(m) * k, 0.5f), B(static_cast<std::size_t>(k) * n, 0.25f),
        C(static_cast<std::size_t>(m) * n);
    const double ms = b.time_ms([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, A.data(), k, B.data(), n, 0.f, C.data(), n);
    });
    *ms_out = ms;
    return flops / (ms * 1e9);
  }
#if TUTTI_BENCH_CUBLAS
  Tensor A = make({m, k}, dtype, b.device()), B = make({k, n}, dtype, b.device());
  Tensor C = Tensor::empty({m, n}, dtype, b.device());
  cublasHandle_t handle = nullptr;
  cublasCreate(&handle);
  cublasSetStream(handle, static_cast<cudaStream_t>(b.stream().native()));
  const cudaDataType_t t = dtype == DType::f32 ? CUDA_R_32F : dtype == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  const float one = 1.f, zero = 0.f;
  // Column-major cuBLAS on row-major data: C^T = B^T · A^T.
  const double ms = b.time_ms([&] {
    cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, B.data(), t, n, A.data(), t, k, &zero, C.data(), t, n,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
  cublasDestroy(handle);
  *ms_out = ms;
  return flops / (ms * 1e9);
#else
  (void)dtype;  // no GPU GEMM in a build without CUDA; device() is never cuda there
  return 0;
#endif
}

// ---- the ops ----

struct Ctx {
  Bench& bench;
  std::vector<Result>& results;  // ceilings are filled in once every op has run
  CopyProbe& copy;
  double last_copy_gbps = 0;                             // the copy measured after the previous memory-bound op
  std::string only;                                      // --only: run the ops whose name contains it
  std::vector<std::pair<int64_t, int64_t>> flash_tiles;  // --flash-tiles: (query, key) tiles to time
};

void memory_op(Ctx& c, const std::string& op, DType dt, double bytes, const std::function<void()>& f) {
  if (op.find(c.only) == std::string::npos) return;
  Result r;
  r.op = op;
  r.dtype = dt;
  r.bytes = bytes;
  r.median_ms = c.bench.time_ms(f);
  r.rate = bytes / (r.median_ms * 1e6);
  const double after = c.copy.quick();
  r.local_ceiling = std::max(c.last_copy_gbps, after);
  c.last_copy_gbps = after;
  c.results.push_back(r);
}

void compute_op(Ctx& c, const std::string& op, DType dt, double flops, const std::function<void()>& f) {
  if (op.find(c.only) == std::string::npos) return;
  Result r;
  r.op = op;
  r.dtype = dt;
  r.flops = flops;
  r.median_ms = c.bench.time_ms(f);
  r.rate = flops / (r.median_ms * 1e9);
  c.results.push_back(r);
}

// Runs one op family, reporting (not aborting) when it is not available in this build.
void guarded(const std::string& what, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    std::cerr << "kernel_bench: skipping " << what << ": " << e.what() << "\n";
  }
}

void bench_memory_ops(Ctx& c, DType dt, int64_t n) {
  const Device dev = c.bench.device();
  const Stream& s = c.bench.stream();
  const double es = static_cast<double>(size_of(dt));
  const double nd = static_cast<double>(n);
  Tensor x = make({n}, dt, dev), y = Tensor::empty({n}, dt, dev), z = make({n}, dt, dev, -1.f, 1.f, 2);

  guarded("reduce", [&] {
    Tensor out = Tensor::zeros({1}, DType::f32, dev);
    Tensor found = Tensor::from_ints({0}, {1}).to(dev);
    memory_op(c, "sum", dt, nd * es, [&] { sum(x, out, false, s); });
    memory_op(c, "sum_squares", dt, nd * es, [&] { sum_squares(x, out, false, s); });
    memory_op(c, "check_finite", dt, nd * es, [&] { check_finite(x, found, s); });
  });
  guarded("cast", [&] {
    const DType other = dt == DType::f32 ? DType::bf16 : DType::f32;
    Tensor o = Tensor::empty({n}, other, dev);
    const double bytes = nd * (es + static_cast<double>(size_of(other)));
    memory_op(c, "cast_to_" + dtype_str(other), dt, bytes, [&] { cast(x, o, s); });
    Tensor found = Tensor::from_ints({0}, {1}).to(dev);
    memory_op(c, "unscale_and_check", dt, 2 * nd * es, [&] { unscale_and_check(z, 1.0f, found, s); });
  });
  guarded("optimizer", [&] {
    // fp32 master weights and state; the gradient in dt; a bf16 copy of w when dt is a half.
    Tensor w = make({n}, DType::f32, dev), buf = Tensor::zeros({n}, DType::f32, dev);
    Tensor m = Tensor::zeros({n}, DType::f32, dev), v = Tensor::zeros({n}, DType::f32, dev);
    Tensor half = dt == DType::f32 ? Tensor() : Tensor::empty({n}, dt, dev);
    const double half_bytes = half.defined() ? nd * es : 0;
    const SgdParams sp{.lr = 1e-4f, .momentum = 0.9f, .weight_decay = 1e-4f};
    memory_op(c, "sgd_update_momentum", dt, nd * (4 * 4 + es) + half_bytes,
              [&] { sgd_update(w, x, buf, half, sp, false, s); });
    AdamWParams ap{.lr = 1e-4f};
    memory_op(c, "adamw_update", dt, nd * (6 * 4 + es) + half_bytes, [&] { adamw_update(w, x, m, v, half, ap, s); });
  });
  guarded("maxpool", [&] {
    const int64_t hw = 32, planes = std::max<int64_t>(1, n / (hw * hw));
    const Shape xs{planes, 1, hw, hw}, ys{planes, 1, hw / 2, hw / 2};
    Tensor px = x.view(0, xs), py = Tensor::empty(ys, dt, dev), pdy = make(ys, dt, dev),
           pdx = Tensor::empty(xs, dt, dev);
    const double xb = static_cast<double>(px.numel()) * es;
    memory_op(c, "maxpool2x2_forward", dt, xb * 1.25, [&] { maxpool2x2_forward(px, py, s); });
    memory_op(c, "maxpool2x2_backward", dt, xb * 2.25, [&] { maxpool2x2_backward(px, pdy, pdx, s); });
  });
  guarded("elementwise", [&] {
    memory_op(c, "relu_forward", dt, 2 * nd * es, [&] { relu_forward(x, y, s); });
    memory_op(c, "relu_backward", dt, 3 * nd * es, [&] { relu_backward(x, z, y, s); });
    memory_op(c, "gelu_forward", dt, 2 * nd * es, [&] { gelu_forward(x, y, s); });
    memory_op(c, "gelu_backward", dt, 3 * nd * es, [&] { gelu_backward(x, z, y, s); });
    memory_op(c, "add", dt, 3 * nd * es, [&] { add(x, z, y, s); });
    memory_op(c, "scale", dt, 2 * nd * es, [&] { scale(x, 0.5f, y, s); });
    // Rows of 1024 channels; the bias itself stays in cache.
    const int64_t channels = 1024, rows = std::max<int64_t>(1, n / channels);
    Tensor bx = x.view(0, {rows, channels}), by = y.view(0, {rows, channels});
    Tensor bias = make({channels}, dt, dev);
    memory_op(c, "bias_add", dt, 2 * static_cast<double>(rows * channels) * es, [&] { bias_add(bx, bias, 1, by, s); });
    Tensor dbias = Tensor::zeros({channels}, DType::f32, dev);
    memory_op(c, "bias_backward", dt, static_cast<double>(rows * channels) * es,
              [&] { bias_backward(bx, 1, dbias, false, s); });
    memory_op(c, "dropout_forward", dt, 2 * nd * es, [&] { dropout_forward(x, 0.1f, 1234, 0, y, s); });
  });
  guarded("layernorm", [&] {
    const int64_t d = 1024, rows = std::max<int64_t>(1, n / d);
    Tensor lx = x.view(0, {rows, d}), ly = y.view(0, {rows, d}), ldy = z.view(0, {rows, d});
    Tensor gamma = make({d}, dt, dev, 0.5f, 1.5f), beta = make({d}, dt, dev);
    Tensor mean = Tensor::empty({rows}, DType::f32, dev), rstd = Tensor::empty({rows}, DType::f32, dev);
    Tensor dgamma = Tensor::zeros({d}, DType::f32, dev), dbeta = Tensor::zeros({d}, DType::f32, dev);
    Tensor ldx = Tensor::empty({rows, d}, dt, dev);
    const double xb = static_cast<double>(rows * d) * es;
    memory_op(c, "layernorm_forward", dt, 2 * xb,
              [&] { layernorm_forward(lx, gamma, beta, 1e-5f, ly, mean, rstd, s); });
    memory_op(c, "layernorm_backward", dt, 3 * xb,
              [&] { layernorm_backward(lx, gamma, mean, rstd, ldy, ldx, dgamma, dbeta, false, s); });
  });
  guarded("cross_entropy", [&] {
    const int64_t classes = 1000, rows = std::max<int64_t>(1, n / classes);
    Tensor logits = x.view(0, {rows, classes}), dlogits = y.view(0, {rows, classes});
    std::vector<int64_t> labels_v(static_cast<std::size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) labels_v[static_cast<std::size_t>(i)] = (i * 7919) % classes;
    Tensor labels = Tensor::from_ints(labels_v, {rows}).to(dev);
    Tensor loss = Tensor::zeros({1}, DType::f32, dev);
    memory_op(c, "softmax_cross_entropy", dt, 2 * static_cast<double>(rows * classes) * es,
              [&] { softmax_cross_entropy(logits, labels, loss, dlogits, {}, s); });
  });
}

void bench_compute_ops(Ctx& c, DType dt, bool gpu) {
  const Device dev = c.bench.device();
  const Stream& s = c.bench.stream();
  guarded("linear", [&] {
    // 4096-wide on the GPU; on the CPU a size that a 2-core machine times in a second.
    const int64_t rows = gpu ? 4096 : 1024, in = gpu ? 4096 : 1024, out = gpu ? 4096 : 1024;
    Tensor x = make({rows, in}, dt, dev), w = make({out, in}, dt, dev, -0.05f, 0.05f), b = make({out}, dt, dev);
    Tensor y = Tensor::empty({rows, out}, dt, dev), dy = make({rows, out}, dt, dev);
    Tensor dx = Tensor::empty({rows, in}, dt, dev), dw = Tensor::empty({out, in}, dt, dev);
    Tensor db = Tensor::empty({out}, dt, dev);
    const double flops = 3 * 2.0 * static_cast<double>(rows * in * out);
    compute_op(c, "linear_fwd_bwd", dt, flops, [&] {
      linear_forward(x, w, b, y, s);
      linear_backward(x, w, dy, dx, dw, db, false, s);
    });
  });
  // The two conv layers of a small CNN on 28x28 images (examples/train_fashion_mnist): 3x3,
  // padding 1; the first (1 -> 32 channels, on the input, no dx) is tiny per image.
  auto conv = [&](const std::string& name, int64_t ch, int64_t k, bool need_dx) {
    guarded(name, [&] {
      const int64_t n = gpu ? 256 : 32, hw = 28;
      const Conv2dParams p{1, 1};
      Tensor x = make({n, ch, hw, hw}, dt, dev), w = make({k, ch, 3, 3}, dt, dev, -0.1f, 0.1f), b = make({k}, dt, dev);
      Tensor y = Tensor::empty({n, k, hw, hw}, dt, dev), dy = make({n, k, hw, hw}, dt, dev);
      Tensor dx = need_dx ? Tensor::empty({n, ch, hw, hw}, dt, dev) : Tensor();
      Tensor dw = Tensor::empty({k, ch, 3, 3}, DType::f32, dev), db = Tensor::empty({k}, DType::f32, dev);
      const double flops = 2.0 * static_cast<double>(n * k * hw * hw * ch * 9);
      compute_op(c, name + "_forward", dt, flops, [&] { conv2d_forward(x, w, b, y, p, s); });
      compute_op(c, name + "_backward", dt, (need_dx ? 2 : 1) * flops,
                 [&] { conv2d_backward(x, w, dy, dx, dw, db, false, p, s); });
    });
  };
  conv("conv2d", 32, 64, true);
  conv("conv2d_1to32", 1, 32, false);
  // Causal self-attention forward + backward: GPT-2 124M's shape on the GPU (8 sequences of
  // 1024, 12 heads of 64), train_gpt's gpt-tiny on the CPU (16 of 128, 4 heads of 32). FLOPs
  // as the MFU formula counts them (docs/gpt.md): 4·B·T²·C forward, twice that backward, the
  // full T x T products (the CPU path skips most of the masked triangle, the GPU's computes it).
  guarded("attention", [&] {
    const int64_t B = gpu ? 8 : 16, T = gpu ? 1024 : 128, heads = gpu ? 12 : 4, C = gpu ? 768 : 128;
    Tensor qkv = make({B, T, 3 * C}, dt, dev), dout = make({B, T, C}, dt, dev);
    Tensor out = Tensor::empty({B, T, C}, dt, dev), probs = Tensor::empty({B, heads, T, T}, dt, dev);
    Tensor dqkv = Tensor::empty({B, T, 3 * C}, dt, dev);
    const double flops = 12.0 * static_cast<double>(B * T * T * C);
    compute_op(c, "attention_fwd_bwd", dt, flops, [&] {
      attention_forward(qkv, heads, out, probs, s);
      attention_backward(qkv, probs, dout, heads, dqkv, s);
    });
    Tensor lse = Tensor::empty({B, heads, T}, DType::f32, dev);
    compute_op(c, "flash_attention_fwd_bwd", dt, flops, [&] {
      flash_attention_forward(qkv, {heads}, out, lse, s);
      flash_attention_backward(qkv, out, lse, dout, {heads}, dqkv, s);
    });
    for (const auto& [q, k] : c.flash_tiles) {
      const FlashAttentionParams p{heads, 0, q, k};
      compute_op(c, "flash_attention_fwd_bwd_q" + std::to_string(q) + "_k" + std::to_string(k), dt, flops, [&] {
        flash_attention_forward(qkv, p, out, lse, s);
        flash_attention_backward(qkv, out, lse, dout, p, dqkv, s);
      });
    }
  });
  // Long sequences, the two kernels side by side (issue 34: the tiled one at least as fast at
  // T >= 1024 on the CPU): one sequence of GPT-2 124M's heads (12 of 64) on the CPU, 4 on the GPU.
  // "_T<T>" rows; with --flash-tiles, also the tiled kernel at each (query x key) tile size.
  for (const int64_t T : gpu ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 2048, 4096}) {
    guarded("long attention", [&] {
      const int64_t B = gpu ? 4 : 1, heads = 12, C = 768;
      const std::string t = "_T" + std::to_string(T);
      Tensor qkv = make({B, T, 3 * C}, dt, dev), dout = make({B, T, C}, dt, dev);
      Tensor out = Tensor::empty({B, T, C}, dt, dev), dqkv = Tensor::empty({B, T, 3 * C}, dt, dev);
      Tensor lse = Tensor::empty({B, heads, T}, DType::f32, dev);
      const double flops = 12.0 * static_cast<double>(B * T * T * C);
      if (std::string("attention_fwd_bwd" + t).find(c.only) != std::string::npos) {
        Tensor probs = Tensor::empty({B, heads, T, T}, dt, dev);
        compute_op(c, "attention_fwd_bwd" + t, dt, flops, [&] {
          attention_forward(qkv, heads, out, probs, s);
          attention_backward(qkv, probs, dout, heads, dqkv, s);
        });
      }
      compute_op(c, "flash_attention_fwd_bwd" + t, dt, flops, [&] {
        flash_attention_forward(qkv, {heads}, out, lse, s);
        flash_attention_backward(qkv, out, lse, dout, {heads}, dqkv, s);
      });
      for (const auto& [q, k] : c.flash_tiles) {
        const FlashAttentionParams p{heads, 0, q, k};
        compute_op(c, "flash_attention_fwd_bwd" + t + "_q" + std::to_string(q) + "_k" + std::to_string(k), dt, flops,
                   [&] {
                     flash_attention_forward(qkv, p, out, lse, s);
                     flash_attention_backward(qkv, out, lse, dout, p, dqkv, s);
                   });
      }
    });
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kernel_bench: tutti's kernels against the machine's copy and GEMM ceilings"};
  std::string device_name = tutti::cuda_available() ? "cuda" : "cpu";
  double size_mb = 64;
  int samples = 7;
  int blas_threads = 1;
  std::string json_path;
  std::vector<std::string> dtype_names;
  app.add_option("--device", device_name, "cpu or cuda[:N] (default: cuda when a GPU is visible)");
  app.add_option("--size-mb", size_mb, "MiB of f32 elements per memory-bound op (the element count is kept for halves)")
      ->check(CLI::PositiveNumber);
  app.add_option("--samples", samples, "timings per op; the median is reported")->check(CLI::Range(1, 1000));
  app.add_option("--dtypes", dtype_names, "dtypes to run (default: f32 on the CPU, f32 and bf16 on the GPU)");
  app.add_option("--blas-threads", blas_threads,
                 "threads of the CPU GEMMs (kernels::set_cpu_threads), ceiling and ops alike")
      ->check(CLI::Range(1, 1024));
  app.add_option("--json", json_path, "write one JSON object per op to this file");
  std::string only, flash_tiles;
  app.add_option("--only", only, "run only the ops whose name contains this (the ceilings always run)");
  app.add_option("--flash-tiles", flash_tiles,
                 "also time the tiled attention at these tile sizes, e.g. 64x256,32x128 (queries x keys)");
  CLI11_PARSE(app, argc, argv);

  try {
    const Device device = Device::parse(device_name);
    device.require_available();
    const bool gpu = device.is_cuda();
    set_cpu_threads(blas_threads);
    std::vector<DType> dtypes;
    for (const auto& d : dtype_names) dtypes.push_back(parse_dtype(d));
    if (dtypes.empty()) dtypes = gpu ? std::vector<DType>{DType::f32, DType::bf16} : std::vector<DType>{DType::f32};

    Bench bench(device, samples);
    std::vector<Result> results;
    const auto bytes = static_cast<std::size_t>(size_mb * 1024 * 1024);
    const int64_t n = static_cast<int64_t>(bytes / 4);

    // Ceilings, measured in this run before the ops and again after them; the better of the two
    // counts (a shared machine can be slowed for a moment, and a low ceiling would flatter).
    const int gemm_size = gpu ? 4096 : 1024;
    std::vector<DType> gemm_dtypes;  // the CPU computes every dtype in fp32
    for (DType dt : dtypes) {
      const DType g = gpu ? dt : DType::f32;
      if (std::find(gemm_dtypes.begin(), gemm_dtypes.end(), g) == gemm_dtypes.end()) gemm_dtypes.push_back(g);
    }
    Result copy_result;
    copy_result.op = "ceiling_copy";
    copy_result.bytes = 2.0 * static_cast<double>(bytes);
    std::vector<Result> gemm_results;
    CopyProbe copy(bench, bytes);
    auto measure_ceilings = [&] {
      double ms = 0;
      const double gbps = copy.full(&ms);
      if (gbps > copy_result.rate) copy_result.rate = gbps, copy_result.median_ms = ms;
      for (std::size_t i = 0; i < gemm_dtypes.size(); ++i) {
        if (gemm_results.size() <= i) {
          Result r;
          r.op = "ceiling_gemm_" + std::to_string(gemm_size);
          r.dtype = gemm_dtypes[i];
          r.flops = 2.0 * gemm_size * gemm_size * gemm_size;
          gemm_results.push_back(r);
        }
        const double tf = gemm_tflops(bench, gemm_dtypes[i], gemm_size, gemm_size, gemm_size, &ms);
        if (tf > gemm_results[i].rate) gemm_results[i].rate = tf, gemm_results[i].median_ms = ms;
      }
    };
    measure_ceilings();

    Ctx ctx{bench, results, copy, copy_result.rate, only, {}};
    for (std::size_t at = 0; at < flash_tiles.size();) {
      const std::size_t end = std::min(flash_tiles.find(',', at), flash_tiles.size());
      const std::string tile = flash_tiles.substr(at, end - at);
      const std::size_t x = tile.find('x');
      TUTTI_CHECK_ARG(x != std::string::npos, "--flash-tiles: '", tile, "' is not QxK");
      ctx.flash_tiles.emplace_back(std::stoll(tile.substr(0, x)), std::stoll(tile.substr(x + 1)));
      at = end + 1;
    }
    for (DType dt : dtypes) {
      bench_memory_ops(ctx, dt, n);
      bench_compute_ops(ctx, dt, gpu);
    }
    measure_ceilings();

    // Every op against its ceiling; the ceilings themselves first.
    copy_result.ceiling = copy_result.rate;
    copy_result.ceiling_name = "copy";
    for (Result& g : gemm_results) g.ceiling = g.rate, g.ceiling_name = "gemm";
    auto gemm_ceiling = [&](DType dt) {
      const DType g = gpu ? dt : DType::f32;
      for (const Result& r : gemm_results) {
        if (r.dtype == g) return r.rate;
      }
      return 0.0;
    };
    for (Result& r : results) {
      r.ceiling = r.compute() ? gemm_ceiling(r.dtype) : r.local_ceiling;
      r.ceiling_name = r.compute() ? "gemm" : "copy";
    }
    results.insert(results.begin(), gemm_results.begin(), gemm_results.end());
    results.insert(results.begin(), copy_result);

    std::printf("kernel_bench on %s (%s), %.0f MiB per memory-bound op, median of %d\n", device.str().c_str(),
                device_description(device).c_str(), size_mb, samples);
    // ceiling / fraction: against the adjacent copy (memory-bound ops) or the GEMM; of_best:
    // against the best copy of the whole run (memory-bound ops; the stricter of the two).
    std::printf("%-24s %-5s %11s %10s %15s %15s %9s %8s\n", "op", "dtype", "size", "median_ms", "rate", "ceiling",
                "fraction", "of_best");
    nlohmann::json out = nlohmann::json::array();
    for (const Result& r : results) {
      const bool comp = r.compute();
      const std::string unit = comp ? "TFLOP/s" : "GB/s";
      char size[32];
      if (comp) {
        std::snprintf(size, sizeof size, "%.2f GF", r.flops / 1e9);
      } else {
        std::snprintf(size, sizeof size, "%.1f MB", r.bytes / 1e6);
      }
      const double of_best = comp ? r.fraction() : r.rate / copy_result.rate;
      std::printf("%-24s %-5s %11s %10.3f %9.3f %-5s %9.3f %-5s %8.1f%% %7.1f%%\n", r.op.c_str(),
                  dtype_str(r.dtype).c_str(), size, r.median_ms, r.rate, comp ? "TF/s" : "GB/s", r.ceiling,
                  comp ? "TF/s" : "GB/s", 100 * r.fraction(), 100 * of_best);
      nlohmann::json j = {{"op", r.op},
                          {"dtype", dtype_str(r.dtype)},
                          {"device", device.str()},
                          {"median_ms", r.median_ms},
                          {"ceiling", r.ceiling},
                          {"ceiling_kind", r.ceiling_name},
                          {"fraction", r.fraction()},
                          {"fraction_of_run_best", of_best}};
      if (comp) {
        j["flops"] = r.flops;
        j["tflops"] = r.rate;
      } else {
        j["bytes"] = r.bytes;
        j["gbps"] = r.rate;
      }
      out.push_back(j);
    }
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      f << out.dump(2) << "\n";
      if (!f) {
        std::cerr << "kernel_bench: could not write " << json_path << "\n";
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "kernel_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
