// Module: the base of every layer and model. A module has parameters, child modules, a
// forward pass and a backward pass; a model is the root module of such a tree.
//
// Threading and streams: a model is used by one thread at a time. Every kernel of forward,
// backward, zero_grad and the flat-buffer copies is issued on the model's stream (stream());
// on the CPU, work runs as it is issued. Nothing here synchronizes the host with the device
// except where a comment says so (init, to, state_dict, load_state_dict).
//
// Writing a non-sequential model: derive from Module, hold the layers as members (or
// unique_ptrs), register them in the constructor with register_module, and implement
// forward_impl / backward_impl by calling the children's forward / backward (backward in
// reverse order, adding the gradients of a tensor that fed several children). Modules are
// neither copyable nor movable, because parents and optimizers hold pointers into them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/flat_plan.h"
#include "tutti/nn/flat_storage.h"
#include "tutti/nn/parameter.h"

namespace tutti::nn {

// Settings of one model, shared by all its modules (a child adopts its parent's).
struct ModuleSettings {
  Device device = Device::cpu();
  Stream stream;                       // where the model's kernels are issued
  DType compute_dtype = DType::f32;    // activations and the parameters' compute copies
  DType grad_dtype = DType::f32;       // gradients backward writes: f32 or compute_dtype
  DType grad_comm_dtype = DType::f32;  // what a data-parallel runtime sends the gradients as
  bool training = true;                // Dropout drops only in training mode
  int batch_slice = 0;                 // this process's slice of the global batch ...
  int batch_slices = 1;                // ... of this many (see Module::set_batch_slice)
  FlatStorage* storage = nullptr;      // the model's (its hooks), null until made
  bool recomputing = false;            // a checkpointed module is replaying its forward in
                                       // backward (Dropout then reuses its last mask)
};

// Activation checkpointing's shared memory (Residual::set_recompute, models::Gpt::set_recompute):
// the layers inside a checkpointed module take their reusable buffers (Module::buffer) from
// here instead of keeping their own, by (their position in the checkpointed body, slot). Bodies
// of the same structure, e.g. the blocks of a transformer, so use the same memory, sized for
// the largest: at any time at most one checkpointed body's activations exist (its forward in
// the forward pass, or its replay and backward in the backward pass), not one per body.
// Shared by the modules it was given to (shared_ptr); freed with the last of them.
class RecomputeWorkspace {
 public:
  // Bytes of the buffers it holds now.
  std::int64_t bytes() const;
  // Frees them (the next use allocates again).
  void clear() { buffers_.clear(); }

 private:
  friend class Module;
  Tensor& slot(int index, int slot);
  std::vector<std::vector<Tensor>> buffers_;  // [position in the body][slot + 2]
};

// One reusable buffer (Module::buffer) that a layer holds once it has run a forward and a backward
// in training, as the layer states it (Module::buffer_statements).
struct BufferStatement {
  enum class Kind : std::uint8_t {
    output,    // forward's result: held until backward by a next layer that keeps its input
    saved,     // made by forward and kept by this layer for its backward (a statistic, its output)
    backward,  // made by backward (an input gradient, a scratch)
  };
  int slot = 0;  // Module::buffer's slot
  std::int64_t bytes = 0;
  Kind kind = Kind::output;
};

// Model FLOPs of one sample through a module in training (see Module::flops).
struct Flops {
  double forward = 0;
  double backward = 0;
  double total() const { return forward + backward; }
};

class Module {
 public:
  Module();
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  // ---- running ------------------------------------------------------------------------
  // Forward pass. A floating x of another dtype is first cast to the compute dtype. The
  // result is in the compute dtype on device(), and stays valid until this module's next
  // forward: modules reuse their output buffers, so that a training step allocates nothing
  // after the first one. Issued on stream(); no host sync. Throws if a parameter was never
  // initialized (call init() or load_state_dict()).
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // Backward of the last forward, given dy = dLoss/dOutput (cast to the compute dtype when
  // needed). Layers run in reverse; each ADDS its parameters' gradients (+=, so k backward
  // passes accumulate until zero_grad) and then calls the grad-ready hook for each. On the
  // model (the root) it first allocates a flat gradient buffer (storage().allocate_grads) when
  // some trainable parameter has no grad yet. Returns dx when input gradients are needed
  // (set_input_grad; a model's input is data, so by default the root returns an undefined
  // Tensor and skips that work); valid until the next backward.
  // dy must have the shape of the forward's output (on the model, the root: InvalidArgument
  // otherwise; e.g. [B, T, V] logits take a [B, T, V] gradient, not the [B·T, V] of a reshape).
  // Each backward of the model needs a forward of its own: a second backward after one
  // forward throws InvalidArgument (it would add the same gradients twice and, under
  // DistributedDataParallel, communicate twice), as PyTorch does without retain_graph.
  Tensor backward(const Tensor& dy);
  // Whether the model (the root) ran a forward that no backward has used yet.
  bool awaiting_backward() const { return awaiting_backward_; }

