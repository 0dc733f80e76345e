// --sync: how the trainers keep their ranks in step. ddp (the default): DDP over every rank (flat
// or --allreduce hierarchical). diloco:H: DDP inside each node and DiLoCo across the nodes
// (tutti/ddp/diloco.h), with --outer-lr, --outer-momentum, --outer-dtype, --error-feedback;
// --ranks-per-node fakes the node map on one machine. With tensor parallelism (train_gpt's --tp N)
// the ranks form a mesh whose last dimension is the tp group: dp x tp, or with diloco node x dp x
// tp (each node's ranks consecutive, as mpirun places them), so that DDP runs over the ranks of
// one tp coordinate (within the node with diloco) and DiLoCo over the nodes' ranks of one (dp, tp)
// coordinate: each tp rank's slices are synced as a model of their own would be. Both trainers
// use it alike:
//
//   example::Sync sync(job, f);                                     // COLLECTIVE (node groups, mesh)
//   tutti::ddp::DistributedDataParallel ddp(sync.ddp_communicator(), model, ddp_options);
//   ... optimizer; ddp.attach(optimizer) ...
//   sync.start(ddp, optimizer);                                     // COLLECTIVE (DiLoCo)
//   tutti::train::State state(ddp, optimizer, scaler, loader);
//   sync.add_state(state);                                          // "diloco." (or the refusal)
//   while (run.next()) { ... optimizer.step(); ddp.zero_grad(); sync.end_step(run); run.end_step(); }
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "run_flags.h"

namespace example {

class Sync {
 public:
  // COLLECTIVE: checks that the ranks agree on the flags, makes the node groups when needed.
  // Throws InvalidArgument naming the flag (--sync, --allreduce, --ranks-per-node, ...).
  // tensor_parallel: the ranks of each tp group (train_gpt's --tp; it must divide the ranks, and
  // with diloco each node's).
  Sync(tutti::Job& job, const RunFlags& f, int tensor_parallel = 1);
  // The communicator the inner DDP runs over: the world's, a hierarchical one, the node's, or the
  // mesh's dp group (the ranks of this rank's tp coordinate; within its node with diloco).
  tutti::Communicator& ddp_communicator();
  // The group the model is split over (the mesh's tp), or nullptr without tensor parallelism.
  tutti::Communicator* tensor_parallel_group() const { return mesh_ ? &mesh_->group("tp") : nullptr; }
  // This rank's slice of the global batch and their number: one per data-parallel replica (the
  // ranks of one tp group share theirs).
  int data_parallel_rank() const { return data_rank_; }
  int data_parallel_size() const { return data_size_; }
  // COLLECTIVE with --sync diloco (the DiLoCo object; node 0's parameters everywhere). Throws
  // DiLoCo's InvalidArgument, naming the flag, for bad DiLoCo flags (--outer-lr, --streaming, ...)
  // or node layouts (one node, nodes of unequal sizes).
  void start(tutti::ddp::DistributedDataParallel& ddp, tutti::optim::Optimizer& optimizer);
  // Adds "diloco." to the run's state: DiLoCo's (collective), or with --sync ddp an entry that
  // refuses a DiLoCo checkpoint.
  void add_state(tutti::train::State& state);
  // After the optimizer's step, before run.end_step(): DiLoCo's inner step (the outer sync every
  // H steps, and at the run's last step, so that the final model is the global one). Returns
  // whether it synced.
  bool end_step(const tutti::train::Run& run);

  bool diloco() const { return sync_every_ > 0; }
  // "ddp", or "diloco:10 (outer Nesterov lr 0.7 momentum 0.9, int8, error feedback; 2 nodes x 2)".
  std::string describe() const;
  // "ddp" or "diloco:H" (the summary's "sync").
  const std::string& mode() const { return mode_; }
  std::int64_t syncs() const { return diloco_ ? diloco_->syncs() : 0; }
  std::int64_t last_sync_bytes() const { return diloco_ ? diloco_->last_sync_bytes() : 0; }

 private:
  // With --sync diloco and tensor parallelism: the node x dp x tp mesh, and DiLoCo's groups from it.
  void use_tensor_parallel_mesh(int tp);

  tutti::Job& job_;
  const RunFlags& f_;
  std::string mode_;
  int sync_every_ = 0;  // 0: ddp
  std::shared_ptr<tutti::Communicator> hierarchical_;
  std::optional<tutti::DeviceMesh> mesh_;  // with tensor parallelism
  int data_rank_ = 0, data_size_ = 1;
  tutti::NodeGroups groups_;
  std::unique_ptr<tutti::ddp::DiLoCo> diloco_;
};

}  // namespace example
