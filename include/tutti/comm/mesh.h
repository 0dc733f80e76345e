// A device mesh: the ranks of a job laid out on named dimensions, with a communicator for each
// dimension. The layout parallelism is built on: data parallelism on one dimension, tensor
// parallelism on another ({"dp", 2} x {"tp", 4}), or the hosts and the ranks within each
// ({"node", N} x {"local", L}).
//
// doc-test: wrap-main
// setup: tutti::Job job(argc, argv);
// setup: tutti::Tensor x = tutti::Tensor::zeros({8}, tutti::DType::f32, job.device());
//   tutti::DeviceMesh mesh = job.mesh({{"dp", tutti::kMeshRest}, {"tp", 1}});  // COLLECTIVE
//   mesh.group("tp").allreduce(x).wait();   // the ranks with this rank's dp coordinate
//   mesh.group("dp").allreduce(x).wait();   // the ranks with this rank's tp coordinate
//   std::printf("shard %d\n", mesh.coordinate("tp"));  // this rank's tensor-parallel shard
//
// Layout: row-major over the dimensions in the order given, the last varying fastest, as in
// PyTorch's DeviceMesh and Megatron: with {dp 2, tp 4}, ranks 0-3 are dp 0 and 4-7 dp 1, and
// the tp group of rank 5 is ranks 4-7. mpirun places consecutive ranks on a host (by slot), so
// a last dimension that divides the ranks per host stays within a host: put the dimension
// with the most traffic (tensor parallelism) last.
//
// Each dimension's group is an ordinary Communicator (communicator.h's promises: collective
// over the group's ranks only; sequence numbers of its own) with the job's deadlines, progress
// board and failure handling, as Job::node_groups' are: a rank missing in a group's collective
// ends the job within the deadline, naming the group's ranks. Its rank() is this rank's
// coordinate on the dimension. Job::node_groups is the case {"node", N} x {"local", L} where
// every host has L ranks (it also allows hosts of unequal size).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/comm/communicator.h"

namespace tutti {

// MeshDim::size: whatever is left of the world once the other dimensions are counted (at most
// one dimension per mesh).
inline constexpr int kMeshRest = -1;

struct MeshDim {
  std::string name;  // unique in the mesh, not empty ("dp", "tp", "node")
  int size = 0;      // > 0, or kMeshRest
};

class DeviceMesh {
 public:
  DeviceMesh() = default;

  int rank() const { return rank_; }                          // in the world the mesh was made from
  int size() const;                                           // the world's size: the product of the dimensions' sizes
  const std::vector<MeshDim>& dims() const { return dims_; }  // sizes resolved (no kMeshRest)
  // A dimension's size, and this rank's coordinate on it (0 .. size - 1). InvalidArgument for
  // a name the mesh lacks, naming the mesh's dimensions.
  int size(std::string_view dim) const;
  int coordinate(std::string_view dim) const;
  // The ranks whose coordinates equal this rank's on every other dimension, ranked by their
  // coordinate on `dim`. The mesh shares ownership: the communicator lives as long as any copy
  // of the mesh (or group_ptr's pointer).
  Communicator& group(std::string_view dim) const { return *group_ptr(dim); }
  std::shared_ptr<Communicator> group_ptr(std::string_view dim) const;
  // "dp 2 x tp 4" (for messages).
  std::string str() const;

  // The layout alone, not collective (what Job::mesh and ThreadGroup::mesh use to make the
  // groups). resolve: the sizes with kMeshRest filled in; InvalidArgument when the dimensions
  // are empty, a name is empty or repeated, a size is neither positive nor kMeshRest (or two
  // are kMeshRest), or the product is not `world` ("a mesh of dp 3 x tp 2 holds 6 ranks, the
  // job has 4"). coordinates: rank's coordinate on each dimension. color: which group of
  // dimension `dim` the rank is in (the same number for every member: its coordinates on the
  // other dimensions, row-major).
  static std::vector<MeshDim> resolve(std::vector<MeshDim> dims, int world);
  static std::vector<int> coordinates(const std::vector<MeshDim>& dims, int rank);
  static int color(const std::vector<MeshDim>& dims, int rank, int dim);

  // Assembles a mesh from its groups, one per dimension in order (Job::mesh, ThreadGroup::mesh).
  DeviceMesh(std::vector<MeshDim> dims, int rank, std::vector<std::shared_ptr<Communicator>> groups);

 private:
  int index_of(std::string_view dim) const;

  std::vector<MeshDim> dims_;
  int rank_ = 0;
  std::vector<int> coordinates_;
  std::vector<std::shared_ptr<Communicator>> groups_;
};

}  // namespace tutti
