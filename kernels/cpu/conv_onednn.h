// The CPU convolution on oneDNN: fp32 forward, backward data and backward weights. Internal
// header: kernels/cpu/conv.cc calls it for f32 tensors when available() (oneDNN found at build
// time: kernels/cpu/conv_onednn.cc; else kernels/cpu/conv_onednn_none.cc, whose functions
// throw). Inputs are validated by the public functions in kernels/conv.cc.
//
// Primitives are created once per shape and thread (a thread-local cache; creating one costs
// far more than running it), and run on kernels::cpu_threads() threads, as the GEMMs do.
#pragma once

#include <cstdint>
#include <string>

#include "tutti/core/tensor.h"
#include "tutti/kernels/conv.h"

namespace tutti::kernels::cpu::onednn {

// True when tutti was built with oneDNN.
bool available();
// "oneDNN 2.6.3 (avx512_core_bf16, OpenMP)"; "" when not available().
std::string describe();
// Primitives (convolutions and reorders) this process has created so far: a training step
// after the first creates none.
std::int64_t primitives_created();

// As cpu::conv2d_forward / conv2d_backward, for f32 tensors only (dw and db f32 too).
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& params);
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params);

}  // namespace tutti::kernels::cpu::onednn
