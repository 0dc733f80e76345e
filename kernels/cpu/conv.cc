#include "kernels/cpu/conv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/gemm.h"
#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// The values of t as fp32: t's own memory when it is f32, else a converted copy in `scratch`.
const float* f32_view(const Tensor& t, std::vector<float>& scratch) {
  if (t.dtype() == DType::f32) return t.data_as<float>();
  scratch.resize(static_cast<std::size_t>(t.numel()));
  detail::dispatch_floating("conv2d", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = t.data_as<T>();
    for (int64_t i = 0; i < t.numel(); ++i) scratch[static_cast<std::size_t>(i)] = to_float(p[i]);
  });
  return scratch.data();
}

// Writes fp32 values into t (any floating dtype; rounds to nearest even for halves).
void store_f32(const float* src, const Tensor& t) {
  detail::dispatch_floating("conv2d", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data_as<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (p != src) std::memcpy(p, src, t.nbytes());
    } else {
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = from_float<T>(src[i]);
    }
  });
}

struct Geometry {
  int64_t n, c, h, w, k, r, s, p, q;
  int stride, pad;
  int64_t crs() const { return c * r * s; }
  int64_t pq() const { return p * q; }
  // True when im2col would be the identity (1x1, stride 1, no padding).
  bool trivial_col() const { return r == 1 && s == 1 && stride == 1 && pad == 0; }
};

Geometry geometry(const Tensor& x, const Tensor& w, const Conv2dParams& params) {
  Geometry g{};
  g.n = x.dim(0), g.c = x.dim(1), g.h = x.dim(2), g.w = x.dim(3);
  g.k = w.dim(0), g.r = w.dim(2), g.s = w.dim(3);
  g.stride = params.stride, g.pad = params.padding;
  g.p = (g.h + 2 * g.pad - g.r) / g.stride + 1;
  g.q = (g.w + 2 * g.pad - g.s) / g.stride + 1;
  return g;
}

// The range [lo, hi) of output columns q whose input column q·stride - pad + s is inside
// [0, W) (ceil and floor divisions written for possibly negative numerators).
std::pair<int64_t, int64_t> inside_columns(const Geometry& g, int64_t s) {
  const int64_t first = g.pad - s, last = g.w - 1 + g.pad - s;  // q·stride must lie in [first, last]
  const int64_t lo = first <= 0 ? 0 : (first + g.stride - 1) / g.stride;
  const int64_t hi = last < 0 ? 0 : last / g.stride + 1;
  return {std::min(lo, g.q), std::clamp(hi, std::min(lo, g.q), g.q)};
}

// col[(c·R + r)·S + s][p·Q + q] = x[c][p·stride - pad + r][q·stride - pad + s], 0 outside.
void im2col(const float* x, const Geometry& g, float* col) {
  for (int64_t c = 0; c < g.c; ++c) {
    const float* xc = x + c * g.h * g.w;
    for (int64_t r = 0; r < g.r; ++r) {
      for (int64_t s = 0; s < g.s; ++s) {
        float* row = col + ((c * g.r + r) * g.s + s) * g.pq();
        // The output columns whose input column q·stride - pad + s lies inside the image: the
        // rest are padding zeros, so the inner loop below has no per-element test.
        const auto [q_lo, q_hi] = inside_columns(g, s);
        for (int64_t p = 0; p < g.p; ++p) {
          const int64_t ih = p * g.stride - g.pad + r;
          float* out = row + p * g.q;
          if (ih < 0 || ih >= g.h) {
            std::memset(out, 0, static_cast<std::size_t>(g.q) * sizeof(float));
            continue;
          }
          const float* xrow = xc + ih * g.w;
          const int64_t shift = s - g.pad;  // output column q reads input column q·stride + shift
          for (int64_t q = 0; q < q_lo; ++q) out[q] = 0.0f;
          if (g.stride == 1) {
            std::memcpy(out + q_lo, xrow + q_lo + shift, static_cast<std::size_t>(q_hi - q_lo) * sizeof(float));
          } else {
            for (int64_t q = q_lo; q < q_hi; ++q) out[q] = xrow[q * g.stride + shift];
          }
          for (int64_t q = q_hi; q < g.q; ++q) out[q] = 0.0f;
        }
      }
    }
  }
}

