// CUDA elementwise ops. Memory-bound: one grid-stride kernel per op and dtype reads and
// writes 16 bytes per access when every pointer of the call is 16-byte aligned (a scalar
// loop finishes the tail), and falls back to scalar accesses for misaligned views. The op
// itself is a small functor computing in fp32. bias_backward reduces deterministically
// (fixed-order partial sums, no float atomics).
#include "kernels/cuda/elementwise.h"

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/dropout_rng.h"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;

// ---- the ops: f(a, b, i) in fp32, a and b the inputs (unused ones are 0), i the index ----

struct ReluForward {
  __device__ float operator()(float x, float, int64_t) const { return x > 0.0f ? x : 0.0f; }
};
struct ReluBackward {
  __device__ float operator()(float x, float dy, int64_t) const { return x > 0.0f ? dy : 0.0f; }
};
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
struct GeluForward {
  __device__ float operator()(float x, float, int64_t) const {
    const float u = kGeluC * (x + kGeluA * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};
struct GeluBackward {
  __device__ float operator()(float x, float dy, int64_t) const {
    const float u = kGeluC * (x + kGeluA * x * x * x);
    const float t = tanhf(u);
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
};
struct Add {
  __device__ float operator()(float a, float b, int64_t) const { return a + b; }
};
struct Scale {
  float alpha;
  __device__ float operator()(float x, float, int64_t) const { return alpha * x; }
};
// a = x, b = out (read before written).
struct AddScaled {
  float alpha;
  __device__ float operator()(float x, float out, int64_t) const { return out + alpha * x; }
};
struct Fill {
  float value;
  __device__ float operator()(float, float, int64_t) const { return value; }
};
// The same draw and the same fp32 product as the CPU (kernels/dropout_rng.h).
struct Dropout {
  float p, scale;
  std::uint64_t key, offset;
  __device__ float operator()(float x, float, int64_t i) const {
    const bool keep = rng::uniform(key, offset + static_cast<std::uint64_t>(i)) >= p;
    return keep ? __fmul_rn(x, scale) : 0.0f;
  }
};

// out[i] = f(in0[i], in1[i], i) for the first NIn inputs. VEC elements per access (VEC = 1
// is the scalar path). out may alias an input: element i is read before it is written.
template <typename T, int NIn, int VEC, typename F>
__global__ void map_kernel(int64_t n, F f, const T* in0, const T* in1, T* out) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  for (int64_t p = tid; p < packs; p += stride) {
    Pack<T, VEC> a{}, b{}, o;
    if constexpr (NIn >= 1) a = reinterpret_cast<const Pack<T, VEC>*>(in0)[p];
    if constexpr (NIn >= 2) b = reinterpret_cast<const Pack<T, VEC>*>(in1)[p];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float av = NIn >= 1 ? load_f32(a.v[k]) : 0.0f, bv = NIn >= 2 ? load_f32(b.v[k]) : 0.0f;
      o.v[k] = store_as<T>(f(av, bv, p * VEC + k));
    }
    reinterpret_cast<Pack<T, VEC>*>(out)[p] = o;
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) {
    const float av = NIn >= 1 ? load_f32(in0[i]) : 0.0f, bv = NIn >= 2 ? load_f32(in1[i]) : 0.0f;
    out[i] = store_as<T>(f(av, bv, i));
  }
}

// Launches map_kernel on out's device and `stream`: vectorized when every pointer allows it.
template <int NIn, typename F>
void launch_map(const char* name, F f, const Tensor& in0, const Tensor& in1, const Tensor& out, const Stream& stream) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  detail::dispatch_floating(name, out.dtype(), [&](auto tag) {
    using H = decltype(tag);
    using T = device_t<H>;
    constexpr int VEC = 16 / sizeof(T);
    const T* a = NIn >= 1 ? ptr<H>(in0) : nullptr;
    const T* b = NIn >= 2 ? ptr<H>(in1) : nullptr;
    T* o = ptr<H>(out);
    const bool aligned = is_aligned(o, 16) && (NIn < 1 || is_aligned(a, 16)) && (NIn < 2 || is_aligned(b, 16));
    if (aligned) {
      map_kernel<T, NIn, VEC><<<grid_for(n / VEC + 1, kBlock), kBlock, 0, native(stream)>>>(n, f, a, b, o);
    } else {
      map_kernel<T, NIn, 1><<<grid_for(n, kBlock), kBlock, 0, native(stream)>>>(n, f, a, b, o);
    }
    TUTTI_CUDA_CHECK_LAUNCH_OF(name);
  });
}

