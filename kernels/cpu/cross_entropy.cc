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

// e^(x - mx) for the C columns of one row into dst (a row of dlogits, or scratch), and their sum:
// the same steps as softmax_xent_rows, so that with one rank the split pieces give its bits.
TUTTI_CPU_SIMD_CLONES float exp_row(const float* row, float mx, float* dst, int64_t C) {
  const ExpBounds bounds = exp_bounds();
  TUTTI_IVDEP
  for (int64_t c = 0; c < C; ++c) dst[c] = exp_f32(row[c] - mx, bounds);
  return sum_f32(dst, C);
}

// Every label of `y` in [0, total) or ignore_index; InvalidArgument naming the op and row otherwise.
int64_t check_and_count(const char* op, const std::vector<int64_t>& y, int64_t total, int64_t ignore_index,
                        const Tensor& logits) {
  int64_t counted = 0;
  for (std::size_t r = 0; r < y.size(); ++r) {
    if (y[r] == ignore_index) continue;
    TUTTI_CHECK_ARG(y[r] >= 0 && y[r] < total, op, ": label ", y[r], " of row ", r, " is out of range [0, ", total,
                    ") for logits ", logits.str(), " (ignore_index ", ignore_index, ")");
    ++counted;
  }
  return counted;
}

}  // namespace

void cross_entropy_local_max(const Tensor& logits, const Tensor& row_max) {
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const F32Buffer L(logits, true);
  auto* out = static_cast<float*>(row_max.data());
  for (int64_t r = 0; r < N; ++r) out[r] = C > 0 ? max_f32(L.data() + r * C, C) : -INFINITY;
}

void cross_entropy_local_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                              const ClassColumns& columns, int64_t ignore_index) {
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const std::vector<int64_t> y = read_labels(labels);
  check_and_count("cross_entropy_local_sums", y, columns.total, ignore_index, logits);
  const F32Buffer L(logits, true);
  const auto* mx = static_cast<const float*>(row_max.data());
  auto* exp_sum = static_cast<float*>(sums.data());
  float* picked = exp_sum + N;
  std::vector<float> scratch(static_cast<std::size_t>(C));
  for (int64_t r = 0; r < N; ++r) {
    const int64_t label = y[static_cast<std::size_t>(r)], column = label - columns.first;
    if (label == ignore_index) {
      exp_sum[r] = picked[r] = 0.0f;
      continue;
    }
    const float* row = L.data() + r * C;
    exp_sum[r] = exp_row(row, mx[r], scratch.data(), C);
    picked[r] = column >= 0 && column < C ? row[column] : 0.0f;
  }
}

void cross_entropy_from_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                             const Tensor& loss, const Tensor& dlogits, const ClassColumns& columns,
                             int64_t ignore_index, float grad_scale) {
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const std::vector<int64_t> y = read_labels(labels);
  const int64_t counted = check_and_count("cross_entropy_from_sums", y, columns.total, ignore_index, logits);
  const float g_scale = grad_scale * (counted > 0 ? 1.0f / static_cast<float>(counted) : 0.0f);
  const auto* mx = static_cast<const float*>(row_max.data());
  const auto* exp_sum = static_cast<const float*>(sums.data());
  const float* picked = exp_sum + N;
  double total = 0.0;
  for (int64_t r = 0; r < N; ++r) {
    if (y[static_cast<std::size_t>(r)] == ignore_index) continue;
    total += static_cast<double>(std::log(exp_sum[r]) + mx[r] - picked[r]);
  }
  static_cast<float*>(loss.data())[0] = counted > 0 ? static_cast<float>(total / static_cast<double>(counted)) : 0.0f;
  if (!dlogits.defined()) return;
  const F32Buffer L(logits, true);
  const F32Buffer D(dlogits, false);
  for (int64_t r = 0; r < N; ++r) {
    float* drow = D.data() + r * C;
    const int64_t label = y[static_cast<std::size_t>(r)], column = label - columns.first;
    if (label == ignore_index) {
      std::fill(drow, drow + C, 0.0f);
      continue;
    }
    exp_row(L.data() + r * C, mx[r], drow, C);
    const float scale = g_scale / exp_sum[r];
    for (int64_t c = 0; c < C; ++c) drow[c] *= scale;
    if (column >= 0 && column < C) drow[column] -= g_scale;
  }
  D.store();
}

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
