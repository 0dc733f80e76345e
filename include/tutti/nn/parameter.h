// Parameter: one trainable tensor of a model, with its fp32 master value, its gradient and,
// under mixed precision, its half-precision compute copy.
//
// Who owns what: a Parameter owns nothing but handles (Tensors share storage). Its value may
// be a view into a flat buffer of the whole model (FlatStorage::flatten), and its grad a
// view into a buffer someone else allocated (the data-parallel runtime's buckets): assign
// `param.grad = bucket.view(offset, param.shape())` before the first backward. Backward only
// ever accumulates (+=) into grad, so it writes straight into whatever buffer grad points at.
#pragma once

#include <cstdint>
#include <functional>
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
  // A zero-filled fp32 CPU parameter of `shape`; Module::init gives it its values. Under a
  // DeferredParameters scope, one without storage (deferred).
  Parameter(Shape shape, InitSpec init);
  Parameter(const Parameter&) = delete;  // layers and optimizers hold pointers to it
  Parameter& operator=(const Parameter&) = delete;

  // Dotted path in the model, set when the model enumerates its parameters: "0.weight",
  // "fc1.bias", "3.body.1.gamma". Stable for a given model structure.
  std::string name;
  // fp32 master value. May be a view into a flat buffer. Always defined, except where the
  // master weights live elsewhere: under DistributedDataParallel's ZeRO stages with a half
  // compute dtype each rank keeps only its shard of them (FlatStorage::release_masters), and
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
  // A shard of a larger tensor (tensor parallelism, parallel/tensor_parallel.h): Module::init
  // draws the whole tensor, of shape `full`, by `init` from this parameter's seed and keeps part
  // `part` of `parts` along `dim`, so a sharded model starts from the values of the unsharded
  // one with the same seed. `full` empty: not a shard. The dimension may be blocks side by side
  // (a fused [q | k | v] projection: Llama's H, G and G heads; SwiGLU's [gate | up]), each split
  // alike: the shard holds elements [b·part/parts, b·(part+1)/parts) of each block of size b, in
  // block order. `blocks` empty: one block, the whole dimension.
  struct InitSlice {
    Shape full;
    int dim = 0;
    int part = 0, parts = 1;
    std::vector<std::int64_t> blocks;
  };
  InitSlice init_slice;
  // false until Module::init or load_state_dict gave it values (or, deferred, a source);
  // forward refuses to run otherwise, so a forgotten init() is an error rather than a silent
  // all-zero model.
  bool initialized = false;
  // true: made under DeferredParameters and not materialized yet. value and compute are
  // undefined; `source` says how to fill it. Module::materialize() gives it storage, and so
  // does DistributedDataParallel, which at ZeRO-3 fills one gather group at a time and keeps
  // only this rank's shard: a model larger than one rank's memory can be built and loaded.
  bool deferred = false;
  // A deferred parameter's values: fills `host`, an fp32 CPU tensor of shape(). Set by
  // Module::init (the values init would draw) and models::hf::load_weights (the folder's
  // tensors); called when the parameter is materialized, possibly once per rank.
  std::function<void(Tensor& host)> source;

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

// While one lives, Parameters made on this thread are deferred: they have a shape and no
// storage, so that a model of any size is built in no memory. What the model allows then:
// to(), set_precision() (amp::apply), init() and hf::load_weights (which set each parameter's
// source), structure queries (parameters, signature, flops); then Module::materialize() or
// DistributedDataParallel. forward, state_dict and load_state_dict refuse a deferred parameter.
//   std::unique_ptr<models::Llama> model;
//   { nn::DeferredParameters defer; model = std::make_unique<models::Llama>(config); }
//   model->to(device).init(seed);   // nothing allocated yet
//   ddp::DdpOptions options;
//   options.sharding = ddp::ShardParameters{};
//   ddp::DistributedDataParallel ddp(comm, *model, options);  // allocates this rank's shard
// Scopes nest.
class DeferredParameters {
 public:
  DeferredParameters();
  ~DeferredParameters();
  DeferredParameters(const DeferredParameters&) = delete;
  DeferredParameters& operator=(const DeferredParameters&) = delete;
  // Whether a scope is open on this thread.
  static bool active();
};

// Fills `dst` (of p's shape, fp32, on any device) from a deferred parameter's source on
// `stream`, through a host tensor; synchronizes. InvalidArgument naming p when it has no
// source (neither init nor a loader gave it one).
void fill_from_source(const Parameter& p, Tensor& dst, const Stream& stream);

// The tensors, in their order, with every run of tensors that lie back to back in one
// storage (same dtype, consecutive offsets, in either order) merged into one flat view.
// Used to zero, scale or reduce many gradients with few kernel launches.
std::vector<Tensor> coalesce_views(const std::vector<Tensor>& tensors);

}  // namespace tutti::nn
