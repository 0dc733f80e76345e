// Mixed-precision policy: which dtype computes, which holds the master weights, which the
// gradients are stored and communicated in, and whether the loss needs scaling.
#pragma once

#include "tutti/amp/loss_scaler.h"
#include "tutti/core/dtype.h"

namespace tutti::nn {
class Module;
}

namespace tutti::amp {

struct Policy {
  DType compute = DType::f32;  // activations and the weights' compute copies
  DType master = DType::f32;   // master weights; always f32 in tutti
  DType grad = DType::f32;     // gradient buffers backward writes (f32 or compute)
  DType comm = DType::f32;     // what the data-parallel runtime sends (cast from grad if needed)

  // Everything in fp32.
  static Policy fp32() { return {}; }
  // bf16 compute; fp32 gradients (accumulation-safe) sent as bf16 (half the bytes).
  static Policy bf16() { return {DType::bf16, DType::f32, DType::f32, DType::bf16}; }
  // fp16 compute with fp32 gradients, sent as fp32: fp16's range is why a loss scale exists.
  static Policy fp16() { return {DType::f16, DType::f32, DType::f32, DType::f32}; }

  // The loss scaler this policy calls for: dynamic for fp16 (its narrow range underflows
  // small gradients), off for bf16 and fp32 (bf16 has fp32's range).
  LossScalerOptions default_scaler() const;
};

// Sets the model's compute and gradient dtypes from the policy (Module::set_precision) and
// the dtype its gradients are communicated in (Module::set_grad_comm_dtype), which
// DistributedDataParallel then uses unless DdpOptions::reducer.grad_comm_dtype says otherwise.
// Throws InvalidArgument for a master dtype other than f32.
void apply(const Policy& policy, nn::Module& model);

}  // namespace tutti::amp
