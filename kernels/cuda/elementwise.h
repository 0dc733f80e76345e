// CUDA launchers of the elementwise ops (vectorized, memory-bound). Inputs are validated by
// kernels/elementwise.cc; each launch is ordered on `stream`. No CUDA types here.
#pragma once

#include <cstdint>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void relu_forward(const Tensor& x, const Tensor& y, const Stream& stream);
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream);
void gelu_forward(const Tensor& x, const Tensor& y, const Stream& stream);
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream);
void swiglu_forward(const Tensor& x, const Tensor& y, const Stream& stream);
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream);
void add(const Tensor& a, const Tensor& b, const Tensor& out, const Stream& stream);
void scale(const Tensor& x, float alpha, const Tensor& out, const Stream& stream);
void add_scaled(const Tensor& x, float alpha, const Tensor& out, const Stream& stream);
void fill(const Tensor& out, float value, const Stream& stream);
// x viewed as [outer, channels, inner].
void bias_add(const Tensor& x, const Tensor& bias, std::int64_t outer, std::int64_t channels, std::int64_t inner,
              const Tensor& out, const Stream& stream);
void bias_backward(const Tensor& dy, std::int64_t outer, std::int64_t channels, std::int64_t inner, const Tensor& dbias,
                   bool accumulate, const Stream& stream);
// scale = 1 / (1 - p), computed once by the caller in fp32 (the GPU uses the same value).
void dropout(const Tensor& x, float p, float scale, std::uint64_t seed, std::uint64_t offset, const Tensor& y,
             const Stream& stream);

}  // namespace tutti::kernels::cuda