// SwiGLU over rows of x = [g | u] (2F columns) -> y (F columns), or backward into dx = [dg | du]:
// a grid-stride loop over the F·rows outputs. silu(g) = g / (1 + e^-g); its derivative as the CPU
// computes it (kernels/cpu/elementwise.cc), with 1 - sigmoid(g) = e^-g · sigmoid(g) and e^-g capped
// so that the product stays finite where the sigmoid underflows.
template <typename T>
__global__ void swiglu_forward_kernel(const T* x, int64_t rows, int64_t F, T* y) {
  const int64_t n = rows * F, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const int64_t r = k / F, i = k % F;
    const float g = load_f32(x[r * 2 * F + i]), u = load_f32(x[r * 2 * F + F + i]);
    y[k] = store_as<T>(g / (1.0f + expf(-g)) * u);
  }
}
template <typename T>
__global__ void swiglu_backward_kernel(const T* x, const T* dy, int64_t rows, int64_t F, T* dx) {
  const int64_t n = rows * F, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const int64_t r = k / F, i = k % F;
    const float g = load_f32(x[r * 2 * F + i]), u = load_f32(x[r * 2 * F + F + i]), d = load_f32(dy[k]);
    const float e = expf(fminf(-g, 69.0f));
    const float s = 1.0f / (1.0f + e);
    dx[r * 2 * F + i] = store_as<T>(d * u * (s * (1.0f + g * (e * s))));
    dx[r * 2 * F + F + i] = store_as<T>(d * (g * s));
  }
}

// out[(n·C + c)·inner + i] = x[...] + bias[c].
template <typename T>
__global__ void bias_add_kernel(const T* x, const T* bias, int64_t total, int64_t channels, int64_t inner, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t c = (k / inner) % channels;
    out[k] = store_as<T>(load_f32(x[k]) + load_f32(bias[c]));
  }
}

// ---- bias_backward ----
// inner = 1 (dy is [rows, C]): column sums in two stages. Stage 1: block (32, 8) sums a
// tile of 32 columns over one chunk of rows into partial[chunk, c] (coalesced across
// columns). Stage 2: out[c] = (accumulate ? out[c] : 0) + the chunk sums in order.
constexpr int kTileCols = 32, kTileRows = 8;

template <typename T>
__global__ void column_partial_kernel(const T* m, int64_t rows, int64_t cols, int64_t rows_per_chunk, float* partial) {
  __shared__ float tile[kTileRows][kTileCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kTileRows) acc += load_f32(m[r * cols + c]);
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) sum += tile[k][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * cols + c] = sum;
  }
}

template <typename G>
__global__ void column_finish_kernel(const float* partial, int64_t chunks, int64_t cols, G* out, bool accumulate) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += stride) {
    float sum = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k * cols + c];
    out[c] = store_as<G>(accumulate ? load_f32(out[c]) + sum : sum);
  }
}

// inner > 1 (dy is [outer, C, inner], e.g. NCHW): one block per channel; threads walk the
// contiguous inner runs of every outer slice.
template <typename T, typename G>
__global__ void channel_sum_kernel(const T* dy, int64_t outer, int64_t channels, int64_t inner, G* out,
                                   bool accumulate) {
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    float acc = 0.0f;
    for (int64_t n = 0; n < outer; ++n) {
      const T* run = dy + (n * channels + c) * inner;
      for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) acc += load_f32(run[i]);
    }
    acc = block_allreduce_sum(acc);
    if (threadIdx.x == 0) out[c] = store_as<G>(accumulate ? load_f32(out[c]) + acc : acc);
  }
}

}  // namespace