// The adjoint of im2col: dx[c][ih][iw] += every col entry that im2col read from there.
// dx must be zeroed by the caller.
void col2im(const float* col, const Geometry& g, float* dx) {
  for (int64_t c = 0; c < g.c; ++c) {
    float* dxc = dx + c * g.h * g.w;
    for (int64_t r = 0; r < g.r; ++r) {
      for (int64_t s = 0; s < g.s; ++s) {
        const float* row = col + ((c * g.r + r) * g.s + s) * g.pq();
        const auto [q_lo, q_hi] = inside_columns(g, s);
        for (int64_t p = 0; p < g.p; ++p) {
          const int64_t ih = p * g.stride - g.pad + r;
          if (ih < 0 || ih >= g.h) continue;
          float* dxrow = dxc + ih * g.w;
          const int64_t shift = s - g.pad;
          const float* in = row + p * g.q;
          if (g.stride == 1) {
            for (int64_t q = q_lo; q < q_hi; ++q) dxrow[q + shift] += in[q];  // contiguous: vectorizes
          } else {
            for (int64_t q = q_lo; q < q_hi; ++q) dxrow[q * g.stride + shift] += in[q];
          }
        }
      }
    }
  }
}

int blas_int(int64_t v) {
  TUTTI_CHECK(v <= INT32_MAX, "conv2d: dimension ", v, " exceeds the BLAS integer range");
  return static_cast<int>(v);
}

}  // namespace

// One GEMM per image, on its im2col matrix. Batching several images into one GEMM (their
// im2col matrices side by side, N = nb·PQ) was measured and is slower on the CPU: one image's
// GEMM (64 x 784 x 288 for a 32 -> 64 channel 28x28 layer) already runs at OpenBLAS's peak
// while its im2col matrix (0.9 MB) is still in L2; a batch's matrix spills to DRAM (40% of
// peak for 32 images), and even a cache-sized batch must copy y / dy between the GEMM's
// [K, nb·PQ] layout and the tensors' [N, K, PQ] (the first layer, 1 -> 32 channels, ran at
// 37% / 21% of peak forward / backward in batches of 8 against ~50% / ~55% one image at a time).
void conv2d_forward_im2col(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                           const Conv2dParams& params) {
  const Geometry g = geometry(x, w, params);
  std::vector<float> xs, ws, bs, ys, col;
  const float* xf = f32_view(x, xs);
  const float* wf = f32_view(w, ws);
  const float* bf = bias.defined() ? f32_view(bias, bs) : nullptr;
  float* yf =
      y.dtype() == DType::f32 ? y.data_as<float>() : (ys.resize(static_cast<std::size_t>(y.numel())), ys.data());
  const bool trivial = g.trivial_col();
  if (!trivial) col.resize(static_cast<std::size_t>(g.crs() * g.pq()));
  const int M = blas_int(g.k), PQ = blas_int(g.pq()), CRS = blas_int(g.crs());
  for (int64_t n = 0; n < g.n; ++n) {
    const float* xn = xf + n * g.c * g.h * g.w;
    float* yn = yf + n * g.k * g.pq();
    const float* cols = xn;  // for a 1x1 conv, x_n is its own im2col matrix
    if (!trivial) {
      im2col(xn, g, col.data());
      cols = col.data();
    }
    // y_n[K, PQ] = W[K, CRS] · col[CRS, PQ]
    sgemm(false, false, M, PQ, CRS, 1.0f, wf, CRS, cols, PQ, 0.0f, yn, PQ);
    if (bf != nullptr) {
      for (int64_t k = 0; k < g.k; ++k) {
        float* row = yn + k * g.pq();
        const float b = bf[k];
        for (int64_t i = 0; i < g.pq(); ++i) row[i] += b;
      }
    }
  }
  if (y.dtype() != DType::f32) store_f32(yf, y);
}

