// Shared pieces of the CPU kernels: typed element access and fp32 staging of half tensors.
// Internal header (kernels/cpu/*.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "tutti/core/dtype.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

// Product of every dimension but the last: the rows of a tensor seen as [rows, last].
inline std::int64_t leading_rows(const Tensor& t) {
  std::int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) rows *= t.shape()[static_cast<std::size_t>(i)];
  return rows;
}

// Converts n elements to and from fp32 (the type every CPU kernel computes in).
template <typename T>
void to_f32(const T* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}
template <typename T>
void from_f32(const float* src, T* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

// A floating tensor seen as fp32 memory: an f32 tensor's own data, or for f16/bf16 an fp32
// scratch copy (filled from the tensor when `load`), written back by store(). Lets BLAS and
// other fp32-only code run on every dtype.
class F32Buffer {
 public:
  // An undefined tensor gives a null buffer (for optional outputs).
  F32Buffer(const Tensor& t, bool load) : tensor_(t) {
    if (!t.defined()) return;
    if (t.dtype() == DType::f32) {
      data_ = static_cast<float*>(t.data());
      return;
    }
    scratch_.resize(static_cast<std::size_t>(t.numel()));
    data_ = scratch_.data();
    if (!load) return;
    if (t.dtype() == DType::f16) to_f32(static_cast<const Half*>(t.data()), data_, t.numel());
    else to_f32(static_cast<const BFloat16*>(t.data()), data_, t.numel());
  }
  float* data() const { return data_; }
  // Writes the fp32 values back into the tensor (rounding to nearest even); no-op for f32.
  void store() const {
    if (!tensor_.defined()) return;
    if (tensor_.dtype() == DType::f16) from_f32(data_, static_cast<Half*>(tensor_.data()), tensor_.numel());
    else if (tensor_.dtype() == DType::bf16) from_f32(data_, static_cast<BFloat16*>(tensor_.data()), tensor_.numel());
  }

 private:
  Tensor tensor_;
  std::vector<float> scratch_;
  float* data_ = nullptr;
};

}  // namespace tutti::kernels::cpu
