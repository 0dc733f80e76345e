// CPU elementwise ops (the reference). Internal header; inputs are validated by
// kernels/elementwise.cc. Same meaning as tutti/kernels/elementwise.h.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void relu_forward(const Tensor& x, const Tensor& y);
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
void gelu_forward(const Tensor& x, const Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
void swiglu_forward(const Tensor& x, const Tensor& y);
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void scale(const Tensor& x, float alpha, const Tensor& out);
void add_scaled(const Tensor& x, float alpha, const Tensor& out);
void fill(const Tensor& out, float value);
// x viewed as [outer, channels, inner].
void bias_add(const Tensor& x, const Tensor& bias, std::int64_t outer, std::int64_t channels, std::int64_t inner,
              const Tensor& out);
void bias_backward(const Tensor& dy, std::int64_t outer, std::int64_t channels, std::int64_t inner, const Tensor& dbias,
                   bool accumulate);
// scale = 1 / (1 - p), computed once by the caller in fp32 (the GPU uses the same value).
void dropout(const Tensor& x, float p, float scale, std::uint64_t seed, std::uint64_t offset, const Tensor& y);

}  // namespace tutti::kernels::cpu
