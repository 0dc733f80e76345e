// Elementwise ops: activations, arithmetic, bias, dropout. Memory-bound: GPU kernels use
// 16-byte vector loads. Shapes: any, as long as the tensors of one call have the same
// number of elements (bias_add: see there). See linear.h for the conventions.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// y = max(x, 0). y may be x (in place).
void relu_forward(const Tensor& x, const Tensor& y, const Stream& stream = Stream());
// dx = dy where x > 0, else 0. x is the forward input. dx may be dy.
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream = Stream());

// GELU, tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(const Tensor& x, const Tensor& y, const Stream& stream = Stream());
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream = Stream());

// SwiGLU (Shazeer 2020; Llama's MLP): x [..., 2F] holds a gate and a value side by side,
// x = [g | u] (columns [0, F) and [F, 2F) of each row) -> y [..., F] = silu(g) · u, with
// silu(g) = g · sigmoid(g). The gate's multiply is fused: the MLP's two input projections are one
// GEMM whose output this reads.
void swiglu_forward(const Tensor& x, const Tensor& y, const Stream& stream = Stream());
// Given dy [..., F]: dx [..., 2F] = [dy · u · silu'(g) | dy · silu(g)] (written). x is the forward
// input.
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream = Stream());

// out = a + b. out may alias a or b.
void add(const Tensor& a, const Tensor& b, const Tensor& out, const Stream& stream = Stream());
// out = alpha · x. out may be x.
void scale(const Tensor& x, float alpha, const Tensor& out, const Stream& stream = Stream());
// out += alpha · x (axpy). For accumulating gradients (residual branches).
void add_scaled(const Tensor& x, float alpha, const Tensor& out, const Stream& stream = Stream());
// out = value everywhere.
void fill(const Tensor& out, float value, const Stream& stream = Stream());

// Adds a per-channel bias: x is [N, C, inner...] viewed as [N, C, inner] with `inner` the
// product of the dimensions after channel_dim (1 for x = [N, C] and channel_dim = 1),
// out[n, c, i] = x[n, c, i] + bias[c]. out may be x.
void bias_add(const Tensor& x, const Tensor& bias, int channel_dim, const Tensor& out, const Stream& stream = Stream());
// dbias[c] (+)= sum over n, i of dy[n, c, i]. dbias may be f32 for half dy.
void bias_backward(const Tensor& dy, int channel_dim, const Tensor& dbias, bool accumulate,
                   const Stream& stream = Stream());

// Dropout with a counter-based RNG: element i is kept when uniform(seed, offset + i) >= p,
// and kept values are scaled by 1 / (1 - p). The mask depends only on (seed, offset + i),
// so the CPU and the GPU drop the same elements, and backward recomputes the mask instead
// of storing it. p in [0, 1); p = 0 copies.
void dropout_forward(const Tensor& x, float p, std::uint64_t seed, std::uint64_t offset, const Tensor& y,
                     const Stream& stream = Stream());
void dropout_backward(const Tensor& dy, float p, std::uint64_t seed, std::uint64_t offset, const Tensor& dx,
                      const Stream& stream = Stream());
// The uniform number in [0, 1) that dropout draws for counter `index` (host side, for tests).
float dropout_uniform(std::uint64_t seed, std::uint64_t index);

}  // namespace tutti::kernels
