#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// The labels as int64, whatever their storage dtype.
std::vector<int64_t> read_labels(const Tensor& labels) {
  std::vector<int64_t> out(static_cast<std::size_t>(labels.numel()));
  if (labels.dtype() == DType::i32) {
    const auto* p = static_cast<const std::int32_t*>(labels.data());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  } else {
    const auto* p = static_cast<const int64_t*>(labels.data());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  }
  return out;
}

// Sum over the rows of -log softmax(row)[label]; when `dl` is not null it also receives
// g_scale · (softmax(row) - onehot(label)) (zeros for ignored rows). `e_scratch` holds C floats
// when dl is null. Labels are already checked. Compute-bound on exp_f32, so it is compiled for
// wider vector units too (common.h).
TUTTI_CPU_SIMD_CLONES double softmax_xent_rows(const float* logits, float* dl, float* e_scratch, const int64_t* labels,
                                               int64_t N, int64_t C, int64_t ignore_index, float g_scale) {
  double total = 0.0;
  const ExpBounds bounds = exp_bounds();
  for (int64_t r = 0; r < N; ++r) {
    const float* row = logits + r * C;
    float* drow = dl != nullptr ? dl + r * C : nullptr;
    const int64_t label = labels[r];
    if (label == ignore_index) {
      if (drow != nullptr) std::fill(drow, drow + C, 0.0f);
      continue;
    }
    // e^(x - max) goes straight into the gradient row (or a scratch row), then is scaled in
    // place: each pass is a simple loop that vectorizes (exp_f32, the lane-wise max and sum of
    // common.h). The label's logit is read first: dlogits may be logits itself.
    float* e = drow != nullptr ? drow : e_scratch;
    const float picked = row[label];
    const float mx = max_f32(row, C);
    TUTTI_IVDEP
    for (int64_t c = 0; c < C; ++c) e[c] = exp_f32(row[c] - mx, bounds);
    const float sum = sum_f32(e, C);
    total += static_cast<double>(std::log(sum) + mx - picked);
    if (drow != nullptr) {
      const float scale = g_scale / sum;
      for (int64_t c = 0; c < C; ++c) drow[c] *= scale;
      drow[label] -= g_scale;
    }
  }
  return total;
}

}  // namespace

void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           int64_t ignore_index, float grad_scale) {
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const std::vector<int64_t> y = read_labels(labels);
  int64_t counted = 0;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t label = y[static_cast<std::size_t>(r)];
    if (label == ignore_index) continue;
    TUTTI_CHECK_ARG(label >= 0 && label < C, "softmax_cross_entropy: label ", label, " of row ", r,
                    " is out of range [0, ", C, ") for logits ", logits.str(), " (ignore_index ", ignore_index, ")");
    ++counted;
  }
  const float inv_count = counted > 0 ? 1.0f / static_cast<float>(counted) : 0.0f;
  const float g_scale = grad_scale * inv_count;
  const F32Buffer L(logits, true);
  const F32Buffer D(dlogits, false);
  std::vector<float> scratch(dlogits.defined() ? 0 : static_cast<std::size_t>(C));
  const double total = softmax_xent_rows(L.data(), dlogits.defined() ? D.data() : nullptr, scratch.data(), y.data(), N,
                                         C, ignore_index, g_scale);
  static_cast<float*>(loss.data())[0] = counted > 0 ? static_cast<float>(total / static_cast<double>(counted)) : 0.0f;
  D.store();
}

void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct, bool accumulate,
                   int64_t ignore_index) {
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const std::vector<int64_t> y = read_labels(labels);
  const F32Buffer L(logits, true);
  int64_t hits = 0;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t label = y[static_cast<std::size_t>(r)];
    if (label == ignore_index || C == 0) continue;
    const float* row = L.data() + r * C;
    int64_t best = 0;  // the first maximum wins ties, as on the GPU
    for (int64_t c = 1; c < C; ++c)
      if (row[c] > row[best]) best = c;
    if (best == label) ++hits;
  }
  auto* out = static_cast<int64_t*>(correct.data());
  out[0] = (accumulate ? out[0] : 0) + hits;
}

}  // namespace tutti::kernels::cpu
