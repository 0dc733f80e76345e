// The device mesh on thread ranks: the layout (coordinates row-major, the groups' colors)
// against a brute-force reference; each dimension's group holds exactly the ranks that agree
// with this one on every other dimension, ranked by their coordinate; {node, local} holds what
// node_groups' intra and inter hold; bad dimensions are refused with the mesh and the world
// named.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tutti/comm/mesh.h"
#include "tutti/comm/thread_group.h"
#include "tutti/core/error.h"
#include "tutti/core/tensor.h"

namespace tutti {
namespace {

// The reference: rank = sum of coordinate x the product of the later dimensions' sizes.
int rank_of(const std::vector<MeshDim>& dims, const std::vector<int>& at) {
  int r = 0;
  for (std::size_t i = 0; i < dims.size(); ++i) r = r * dims[i].size + at[i];
  return r;
}

// The world ranks that agree with `rank` on every dimension but `dim`, by brute force.
std::vector<int> members(const std::vector<MeshDim>& dims, int world, int rank, int dim) {
  const std::vector<int> mine = DeviceMesh::coordinates(dims, rank);
  std::vector<int> out;
  for (int q = 0; q < world; ++q) {
    const std::vector<int> theirs = DeviceMesh::coordinates(dims, q);
    bool same = true;
    for (std::size_t i = 0; i < dims.size(); ++i) same = same && (static_cast<int>(i) == dim || theirs[i] == mine[i]);
    if (same) out.push_back(q);
  }
  return out;
}

std::int64_t sum_over(Communicator& comm, std::int64_t value) {
  const Tensor x = Tensor::from_ints({value}, {1}, DType::i64);
  comm.allreduce(x).wait();
  return x.to_ints()[0];
}

TEST(DeviceMeshLayout, RowMajorWithTheLastDimensionFastest) {
  const std::vector<MeshDim> dims = DeviceMesh::resolve({{"dp", 2}, {"tp", 3}}, 6);
  EXPECT_EQ(DeviceMesh::coordinates(dims, 0), (std::vector<int>{0, 0}));
  EXPECT_EQ(DeviceMesh::coordinates(dims, 2), (std::vector<int>{0, 2}));
  EXPECT_EQ(DeviceMesh::coordinates(dims, 4), (std::vector<int>{1, 1}));
  const std::vector<MeshDim> cube = DeviceMesh::resolve({{"a", 2}, {"b", kMeshRest}, {"c", 2}}, 12);
  ASSERT_EQ(cube[1].size, 3);
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(rank_of(cube, DeviceMesh::coordinates(cube, r)), r);
    for (int d = 0; d < 3; ++d) {
      // Same color exactly for the members of r's group on d.
      const std::vector<int> group = members(cube, 12, r, d);
      for (int q = 0; q < 12; ++q) {
        const bool member = std::find(group.begin(), group.end(), q) != group.end();
        EXPECT_EQ(DeviceMesh::color(cube, q, d) == DeviceMesh::color(cube, r, d), member)
            << "ranks " << r << " and " << q << " on dimension " << d;
      }
    }
  }
}

TEST(DeviceMeshLayout, RefusesDimensionsThatDoNotFitTheWorld) {
  const auto refused = [](std::vector<MeshDim> dims, int world, const std::string& says) {
    try {
      (void)DeviceMesh::resolve(std::move(dims), world);
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({{"dp", 3}, {"tp", 2}}, 4, "a mesh of dp 3 x tp 2 holds 6 ranks, the job has 4");
  refused({{"dp", kMeshRest}, {"tp", 3}}, 4, "the job's 4 rank(s) are not a multiple of the other dimensions' 3");
  refused({{"dp", kMeshRest}, {"tp", kMeshRest}}, 4, "only one dimension can take the rest");
  refused({{"dp", 2}, {"dp", 2}}, 4, "the dimension 'dp' appears twice in dp 2 x dp 2");
  refused({{"dp", 0}}, 4, "the dimension 'dp' has size 0");
  refused({{"", 4}}, 4, "has no name");
  refused({}, 4, "at least one dimension");
}

TEST(DeviceMesh, EachGroupHoldsTheRanksThatAgreeOnTheOtherDimensions) {
  const std::vector<MeshDim> dims = {{"pp", 2}, {"dp", kMeshRest}, {"tp", 2}};
  ThreadGroup group(8);
  group.run([&](int r) {
    DeviceMesh mesh = group.mesh(r, dims);
    EXPECT_EQ(mesh.size(), 8);
    EXPECT_EQ(mesh.rank(), r);
    EXPECT_EQ(mesh.size("dp"), 2);
    EXPECT_EQ(mesh.str(), "pp 2 x dp 2 x tp 2");
    for (int d = 0; d < 3; ++d) {
      const std::string& name = mesh.dims()[static_cast<std::size_t>(d)].name;
      const std::vector<int> expected = members(mesh.dims(), 8, r, d);
      Communicator& g = mesh.group(name);
      EXPECT_EQ(g.size(), mesh.size(name));
      EXPECT_EQ(g.rank(), mesh.coordinate(name));
      EXPECT_EQ(expected[static_cast<std::size_t>(g.rank())], r) << "ranked by the coordinate on " << name;
      std::int64_t ranks = 0, squares = 0;
      for (int q : expected) ranks += q, squares += q * q;
      // Two sums name the pair of members of a group of 2 (the sum alone could be ambiguous).
      EXPECT_EQ(sum_over(g, r), ranks) << name;
      EXPECT_EQ(sum_over(g, r * r), squares) << name;
    }
    try {
      (void)mesh.coordinate("ep");
      ADD_FAILURE() << "a dimension the mesh lacks";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("no dimension 'ep' in the mesh pp 2 x dp 2 x tp 2"), std::string::npos)
          << e.what();
    }
  });
}

TEST(DeviceMesh, NodeByLocalHoldsWhatNodeGroupsHold) {
  ThreadGroup group(6);
  group.run([&](int r) {
    NodeGroups nodes = group.node_groups(r, {3, 3});
    DeviceMesh mesh = group.mesh(r, {{"node", kMeshRest}, {"local", 3}});
    EXPECT_EQ(mesh.coordinate("node"), nodes.node);
    EXPECT_EQ(mesh.group("local").rank(), nodes.intra->rank());
    EXPECT_EQ(mesh.group("node").rank(), nodes.inter->rank());
    EXPECT_EQ(sum_over(mesh.group("local"), 1 << r), sum_over(*nodes.intra, 1 << r));
    EXPECT_EQ(sum_over(mesh.group("node"), 1 << r), sum_over(*nodes.inter, 1 << r));
  });
}

}  // namespace
}  // namespace tutti
