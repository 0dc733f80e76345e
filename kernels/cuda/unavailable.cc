// A build without CUDA still links the CUDA launchers that the dispatchers name: each one
// here throws. They are never reached in practice, since no Tensor can live on a GPU in such
// a build (Device::require_available() refuses it).
#include "tutti/core/error.h"

// Each family's stubs, in its own section.
// ---- linear, elementwise, cross_entropy, layernorm ----
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/linear.h"

namespace tutti::kernels::cuda {

namespace {
[[noreturn]] void no_cuda_ka(const char* op) { TUTTI_THROW(BackendError, op, ": built without CUDA"); }
}  // namespace
void matmul(const Tensor&, bool, const Tensor&, bool, const Tensor&, float, float, const Stream&) {
  no_cuda_ka("matmul");
}
void linear_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Stream&) {
  no_cuda_ka("linear_forward");
}
void linear_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                     const Stream&) {
  no_cuda_ka("linear_backward");
}
void relu_forward(const Tensor&, const Tensor&, const Stream&) { no_cuda_ka("relu_forward"); }
void relu_backward(const Tensor&, const Tensor&, const Tensor&, const Stream&) { no_cuda_ka("relu_backward"); }
void gelu_forward(const Tensor&, const Tensor&, const Stream&) { no_cuda_ka("gelu_forward"); }
void gelu_backward(const Tensor&, const Tensor&, const Tensor&, const Stream&) { no_cuda_ka("gelu_backward"); }
void swiglu_forward(const Tensor&, const Tensor&, const Stream&) { no_cuda_ka("swiglu_forward"); }
void swiglu_backward(const Tensor&, const Tensor&, const Tensor&, const Stream&) { no_cuda_ka("swiglu_backward"); }
void add(const Tensor&, const Tensor&, const Tensor&, const Stream&) { no_cuda_ka("add"); }
void scale(const Tensor&, float, const Tensor&, const Stream&) { no_cuda_ka("scale"); }
void add_scaled(const Tensor&, float, const Tensor&, const Stream&) { no_cuda_ka("add_scaled"); }
void fill(const Tensor&, float, const Stream&) { no_cuda_ka("fill"); }
void bias_add(const Tensor&, const Tensor&, std::int64_t, std::int64_t, std::int64_t, const Tensor&, const Stream&) {
  no_cuda_ka("bias_add");
}
void bias_backward(const Tensor&, std::int64_t, std::int64_t, std::int64_t, const Tensor&, bool, const Stream&) {
  no_cuda_ka("bias_backward");
}
void dropout(const Tensor&, float, float, std::uint64_t, std::uint64_t, const Tensor&, const Stream&) {
  no_cuda_ka("dropout");
}
void softmax_cross_entropy(const Tensor&, const Tensor&, const Tensor&, const Tensor&, std::int64_t, float,
                           const Stream&) {
  no_cuda_ka("softmax_cross_entropy");
}
void count_correct(const Tensor&, const Tensor&, const Tensor&, bool, std::int64_t, const Stream&) {
  no_cuda_ka("count_correct");
}
void layernorm_forward(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&, const Tensor&, const Tensor&,
                       const Stream&) {
  no_cuda_ka("layernorm_forward");
}
void layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, const Tensor&, bool, const Stream&) {
  no_cuda_ka("layernorm_backward");
}

}  // namespace tutti::kernels::cuda

// ---- conv, reduce, cast, optimizer ----
#include "kernels/cuda/cast.h"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/cuda/reduce.h"

namespace tutti::kernels::cuda {
namespace {
[[noreturn]] void no_cuda_kb(const char* op) {
  TUTTI_THROW(BackendError, op, ": this build of tutti has no CUDA (TUTTI_WITH_CUDA=OFF)");
}
}  // namespace
void conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&, const Stream&) {
  no_cuda_kb("conv2d_forward");
}
void conv2d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                     const Conv2dParams&, const Stream&) {
  no_cuda_kb("conv2d_backward");
}
void maxpool2x2_forward(const Tensor&, const Tensor&, const Stream&) { no_cuda_kb("maxpool2x2_forward"); }
void maxpool2x2_backward(const Tensor&, const Tensor&, const Tensor&, const Stream&) {
  no_cuda_kb("maxpool2x2_backward");
}
void sum(const Tensor&, const Tensor&, bool, const Stream&) { no_cuda_kb("sum"); }
void sum_squares(const Tensor&, const Tensor&, bool, const Stream&) { no_cuda_kb("sum_squares"); }
void check_finite(const Tensor&, const Tensor&, const Stream&) { no_cuda_kb("check_finite"); }
void cast(const Tensor&, const Tensor&, const Stream&) { no_cuda_kb("cast"); }
void unscale_and_check(const Tensor&, float, const Tensor&, const Stream&) { no_cuda_kb("unscale_and_check"); }
void sgd_update(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const SgdParams&, bool, const Stream&) {
  no_cuda_kb("sgd_update");
}
void adamw_update(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWParams&,
                  const Stream&) {
  no_cuda_kb("adamw_update");
}
}  // namespace tutti::kernels::cuda

// ---- embedding, attention, fixed_point, compress ----
#include "kernels/cuda/attention.h"
#include "kernels/cuda/compress.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fixed_point.h"

namespace tutti::kernels::cuda {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  TUTTI_THROW(BackendError, op, ": this build of tutti has no CUDA (TUTTI_WITH_CUDA=OFF)");
}
}  // namespace
void embedding_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Stream&) {
  no_cuda("embedding_forward");
}
void embedding_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, const Stream&) {
  no_cuda("embedding_backward");
}
void attention_forward(const Tensor&, std::int64_t, const Tensor&, const Tensor&, const Stream&) {
  no_cuda("attention_forward");
}
void attention_backward(const Tensor&, const Tensor&, const Tensor&, std::int64_t, const Tensor&, const Stream&) {
  no_cuda("attention_backward");
}
void fixed_point_accumulate(const Tensor&, double, double, const Tensor&, const Tensor&, bool, const Stream&) {
  no_cuda("fixed_point_accumulate");
}
void fixed_point_to_float(const Tensor&, double, const Tensor&, const Stream&) { no_cuda("fixed_point_to_float"); }
void quantize_blocks(const Tensor&, int, std::int64_t, const Tensor&, const Tensor&, const Tensor&, const Stream&) {
  no_cuda("quantize_blocks");
}
void dequantize_blocks(const Tensor&, const Tensor&, int, std::int64_t, const Tensor&, bool, const Stream&) {
  no_cuda("dequantize_blocks");
}
}  // namespace tutti::kernels::cuda

// ---- flash_attention, rmsnorm, rope ----
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"

namespace tutti::kernels::cuda {
namespace {
[[noreturn]] void unavailable(const char* op) {
  TUTTI_THROW(BackendError, op, ": this build of tutti has no CUDA (TUTTI_WITH_CUDA=OFF)");
}
}  // namespace
void flash_attention_forward(const Tensor&, const FlashShape&, const Tensor&, const Tensor&, const Stream&) {
  unavailable("flash_attention_forward");
}
void flash_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const FlashShape&,
                              const Tensor&, const Stream&) {
  unavailable("flash_attention_backward");
}
void rmsnorm_forward(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&, const Stream&) {
  unavailable("rmsnorm_forward");
}
void rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                      const Stream&) {
  unavailable("rmsnorm_backward");
}
void rope_rotate(const Tensor&, const RopeShape&, const Tensor&, bool, const Stream&) { unavailable("rope_rotate"); }
}  // namespace tutti::kernels::cuda