  // ---- structure ----------------------------------------------------------------------
  // Every parameter of this module and its children, in registration order (depth first),
  // with Parameter::name set to its dotted path ("0.weight", "fc1.bias"). Includes frozen
  // ones (requires_grad false). Pointers stay valid as long as the module lives.
  std::vector<Parameter*> parameters();
  // Those with requires_grad, in the same order.
  std::vector<Parameter*> trainable_parameters();
  // One line per parameter, "name shape dtype requires_grad", in registration order, then
  // one per entry of extra_state(), "name shape dtype state": what every rank must agree on.
  // structure_hash() is a 64-bit FNV-1a hash of it.
  std::string signature();
  std::uint64_t structure_hash();
  // Direct children with their names, in registration order.
  const std::vector<std::pair<std::string, Module*>>& children() const { return children_; }
  // A short type name, "Linear(784, 512)".
  virtual std::string describe() const = 0;
  // Model FLOPs of ONE sample whose shape is `sample` (the input's shape without the batch
  // dimension: {784}, {1, 28, 28}) through this module in training, for MFU (obs/mfu.h):
  // matrix products and convolutions only, 2 FLOPs per multiply-add, backward counted as twice
  // the forward (the input's and the weights' gradients), the convention of PaLM's MFU (6 N per
  // token), except where backward computes no input gradient (input_grad_needed() false: the
  // model's first layer, whose input is data): there the weights' gradient alone, once the
  // forward (backward_flops). Counting work that is not done would let MFU pass 100%. Writes the
  // output's per-sample shape to `out`. Containers add their children's (Sequential chains the
  // shapes); the default is an elementwise layer: no FLOPs, out = sample. A custom layer with
  // matrix products should override it.
  virtual Flops flops(const Shape& sample, Shape& out) const;
  // The bytes of the reusable buffers (Module::buffer) this module holds once it has run a
  // forward and a backward in training on a batch whose input has the shape `input` (batch
  // dimension first) in `dtype` (the compute dtype): what every later step holds too, since
  // buffers are reused, never freed. Writes the output's shape to `out`. The default adds this
  // module's buffer_statements (so it throws where they do: a layer that does not state its
  // buffers cannot be planned); containers (Sequential, Residual) add their children's.
  // train::memory_plan(model, sample, options) adds them to DistributedDataParallel's part.
  virtual std::int64_t buffer_bytes(const Shape& input, DType dtype, Shape& out) const;
  // This module's own buffers, one statement per Module::buffer slot it fills in a training step
  // on such an input (not its children's), with the output's shape in `out`: what buffer_bytes
  // adds, and what train::memory_plan reads by slot to size a recomputed body's shared workspace
  // (RecomputeWorkspace). Each layer states them beside the code that allocates them (its output,
  // its input gradient where backward makes one, its statistics). The default throws
  // InvalidArgument naming the layer.
  virtual std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const;
  // flops(sample).total(): the training FLOPs of one sample.
  double training_flops_per_sample(const Shape& sample) const;
  // The backward FLOPs of a layer with weights whose forward is `forward` FLOPs of matrix
  // products: the weights' gradient (= forward), plus the input's (= forward) when it is needed.
  double backward_flops(double forward) const;

