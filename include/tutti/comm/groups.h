// Node groups and the hierarchical allreduce: two levels of communication for clusters whose
// nodes are joined by a thinner link than their ranks within a node.
//
// doc-test: wrap-main
// setup: tutti::Job job(argc, argv);
// setup: tutti::Tensor x = tutti::Tensor::zeros({8}, tutti::DType::f32, job.device());
// setup: tutti::nn::Sequential model;
// setup: model.add<tutti::nn::Linear>(8, 8);
//   tutti::NodeGroups groups = job.node_groups();          // COLLECTIVE
//   groups.intra->allreduce(x).wait();                     // the ranks of this node
//   auto hier = tutti::hierarchical_communicator(job.communicator(), groups);
//   tutti::ddp::DistributedDataParallel ddp(*hier, model);  // gradients: two-level allreduce
//
// The hierarchical allreduce of n elements over N nodes of L ranks each: reduce-scatter inside
// the node (each rank gets n/L elements), allreduce of that shard across the nodes (the ranks
// with the same local index), all-gather inside the node. Each rank sends about 2n/L elements
// over the inter-node link where a flat ring sends about 2n(NL-1)/(NL): L times fewer bytes
// cross the link per rank. docs/multinode.md ("Hierarchical allreduce") has measurements.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"

namespace tutti {

// A world split in two ways by a node map (Job::node_groups, ThreadGroup::node_groups). Both
// communicators are ordinary Communicators (same promises as communicator.h: every collective
// is collective over the group's ranks only), with sequence numbers of their own.
struct NodeGroups {
  // Every rank of this node, ranked by local index (rank() == this rank's local index).
  std::shared_ptr<Communicator> intra;
  // The ranks with this rank's local index, one per node, ranked by node (rank() == node).
  // On nodes with fewer ranks than others, the high local indices have fewer members.
  std::shared_ptr<Communicator> inter;
  int node = 0;                 // this rank's node, 0 .. node_count() - 1
  std::vector<int> node_sizes;  // ranks per node, by node (the same vector on every rank)
  int node_count() const { return static_cast<int>(node_sizes.size()); }
  // "2, 2" (for messages).
  std::string sizes_str() const;
};

// A communicator over the same ranks as `world` whose allreduce is hierarchical (see the top
// of this file); every other collective is world's (forwarded, with the caller's label and
// stream). Not collective. `world` must outlive it; it keeps the groups alive.
// - Needs the same number of ranks on every node: otherwise throws InvalidArgument naming the
//   node sizes ("... this job has 3, 1 rank(s) on its 2 nodes"), the same on every rank. A
//   world of one node, or of one rank per node, gives allreduces identical in result to
//   world's and forwards them to world.
// - Results: the same on every rank; they differ from world's by the summation order only
//   (bit-identical for integers, max and min; within rounding for floats). Halves are rounded
//   once per level (twice) instead of once. avg is the mean over all ranks.
// - Issue order: the three steps of each allreduce run in issue order on the groups (on a
//   thread of this communicator for CPU tensors and the mpi backend, on a stream of its own
//   chained after the caller's for nccl), so allreduces overlap with the caller's work as
//   world's do. Other collectives issued on it are world's and may run alongside a pending
//   allreduce: as always, wait for a collective before passing its tensors to another.
// - Failures: each step has the deadline of its group's communicator; a missed one ends the
//   job through the watchdog as any collective does, and an error fails the allreduce's Work.
// - Elements beyond the last multiple of the node size (fewer than L) are allreduced inside the
//   node, then across nodes.
std::shared_ptr<Communicator> hierarchical_communicator(Communicator& world, const NodeGroups& groups);

}  // namespace tutti
