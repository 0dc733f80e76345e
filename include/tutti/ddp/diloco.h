// DiLoCo: data parallelism across nodes joined by a thin link (issue 23; arXiv 2311.08105).
//
// Each node trains synchronously within itself (a DistributedDataParallel over its ranks,
// NodeGroups::intra, with any ZeRO stage) for H inner steps; then the nodes average the
// pseudo-gradient Δ = global − local (the global parameters of the last sync minus this node's
// parameters now) and an outer optimizer (Nesterov SGD, lr 0.7, momentum 0.9 by default) applies
// it to the global parameters, from which every node continues. The link carries the whole
// parameter vector once per H steps instead of the gradients at every step.
//
// doc-test: fragment a sketch: the inner step is elided
//   tutti::NodeGroups groups = job.node_groups();                         // COLLECTIVE
//   tutti::ddp::DistributedDataParallel ddp(*groups.intra, model);        // within the node
//   ddp.attach(optimizer);
//   tutti::ddp::DiLoCo diloco(ddp, optimizer, groups, {.sync_every = 50}); // COLLECTIVE
//   for (...) {
//     ... ddp.forward / ddp.backward / optimizer.step() / ddp.zero_grad() ...
//     diloco.end_inner_step(step == steps - 1); // every H-th call, and the last: COLLECTIVE
//   }
//
// The outer sync, for n = reducer().plan().total parameters, N nodes of L ranks: each rank
// takes Δ on its slice of ceil(n / L) elements (local rank l: [l · ceil(n/L), ...)), averages it across
// the nodes over NodeGroups::inter (L slices travel in parallel, each node sends n values in
// all, as the hierarchical allreduce does), then the averaged slices are all-gathered inside
// the node, and every rank applies the outer step to the whole vector. So the global
// parameters and the outer momentum are fp32, whole and bit-identical on every rank (they are
// replicated, not sharded), and the model's parameters (values, masters, compute copies: DDP's
// load_parameters_flat) are set to the new global ones. The inner optimizer's state carries on.
//
// Outer dtype (what crosses the link): f32 (allreduce of Δ), bf16 (allreduce in bf16), int8 or
// int4 (kernels/compress.h: per-block absmax, blocks of DiLoCoOptions::block; quantized values
// cannot be summed on the wire, so each rank all-gathers the nodes' bytes and scales and
// dequantizes and adds them itself, in node order, then divides by N; every rank gets the same
// bits), or with DiLoCoOptions::exchange reduce_scatter (the default from 3 nodes) each rank cuts
// its quantized slice into N chunks of whole blocks, sends chunk k to node k (N − 1 sendrecv
// rounds), each owner dequantizes and sums the N chunks in node order, divides by N and
// requantizes the average, and the averages are all-gathered (everyone dequantizes the same
// bytes): 2 (N − 1) / N of the quantized slice sent per rank instead of (N − 1) times it, at the
// cost of a second quantization. Error feedback (not f32): each rank keeps what quantization left out of its slice and
// adds it to the next sync's Δ, so that the sum of what was sent follows the sum of Δ; with
// reduce_scatter the owner also keeps its requantization error and adds it to its next average.
//
// Streaming (DiLoCoOptions::fragments = F > 1): the flat vector is cut into F equal fragments,
// each synced as above on its own range, fragment 0 at the end of each period and fragment f at
// its inner step f · H / F; only the synced range of the model is set to the global values.
// The fragments are cut in the flat plan's layout, whose padding depends on the ZeRO stage: the
// same F syncs slightly different parameter ranges at different stages.
//
// Overlap (DiLoCoOptions::overlap_steps = τ > 0, at most H / F so that one sync is in flight):
// at the fragment's step Δ is taken, the model's fragment kept as a snapshot, and the exchange
// across nodes launched (the Communicator runs it on its own thread or stream); the call
// returns and the inner steps go on. τ steps later (before that step's own launch) the exchange
// is finished (the int8/int4 reduce_scatter's second half, blocking, is done here), the outer
// step runs on the fragment, and the model's fragment becomes global_new + (local_now −
// snapshot): the new global values plus this node's progress during the overlap. τ = 0 is the
// blocking sync; sync() completes a sync in flight first.
//
// Checkpoints (state_dict, COLLECTIVE; train::State::add_collective): the global parameters and
// the outer momentum by parameter name ("global.<name>", "momentum.<name>"), the inner steps
// done in the current period ("inner_step"), the node count ("nodes"), and every node's own
// state (parameters "node<k>.model.<name>", inner optimizer "node<k>.optim.<key>", residuals
// "node<k>.residual", "node<k>.owner_residual"), and a sync in flight: its exchange finished
// (not its outer step), "pending_fragment" (-1: none), "pending_age", "pending_average" and each
// node's "node<k>.snapshot", so that a resume on the same number of nodes continues exactly (even
// mid-period, with a sync in flight). load_state_dict (not collective) on another number of nodes keeps the outer state
// (it is replicated) and restarts the period from the global parameters: every node takes them
// and node 0's inner optimizer state, the inner steps since the last sync are dropped (their
// progress belonged to nodes of the old layout), the residuals start at zero (they are what
// each old node still owed), and a sync in flight is dropped. A state without DiLoCo entries (a --sync ddp checkpoint)
// is refused.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tutti/comm/groups.h"
#include "tutti/core/state_dict.h"
#include "tutti/core/tensor.h"
#include "tutti/ddp/ddp.h"
#include "tutti/optim/optimizer.h"

