#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// As LayerNorm's row loops (kernels/cpu/layernorm.cc): fp32 memory, a few short passes over each
// row in L1, compiled for wider vector units, sums in 16 lanes.
TUTTI_CPU_SIMD_CLONES void forward_rows(const float* x, const float* w, float eps, float* y, float* r_out, int64_t rows,
                                        int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * D;
    float* out = y + r * D;
    if (r + 1 < rows) prefetch_row(row + D, D);
    const float sq = sum_lanes(D, [row](int64_t i) { return row[i] * row[i]; });
    const float rs = 1.0f / std::sqrt(sq / static_cast<float>(D) + eps);
    TUTTI_IVDEP
    for (int64_t i = 0; i < D; ++i) out[i] = row[i] * rs * w[i];
    r_out[r] = rs;
  }
}

// dx = rstd · (g - xhat · mean(g · xhat)), g = dy · weight, xhat = x · rstd; dweight += dy · xhat
// summed over the rows into dw.
TUTTI_CPU_SIMD_CLONES void backward_rows(const float* x, const float* w, const float* r_in, const float* dy, float* dx,
                                         float* __restrict dw, int64_t rows, int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    const float* gr = dy + r * D;
    float* out = dx + r * D;
    const float rs = r_in[r];
    const float sum_gx = sum_lanes(D, [&](int64_t i) { return gr[i] * w[i] * (xr[i] * rs); });
    for (int64_t i = 0; i < D; ++i) dw[i] += gr[i] * (xr[i] * rs);
    const float mean_gx = sum_gx / static_cast<float>(D);
    TUTTI_IVDEP
    for (int64_t i = 0; i < D; ++i) out[i] = rs * (gr[i] * w[i] - (xr[i] * rs) * mean_gx);
  }
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd) {
  const F32Buffer X(x, true), W(weight, true), Y(y, false);
  forward_rows(X.data(), W.data(), eps, Y.data(), static_cast<float*>(rstd.data()), leading_rows(x), x.dim(-1));
  Y.store();
}

void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                      const Tensor& dweight, bool accumulate_params) {
  const int64_t D = x.dim(-1);
  const F32Buffer X(x, true), W(weight, true), DY(dy, true), DX(dx, false), DW(dweight, accumulate_params);
  std::vector<float> dw(static_cast<std::size_t>(D), 0.0f);
  backward_rows(X.data(), W.data(), static_cast<const float*>(rstd.data()), DY.data(), DX.data(), dw.data(),
                leading_rows(x), D);
  DX.store();
  if (DW.data() == nullptr) return;
  for (int64_t i = 0; i < D; ++i)
    DW.data()[i] = (accumulate_params ? DW.data()[i] : 0.0f) + dw[static_cast<std::size_t>(i)];
  DW.store();
}

}  // namespace tutti::kernels::cpu