  // ---- settings (call on the model, not on a child; they apply to the whole tree) -------
  // Moves parameters (keeping a flat layout, if any) to `device` and issues later work on
  // `stream` (default: the CPU stream, i.e. the device's default stream on a GPU). Grads that
  // the storage allocated move too (zeroed); grads placed from outside are dropped (undefined).
  // Synchronizes the host with the copies.
  Module& to(Device device, const Stream& stream = Stream());
  Module& set_stream(const Stream& stream);
  // Mixed precision: compute in `compute` (f32, f16 or bf16) from half copies of the fp32
  // master weights, gradients stored in `grad` (f32 or `compute`). Grads of another dtype
  // are dropped (they get reallocated at the next backward, or placed again).
  Module& set_precision(DType compute, DType grad = DType::f32);
  // The dtype a data-parallel runtime sends the gradients in (f32, f16 or bf16), which
  // DistributedDataParallel uses unless its options say otherwise. f32 unless set;
  // amp::apply sets the policy's (bf16 for Policy::bf16()).
  Module& set_grad_comm_dtype(DType dtype);
  // Data parallelism: this process's batch is slice `index` of `count` equal, consecutive
  // slices of one global batch (rank r of N under data::DistributedLoader, which splits every
  // global batch so). Dropout then gives every element the random number of its position in
  // the global batch, so N processes with their slices draw the masks one process with the
  // whole batch would, and no two ranks share a mask. DistributedDataParallel sets (rank,
  // world size) for as long as it lives. Default (0, 1): the batch is the whole batch.
  Module& set_batch_slice(int index, int count);
  // Fills every parameter by its InitSpec from a generator seeded by (seed, index in
  // registration order): the same seed gives the same values on the CPU and the GPU
  // (values are drawn on the host and copied). Also seeds the Dropout layers. Refreshes the
  // compute copies. Synchronizes.
  // On a model with deferred parameters (nn::DeferredParameters) it allocates nothing: each
  // deferred one gets as its source the values init would draw, filled when it is materialized.
  Module& init(std::uint64_t seed);
  // Gives every deferred parameter (nn::DeferredParameters) fp32 storage on device(), filled
  // from its source one parameter at a time, and its compute copy under mixed precision.
  // InvalidArgument naming the first one without a source (never initialized). Nothing to do
  // when none is deferred. Synchronizes.
  Module& materialize();
  // Whether some parameter is deferred (made under nn::DeferredParameters, not materialized).
  bool has_deferred_parameters();
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  // Whether backward returns dx (see backward). Children of a module other than the first
  // of a Sequential always compute it.
  Module& set_input_grad(bool needed);
  bool input_grad_needed() const { return input_grad_needed_; }

  const ModuleSettings& settings() const { return *settings_; }
  Device device() const { return settings_->device; }
  const Stream& stream() const { return settings_->stream; }
  DType compute_dtype() const { return settings_->compute_dtype; }
  DType grad_dtype() const { return settings_->grad_dtype; }
  DType grad_comm_dtype() const { return settings_->grad_comm_dtype; }
  bool is_training() const { return settings_->training; }

  // ---- flat buffers (flat_storage.h) ----------------------------------------------------
  // The model's flat buffers (values, compute copies, gradients, under one FlatPlan) and the
  // grad-ready, grad-placement and param-use hooks; made on first use. Call it on the model
  // (the root module), not on a child (InvalidArgument).
  FlatStorage& storage();
  // Zeroes every gradient (a few memsets: adjacent views are merged), on stream().
  void zero_grad();
  // Makes every grad undefined (the buffers they viewed are released when unused).
  void drop_grads();

  // ---- state --------------------------------------------------------------------------
  // "name" -> CPU copy of the fp32 master value, for every parameter, and extra_state().
  // Synchronizes.
  StateDict state_dict();
  // Copies values back by name (shapes must match; with strict, every parameter and extra
  // state entry must be present and every entry must be one) and refreshes the compute
  // copies. Synchronizes.
  void load_state_dict(const StateDict& state, bool strict = true);
  // The modules' state that is not a parameter, under "<module path>.<key>" like the
  // parameters' names: i64 CPU tensors. Dropout's random-number seed and position
  // ("1.rng_seed", "1.rng_counter"), so that a resumed run draws the masks an uninterrupted
  // one would. Part of state_dict(); DistributedDataParallel gives every rank rank 0's.
  StateDict extra_state();
  // Restores entries of extra_state() by name (with strict, every one must be present; other
  // names are ignored).
  void load_extra_state(const StateDict& state, bool strict = true);
  // Casts every fp32 value into its compute copy (after values changed outside an optimizer).
  void refresh_compute_copies();

