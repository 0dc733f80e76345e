// Parameter: one trainable tensor of a model, with its fp32 master value, its gradient and,
// under mixed precision, its half-precision compute copy.
//
// Who owns what: a Parameter owns nothing but handles (Tensors share storage). Its value may
// be a view into a flat buffer of the whole model (Module::flatten_parameters), and its grad a
// view into a buffer someone else allocated (the data-parallel runtime's buckets): assign
// `param.grad = bucket.view(offset, param.shape())` before the first backward. Backward only
// ever accumulates (+=) into grad, so it writes straight into whatever buffer grad points at.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/core/tensor.h"

namespace tutti::nn {

// How Module::init fills a parameter. fan_in / fan_out are those of the layer that owns it.
struct InitSpec {
  enum class Kind : std::uint8_t {
    zeros,
    ones,
    uniform,          // U(-bound, bound)
    kaiming_uniform,  // U(-b, b), b = sqrt(6 / fan_in): He et al., for ReLU-like layers
    xavier_uniform,   // U(-b, b), b = sqrt(6 / (fan_in + fan_out)): Glorot & Bengio
    normal,           // N(0, bound^2): bound is the standard deviation (GPT-2: 0.02)
  };
  Kind kind = Kind::zeros;
  double fan_in = 0;
  double fan_out = 0;
  double bound = 0;  // for Kind::uniform; the standard deviation for Kind::normal

  static InitSpec zeros() { return {Kind::zeros}; }
  static InitSpec ones() { return {Kind::ones}; }
  static InitSpec uniform(double bound) { return {Kind::uniform, 0, 0, bound}; }
  static InitSpec kaiming_uniform(double fan_in) { return {Kind::kaiming_uniform, fan_in, 0, 0}; }
  static InitSpec xavier_uniform(double fan_in, double fan_out) { return {Kind::xavier_uniform, fan_in, fan_out, 0}; }
  static InitSpec normal(double std) { return {Kind::normal, 0, 0, std}; }
};

struct Parameter {
  // A zero-filled fp32 CPU parameter of `shape`; Module::init gives it its values.
  Parameter(Shape shape, InitSpec init);
  Parameter(const Parameter&) = delete;  // layers and optimizers hold pointers to it
  Parameter& operator=(const Parameter&) = delete;

  // Dotted path in the model, set when the model enumerates its parameters: "0.weight",
  // "fc1.bias", "3.body.1.gamma". Stable for a given model structure.
  std::string name;
  // fp32 master value. May be a view into a flat buffer. Always defined, except where the
  // master weights live elsewhere: under DistributedDataParallel's ZeRO stages with a half
  // compute dtype each rank keeps only its shard of them (Module::release_master_values), and
  // value is undefined; forward and backward read `compute`, which stays whole.
  Tensor value;
  // Gradient: f32, or the compute dtype under mixed precision; undefined until the model
  // allocates one (lazily, at the first backward) or someone places a view here. Its shape
  // must equal shape() and it must live on value's device.
  Tensor grad;
  // Half-precision copy of value that forward and backward read under mixed precision;
  // undefined when the compute dtype is f32. The optimizers keep it equal to value.
  Tensor compute;
  // false: backward computes no gradient for it and optimizers skip it (a frozen weight).
  bool requires_grad = true;
  // true: weight decay must never apply to it. Set by the layer that owns it, before it
  // registers it: embedding tables (TokenPositionEmbedding), normalization gains and offsets
  // (LayerNorm), biases (Linear, Conv2d). optim::weight_decay_groups' default rule reads it; a
  // layer of your own sets it the same way.
  bool no_weight_decay = false;
  // How Module::init fills it.
  InitSpec init;
  // false until Module::init or load_state_dict gave it values; forward refuses to run
  // otherwise, so a forgotten init() is an error rather than a silent all-zero model.
  bool initialized = false;

  // The shape given at construction; value, grad and compute all have it.
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return numel_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  Device device() const { return compute_value().device(); }
  // What forward and backward read: the compute copy when there is one, else the value.
  const Tensor& compute_value() const { return compute.defined() ? compute : value; }

 private:
  Shape shape_;
  std::int64_t numel_ = 0;
};

// The tensors, in their order, with every run of tensors that lie back to back in one
// storage (same dtype, consecutive offsets, in either order) merged into one flat view.
// Used to zero, scale or reduce many gradients with few kernel launches.
std::vector<Tensor> coalesce_views(const std::vector<Tensor>& tensors);

}  // namespace tutti::nn
