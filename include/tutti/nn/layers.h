// The layers: Linear, ReLU, GELU, SwiGLU, Dropout, LayerNorm, RMSNorm, Conv2d, MaxPool2d, Flatten,
// Residual.
// Each is a Module (see module.h for what forward/backward promise) over the kernels of
// tutti/kernels. Shapes: the first dimension is the batch.
#pragma once

#include <cstdint>
#include <memory>

#include "tutti/kernels/conv.h"
#include "tutti/nn/module.h"
#include "tutti/nn/sequential.h"

namespace tutti::nn {

// How a weight matrix is initialized (biases start at zero): WeightInit::kaiming_uniform (the
// default), WeightInit::xavier_uniform, or WeightInit::normal(std), N(0, std²) (GPT-2: 0.02).
struct WeightInit {
  enum class Kind : std::uint8_t { kaiming_uniform, xavier_uniform, normal };
  Kind kind = Kind::kaiming_uniform;
  double stddev = 0;  // Kind::normal only

  static const WeightInit kaiming_uniform;  // U(-b, b), b = sqrt(6 / fan_in)
  static const WeightInit xavier_uniform;   // U(-b, b), b = sqrt(6 / (fan_in + fan_out))
  static constexpr WeightInit normal(double stddev) { return {Kind::normal, stddev}; }
  // The InitSpec of a weight with these fans.
  InitSpec spec(double fan_in, double fan_out) const;
  friend constexpr bool operator==(const WeightInit&, const WeightInit&) = default;
};
inline constexpr WeightInit WeightInit::kaiming_uniform{WeightInit::Kind::kaiming_uniform, 0};
inline constexpr WeightInit WeightInit::xavier_uniform{WeightInit::Kind::xavier_uniform, 0};

struct LinearOptions {
  bool bias = true;
  WeightInit init = WeightInit::kaiming_uniform;
};

// y[..., out] = x[..., in] · weight[out, in]^T + bias[out]. The bias is marked no_weight_decay.
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, LinearOptions options = {});
  Parameter weight;
  Parameter bias;  // a [0]-shaped, unregistered placeholder when options.bias is false
  std::string describe() const override;
  Flops flops(const Shape& sample, Shape& out) const override;
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  // The bias forward adds: the bias, or none without one. parallel::RowParallelLinear adds it on
  // one rank of its group only, before the output is summed over the group.
  virtual Tensor forward_bias() const { return has_bias_ ? bias.compute_value() : Tensor(); }
  // Forward's multiply, y = x · weight^T + forward_bias(), and backward's, on given tensors: the
  // weight's and the bias's gradients added and reported ready, dx = dy · weight where dx is
  // defined. parallel::ColumnParallelLinear and RowParallelLinear gather or scatter around them.
  void multiply(const Tensor& x, const Tensor& y);
  void multiply_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
  Tensor x_;  // forward input, for backward

 private:
  std::int64_t in_, out_;
  bool has_bias_;
};

class ReLU : public Module {
 public:
  std::string describe() const override { return "ReLU"; }
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Tensor x_;
};

// GELU, tanh approximation.
class GELU : public Module {
 public:
  std::string describe() const override { return "GELU"; }
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Tensor x_;
};

// SwiGLU's gated activation (Llama's MLP): [..., 2F] holding [gate | up] (the output of one
// Linear(C, 2F) whose first F rows are the gate projection) -> [..., F] = silu(gate) · up
// (kernels::swiglu_forward). No parameters.
class SwiGLU : public Module {
 public:
  std::string describe() const override { return "SwiGLU"; }
  // [.., 2F] -> [.., F]; no FLOPs counted (elementwise).
  Flops flops(const Shape& sample, Shape& out) const override;
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Tensor x_;
};

// Drops each element with probability p in training mode (scaling kept ones by 1/(1-p));
// the identity in eval mode. The mask comes from a counter-based generator keyed by the
// seed init() gives: element e of a forward's global batch gets random number counter + e,
// and the counter then advances by the global batch's size. So the mask is the same on the
// CPU and the GPU, backward recomputes it instead of storing it, and with the model's batch
// slice (Module::set_batch_slice; DistributedDataParallel sets it) rank r of N, holding rows
// [r·n, (r+1)·n) of a global batch of N·n rows, draws exactly the random numbers of those
// rows: N ranks mask as one process with the whole batch, and never alike. (This needs the
// equal, consecutive slices DistributedLoader makes; with other data the masks still differ
// between ranks.) The seed and the counter are the layer's state ("rng_seed",
// "rng_counter" in Module::extra_state), saved in checkpoints with the model, so a resumed
// run draws the masks an uninterrupted one would. Inside a checkpointed Residual, the
// replay of the forward in backward reuses that forward's mask (ModuleSettings::recomputing).
class Dropout : public Module {
 public:
  explicit Dropout(float p);
  std::string describe() const override;
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;
  float p() const { return p_; }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  void on_init(std::uint64_t seed) override;
  StateDict own_extra_state() const override;
  void load_own_extra_state(const StateDict& state) override;