void conv2d_backward_im2col(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                            const Tensor& db, bool accumulate_params, const Conv2dParams& params) {
  const Geometry g = geometry(x, w, params);
  std::vector<float> xs, ws, dys, dxs, dws, dbs, col, dcol;
  const float* xf = f32_view(x, xs);
  const float* wf = f32_view(w, ws);
  const float* dyf = f32_view(dy, dys);

  // dw and db accumulate in fp32 over the batch, starting from their old values or zero.
  dws.assign(static_cast<std::size_t>(dw.numel()), 0.0f);
  if (accumulate_params) {
    std::vector<float> tmp;
    const float* old = f32_view(dw, tmp);
    std::memcpy(dws.data(), old, dws.size() * sizeof(float));
  }
  if (db.defined()) {
    dbs.assign(static_cast<std::size_t>(db.numel()), 0.0f);
    if (accumulate_params) {
      std::vector<float> tmp;
      const float* old = f32_view(db, tmp);
      std::memcpy(dbs.data(), old, dbs.size() * sizeof(float));
    }
  }
  float* dxf = nullptr;
  if (dx.defined()) {
    dxf =
        dx.dtype() == DType::f32 ? dx.data_as<float>() : (dxs.resize(static_cast<std::size_t>(dx.numel())), dxs.data());
    std::memset(dxf, 0, static_cast<std::size_t>(dx.numel()) * sizeof(float));
  }
  const bool trivial = g.trivial_col();
  if (!trivial) col.resize(static_cast<std::size_t>(g.crs() * g.pq()));
  if (dxf != nullptr && !trivial) dcol.resize(col.size());
  const int K = blas_int(g.k), PQ = blas_int(g.pq()), CRS = blas_int(g.crs());

  for (int64_t n = 0; n < g.n; ++n) {
    const float* xn = xf + n * g.c * g.h * g.w;
    const float* dyn = dyf + n * g.k * g.pq();
    const float* cols = xn;
    if (!trivial) {
      im2col(xn, g, col.data());
      cols = col.data();
    }
    // dW[K, CRS] += dy_n[K, PQ] · col[CRS, PQ]^T
    sgemm(false, true, K, CRS, PQ, 1.0f, dyn, PQ, cols, PQ, 1.0f, dws.data(), CRS);
    if (db.defined()) {
      for (int64_t k = 0; k < g.k; ++k) dbs[static_cast<std::size_t>(k)] += sum_f32(dyn + k * g.pq(), g.pq());
    }
    if (dxf != nullptr) {
      float* dxn = dxf + n * g.c * g.h * g.w;
      // dcol[CRS, PQ] = W[K, CRS]^T · dy_n[K, PQ]; for a 1x1 conv it is dx_n itself.
      float* target = trivial ? dxn : dcol.data();
      sgemm(true, false, CRS, PQ, K, 1.0f, wf, CRS, dyn, PQ, 0.0f, target, PQ);
      if (!trivial) col2im(dcol.data(), g, dxn);
    }
  }
  store_f32(dws.data(), dw);
  if (db.defined()) store_f32(dbs.data(), db);
  if (dxf != nullptr && dx.dtype() != DType::f32) store_f32(dxf, dx);
}

// f32 on oneDNN where tutti was built with it; halves (and every dtype without oneDNN) on
// im2col + OpenBLAS.
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& params) {
  if (x.dtype() == DType::f32 && onednn::available()) {
    onednn::conv2d_forward(x, w, bias, y, params);
  } else {
    conv2d_forward_im2col(x, w, bias, y, params);
  }
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params) {
  if (x.dtype() == DType::f32 && onednn::available()) {
    onednn::conv2d_backward(x, w, dy, dx, dw, db, accumulate_params, params);
  } else {
    conv2d_backward_im2col(x, w, dy, dx, dw, db, accumulate_params, params);
  }
}

std::string conv2d_backend() {
  return onednn::available() ? onednn::describe() + " for f32, im2col + OpenBLAS for halves" : "im2col + OpenBLAS";
}

}  // namespace tutti::kernels::cpu