namespace tutti::ddp {

// What the pseudo-gradients are sent as between nodes.
enum class OuterDType : std::uint8_t { f32, bf16, int8, int4 };
// "f32", "bf16", "int8", "int4" (the examples' --outer-dtype); InvalidArgument otherwise.
OuterDType parse_outer_dtype(std::string_view text);
const char* outer_dtype_name(OuterDType dtype);

// How int8 / int4 pseudo-gradients cross the nodes (f32 and bf16 are always an allreduce).
// allgather: every rank gets every node's bytes, (N − 1) Q per rank for Q bytes of quantized
// slice. reduce_scatter: each node owns 1/N of the slice, gets the others' chunks of it, averages
// and requantizes them, and the averages are all-gathered: 2 (N − 1) / N Q per rank, one more
// quantization. automatic: allgather on 2 nodes, reduce_scatter from 3.
enum class OuterExchange : std::uint8_t { automatic, allgather, reduce_scatter };
// "auto", "allgather", "reduce_scatter" (the examples' --outer-exchange); InvalidArgument otherwise.
OuterExchange parse_outer_exchange(std::string_view text);
const char* outer_exchange_name(OuterExchange exchange);

struct DiLoCoOptions {
  int sync_every = 10;          // H: inner steps between outer syncs (>= 1)
  double outer_lr = 0.7;        // > 0
  double outer_momentum = 0.9;  // in [0, 1)
  bool nesterov = true;
  OuterDType outer_dtype = OuterDType::f32;
  bool error_feedback = false;  // keep the quantization residual per rank (no effect with f32)
  std::int64_t block = 64;      // int8 / int4: elements per scale (even)
  // Streaming: the flat vector cut into this many equal fragments (1 ..  sync_every); fragment 0
  // syncs at the end of each period, fragment f at its inner step f · H / F, so that the link
  // carries n / F values at a time instead of n every H steps.
  int fragments = 1;
  // Overlap τ (0 .. floor(H / F)): 0 blocks each sync until its fragment is in the model. τ > 0
  // launches the fragment's exchange across nodes and returns; the inner steps go on while it
  // travels and it is applied τ inner steps later (merge rule at the top of this file).
  int overlap_steps = 0;
  OuterExchange exchange = OuterExchange::automatic;  // int8 / int4 only
};

class DiLoCo {
 public:
  // COLLECTIVE over every rank of the groups. `inner` runs over groups.intra and `optimizer`
  // is the one attached to it (its state is part of the checkpoints); both must outlive this
  // object. Node 0's parameters become the global parameters of every node (broadcast over
  // groups.inter). Throws InvalidArgument (the same on every rank) for sync_every < 1,
  // outer_lr <= 0, outer_momentum outside [0, 1), a bad block, one node only, or nodes with
  // unequal rank counts (naming NodeGroups::sizes_str()).
  DiLoCo(DistributedDataParallel& inner, optim::Optimizer& optimizer, const NodeGroups& groups,
         DiLoCoOptions options = {});
  ~DiLoCo();
  DiLoCo(const DiLoCo&) = delete;
  DiLoCo& operator=(const DiLoCo&) = delete;