 private:
  float p_;
  std::uint64_t seed_ = 0;
  std::uint64_t counter_ = 0;      // elements of global batches drawn so far
  std::uint64_t last_offset_ = 0;  // the random number of this rank's first element in the last forward
  bool last_dropped_ = false;      // whether the last forward dropped (training and p > 0)
};

// Normalizes over the last dimension: y = (x - mean) / sqrt(var + eps) · gamma + beta. gamma and
// beta are marked no_weight_decay.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t dim, float eps = 1e-5f);
  Parameter gamma;  // ones
  Parameter beta;   // zeros
  std::string describe() const override;
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  // Whether this backward's input holds only some rows of the batch, so that its parameters'
  // gradients are partial (a sequence-parallel subclass, parallel::SequenceParallelLayerNorm):
  // then backward writes [dgamma | dbeta] ([2, dim]) to scratch, passes it to sum_partial_grads
  // (which sums it over the ranks holding the other rows, in place), and adds the result.
  virtual bool partial_rows() const { return false; }
  virtual void sum_partial_grads(const Tensor& /*grads*/) {}

 private:
  std::int64_t dim_;
  float eps_;
  Tensor x_, mean_, rstd_;
};

// Root-mean-square normalization over the last dimension (Llama's): y = x / sqrt(mean(x²) + eps) ·
// weight, no mean subtracted and no bias (kernels::rmsnorm_forward). The weight (ones) is marked
// no_weight_decay.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(std::int64_t dim, float eps = 1e-5f);
  Parameter weight;  // ones
  std::string describe() const override;
  float eps() const { return eps_; }
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  // As LayerNorm's (parallel::SequenceParallelRMSNorm): the weight's gradient [dim] only.
  virtual bool partial_rows() const { return false; }
  virtual void sum_partial_grads(const Tensor& /*grads*/) {}

 private:
  std::int64_t dim_;
  float eps_;
  Tensor x_, rstd_;
};

struct Conv2dOptions {
  int stride = 1;
  int padding = 0;
  bool bias = true;
  WeightInit init = WeightInit::kaiming_uniform;
};

// x [N, C, H, W] -> y [N, K, P, Q] with a square kernel. The bias is marked no_weight_decay.
class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, int kernel_size, Conv2dOptions options = {});
  Parameter weight;  // [K, C, R, R]
  Parameter bias;    // [K]; [0] and unregistered without bias
  std::string describe() const override;
  Flops flops(const Shape& sample, Shape& out) const override;
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  std::int64_t in_, out_;
  int kernel_;
  kernels::Conv2dParams params_;
  bool has_bias_;
  Tensor x_;
};

// 2x2 max-pooling with stride 2 (H and W even): [N, C, H, W] -> [N, C, H/2, W/2].
class MaxPool2d : public Module {
 public:
  std::string describe() const override { return "MaxPool2d(2)"; }
  Flops flops(const Shape& sample, Shape& out) const override;
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Tensor x_;
};

// [N, d1, d2, ...] -> [N, d1·d2·...] as a view (no copy).
class Flatten : public Module {
 public:
  std::string describe() const override { return "Flatten"; }
  Flops flops(const Shape& sample, Shape& out) const override;
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Shape in_shape_;
};

// y = x + body(x); body must keep the shape. Build the body in place:
// doc-test: wrap-main
// setup: using namespace tutti::nn;
// setup: Sequential model;
//   model.emplace<Residual>().body().add<LayerNorm>(64).add<Linear>(64, 64);
//
// Activation checkpointing (set_recompute): the body's layers then take their buffers from a
// RecomputeWorkspace (module.h), which the next checkpointed Residual overwrites, so that
// between forward and backward the residual keeps only its input x (a handle: the layer before
// owns it) and its output y. Its backward first runs the body's forward again on x (the same
// kernels in the same order, Dropout replaying its mask: ModuleSettings::recomputing), then the
// body's backward, so the gradients are bit-identical to those without recomputation, for one
// more forward of the body.
class Residual : public Module {
 public:
  Residual();
  // A residual around one given module (it becomes body()[0]).
  explicit Residual(std::unique_ptr<Module> inner);
  Sequential& body() { return *body_; }
  const Sequential& body() const { return *body_; }
  std::string describe() const override { return "Residual"; }
  Flops flops(const Shape& sample, Shape& out) const override;
  // Its own buffers (y, and dx where its input needs a gradient), which it keeps when its body
  // recomputes; buffer_bytes adds the body's.
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;
  std::int64_t buffer_bytes(const Shape& input, DType dtype, Shape& out) const override;
  // Checkpoints this residual's body in `workspace` (shared with the other checkpointed
  // residuals of the model, whose bodies should have the same structure); null turns it off.
  // Takes effect at the next forward; do not call it between a forward and its backward.
  // Throws InvalidArgument for an empty body (nothing to recompute), or when checkpointed bodies
  // would nest (this residual inside a checkpointed body, or one inside this body).
  Residual& set_recompute(std::shared_ptr<RecomputeWorkspace> workspace);
  bool recomputes() const { return workspace_ != nullptr; }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Sequential* body_;
  std::shared_ptr<RecomputeWorkspace> workspace_;
  Tensor x_;  // the forward's input, when recomputing
};

}  // namespace tutti::nn