 protected:
  // The layer's own work, called by forward()/backward() with x and dy already in the
  // compute dtype.
  virtual Tensor forward_impl(const Tensor& x) = 0;
  virtual Tensor backward_impl(const Tensor& dy) = 0;
  // Called by init() with a seed derived for this module (Dropout keeps it).
  virtual void on_init(std::uint64_t /*seed*/) {}
  // This module's own non-parameter state, keyed without its path (i64 tensors), and its
  // restoration from the same keys (every key present). See extra_state().
  virtual StateDict own_extra_state() const { return {}; }
  virtual void load_own_extra_state(const StateDict& /*state*/) {}
  // Called when the child list changes or input_grad_needed changes: containers pass the
  // input-gradient need on to their children.
  virtual void on_input_grad_changed() {}

  // Activation checkpointing (see RecomputeWorkspace): every module below `body` (body included)
  // takes its buffers from `workspace`, or again its own when null. Static, so that a container
  // can call it on its children.
  static void use_workspace(Module& body, const std::shared_ptr<RecomputeWorkspace>& workspace);
  // Marks the model as replaying a checkpointed forward (ModuleSettings::recomputing).
  void set_recomputing(bool on) { settings_->recomputing = on; }
  // Registers a parameter member under `name` (unique within this module).
  Parameter& register_parameter(std::string name, Parameter& param);
  // Registers a child held by the caller / owned by this module; it adopts this model's
  // settings and computes its input gradient.
  Module& register_module(std::string name, Module& child);
  Module& register_module(std::string name, std::unique_ptr<Module> child);
  // Tells the grad-ready hook (FlatStorage) that `param`'s gradient has been written for this backward.
  void grad_ready(Parameter& param);
  // A reusable buffer of `shape` and `dtype` on device(), one per slot: reallocated only
  // when it must grow, so repeated steps allocate nothing. Contents are uninitialized. Inside a
  // checkpointed body it is the RecomputeWorkspace's, which other bodies overwrite.
  Tensor buffer(int slot, const Shape& shape, DType dtype);
  // The gradient of `param` to accumulate into: where the placement hook says, else its grad,
  // allocated (zeroed) if still undefined (a module used on its own, without the root's flat
  // buffer). Layers call it right before they write the gradient.
  const Tensor& grad_of(Parameter& param);

 private:
  friend class FlatStorage;  // the model's flat buffers reach its parameters and children
  void adopt_settings(const std::shared_ptr<ModuleSettings>& settings);
  void collect(const std::string& prefix, std::vector<Parameter*>& out);
  void collect_modules(std::vector<Module*>& out);
  void collect_named_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out);
  void require_root(const char* what) const;
  void require_masters(const char* what) const;
  // InvalidArgument when some parameter is deferred (not materialized).
  void require_materialized(const char* what);
  void structure_changed();
  void check_initialized();
  void clear_buffers_recursive();

  std::shared_ptr<ModuleSettings> settings_;
  Module* parent_ = nullptr;
  // The name of this module's spans in a trace (trace_label()), made when first needed.
  mutable std::shared_ptr<std::string> trace_label_;
  const std::string& trace_label() const;
  bool input_grad_needed_ = false;
  std::vector<std::pair<std::string, Parameter*>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::vector<std::unique_ptr<Module>> owned_children_;
  std::vector<Tensor> buffers_;
  std::shared_ptr<RecomputeWorkspace> workspace_;  // where buffer() takes them instead, when set
  int workspace_index_ = 0;                        // this module's position in the checkpointed body
  // Root only: cached parameters() and the flat buffers.
  std::vector<Parameter*> all_params_;
  bool all_params_valid_ = false;
  bool checked_initialized_ = false;
  bool awaiting_backward_ = false;
  Shape output_shape_;                    // the root's: of its last forward's output, which backward's dy must have
  std::unique_ptr<FlatStorage> storage_;  // null until storage() first runs
};

}  // namespace tutti::nn