  // After each optimizer step. Every sync_every-th call (with fragments: at each fragment's
  // step) runs the outer sync (COLLECTIVE across every rank; blocks until the new parameters
  // are in the model, or with overlap_steps > 0 launches it) and returns true; the others only
  // count (and apply an overlapped sync whose τ steps are done) and return false. last_step:
  // the run's last optimizer step (train::Run: run.step() + 1 == run.steps()); when the
  // schedule does not sync at it, sync() runs (COLLECTIVE) and it returns true, so that the
  // run ends with the global model on every node, not each node's own.
  bool end_inner_step(bool last_step = false);
  // Completes an overlapped sync in flight, then runs the outer sync of every fragment now,
  // whatever the count (COLLECTIVE), and restarts the period.
  void sync();
  // The fragment whose overlapped sync is in flight, or -1.
  int pending_fragment() const { return pending_; }

  // COLLECTIVE (every rank; rank 0's result holds every node's state, see the top of this
  // file; the other ranks' results hold their own node's). Whole CPU tensors.
  StateDict state_dict();
  // Not collective: every rank takes what it needs (see the top of this file). InvalidArgument
  // when the state has no DiLoCo entries or they do not fit the model.
  void load_state_dict(const StateDict& state);

  int inner_step() const { return inner_step_; }  // inner steps done in this period
  std::int64_t syncs() const { return syncs_; }   // outer syncs done by this object
  const DiLoCoOptions& options() const { return options_; }
  int nodes() const { return groups_.node_count(); }
  // f32 [reducer().plan().total] on the model's device: the global parameters and the outer momentum.
  const Tensor& global_parameters() const { return global_; }
  const Tensor& outer_momentum() const { return momentum_; }
  // The averaged pseudo-gradient of the last fragment synced: its first (fragment's length)
  // elements (f32; with one fragment, reducer().plan().total).
  const Tensor& last_pseudo_gradient() const { return avg_; }
  // Bytes one rank sent across nodes in the last sync (its slice, in the outer dtype).
  std::int64_t last_sync_bytes() const { return last_bytes_; }

 private:
  // The exchange of this rank's slice `delta` of a fragment across the nodes, in two halves
  // (diloco_exchange.cc): launch issues what can travel without the host (residual: its error
  // feedback, or undefined); finish waits for it, does the rest, and leaves delta averaged over
  // the nodes. owner_residual: the reduce_scatter owner's error feedback, or undefined.
  void launch_exchange(const Tensor& delta, const Tensor& residual);
  void finish_exchange(const Tensor& delta, const Tensor& owner_residual);
  bool reduce_scatter_exchange() const;
  // Fragment f: Δ = global − local on this rank's slice into avg_, its exchange launched, and
  // (keep_snapshot) local's fragment copied into snapshot_.
  void launch(int f, const Tensor& local, bool keep_snapshot);
  // The launched fragment's exchange finished and avg_ holding its whole average.
  void receive(int f);
  // The outer step on fragment f's global parameters and momentum, from avg_.
  void outer_step(int f);
  // Outer sync of fragment f, blocking; sets local's elements of it to the new global ones.
  void sync_fragment(int f, const Tensor& local);
  bool scheduled_step();  // end_inner_step's schedule: true when it synced (or launched a sync)
  // The overlapped sync in flight: received, outer step, merged into local (see the top).
  void apply_pending(const Tensor& local);
  std::pair<std::int64_t, std::int64_t> fragment(int f) const;  // [begin, end) of the flat vector
  std::pair<std::int64_t, std::int64_t> my_slice(int f) const;  // this rank's (begin, count) of it
  StateDict named(const Tensor& flat) const;
  Tensor flat_of(const StateDict& state, const std::string& prefix) const;
  const Tensor& buffer(int i, Shape shape, DType dtype, Device device);  // buffers_[i], reshaped if needed

  DistributedDataParallel& inner_;
  optim::Optimizer& optimizer_;
  NodeGroups groups_;
  DiLoCoOptions options_;
  std::int64_t total_ = 0, shard_ = 0;  // plan().total, ceil(widest fragment / L)
  Tensor global_, momentum_, avg_;      // f32 [total]; avg_: f32 [L · shard]
  Tensor residual_;                     // f32 [total]: this rank's slices (error feedback)
  Tensor owner_residual_;               // f32 [total]: the owned chunks' (reduce_scatter)
  Tensor snapshot_;                     // f32 [widest fragment]: local at the pending launch
  std::array<Tensor, 8> buffers_;       // the compressed dtypes' staging
  std::vector<Work> works_;             // the launched exchange's collectives
  int pending_ = -1, pending_age_ = 0;  // overlap: the fragment in flight, inner steps since
  bool received_ = false;               // its average is in avg_ (checkpoint, resume)
  int inner_step_ = 0;
  std::int64_t syncs_ = 0, last_bytes_ = 0;
};

}  // namespace tutti::ddp