void relu_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  launch_map<1>("relu_forward", ReluForward{}, x, Tensor(), y, stream);
}
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream) {
  launch_map<2>("relu_backward", ReluBackward{}, x, dy, dx, stream);
}
void gelu_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  launch_map<1>("gelu_forward", GeluForward{}, x, Tensor(), y, stream);
}
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream) {
  launch_map<2>("gelu_backward", GeluBackward{}, x, dy, dx, stream);
}
void swiglu_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  const int64_t F = x.dim(-1) / 2;
  if (F == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / (2 * F);
  DeviceGuard guard(x.device());
  detail::dispatch_floating("swiglu_forward", x.dtype(), [&](auto tag) {
    using H = decltype(tag);
    swiglu_forward_kernel<<<grid_for(rows * F, kBlock), kBlock, 0, native(stream)>>>(ptr<H>(x), rows, F, ptr<H>(y));
    TUTTI_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
  });
}
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream) {
  const int64_t F = x.dim(-1) / 2;
  if (F == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / (2 * F);
  DeviceGuard guard(x.device());
  detail::dispatch_floating("swiglu_backward", x.dtype(), [&](auto tag) {
    using H = decltype(tag);
    swiglu_backward_kernel<<<grid_for(rows * F, kBlock), kBlock, 0, native(stream)>>>(ptr<H>(x), ptr<H>(dy), rows, F,
                                                                                      ptr<H>(dx));
    TUTTI_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
  });
}
void add(const Tensor& a, const Tensor& b, const Tensor& out, const Stream& stream) {
  launch_map<2>("add", Add{}, a, b, out, stream);
}
void scale(const Tensor& x, float alpha, const Tensor& out, const Stream& stream) {
  launch_map<1>("scale", Scale{alpha}, x, Tensor(), out, stream);
}
void add_scaled(const Tensor& x, float alpha, const Tensor& out, const Stream& stream) {
  launch_map<2>("add_scaled", AddScaled{alpha}, x, out, out, stream);
}
void fill(const Tensor& out, float value, const Stream& stream) {
  launch_map<0>("fill", Fill{value}, Tensor(), Tensor(), out, stream);
}
void dropout(const Tensor& x, float p, float scale, std::uint64_t seed, std::uint64_t offset, const Tensor& y,
             const Stream& stream) {
  launch_map<1>("dropout", Dropout{p, scale, rng::key_of(seed), offset}, x, Tensor(), y, stream);
}

void bias_add(const Tensor& x, const Tensor& bias, int64_t outer, int64_t channels, int64_t inner, const Tensor& out,
              const Stream& stream) {
  const int64_t total = x.numel();
  if (total == 0) return;
  DeviceGuard guard(x.device());
  detail::dispatch_floating("bias_add", x.dtype(), [&](auto tag) {
    using H = decltype(tag);
    bias_add_kernel<<<grid_for(total, kBlock), kBlock, 0, native(stream)>>>(ptr<H>(x), ptr<H>(bias), total, channels,
                                                                            inner, ptr<H>(out));
    TUTTI_CUDA_CHECK_LAUNCH("bias_add_kernel");
  });
}

void bias_backward(const Tensor& dy, int64_t outer, int64_t channels, int64_t inner, const Tensor& dbias,
                   bool accumulate, const Stream& stream) {
  if (channels == 0) return;
  DeviceGuard guard(dy.device());
  const cudaStream_t s = native(stream);
  if (outer * inner == 0) {  // nothing to sum: the gradient is 0 (or unchanged)
    if (!accumulate) TUTTI_CUDA_CHECK(cudaMemsetAsync(dbias.data(), 0, dbias.nbytes(), s));
    return;
  }
  detail::dispatch_floating("bias_backward", dy.dtype(), [&](auto tag) {
    using H = decltype(tag);
    using T = device_t<H>;
    const T* g = ptr<H>(dy);
    // dbias is f32 or the dtype of dy.
    auto run = [&](auto* out) {
      if (inner == 1) {
        const int64_t rows = outer, cols = channels;
        const int64_t tiles = (cols + kTileCols - 1) / kTileCols;
        // Enough chunks of rows to fill the GPU about four times, at least 32 rows each.
        const int64_t want = std::max<int64_t>(1, 4 * static_cast<int64_t>(sm_count()) / tiles);
        const int64_t chunks = std::min<int64_t>({want, (rows + 31) / 32, 65535});
        const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
        StreamScratch partial(static_cast<std::size_t>(chunks * cols) * sizeof(float), s);
        column_partial_kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)),
                                dim3(kTileCols, kTileRows), 0, s>>>(g, rows, cols, rows_per_chunk, partial.as<float>());
        TUTTI_CUDA_CHECK_LAUNCH("column_partial_kernel");
        column_finish_kernel<<<grid_for(cols, kBlock), kBlock, 0, s>>>(partial.as<float>(), chunks, cols, out,
                                                                       accumulate);
        TUTTI_CUDA_CHECK_LAUNCH("column_finish_kernel");
      } else {
        const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(channels, 65535));
        channel_sum_kernel<<<blocks, kBlock, 0, s>>>(g, outer, channels, inner, out, accumulate);
        TUTTI_CUDA_CHECK_LAUNCH("channel_sum_kernel");
      }
    };
    if (dbias.dtype() == DType::f32)
      run(ptr<float>(dbias));
    else
      run(ptr<H>(dbias));
  });
}

}  // namespace tutti::kernels::cuda
