// Exact sums in fixed point: DistributedDataParallel's deterministic mode adds every slice's
// gradients into int64 accumulators, whose sums (here and in an integer allreduce) are exact,
// so they do not depend on the order of the additions. See linear.h for conventions.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// For every element: v = double(x[i]) · scale, rounded to the nearest integer (ties to even);
// acc[i] += v when x[i] is finite and |v| <= limit. Otherwise acc[i] is left as it is and
// status[0] (x[i] is inf or nan) or status[1] (|v| > limit) is set to 1; status is otherwise
// untouched, so one status collects several calls (zero it first). zero_x: x is then set to
// zero (a gradient buffer ready for the next slice, in the same pass). x: f32, f16 or bf16;
// acc: i64 of the same numel; status: i64 [2]. The rounding is the same on the CPU and on a
// GPU, so a slice's contribution is the same bits wherever it is computed. Keep limit at most
// 2^62 / (the number of calls whose results are summed) and no sum can overflow.
void fixed_point_accumulate(const Tensor& x, double scale, double limit, const Tensor& acc, const Tensor& status,
                            bool zero_x = false, const Stream& stream = Stream());
// out[i] = acc[i] · scale, computed in double and rounded once to out's dtype (f32, f16 or bf16).
void fixed_point_to_float(const Tensor& acc, double scale, const Tensor& out, const Stream& stream = Stream());

}  // namespace tutti::kernels
